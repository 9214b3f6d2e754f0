"""What a path a user named is, without the operating system's refusals escaping as tracebacks.

``Path.is_file()`` answers False for a missing file but raises for a directory on the way
that cannot be entered, a name too long or a link loop; and ``Path.rglob`` skips a
subdirectory it cannot read without a word, so a check of a tree could pass having
checked nothing there. Commands look at the paths they are given through here and turn
the ``OSError`` into their usage error (exit 2), naming the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Literal

from kvpolicy.units import MiB

PathKind = Literal["file", "dir", "other", "missing"]

POLICY_SUFFIX = ".kvp"
TEST_SUFFIX = ".kvtest.json"
"""Policy unit tests (``kvpolicy test``) are ``*.kvtest.json`` files, found by this ending."""
FACTS_SUFFIX = ".facts.json"
"""The sample facts of ``NAME.kvp`` are ``NAME.facts.json`` beside it."""

MAX_INPUT_BYTES = 64 * MiB
"""What a facts, state, test or model config file may hold: thousands of instances fit in a few
MiB, and an unbounded read (``/dev/zero``) would exhaust memory before any check could refuse it."""

_READ_CHUNK = 1 * MiB


def path_kind(path: Path) -> PathKind:
    """``file`` (a regular file), ``dir``, ``other`` (a pipe such as ``<(...)``, a device) or
    ``missing``, links followed; ``OSError`` when the system cannot tell (no permission to
    enter a directory on the way, a name too long, a link loop)."""
    _check_name(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    return "dir" if stat.S_ISDIR(mode) else "other"


def files_under(root: Path, suffix: str) -> list[Path]:
    """The files named ``*suffix`` in the tree under ``root``, sorted; ``OSError`` for a directory
    in it that cannot be read, or such a name that is a link to nothing or a loop (none is skipped
    without a word). Hidden directories (``.git``, a Kubernetes ConfigMap volume's ``..data`` and
    the ``..2024_…`` directory it links to, which would give each file twice) and links to
    directories are not entered."""

    def refuse(exc: OSError) -> None:
        raise exc

    found: list[Path] = []
    for directory, subdirs, names in os.walk(root, onerror=refuse):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for name in names:
            if name.endswith(suffix):
                found.extend(_named_file(Path(directory) / name))
    return sorted(found)


def expand(names: list[str], suffix: str) -> list[Path]:
    """The paths named, a directory expanded to the files named ``*suffix`` under it
    (``files_under``), anything else read as named (a file, a pipe); ``FileNotFoundError`` for a
    name that is not there, ``OSError`` for one that cannot be looked at (``exc.filename`` says
    which: the name, or a path in its tree)."""
    found: list[Path] = []
    for name in names:
        path = Path(name)
        kind = path_kind(path)
        if kind == "missing":
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", name)
        found.extend(files_under(path, suffix) if kind == "dir" else [path])
    return found


def _named_file(path: Path) -> list[Path]:
    """``[path]`` for a file found by its name in a tree; [] for a directory so named."""
    kind = path_kind(path)
    if kind == "missing":  # listed, so a link to nothing
        raise FileNotFoundError(errno.ENOENT, "a link to nothing", str(path))
    return [] if kind == "dir" else [path]


def reason(exc: OSError) -> str:
    """The system's words for ``exc`` ("Permission denied"), without the errno and path."""
    return exc.strerror or str(exc)


def read_bounded(path: Path | str, limit: int) -> bytes:
    """The file's bytes, never more than ``limit`` + 1 (enough to tell that it is over);
    ``OSError`` as ``open`` raises it, and for a name with a NUL character."""
    _check_name(Path(path))
    with open(path, "rb") as stream:
        return read_stream(stream, limit)


def read_stream(stream: BinaryIO, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``stream``, read a chunk at a time: a limit set very high
    costs nothing until the bytes are there."""
    chunks, left = [], limit + 1
    while left > 0:
        chunk = stream.read(min(left, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class NotRegularFile(OSError):
    """A path that is something other than a regular file (a FIFO, a device, a socket, a
    directory) where a file that can be read again and again is needed; ``kind`` says what."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(errno.EISDIR if kind == "a directory" else errno.EINVAL, f"{kind}, not a regular file",
                         str(path))
        self.kind = kind


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words: "a FIFO (named pipe)", "a directory"..."""
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (links followed); ``NotRegularFile``
    for anything else, ``OSError`` as ``open`` raises it.

    It never blocks and never opens what is not a regular file: a FIFO's open waits for a
    writer (and would wake one waiting for a reader), a device's may act. So the kind is
    checked before the open, and again on the open file (the name may have been replaced
    in between), which is opened with O_NONBLOCK (a FIFO's open returns at once) and
    O_NOCTTY (a terminal does not become this process's controlling one)."""
    _check_name(Path(path))
    _require_regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _require_regular(path, os.fstat(fd).st_mode)
        return open(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def _require_regular(path: Path | str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, file_kind(mode))


def _check_name(path: Path) -> None:
    if "\0" in str(path):  # the system would raise ValueError: say it as the OSError it is
        raise OSError(errno.EINVAL, "a file name cannot contain a NUL character", str(path))
