"""Records: multi-field data that readers without the lock never see half-written.

A record is a sequence word ``seq`` and two copies of the body. The copy readers use
is ``copy[seq & 1]``. A writer (always holding the segment's write lock) fills the
*other* copy — body, then CRC-32 — and only then stores ``seq + 1``: one aligned
8-byte store that makes the new copy visible all at once. A reader loads ``seq``,
copies the visible body out, loads ``seq`` again and retries if it moved.

This is a seqlock whose "odd" state is the other copy. It keeps the seqlock's
promise (no reader sees half an update, readers never block writers) and adds one
that matters here: a writer killed with ``kill -9`` half-way through leaves
``seq`` unchanged, so readers keep reading the complete previous copy and nothing
needs repair — a classic seqlock would be left odd and wedge every reader.

Memory order: the writer's body stores must become visible before its ``seq``
store, and the reader's body loads must happen between its two ``seq`` loads. On
x86-64 (TSO) plain loads and stores already behave so. Elsewhere (AArch64)
``fence()`` orders them: it releases and re-acquires a lock held by this thread,
and a store-release followed by a load-acquire is a full barrier there.

``SegmentRecords`` places the records of one segment at their layout offsets: the
header's GPU and totals records and, per slot, ``SlotRecords`` (identity, published,
usage, reservation and the activity word), read together consistently by
``SlotRecords.read``. What the values mean is ``codec``'s business.
"""

from __future__ import annotations

import functools
import mmap
import os
import platform
import signal
import struct
import threading
import zlib
from collections import namedtuple
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import CorruptSegment, TornSlot
from kvpolicy.runtime.layout import CRC_FORMAT, CRC_SIZE, RecordSpec

U64 = (1 << 64) - 1
"""Sequence words, epochs and counters wrap at 2⁶⁴ (a damaged word may hold any value)."""

READ_RETRIES = 10_000
"""Retries of a lock-free read before giving up; a writer holds a record for microseconds."""
SLOT_READ_RETRIES = 1000
"""Retries of a slot's read across its records (a claim or free in progress moves them)."""

if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):

    def fence() -> None:
        """No-op on x86: stores are not reordered with stores, nor loads with loads."""

else:  # pragma: no cover - exercised on AArch64 hosts only
    _held = threading.local()

    def fence() -> None:
        """A full barrier: release then re-acquire a lock this thread holds (stlr; ldar)."""
        lock = getattr(_held, "lock", None)
        if lock is None:
            lock = _held.lock = threading.Lock()
            lock.acquire()
        lock.release()
        lock.acquire()


_CRC = struct.Struct(CRC_FORMAT)


# --- the crash test hook ----------------------------------------------------------------------------

KILL_AT_ENV = "KVPOLICY_TEST_KILL_AT_STORE"
"""Test hook: ``N`` makes this process SIGKILL itself just before its N-th store into a segment.

Every store of a change passes ``store_point()`` — each record copy's body, each sequence
word, each single word — so a test can kill a writer at every write point in turn, in a
real process (``tests/runtime/test_ledger_crash.py``). Unset (production) it costs one
test of a module global per store.
"""
KILL_AT = int(os.environ.get(KILL_AT_ENV) or 0)
_stores = 0


def store_point() -> None:
    """Count one store; with the test hook set, die of SIGKILL at the chosen one."""
    global _stores
    _stores += 1
    if _stores == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def stores_made() -> int:
    """How many stores into segments this process made (the crash test's count of write points)."""
    return _stores


@functools.cache
def _compiled(spec: RecordSpec) -> tuple[struct.Struct, Any]:
    """The body's Struct and value tuple class, built once per record kind."""
    return struct.Struct(spec.body_format), namedtuple(f"{spec.name.title()}Record", spec.names)


def value_type(spec: RecordSpec) -> Any:
    """The named tuple class of ``spec``'s values (the one ``Record.read`` returns)."""
    return _compiled(spec)[1]


class Words(Protocol):
    """What a reader needs of a segment's 64-bit words: one by index (``Segment.words``, or a
    stand-in that refuses every read once an instance detached)."""

    def __getitem__(self, index: int, /) -> int: ...


