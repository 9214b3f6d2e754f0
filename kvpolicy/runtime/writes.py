"""Every store into a segment: one change at a time, and the record writes each change makes.

Readers never take the lock (``records``), so what they can see — and what a writer
killed half-way leaves behind — is decided by the stores in this module, in the order
they are made. Nothing else in kvpolicy stores into a segment's records or words
(``Segment`` writes the header of a new file, ``SegmentRecords.initialise`` its
first records).

A *change* (``Change``) holds the segment's write lock. On entry it stores the
writer's pid in ``dirty``; on exit it moves ``generation`` (for engines' changes) and
clears ``dirty``. Whoever takes the lock and finds ``dirty`` set — its writer died
inside a change — rebuilds the header's totals from the slots, which are always
complete thanks to the two-copy records; so does a change that stops half-way on an
unexpected error.

``SegmentWriter`` has one method per step of a change. Each writes slot records and
moves the header's totals by exactly what those records moved, so that the totals
stay Σ over the slots (the invariant ``rebuild_totals`` restores): the numbered
*write points* in each docstring are the stores, in order.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kvpolicy.runtime import codec
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.admission import unmet
from kvpolicy.runtime.errors import CorruptSegment, LedgerError
from kvpolicy.runtime.reader import SegmentReader
from kvpolicy.runtime.records import DIRTY, GENERATION, HEARTBEAT, PRESSURE, SlotRecords
from kvpolicy.runtime.values import InstanceLimits, Totals


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
            if words[DIRTY]:
                writer.rebuild_totals()
            words[DIRTY] = seg.opened_by if seg.fd is not None else os.getpid()
        except BaseException:
            seg.unlock()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        writer = self.writer
        seg = writer.seg
        words = seg.words
        try:
            if exc_type is not None and not issubclass(exc_type, LedgerError):
                writer.rebuild_totals()  # a change that stopped half-way may have moved the totals
            if self.engine:
                words[GENERATION] += 1
            words[DIRTY] = 0
        finally:
            seg.unlock()


class SegmentWriter:
    """The stores into one open segment. Every method but ``beat`` and ``touch`` runs inside a ``Change``."""

    __slots__ = ("_mm", "_words", "reader", "records", "seg")

    def __init__(self, reader: SegmentReader) -> None:
        self.reader = reader
        self.seg = reader.seg
        self.records = reader.records
        self._mm = reader.seg.mm
        self._words = reader.seg.words

    def change(self, *, engine: bool = True) -> Change:
        """Hold the write lock around a change; repair totals a dead writer left; bump the generation."""
        return Change(self, engine)

    # --- the header's totals ---------------------------------------------------------------------

    def rebuild_totals(self) -> Totals:
        """Σ over the slots, written as the totals record. CorruptSegment if a slot cannot be read.

        1. totals.
        """
        runtime = mapped = pending = guarantees = active = unmet_total = 0
        for i in range(self.seg.slot_count):
            v = self.reader.slot(i)
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
        assert min(values) >= 0, f"totals went negative: {values} (ledger bug)"
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
        slot.published.write(mm, words, codec.published(epoch, 0, InstanceLimits(guarantee, guarantee, guarantee), 0))
        slot.usage.write(mm, words, slot.usage.zero()._replace(epoch=epoch, updated_at_ns=now))
        slot.reservation.write(mm, words, codec.reservation(epoch, 0, None, {}))
        words[slot.activity] = now
        seq = slot.identity.write(mm, words, identity)
        counted = guarantee if codec.is_elastic(identity) else 0
        self._adjust_totals(active=1, guarantees=counted, unmet_guarantees=counted)
        return seq

    def free(self, slots: list[SlotRecords]) -> Totals:
        """Each of ``slots`` reset and marked free (epoch + 1), then the totals rebuilt from the slots.

        Per slot: 1. published, 2. usage, 3. reservation (zero, new epoch); 4. identity (state free,
        new epoch). Then 5. totals (rebuilt).
        """
        for slot in slots:
            self._free(slot)
        return self.rebuild_totals()

    def _free(self, slot: SlotRecords) -> None:
        mm, words = self._mm, self._words
        try:
            _, ident = slot.identity.read(mm, words)
            epoch = ident.epoch + 1
        except CorruptSegment:
            epoch = (slot.identity.seq(words) << 20) + 1  # unknown epoch: any value unlike the old ones
        for rec in (slot.published, slot.usage, slot.reservation):
            rec.write(mm, words, rec.zero()._replace(epoch=epoch))
        slot.identity.write(mm, words, slot.identity.zero()._replace(epoch=epoch))

    def mark_elastic(self, slot: SlotRecords, ident: Any) -> int:
        """The occupant (identity ``ident``) has an elastic pool: its guarantee counts. The identity record's new seq.

        1. identity (flag elastic); 2. totals (G + guarantee, Σ unmet + what it lacks of it).
        """
        mm, words = self._mm, self._words
        seq = slot.identity.write(mm, words, ident._replace(flags=ident.flags | L.FLAG_ELASTIC))
        _, pub = slot.published.read(mm, words)
        _, use = slot.usage.read(mm, words)
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
        slot.reservation.write(mm, words, reservation)
        self._adjust_totals(runtime_reserved=now - was)

    def figures(self, values: Any) -> None:
        """The GPU's figures: an engine's provisional ones, or a controller's publish. 1. gpu."""
        self.records.gpu.write(self._mm, self._words, values)

    # --- elastic bytes ---------------------------------------------------------------------------

    def admit(self, slot: SlotRecords, use: Any, nbytes: int, guarantee: int) -> None:
        """``nbytes`` admitted to the occupant whose usage record is ``use`` and counted guarantee ``guarantee``.

        1. usage (pending + n); 2. totals (Σ pending + n; Σ unmet by what the guarantee lacks less).
        """
        held = use.mapped + use.pending
        admitted = use._replace(pending=use.pending + nbytes, updated_at_ns=time.time_ns())
        slot.usage.write(self._mm, self._words, admitted)
        lacks_less = unmet(guarantee, held + nbytes) - unmet(guarantee, held)
        self._adjust_totals(elastic_pending=nbytes, unmet_guarantees=lacks_less)

    def settle(self, slot: SlotRecords, use: Any, *, commit: int, rollback: int, release: int) -> None:
        """Admitted bytes mapped (commit) or given back (rollback); mapped bytes unmapped (release).

        1. usage (pending − commit − rollback, mapped + commit − release); 2. totals (the same, and
        Σ unmet by what the occupant's guarantee lacks more after a rollback or release).
        """
        mm, words = self._mm, self._words
        slot.usage.write(
            mm,
            words,
            use._replace(
                pending=use.pending - commit - rollback,
                mapped=use.mapped + commit - release,
                updated_at_ns=time.time_ns(),
            ),
        )
        more_unmet = 0
        if rollback or release:  # a commit moves pending to mapped: what the instance holds stays
            held = use.mapped + use.pending
            g = codec.counted_guarantee(slot.identity.read(mm, words)[1], slot.published.read(mm, words)[1])
            more_unmet = unmet(g, held - rollback - release) - unmet(g, held)
        self._adjust_totals(
            elastic_pending=-commit - rollback, elastic_mapped=commit - release, unmet_guarantees=more_unmet
        )

    def report_usage(self, slot: SlotRecords, use: Any, used: int) -> None:
        """Bytes in live blocks (counted in no total). 1. usage."""
        slot.usage.write(self._mm, self._words, use._replace(used=used, updated_at_ns=time.time_ns()))

    def acknowledge(
        self, slot: SlotRecords, use: Any, revision: int, status: int, deferred_since_ns: int, now_ns: int
    ) -> None:
        """The occupant applied (or defers) ``revision`` (counted in no total). 1. usage."""
        values = use._replace(
            ack_revision=revision, ack_status=status, deferred_since_ns=deferred_since_ns, updated_at_ns=now_ns
        )
        slot.usage.write(self._mm, self._words, values)

    def bump_pressure(self) -> None:
        """An elastic admission the GPU's budget refused: others' pools give back what they hold unused. 1. pressure."""
        self._words[PRESSURE] += 1

    # --- the controller's publish ----------------------------------------------------------------

    def limits(self, slot: SlotRecords, ident: Any, revision: int, limits: InstanceLimits, now_ns: int) -> None:
        """Published limits for the occupant with identity ``ident``.

        1. published; 2. totals (G and Σ unmet, when an elastic occupant's guarantee changed).
        """
        mm, words = self._mm, self._words
        _, old = slot.published.read(mm, words)
        slot.published.write(mm, words, codec.published(ident.epoch, revision, limits, now_ns))
        if codec.is_elastic(ident) and limits.guarantee != old.guarantee:
            _, use = slot.usage.read(mm, words)
            held = use.mapped + use.pending
            self._adjust_totals(
                guarantees=limits.guarantee - old.guarantee,
                unmet_guarantees=unmet(limits.guarantee, held) - unmet(old.guarantee, held),
            )

    # --- single words, stored without the lock ---------------------------------------------------

    def beat(self, now_ns: int) -> None:
        """The controller is alive."""
        self._words[HEARTBEAT] = now_ns

    def touch(self, slot: SlotRecords, now_ns: int) -> None:
        """The occupant of ``slot`` served something."""
        self._words[slot.activity] = now_ns
