"""One GPU's segment file: safe creation, the checks before trusting it, the mapping and its locks.

Files live in the ledger directory (default ``/dev/shm/kvpolicy``) as ``<gpu>.ledger``.

Security model (docs/ledger.md has the long form):
- The directory is created mode 0700 and segments mode 0600, or 0770/0660 owned by
  the configured group, so engines of other users or containers in that group can
  take part.
- Before anything in a segment is believed, the file must be a regular file (not a
  symlink: ``O_NOFOLLOW``), owned by this user — or by another user when the owner
  configured ``allow_foreign_owner``, or a group member when the file belongs to
  the configured group and is group-writable — and not accessible to others. Then
  the header must carry the magic, this layout version, consistent sizes, the
  expected GPU id and a correct CRC.
- A new segment is written in full under a temporary name and linked into place,
  so no process ever opens a half-initialised one.

Locks are open-file-description (OFD) locks: the kernel drops them when the last
descriptor of their open file closes, which includes the death of the process by
any signal, so ``kill -9`` never leaves a lock behind. Byte ``LOCK_WRITE`` is the
write lock; byte ``LOCK_SLOT_BASE + i`` is held by the live owner of slot ``i``,
which lets any process (in any pid namespace) tell a live owner from a dead one.
OFD locks do not exclude threads sharing the descriptor, so a thread lock comes
first. A forked child shares its parent's descriptors and hence their locks: the
child closes its copies at fork (``os.register_at_fork``), keeping only the
read-only view of the mapping.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import logging
import mmap
import os
import pwd
import secrets
import stat
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import (
    CorruptSegment,
    Detached,
    ForeignSegment,
    LayoutVersionMismatch,
    LedgerError,
    SegmentSetAside,
    SegmentTruncated,
    UnsafeSegment,
)
from kvpolicy.runtime.records import SegmentRecords

log = logging.getLogger("kvpolicy.ledger")

SUFFIX = ".ledger"
_FLOCK = struct.Struct("hhxxxxqqixxxx")  # struct flock on Linux (x86-64 and AArch64)


@dataclass(frozen=True)
class Access:
    """Who may share the ledger: this user only (default), a group, or anyone's segment."""

    group: int | None = None
    """Group id: the directory and segments are created for it (0770/0660) and its segments are trusted."""
    allow_foreign_owner: bool = False
    """Trust segments owned by another user (e.g. a controller running as a service user)."""

    @classmethod
    def from_options(cls, group: str | int | None = None, allow_foreign_owner: bool = False) -> Access:
        """``group`` by name or id; an unknown name is an error naming it."""
        if group is None or group == "":
            return cls(None, allow_foreign_owner)
        if isinstance(group, int) or str(group).isdigit():
            return cls(int(group), allow_foreign_owner)
        try:
            return cls(grp.getgrnam(str(group)).gr_gid, allow_foreign_owner)
        except KeyError:
            raise LedgerError(f"kvpolicy ledger: no such group {group!r} (see /etc/group)") from None

    @property
    def file_mode(self) -> int:
        return 0o660 if self.group is not None else 0o600

    @property
    def dir_mode(self) -> int:
        return 0o2770 if self.group is not None else 0o700


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


OTHERS_FILE = 0o007
"""A ledger file (segment, status, controller lock) with any of these bits (o+rwx) is refused."""
OTHERS_DIR = 0o002
"""The ledger directory is refused if others may write it (o+w); o+rx only lets them see names."""