class Record:
    """One record at a fixed offset of a segment: typed reads (lock-free) and writes (locked)."""

    __slots__ = (
        "_copies",
        "_crc_off",
        "_crc_struct",
        "_last",
        "_struct",
        "_tuple",
        "offset",
        "seq_index",
        "spec",
        "where"
    )

    def __init__(self, spec: RecordSpec, offset: int, where: str) -> None:
        assert offset % 8 == 0, f"record {spec.name} at unaligned offset {offset}"
        self.spec = spec
        self.offset = offset
        self.seq_index = offset // 8
        self._copies = (offset + 8, offset + 8 + spec.copy_size)
        self._struct, self._tuple = _compiled(spec)
        self._crc_struct = _CRC
        self._crc_off = spec.copy_size - CRC_SIZE  # the body padded to 8 bytes
        self.where = where
        self._last: tuple[int, Any] = (-1, None)  # (seq, values) last read or written by this process

    def seq(self, words: Words) -> int:
        """The sequence word: changes exactly when a new copy becomes visible."""
        return words[self.seq_index]

    def read(self, mm: mmap.mmap, words: Words) -> tuple[int, Any]:
        """``(seq, values)`` of the visible copy, consistent; CorruptSegment if its CRC is wrong.

        While ``seq`` has not moved since this process last read or wrote the record, the values
        are the ones it had then (every write moves ``seq``): one 8-byte load.
        """
        last = self._last
        if words[self.seq_index] == last[0]:
            return last
        crc_off = self._crc_off
        for _ in range(READ_RETRIES):
            seq = words[self.seq_index]
            fence()
            off = self._copies[seq & 1]
            raw = mm[off : off + crc_off + CRC_SIZE]
            fence()
            if words[self.seq_index] != seq:
                continue
            (crc,) = self._crc_struct.unpack_from(raw, crc_off)
            body = raw[: self._struct.size]
            if zlib.crc32(body) != crc:
                raise CorruptSegment(
                    f"{self.where}: the {self.spec.name} record (copy {seq & 1}, seq {seq}) fails its "
                    f"CRC check: the segment was changed by something other than kvpolicy, or is damaged"
                )
            last = self._last = (seq, self._tuple._make(self._struct.unpack_from(body)))
            return last
        raise CorruptSegment(
            f"{self.where}: the {self.spec.name} record changed during {READ_RETRIES} reads in a row; "
            "a writer is stuck in a loop or the sequence word is being overwritten"
        )

    def write(self, mm: mmap.mmap, words: memoryview, values: Any) -> int:
        """Write ``values`` (a tuple in field order) as the new visible copy. Hold the write lock."""
        seq = words[self.seq_index]
        off = self._copies[(seq & 1) ^ 1]
        body = self._struct.pack(*values)  # struct.error before any store if a value does not fit
        if KILL_AT:
            store_point()
        mm[off : off + len(body)] = body
        self._crc_struct.pack_into(mm, off + self._crc_off, zlib.crc32(body))
        fence()
        new = (seq + 1) & U64  # 2⁶⁴ − 1 is odd, 0 even: the parity still flips
        if KILL_AT:
            store_point()
        words[self.seq_index] = new
        self._last = (new, values if type(values) is self._tuple else self._tuple._make(values))
        return new

    def make(self, **values: Any) -> Any:
        """A value tuple of this record from keyword fields (all required)."""
        return self._tuple(**values)

    def zero(self) -> Any:
        """The record with every field zero (strings empty)."""
        return self._tuple._make(b"" if code.endswith("s") else 0 for _, code in self.spec.fields if not code.endswith("x"))

    def initialise(self, mm: mmap.mmap, words: memoryview, values: Any) -> None:
        """Write both copies (a new segment only: nobody else can see it yet)."""
        self.write(mm, words, values)
        self.write(mm, words, values)


# --- a segment's records --------------------------------------------------------------------------

