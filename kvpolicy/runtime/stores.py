"""Small JSON documents the controller keeps beside the ledger (``status.json``, ``state.json``).

Written crash-safely: a new temporary file in the same directory (mode 0600, or the
ledger's group mode), written and fsynced, then renamed over the old one and the
directory fsynced, so a reader — or a controller started after a crash — finds the old
document or the new one, never half of one. Read defensively: a symlink, anything but
a regular file, a file others may use and one over the size cap are refused before a
byte is parsed.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from kvpolicy.paths import MAX_INPUT_BYTES, reason
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access, check_owner

MAX_DOCUMENT_BYTES = MAX_INPUT_BYTES
"""The largest document read (a full node's status is well under 1 MiB); a larger one is refused. The cap of
every JSON document kvpolicy reads, so that ``kvpolicy explain --state`` and a restarted controller take the
same rule state files."""


def write_document(path: Path, text: str, access: Access | None = None) -> Path:
    """Replace ``path`` with ``text`` atomically and durably; LedgerError naming the cause if it fails. A
    document over ``MAX_DOCUMENT_BYTES`` is not written: no reader would take it, and the last one written,
    which a reader does take, stays."""
    data = text.encode("utf-8")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise LedgerError(f"kvpolicy ledger: not writing {path}: {len(data)} B is over the {MAX_DOCUMENT_BYTES} B a "
                          "reader takes; the last one written stays")
    access = access or Access()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _write_error(exc, path) from None
    try:
        if access.group is not None:
            os.fchown(fd, -1, access.group)
        os.fchmod(fd, access.file_mode)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_error(exc, path) from None
        raise
    _sync_directory(path.parent)
    return path


def _sync_directory(directory: Path) -> None:
    """Make the rename durable; a filesystem that cannot fsync a directory (tmpfs may not) is fine."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_error(exc: OSError, path: Path) -> LedgerError:
    """A failed write as a LedgerError; ENOSPC named, with what to do."""
    what = errno.errorcode.get(exc.errno or 0, "error")
    hint = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = " Free space on that filesystem (for /dev/shm: a larger --shm-size or tmpfs size=)."
    return LedgerError(f"kvpolicy ledger: cannot write {path} ({what}: {reason(exc)}).{hint}")


def read_document(path: Path, what: str) -> str | None:
    """The text of ``path`` (``what`` names it in errors: "a status file"), or None if it does not
    exist; LedgerError if it is not to be trusted or not UTF-8."""
    raw = read_document_bytes(path, what)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LedgerError(f"kvpolicy ledger: {path} is not UTF-8 ({exc}); not {what}") from None


def read_document_bytes(path: Path, what: str) -> bytes | None:
    """The bytes of ``path``, as ``read_document`` reads them (its caller decodes them)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LedgerError(f"kvpolicy ledger: {path} is a symlink; refusing to follow it") from None
        raise LedgerError(f"kvpolicy ledger: cannot read {path}: {reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise LedgerError(f"kvpolicy ledger: {path} is not a regular file; refusing to read it")
        check_owner(st, f"the {what.removeprefix('a ')} {path}", Access(allow_foreign_owner=True))
        if st.st_size > MAX_DOCUMENT_BYTES:
            raise LedgerError(
                f"kvpolicy ledger: {path} is {st.st_size} bytes, more than {what} can be "
                f"({MAX_DOCUMENT_BYTES} B); refusing to read it"
            )
        raw = f.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise LedgerError(f"kvpolicy ledger: {path} grew past {MAX_DOCUMENT_BYTES} B while read; refusing it")
    return raw
