"""Every store into a segment: one change at a time, and the record writes each change makes.

Readers never take the lock (``records``), so what they can see — and what a writer
killed half-way leaves behind — is decided by the stores in this module, in the order
they are made. Nothing else in kvpolicy stores into a segment's records or words
(``Segment`` writes the header of a new file, ``SegmentRecords.initialise`` its
first records). docs/ledger.md ("Crash safety") lists every write point and what a
writer killed just before it leaves.

Crash safety by construction:

- a record is never torn (two copies, one sequence word: ``records``);
- a slot is never torn either: a claim writes the occupant's identity last, a free
  writes it first, so the slot reads as free or as one complete occupant whatever
  store a writer dies before (``SlotRecords.read`` reports any other mix as damage);
- the header's totals are a cache of Σ over the slots. A change stores the writer's
  pid in ``dirty`` before it moves anything and 0 after; whoever takes the lock and
  finds it set repairs (``SegmentWriter.repair``), and the repair cannot fail: it
  wipes damaged slots nobody holds, and counts a damaged slot whose owner still lives
  conservatively (over, never under) until that owner is gone;
- every step reads what it needs before its first store, so a step that fails on
  damage fails before it moved anything; a change that fails after a store is
  repaired on the spot.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from kvpolicy.runtime import codec
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.admission import unmet
from kvpolicy.runtime.errors import CorruptSegment
from kvpolicy.runtime.reader import SegmentReader
from kvpolicy.runtime import records
from kvpolicy.runtime.records import DIRTY, GENERATION, HEARTBEAT, PRESSURE, U64, SlotRecords, store_point
from kvpolicy.runtime.values import InstanceLimits, Totals

SATURATED = U64 - 1
"""A total that cannot be known (a damaged slot whose owner lives): counted as all memory, never as none."""


class Change:
    """The write lock around one change (a class, not a generator: it is on the admission path)."""

    __slots__ = ("engine", "writer")

    def __init__(self, writer: SegmentWriter, engine: bool) -> None:
        self.writer = writer
        self.engine = engine

    def __enter__(self) -> None:
        writer = self.writer
        seg = writer.seg
        seg.lock()
        try:
            words = seg.words
            if words[DIRTY] or not writer.header_readable():
                writer.repair()
            writer.moved = False
            writer.store_word(DIRTY, seg.opened_by if seg.fd is not None else os.getpid())
        except BaseException:
            seg.unlock()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        writer = self.writer
        seg = writer.seg
        try:
            if exc_type is not None and writer.moved:
                writer.repair()  # the change stopped after a store: the totals may lag the slots
            if self.engine:
                writer.store_word(GENERATION, (seg.words[GENERATION] + 1) & U64)
            writer.store_word(DIRTY, 0)
        finally:
            seg.unlock()


class SegmentWriter:
    """The stores into one open segment. Every method but ``beat`` and ``touch`` runs inside a ``Change``."""

    __slots__ = ("_held_anywhere", "_mm", "_words", "moved", "reader", "records", "seg")

    def __init__(self, reader: SegmentReader, held_anywhere: Callable[[int], bool]) -> None:
        self.reader = reader
        self.seg = reader.seg
        self.records = reader.records
        self._mm = reader.seg.mm
        self._words = reader.seg.words
        self._held_anywhere = held_anywhere
        """Whether slot i's owner lock is held (by this process or another): a damaged slot is wiped only if not."""
        self.moved = False
        """Whether the current change has stored anything yet (a failure after that is repaired)."""

    def store_word(self, index: int, value: int) -> None:
        """One 8-byte word of the segment."""
        if records.KILL_AT:
            store_point()
        self._words[index] = value

    def change(self, *, engine: bool = True) -> Change:
        """Hold the write lock around a change; repair totals a dead writer left; bump the generation."""
        return Change(self, engine)

    # --- the header's totals ---------------------------------------------------------------------

    def header_readable(self) -> bool:
        """Whether the header's GPU and totals records pass their checks (one word each when unchanged)."""
        try:
            self.records.totals.read(self._mm, self._words)
            self.records.gpu.read(self._mm, self._words)
        except CorruptSegment:
            return False
        return True

    def repair(self) -> Totals:
        """Make the segment whole again, under the lock; cannot fail on damage.

        1. a damaged GPU record: zero (no figures: elastic admission stops until the next publish);
        2. per damaged slot nobody holds: ``free`` (identity first); 3. totals, rebuilt.
        """
        self.moved = True
        mm, words = self._mm, self._words
        try:
            self.records.gpu.read(mm, words)
        except CorruptSegment:
            self.records.gpu.write(mm, words, self.records.gpu.zero())
        for slot in self.records.slots:
            try:
                self.reader.slot(slot.index)
            except CorruptSegment:
                if not self._held_anywhere(slot.index):  # a live owner's damaged slot stays, counted high
                    self._free(slot)
        return self.rebuild_totals()

    def rebuild_totals(self) -> Totals:
        """Σ over the readable slots, written as the totals record.

        A damaged slot's share is unknown (its owner still lives, or ``repair`` would have wiped
        it): each total then keeps the larger of the old total and the sum, and with no readable
        old totals the GPU counts as fully reserved, so admission over-counts until the owner is
        gone and its slot is wiped; it never under-counts. 1. totals.
        """
        runtime = mapped = pending = guarantees = active = unmet_total = 0
        damaged = False
        for i in range(self.seg.slot_count):
            try:
                v = self.reader.slot(i)
            except CorruptSegment:
                damaged = True
                active += 1
                continue
            if v is None:
                continue
            active += 1
            runtime += v.runtime_reserved
            mapped += v.mapped
            pending += v.pending
            if v.elastic:
                guarantees += v.guarantee
                unmet_total += unmet(v.guarantee, v.mapped + v.pending)
        t = Totals(runtime, mapped, pending, guarantees, active, unmet_total)
        if damaged:
            try:
                old = codec.decode_totals(self.records.totals.read(self._mm, self._words)[1])
                t = Totals(*(max(a, b) for a, b in zip(_fields(t), _fields(old))))
            except CorruptSegment:
                t = Totals(SATURATED, mapped, pending, guarantees, active, unmet_total)
        t = Totals(*(min(x, SATURATED) for x in _fields(t)))
        self.moved = True
        self.records.totals.write(self._mm, self._words, codec.encode_totals(t))
        return t

    def _adjust_totals(
        self,
        runtime_reserved: int = 0,
        elastic_mapped: int = 0,
        elastic_pending: int = 0,
        guarantees: int = 0,
        active: int = 0,
        unmet_guarantees: int = 0,
    ) -> None:
        rec = self.records.totals
        _, t = rec.read(self._mm, self._words)
        values = (
            t.runtime_reserved + runtime_reserved,
            t.elastic_mapped + elastic_mapped,
            t.elastic_pending + elastic_pending,
            t.guarantees + guarantees,
            t.active + active,
            t.unmet_guarantees + unmet_guarantees,
        )
        if min(values) < 0 or max(values) > SATURATED:  # only after damage; never guess: rebuild
            self.rebuild_totals()
            return
        rec.write(self._mm, self._words, values)

    # --- claim and free --------------------------------------------------------------------------

    def claim(self, slot: SlotRecords, identity: Any, guarantee: int) -> int:
        """A new occupant in the free ``slot``, its limit ``guarantee`` until a publish; the identity record's new seq.

        ``identity`` (``codec.identity``) carries the new epoch; the other records take it first,
        so a reader sees the occupant only once its identity is visible, with every record its own.
        1. published (limit = target = guarantee, revision 0); 2. usage (zero); 3. reservation
        (empty); 4. the activity word; 5. identity (state active: the claim is visible);
        6. totals (active + 1; G and Σ unmet + guarantee for an elastic instance).
        """
        mm, words = self._mm, self._words
        epoch = identity.epoch
        now = identity.attached_at_ns
        self.moved = True
        slot.published.write(mm, words, codec.published(epoch, 0, InstanceLimits(guarantee, guarantee, guarantee), 0))
        slot.usage.write(mm, words, slot.usage.zero()._replace(epoch=epoch, updated_at_ns=now))
        slot.reservation.write(mm, words, codec.reservation(epoch, 0, None, {}))
        self.store_word(slot.activity, now)
        seq = slot.identity.write(mm, words, identity)
        counted = guarantee if codec.is_elastic(identity) else 0
        self._adjust_totals(active=1, guarantees=counted, unmet_guarantees=counted)
        return seq

    def free(self, slots: list[SlotRecords]) -> Totals:
        """Each of ``slots`` marked free (new epoch) and reset, then the totals rebuilt from the slots.

        Per slot: 1. identity (state free, new epoch: from here on the slot reads as free);
        2. published, 3. usage, 4. reservation (zero, new epoch). Then 5. totals (rebuilt).
        """
        for slot in slots:
            self._free(slot)
        return self.rebuild_totals()

    def _free(self, slot: SlotRecords) -> None:
        mm, words = self._mm, self._words
        self.moved = True
        try:
            _, ident = slot.identity.read(mm, words)
            epoch = next_epoch(ident.epoch)
        except CorruptSegment:
            epoch = next_epoch(secrets.randbits(64))  # unknown epoch: any value unlike the old ones
        slot.identity.write(mm, words, slot.identity.zero()._replace(epoch=epoch))
        for rec in (slot.published, slot.usage, slot.reservation):
            rec.write(mm, words, rec.zero()._replace(epoch=epoch))

    def mark_elastic(self, slot: SlotRecords, ident: Any) -> int:
        """The occupant (identity ``ident``) has an elastic pool: its guarantee counts. The identity record's new seq.

        1. identity (flag elastic); 2. totals (G + guarantee, Σ unmet + what it lacks of it).
        """
        mm, words = self._mm, self._words
        _, pub = slot.published.read(mm, words)
        _, use = slot.usage.read(mm, words)
        self.moved = True
        seq = slot.identity.write(mm, words, ident._replace(flags=ident.flags | L.FLAG_ELASTIC))
        self._adjust_totals(guarantees=pub.guarantee, unmet_guarantees=unmet(pub.guarantee, use.mapped + use.pending))
        return seq

    # --- runtime-owned reservations --------------------------------------------------------------

    def reserve(self, slot: SlotRecords, reservation: Any) -> None:
        """The occupant's reservation record replaced (a static admission, or a pool report).

        1. reservation; 2. totals (R by the change of its runtime-owned bytes).
        """
        mm, words = self._mm, self._words
        where = self.reader.where
        _, old = slot.reservation.read(mm, words)
        was = codec.runtime_reserved(old, where)
        now = codec.runtime_reserved(reservation, where)
        self.moved = True
        slot.reservation.write(mm, words, reservation)
        self._adjust_totals(runtime_reserved=now - was)

    def figures(self, values: Any) -> None:
        """The GPU's figures: an engine's provisional ones, or a controller's publish. 1. gpu."""
        self.moved = True
        self.records.gpu.write(self._mm, self._words, values)

    # --- elastic bytes ---------------------------------------------------------------------------

    def admit(self, slot: SlotRecords, use: Any, nbytes: int, guarantee: int) -> None:
        """``nbytes`` admitted to the occupant whose usage record is ``use`` and counted guarantee ``guarantee``.

        1. usage (pending + n); 2. totals (Σ pending + n; Σ unmet by what the guarantee lacks less).
        """
        held = use.mapped + use.pending
        admitted = use._replace(pending=use.pending + nbytes, updated_at_ns=time.time_ns())
        self.moved = True
        slot.usage.write(self._mm, self._words, admitted)
        lacks_less = unmet(guarantee, held + nbytes) - unmet(guarantee, held)
        self._adjust_totals(elastic_pending=nbytes, unmet_guarantees=lacks_less)

    def settle(self, slot: SlotRecords, use: Any, *, commit: int, rollback: int, release: int) -> None:
        """Admitted bytes mapped (commit) or given back (rollback); mapped bytes unmapped (release).

        1. usage (pending − commit − rollback, mapped + commit − release); 2. totals (the same, and
        Σ unmet by what the occupant's guarantee lacks more after a rollback or release).
        """
        mm, words = self._mm, self._words
        more_unmet = 0
        if rollback or release:  # a commit moves pending to mapped: what the instance holds stays
            held = use.mapped + use.pending
            g = codec.counted_guarantee(slot.identity.read(mm, words)[1], slot.published.read(mm, words)[1])
            more_unmet = unmet(g, held - rollback - release) - unmet(g, held)
        self.moved = True
        slot.usage.write(
            mm,
            words,
            use._replace(
                pending=use.pending - commit - rollback,
                mapped=use.mapped + commit - release,
                updated_at_ns=time.time_ns(),
            ),
        )
        self._adjust_totals(
            elastic_pending=-commit - rollback, elastic_mapped=commit - release, unmet_guarantees=more_unmet
        )

    def report_usage(self, slot: SlotRecords, use: Any, used: int, waiting_mib: int) -> None:
        """Bytes in live blocks and MiB refused to waiting work (counted in no total). 1. usage."""
        self.moved = True
        values = use._replace(used=used, waiting_mib=waiting_mib, updated_at_ns=time.time_ns())
        slot.usage.write(self._mm, self._words, values)

    def acknowledge(
        self, slot: SlotRecords, use: Any, revision: int, status: int, deferred_since_ns: int, now_ns: int
    ) -> None:
        """The occupant applied (or defers) ``revision`` (counted in no total). 1. usage."""
        values = use._replace(
            ack_revision=revision, ack_status=status, deferred_since_ns=deferred_since_ns, updated_at_ns=now_ns
        )
        self.moved = True
        slot.usage.write(self._mm, self._words, values)

    def bump_pressure(self) -> None:
        """An elastic admission the GPU's budget refused: others' pools give back what they hold unused. 1. pressure."""
        self.store_word(PRESSURE, (self._words[PRESSURE] + 1) & U64)

    # --- the controller's publish ----------------------------------------------------------------

    def limits(self, slot: SlotRecords, ident: Any, revision: int, limits: InstanceLimits, now_ns: int) -> None:
        """Published limits for the occupant with identity ``ident``.

        1. published; 2. totals (G and Σ unmet, when an elastic occupant's guarantee changed).
        """
        mm, words = self._mm, self._words
        _, old = slot.published.read(mm, words)
        _, use = slot.usage.read(mm, words)
        values = codec.published(ident.epoch, revision, limits, now_ns)
        self.moved = True
        slot.published.write(mm, words, values)
        if codec.is_elastic(ident) and limits.guarantee != old.guarantee:
            held = use.mapped + use.pending
            self._adjust_totals(
                guarantees=limits.guarantee - old.guarantee,
                unmet_guarantees=unmet(limits.guarantee, held) - unmet(old.guarantee, held),
            )

    # --- single words, stored without the lock ---------------------------------------------------

    def beat(self, now_ns: int) -> None:
        """The controller is alive."""
        self.store_word(HEARTBEAT, now_ns & U64)

    def touch(self, slot: SlotRecords, now_ns: int) -> None:
        """The occupant of ``slot`` served something."""
        self.store_word(slot.activity, now_ns & U64)


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``, wrapping within the field (a damaged epoch may be 2⁶⁴ − 1)."""
    return (epoch + 1) & U64


def _fields(t: Totals) -> tuple[int, ...]:
    return (t.runtime_reserved, t.elastic_mapped, t.elastic_pending, t.guarantees, t.active, t.unmet_guarantees)