# The header's single words, as indices into ``Segment.words`` (each read or stored whole).
GENERATION = L.OFF_GENERATION // 8
HEARTBEAT = L.OFF_HEARTBEAT // 8
DIRTY = L.OFF_DIRTY // 8
PRESSURE = L.OFF_PRESSURE // 8


class SlotValues(NamedTuple):
    """One slot's records as read together: every record of the same occupant (same epoch)."""

    identity: Any
    published: Any
    usage: Any
    reservation: Any
    activity: int
    """The last-activity word (ns), stored without the lock."""


class SlotRecords:
    """Slot ``index``'s records and its activity word, at their layout offsets."""

    __slots__ = ("activity", "identity", "index", "published", "reservation", "usage", "where")

    def __init__(self, index: int, where: str) -> None:
        base = L.slot_offset(index)
        self.index = index
        self.where = where = f"{where} slot {index}"
        self.identity = Record(L.IDENTITY_RECORD, base + L.SLOT_OFF_IDENTITY, where)
        self.published = Record(L.PUBLISHED_RECORD, base + L.SLOT_OFF_PUBLISHED, where)
        self.usage = Record(L.USAGE_RECORD, base + L.SLOT_OFF_USAGE, where)
        self.reservation = Record(L.RESERVATION_RECORD, base + L.SLOT_OFF_RESERVATION, where)
        self.activity = (base + L.SLOT_OFF_ACTIVITY) // 8
        """Index of the last-activity word in the segment's words."""

    def __iter__(self) -> Iterator[Record]:
        return iter((self.identity, self.published, self.usage, self.reservation))

    def read(self, mm: mmap.mmap, words: memoryview) -> SlotValues | None:
        """The slot's records of one occupant (None if the slot is free); CorruptSegment if damaged.

        The identity record's sequence word brackets the read: if it moved, a claim or free
        happened meanwhile and the slot is read again. Every record must carry the identity's
        epoch. A claim writes the identity last and a free writes it first, so while the
        identity says "active, epoch e" and does not move, every other record already holds
        epoch e: a record of another epoch under a still identity is damage (``TornSlot``),
        reported at once, never waited for.
        """
        identity, published, usage, reservation = self.identity, self.published, self.usage, self.reservation
        for _ in range(SLOT_READ_RETRIES):
            s1, ident = identity.read(mm, words)
            if ident.state == L.SLOT_FREE:
                return None
            _, pub = published.read(mm, words)
            _, use = usage.read(mm, words)
            _, res = reservation.read(mm, words)
            activity = words[self.activity]
            if identity.seq(words) != s1:
                continue  # the slot was claimed, freed or changed meanwhile
            if not pub.epoch == use.epoch == res.epoch == ident.epoch:
                raise TornSlot(
                    f"{self.where}: records of different occupants (identity epoch {ident.epoch}, published "
                    f"{pub.epoch}, usage {use.epoch}, reservation {res.epoch}): the slot is damaged"
                )
            return SlotValues(ident, pub, use, res, activity)
        raise CorruptSegment(
            f"{self.where}: the slot changed hands during {SLOT_READ_RETRIES} reads in a row; "
            "its identity's sequence word is being overwritten"
        )


class SegmentRecords:
    """Every record of a segment with ``slot_count`` slots: the header's GPU and totals records, then the slots'."""

    __slots__ = ("gpu", "slots", "totals")

    def __init__(self, slot_count: int, where: str) -> None:
        self.gpu = Record(L.GPU_RECORD, L.OFF_GPU_RECORD, where)
        self.totals = Record(L.TOTALS_RECORD, L.OFF_TOTALS_RECORD, where)
        self.slots = tuple(SlotRecords(i, where) for i in range(slot_count))

    def __iter__(self) -> Iterator[Record]:
        yield self.gpu
        yield self.totals
        for slot in self.slots:
            yield from slot

    def initialise(self, mm: mmap.mmap, words: memoryview) -> None:
        """Every record zero, both copies: GPU figures unknown, zero totals, every slot free (a new segment only)."""
        for rec in self:
            rec.initialise(mm, words, rec.zero())