def check_owner(st: os.stat_result, what: str, access: Access, *, others: int = OTHERS_FILE) -> None:
    """Refuse a file or directory others may use (``others`` bits), or that another user could have written."""
    me = os.geteuid()
    if st.st_mode & others:
        mode = stat.S_IMODE(st.st_mode)
        can = "writable by every user; anyone could forge limits in it" if mode & 0o002 else (
            "open to every user (any o+ bit is refused); the ledger's files are for its owner and group only"
        )
        raise UnsafeSegment(
            f"kvpolicy ledger: {what} is {can} (mode {mode:04o}). Remove it, or chmod o-rwx if you trust its contents."
        )
    if st.st_uid == me or access.allow_foreign_owner:
        return
    if access.group is not None and st.st_gid == access.group and st.st_mode & 0o060 == 0o060:
        return
    hint = (
        f"configure the ledger group (group=/--ledger-group/KVPOLICY_LEDGER_GROUP) to {_group_name(st.st_gid)} "
        "if that user is trusted, or allow_foreign_owner"
    )
    if access.group is not None and st.st_gid != access.group:
        hint = f"it belongs to {_group_name(st.st_gid)}, not the configured {_group_name(access.group)}; " + hint
    raise ForeignSegment(
        f"kvpolicy ledger: {what} is owned by {_who(st.st_uid)}, and this process runs as {_who(me)}. "
        f"Refusing to trust it: {hint}."
    )


def ensure_directory(path: Path, access: Access) -> None:
    """Create the ledger directory (mode 0700, or 2770 for a group) or check the one that exists."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        if access.group is not None:
            os.chown(path, -1, access.group)
        os.chmod(path, access.dir_mode)  # mkdir's mode went through the umask
    check_directory(path, access)


def check_directory(path: Path, access: Access) -> None:
    """Refuse a ledger directory that is a symlink, not a directory, or not to be trusted (``check_owner``)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeSegment(f"kvpolicy ledger: the ledger directory {path} is {kind}; refusing to use it")
    check_owner(st, f"the ledger directory {path}", access, others=OTHERS_DIR)


def segment_path(directory: Path, gpu: str) -> Path:
    return directory / f"{gpu}{SUFFIX}"


def check_gpu_id(gpu: str) -> bytes:
    """The GPU id as stored: 1–64 (``GPU_ID_WIDTH``) bytes of letters, digits and ``:._-``, not starting with
    a dot: a UUID (``GPU-…``, ``MIG-…``) or a fallback ``cuda:N``."""
    raw = gpu.encode()
    if not raw or len(raw) > L.GPU_ID_WIDTH:
        raise LedgerError(f"kvpolicy ledger: GPU id {gpu!r} must be 1 to {L.GPU_ID_WIDTH} bytes")
    if gpu.startswith(".") or not all(c.isascii() and (c.isalnum() or c in ":._-") for c in gpu):
        raise LedgerError(
            f"kvpolicy ledger: GPU id {gpu!r} may hold only letters, digits and ':._-' and must not "
            "start with '.' (it names the segment file), e.g. 'GPU-5a0e4f2c-…' or 'cuda:0'"
        )
    return raw


_open_segments: weakref.WeakSet[Segment] = weakref.WeakSet()
_held: dict[int, int] = {}  # thread ident -> write locks it holds
_LOCK_WRITE = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, L.LOCK_WRITE, 1, 0)
_UNLOCK_WRITE = _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, L.LOCK_WRITE, 1, 0)
_unlock_hooks: list[Callable[[], None]] = []


def _leave(me: int) -> None:
    """The thread is out of one ledger change; after the outermost, run the unlock hooks."""
    n = _held.pop(me, 1) - 1
    if n:
        _held[me] = n
    elif _unlock_hooks:
        for hook in _unlock_hooks:
            hook()


