"""Helpers the commands share: finding policy files, reading option values."""

from __future__ import annotations

import argparse
import math
import re
import socket
import sys
from pathlib import Path

from kvpolicy import units
from kvpolicy.paths import POLICY_SUFFIX, expand, path_kind, reason


class UsageError(Exception):
    """A command-line mistake: the command prints it and exits 2."""


def policy_files(paths: list[str]) -> list[Path]:
    """The files named, with directories expanded to the ``.kvp`` files under them (``named_files``)."""
    return named_files(paths, POLICY_SUFFIX)


STDIN_NAME = "<stdin>"
"""What messages call standard input when ``--stdin-filename`` gives no name."""


def policy_inputs(names: list[str], stdin_name: str | None) -> list[tuple[str, Path | None]]:
    """(name, path) of each policy named: ``-`` alone is standard input, named ``stdin_name``
    (``--stdin-filename``; no path); UsageError for ``-`` among files, a ``stdin_name`` without
    ``-`` (it would name nothing), or a name ``policy_files`` refuses."""
    if names == ["-"]:
        return [(stdin_name or STDIN_NAME, None)]
    if "-" in names:
        raise UsageError("- (standard input) cannot be combined with other files")
    if stdin_name is not None:
        raise UsageError("--stdin-filename names standard input, which is read only with - as the one file")
    return [(str(path), path) for path in policy_files(names)]


def read_policy_input(path: Path | None, limit: int | None = None) -> bytes:
    """The bytes of a policy ``policy_inputs`` gave, to the size cap: standard input's without a path."""
    from kvpolicy.lint.source import read_policy_bytes, read_policy_stream

    return read_policy_stream(sys.stdin.buffer, limit) if path is None else read_policy_bytes(path, limit)


def named_files(paths: list[str], suffix: str) -> list[Path]:
    """The files named, with directories expanded to the ``*suffix`` files under them; UsageError for
    a name that is missing or cannot be looked at, or a directory under it that cannot be read."""
    found: list[Path] = []
    for name in paths:
        try:
            found.extend(expand([name], suffix))
        except OSError as exc:
            raise UsageError(_cannot_use(name, exc)) from None
    return found


def _cannot_use(name: str, exc: OSError) -> str:
    """What ``expand`` refused of the path ``name``: it, or (a directory) something in it."""
    if exc.filename is not None and Path(exc.filename) != Path(name):
        return f"{name}: cannot read {exc.filename} in it: {reason(exc)}"
    if isinstance(exc, FileNotFoundError):
        return f"{name}: no such file or directory"
    return f"{name}: cannot read it: {reason(exc)}"


def check_readable(command: str, path: Path) -> None:
    """UsageError unless ``path`` names something to read (a file, or a pipe)."""
    try:
        kind = path_kind(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it: {reason(exc)}") from None
    if kind == "missing":
        raise UsageError(f"{path}: no such file")
    if kind == "dir":
        raise UsageError(f"{path}: is a directory; kvpolicy {command} reads one policy file")


def parse_size(text: str) -> int:
    """``141GiB``, ``141 GiB`` or ``1.5TiB`` → bytes; argparse type for size options.

    A unit is required, as in the language: ``--gpu-capacity 80`` is a usage error.
    """
    try:
        return units.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_positive_size(text: str) -> int:
    """A size of more than 0 bytes (``80GiB``); argparse type for a GPU's memory or capacity."""
    value = parse_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size of more than 0 bytes, e.g. 80GiB")
    return value


def parse_seconds(text: str) -> float:
    """A positive, finite number of seconds (``0.5``, ``10``); argparse type for intervals.

    ``nan``, ``inf`` and ``0`` are refused: an interval of none of them can be waited out.
    """
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, e.g. 1 or 0.5") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive, finite number of seconds, e.g. 1 or 0.5")
    return seconds


def parse_count(text: str) -> int:
    """A whole number, 0 or more; argparse type."""
    if not (text.strip().isascii() and text.strip().isdigit()) or len(text.strip()) > 18:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 or more)")
    return int(text)


def parse_positive_count(text: str) -> int:
    """A whole number, 1 or more; argparse type."""
    try:
        count = parse_count(text)
    except argparse.ArgumentTypeError:
        count = 0
    if count == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return count


_ADDRESS = re.compile(r"\[(?P<v6>[^\]]+)\]:(?P<v6port>[^:]*)|(?P<host>[^:\[\]]*):(?P<port>[^:]*)")
_ADDRESS_EXAMPLES = "e.g. 127.0.0.1:9464 (this machine only), 0.0.0.0:9464 (every interface) or [::1]:9464"


def parse_port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port); argparse type."""
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    if len(text.strip()) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"port {text.strip()} is out of range: a port is 0 to 65535")
    port = int(text)
    return port


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` → (host, port); argparse type for addresses to listen on.

    The host must be given (binding every interface is a choice, not a default) and must
    resolve; an IPv6 address goes in brackets.
    """
    match = _ADDRESS.fullmatch(text.strip())
    if match is None:
        if text.count(":") > 1:
            raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9464")
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT; {_ADDRESS_EXAMPLES}")
    host = match["v6"] or match["host"]
    try:
        port = parse_port(match["v6port"] if match["v6"] else match["port"])
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if not host:
        raise argparse.ArgumentTypeError(f"{text!r} has no host; {_ADDRESS_EXAMPLES}")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise argparse.ArgumentTypeError(f"{text!r}: cannot resolve the host {host!r} ({reason})") from None
    return host, port
