"""Reading a policy: at most a bounded number of bytes, whatever the file is.

A policy is a few kilobytes; parsing costs some hundred bytes of memory per
character, so an unbounded read (a huge file, ``/dev/zero`` behind a symlink) would
exhaust memory before any check could refuse it. Every reader (``kvpolicy lint``,
``fmt``, ``explain``, the controller's reload, the adapters) reads through here and
gets KV026 policy-too-large, at the line and column where the limit falls, for a
policy over ``max_policy_bytes()``: 1 MiB unless ``KVPOLICY_MAX_POLICY_SIZE`` (a
size such as ``4MiB``, or bytes) says otherwise.
"""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

from kvpolicy.catalogue import POLICY_TOO_LARGE
from kvpolicy.diagnostics import Diagnostic, PolicyError, Span
from kvpolicy.paths import read_bounded, read_stream
from kvpolicy.units import SIZE_UNITS, MiB, format_bytes

DEFAULT_MAX_POLICY_BYTES = 1 * MiB
MAX_POLICY_SIZE_ENV = "KVPOLICY_MAX_POLICY_SIZE"
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def max_policy_bytes() -> int:
    """The size cap: ``KVPOLICY_MAX_POLICY_SIZE`` if set, else 1 MiB; raises ValueError
    for a setting that is not a positive size."""
    value = os.environ.get(MAX_POLICY_SIZE_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_POLICY_BYTES
    match = _SIZE.fullmatch(value)
    unit = match.group(2) if match else None
    if match is None or (unit and unit not in SIZE_UNITS):
        raise ValueError(f"{MAX_POLICY_SIZE_ENV}={value!r} is not a size such as 4MiB")
    limit = int(Fraction(match.group(1)) * (SIZE_UNITS[unit] if unit else 1))
    if limit <= 0:
        raise ValueError(f"{MAX_POLICY_SIZE_ENV}={value!r} must be more than 0 bytes")
    return limit


def read_policy_bytes(path: Path | str, limit: int | None = None) -> bytes:
    """The file's bytes, but never more than ``limit`` + 1 (enough to tell that it is over the
    limit, which ``decode_policy`` then reports); OSError as ``open`` raises it."""
    if limit is None:
        limit = _limit_or_default()
    return read_bounded(path, limit)


def read_policy_stream(stream: BinaryIO, limit: int | None = None) -> bytes:
    """Standard input's (or any stream's) bytes, at most ``limit`` + 1 of them."""
    return read_stream(stream, _limit_or_default() if limit is None else limit)


def _limit_or_default() -> int:
    try:
        return max_policy_bytes()
    except ValueError:
        return DEFAULT_MAX_POLICY_BYTES  # check_size reports the setting


def check_size(data: bytes, file: str, limit: int | None = None) -> None:
    """Raises PolicyError (KV026) if ``data`` is over the size cap (or the cap's setting is wrong)."""
    if limit is None:
        try:
            limit = max_policy_bytes()
        except ValueError as exc:
            raise PolicyError([POLICY_TOO_LARGE.at(file, Span.point(1, 1), f"the policy is not read: {exc}",
                                                   "set a size such as 4MiB, or unset it for 1 MiB")]) from None
    if len(data) > limit:
        raise PolicyError([too_large(data, file, limit)])


def too_large(data: bytes, file: str, limit: int) -> Diagnostic:
    """KV026 at the first character past ``limit`` bytes."""
    start = data.rfind(b"\n", 0, limit) + 1
    line = data.count(b"\n", 0, start) + 1
    col = len(data[start:limit].decode("utf-8", errors="replace")) + 1
    return POLICY_TOO_LARGE.at(
        file, Span.point(line, col),
        f"the policy is over the size limit of {format_bytes(limit)}; it is not read further",
        f"split it, or raise the limit with {MAX_POLICY_SIZE_ENV} (e.g. {MAX_POLICY_SIZE_ENV}=4MiB)",
    )