def add_unlock_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` after the outermost write lock of the current thread is released (signal deferral)."""
    _unlock_hooks.append(hook)


class Segment:
    """An open, checked, mapped segment. ``words`` is the mapping as 8-byte words."""

    def __init__(self, path: Path, gpu: str, fd: int, mm: mmap.mmap, slot_count: int) -> None:
        self.path = path
        self.gpu = gpu
        self.fd: int | None = fd
        self.mm = mm
        self.words = memoryview(mm).cast("Q")
        self.slot_count = slot_count
        self.opened_by = os.getpid()
        self._tlock = threading.Lock()
        self._holder: int | None = None
        _open_segments.add(self)

    # --- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        gpu: str,
        access: Access,
        *,
        create: bool = True,
        slot_count: int = L.DEFAULT_SLOTS,
        repair: bool = False,
    ) -> Segment:
        """Open the GPU's segment (creating it, and the directory, if ``create``), checked before use.

        A segment that fails its checks is refused (``CorruptSegment`` naming the file). With
        ``repair`` (the controller and ``attach``), one that nobody holds a slot in is first moved
        aside (``<gpu>.ledger.<why>-<ns>``, kept for a post-mortem) and, with ``create``, replaced.
        """
        check_gpu_id(gpu)
        if not 1 <= slot_count <= L.MAX_SLOTS:
            raise LedgerError(f"kvpolicy ledger: slot count {slot_count} is outside 1..{L.MAX_SLOTS}")
        if create:
            ensure_directory(directory, access)
        elif directory.exists():
            check_owner(os.lstat(directory), f"the ledger directory {directory}", access, others=OTHERS_DIR)
        path = segment_path(directory, gpu)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                if not create:
                    raise
                made = cls._create(directory, path, gpu, access, slot_count)
                if made is not None:
                    return made
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafeSegment(f"kvpolicy ledger: {path} is a symlink; refusing to follow it") from None
                raise
            try:
                return cls._checked(path, gpu, fd, access)
            except CorruptSegment as exc:
                aside = _set_aside(fd, path, exc) if repair else None
                os.close(fd)
                if aside is None:
                    raise
                log.warning("%s; moved it aside to %s", exc, aside)
                if not create:
                    raise SegmentSetAside(f"{exc}; nobody held a slot in it, so it was moved aside to {aside}") from None
                # loop: create a fresh segment in its place
            except BaseException:
                os.close(fd)
                raise

    @classmethod
    def _checked(cls, path: Path, gpu: str, fd: int, access: Access) -> Segment:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSegment(f"kvpolicy ledger: {path} is not a regular file; refusing to use it")
        check_owner(st, f"the segment {path}", access)
        if st.st_size < L.HEADER_SIZE:
            raise SegmentTruncated(
                f"kvpolicy ledger: {path} is {st.st_size} bytes, shorter than a ledger header "
                f"({L.HEADER_SIZE} B): not a kvpolicy ledger segment"
            )
        head = os.pread(fd, L.HEADER_STATIC_SIZE + 4, 0)
        slot_count = check_header(head, path, gpu, st.st_size)
        mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, gpu, fd, mm, slot_count)

    @classmethod
    def _create(cls, directory: Path, path: Path, gpu: str, access: Access, slot_count: int) -> Segment | None:
        """Write a complete segment under a temporary name and link it into place; None if we lost a race."""
        tmp = directory / f".{gpu}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            raise _no_room(exc, directory, gpu) from None
        try:
            if access.group is not None:
                os.fchown(fd, -1, access.group)
            os.fchmod(fd, access.file_mode)
            size = L.segment_size(slot_count)
            try:
                # Every page allocated now: on a full tmpfs this fails with ENOSPC, where a sparse
                # file would map fine and then kill us with SIGBUS at the first store.
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in _NO_ROOM:
                    raise
                raise _no_room(exc, directory, gpu) from None
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            seg = cls(path, gpu, fd, mm, slot_count)
            header = pack_header(gpu, slot_count)
            mm[: len(header)] = header
            SegmentRecords(slot_count, f"kvpolicy ledger: {path}").initialise(mm, seg.words)
            try:
                os.link(tmp, path)
            except FileExistsError:
                seg.close()
                return None
            return seg
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
        finally:
            os.unlink(tmp)

    def check_size(self) -> None:
        """SegmentTruncated if the file became shorter than its mapping (touching the lost part is SIGBUS)."""
        if self.fd is None:
            return
        size = os.fstat(self.fd).st_size
        if size < len(self.mm):
            raise SegmentTruncated(
                f"kvpolicy ledger: {self.path} was truncated to {size} bytes while open (its layout needs "
                f"{len(self.mm)}); refusing to touch it. Something other than kvpolicy changed the file."
            )

    # --- locks -----------------------------------------------------------------------------------

    def _fd(self) -> int:
        if self.fd is None:
            if os.getpid() != self.opened_by:
                raise Detached(
                    f"kvpolicy ledger: the segment {self.path} was opened by pid {self.opened_by}; this process "
                    f"(pid {os.getpid()}) is a fork of it and may only read. Attach again in this process."
                )
            raise Detached(f"kvpolicy ledger: the segment {self.path} is closed")
        return self.fd

    def _ofd(self, cmd: int, kind: int, offset: int) -> bytes:
        return fcntl.fcntl(self._fd(), cmd, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))

    def lock(self) -> None:
        """Take the segment's write lock: the thread lock, then the OFD lock on byte LOCK_WRITE."""
        me = threading.get_ident()
        if self._holder == me:
            raise LedgerError("kvpolicy ledger: the write lock is not re-entrant (internal error)")
        # Counted before the first lock is taken: a SIGTERM from here on is deferred to the
        # unlock, so its handler never tries to lock while this thread holds the thread lock.
        _held[me] = _held.get(me, 0) + 1
        try:
            self._tlock.acquire()
            try:
                fcntl.fcntl(self._fd(), fcntl.F_OFD_SETLKW, _LOCK_WRITE)
            except BaseException:
                self._tlock.release()
                raise
        except BaseException:
            _leave(me)
            raise
        self._holder = me

    def unlock(self) -> None:
        me = self._holder
        self._holder = None
        try:
            if self.fd is not None:
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _UNLOCK_WRITE)
        finally:
            self._tlock.release()
            _leave(me)  # type: ignore[arg-type]  # unlock follows lock(), which set the holder

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the segment's write lock for the block."""
        self.lock()
        try:
            yield
        finally:
            self.unlock()

    def try_hold_slot(self, index: int) -> bool:
        """Take slot ``index``'s owner lock; False if another open file holds it."""
        try:
            self._ofd(fcntl.F_OFD_SETLK, fcntl.F_WRLCK, L.LOCK_SLOT_BASE + index)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def drop_slot(self, index: int) -> None:
        self._ofd(fcntl.F_OFD_SETLK, fcntl.F_UNLCK, L.LOCK_SLOT_BASE + index)

    def slot_held_elsewhere(self, index: int) -> bool:
        """Whether another open file (a live owner) holds slot ``index``'s owner lock."""
        res = self._ofd(fcntl.F_OFD_GETLK, fcntl.F_WRLCK, L.LOCK_SLOT_BASE + index)
        return _FLOCK.unpack(res)[0] != fcntl.F_UNLCK

    # --- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap and close; every lock this descriptor held is dropped."""
        _open_segments.discard(self)
        try:
            self.words.release()
            self.mm.close()
        except BufferError:
            pass  # a reader still holds a view; the mapping goes with the last reference
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _after_fork_in_child(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the parent's locks must not live on in the child
            self.fd = None
        self._tlock = threading.Lock()
        self._holder = None
        _held.clear()


def holds_any_lock() -> bool:
    """Whether the current thread holds the write lock of any open segment."""
    return threading.get_ident() in _held


def _after_fork() -> None:
    for seg in list(_open_segments):
        seg._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork)


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _no_room(exc: OSError, directory: Path, gpu: str) -> LedgerError:
    assert exc.errno is not None  # one of _NO_ROOM
    return LedgerError(
        f"kvpolicy ledger: no room for {gpu}'s segment in {directory} ({errno.errorcode[exc.errno]}: "
        f"{os.strerror(exc.errno)}). Free space on that filesystem (for /dev/shm: a larger --shm-size or "
        "tmpfs size=, or remove stale files), or point the ledger elsewhere (--ledger-dir / KVPOLICY_LEDGER_DIR)."
    )


def _set_aside(fd: int, path: Path, problem: CorruptSegment) -> Path | None:
    """Rename a segment that cannot be used out of the way, if nobody uses it; its new path, or None.

    Only when no process holds its write lock or any slot's owner lock (the same lock bytes in
    every layout version) and the name still points at this file. A newer layout is never moved:
    it is in use by a newer kvpolicy, and this one is what needs upgrading.
    """
    if isinstance(problem, LayoutVersionMismatch) and problem.newer:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _LOCK_WRITE)
    except OSError:
        return None  # a writer is inside a change: report now, try again later
    try:
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, L.LOCK_SLOT_BASE, L.MAX_SLOTS, 0)
        if _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK:
            return None  # an engine still holds a slot in it
        if os.lstat(path).st_ino != os.fstat(fd).st_ino:
            return None  # already replaced
        aside = path.with_name(f"{path.name}.{problem.tag}-{time.time_ns()}")
        os.rename(path, aside)
        return aside
    except OSError:
        return None
    finally:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _UNLOCK_WRITE)


def check_header(head: bytes, path: Path | str, gpu: str, file_size: int) -> int:
    """Validate the static header; the slot count, or CorruptSegment / LayoutVersionMismatch."""
    magic, version, header_size, slot_count, slot_size, total, gpu_raw, _created, _uid = struct.unpack_from(
        L.HEADER_STATIC_FORMAT, head
    )
    if magic == L.MAGIC and version != L.LAYOUT_VERSION:
        raise LayoutVersionMismatch.between(path, version)
    if magic != L.MAGIC:
        raise CorruptSegment(
            f"kvpolicy ledger: {path} is not a kvpolicy ledger segment (it starts with {magic!r}, not "
            f"{L.MAGIC!r}); refusing to use it"
        )
    (crc,) = struct.unpack_from("<I", head, L.HEADER_CRC_OFFSET)
    if zlib.crc32(head[: L.HEADER_STATIC_SIZE]) != crc:
        raise CorruptSegment(f"kvpolicy ledger: {path}: the header fails its CRC check; the segment is damaged")
    expected_total = L.HEADER_SIZE + slot_count * slot_size
    if header_size == L.HEADER_SIZE and slot_size == L.SLOT_SIZE and total == expected_total and file_size < total:
        raise SegmentTruncated(
            f"kvpolicy ledger: {path}: inconsistent sizes: the file is {file_size} bytes, shorter than the "
            f"{total} its header says ({slot_count} slots): it was truncated; refusing to map it"
        )
    if (
        header_size != L.HEADER_SIZE
        or slot_size != L.SLOT_SIZE
        or not 1 <= slot_count <= L.MAX_SLOTS
        or total != expected_total
        or file_size != total
    ):
        raise CorruptSegment(
            f"kvpolicy ledger: {path}: inconsistent sizes (header {header_size}, slots {slot_count} × {slot_size}, "
            f"total {total}, file {file_size} bytes); the segment is damaged"
        )
    stored = gpu_raw.rstrip(b"\0").decode("utf-8", "replace")
    if stored != gpu:
        raise CorruptSegment(f"kvpolicy ledger: {path} belongs to GPU {stored!r}, not {gpu!r}; it was renamed or copied")
    return slot_count


def pack_header(gpu: str, slot_count: int) -> bytes:
    """The static header of a new segment, with its CRC."""
    static = struct.pack(
        L.HEADER_STATIC_FORMAT,
        L.MAGIC,
        L.LAYOUT_VERSION,
        L.HEADER_SIZE,
        slot_count,
        L.SLOT_SIZE,
        L.segment_size(slot_count),
        check_gpu_id(gpu),
        time.time_ns(),
        os.geteuid(),
    )
    return static + struct.pack("<I", zlib.crc32(static))


def refuse_older_in_use(directory: Path, gpu: str) -> None:
    """Raise ``LayoutVersionMismatch`` if ``gpu``'s segment is of an older layout and an engine holds a slot in it.

    For the ids a GPU had before: layout 2 keyed GPUs by ``cuda:N``, layout 3 by UUID, so an
    engine of the old layout on this GPU is in another file and only this check sees it.
    Nothing is read beyond the version, and nothing is changed.
    """
    path = segment_path(directory, gpu)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # none (or not a file we would open): nothing of the old layout runs under this name
    try:
        head = os.pread(fd, 12, 0)
        if len(head) < 12:
            return
        magic, version = struct.unpack_from("<8sI", head)
        if magic != L.MAGIC or version >= L.LAYOUT_VERSION:
            return
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, L.LOCK_SLOT_BASE, L.MAX_SLOTS, 0)
        if _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK:
            raise LayoutVersionMismatch.between(path, version)
    finally:
        os.close(fd)


def list_gpus(directory: Path) -> list[str]:
    """GPU ids of the segments in ``directory`` (sorted; none if it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX) and not n.startswith("."))
