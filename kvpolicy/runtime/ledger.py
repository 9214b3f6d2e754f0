"""One GPU's ledger: every operation on one segment, each a read, a decision and a write.

``GpuLedger`` coordinates the pieces; it holds no formula and makes no store itself:

- ``reader.SegmentReader`` — lock-free reads, records decoded (``codec``) into ``values``;
- ``admission`` — both admission formulas, pure functions of figures, totals and the
  instance's own share;
- ``writes.SegmentWriter`` — every store, inside a ``writes.Change`` (the write lock,
  the ``dirty`` word and the generation), keeping the header's totals equal to Σ over
  the slots;
- ``liveness.SlotOwners`` — the slot locks held here and whether another slot's
  owner lives (reclaim frees the slots of dead ones).

Every change happens under the segment's write lock; readers without the lock (the
controller, ``kvpolicy status``, an engine's hot path) use the records' sequence words
and never see half an update (``records``). docs/ledger.md has the formulas and the
layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime import codec
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.admission import Holding, Refusal, refuse_elastic, refuse_reserve, refuse_static
from kvpolicy.runtime.errors import CorruptSegment, Detached, DuplicateInstance, LedgerError, SlotsFull
from kvpolicy.runtime.liveness import ProcessIdentity, SlotOwners, this_process
from kvpolicy.runtime.reader import SegmentReader
from kvpolicy.runtime.records import GENERATION, HEARTBEAT, PRESSURE, SegmentRecords
from kvpolicy.runtime.segment import Access, Segment
from kvpolicy.runtime.values import ADMITTED_POOL, GpuFigures, check_bytes, GpuLimits, InstanceLimits, SlotView, Totals
from kvpolicy.runtime.writes import Change, SegmentWriter, next_epoch

# GpuLedger's vocabulary, defined in ``values`` and ``admission``, is importable from here too.
__all__ = [
    "ADMITTED_POOL",
    "Claim",
    "GpuFigures",
    "GpuLedger",
    "GpuLimits",
    "InstanceLimits",
    "Refusal",
    "SlotView",
    "Totals",
]


@dataclass(frozen=True)
class Claim:
    """An instance's hold on its slot: the slot, its epoch, and the identity record's seq when last written."""

    index: int
    epoch: int
    identity_seq: int


class GpuLedger:
    """One GPU's segment and every operation on it."""

    def __init__(self, segment: Segment) -> None:
        self.seg = segment
        self.gpu = segment.gpu
        self.reader = SegmentReader(segment)
        self.owners = SlotOwners(segment)
        self.writer = SegmentWriter(self.reader, self.owners.held_anywhere)
        self.records: SegmentRecords = self.reader.records
        """The segment's records at their offsets (``Instance.read`` watches its published record directly)."""
        self.where = self.reader.where
        self._slots = self.records.slots
        self._me: ProcessIdentity | None = None

    @classmethod
    def open(
        cls,
        directory: Path,
        gpu: str,
        access: Access | None = None,
        *,
        create: bool = True,
        slot_count: int = L.DEFAULT_SLOTS,
        repair: bool = False,
    ) -> GpuLedger:
        """Open (or create) the GPU's segment under ``directory``, checked before use (``Segment.open``)."""
        seg = Segment.open(Path(directory), gpu, access or Access(), create=create, slot_count=slot_count, repair=repair)
        return cls(seg)

    def close(self) -> None:
        self.seg.close()

    @property
    def slot_count(self) -> int:
        return self.seg.slot_count

    # --- single words ----------------------------------------------------------------------------

    def generation(self) -> int:
        """Changes whenever an engine changes anything in this segment (one 8-byte read)."""
        return self.seg.words[GENERATION]

    def budget_stamp(self) -> tuple[int, int]:
        """The sequence words of the GPU's figures and totals records (two 8-byte reads, no lock).

        Each moves at every write of its record and never comes back: while the stamp is the
        same, so is everything an elastic admission reads about the GPU.
        """
        words = self.seg.words
        return words[self.records.gpu.seq_index], words[self.records.totals.seq_index]

    def heartbeat(self) -> float | None:
        """Wall-clock time of the controller's last heartbeat, or None if none ever beat."""
        ns = self.seg.words[HEARTBEAT]
        return codec.seconds(ns) if ns else None

    def pressure(self) -> int:
        """How many elastic admissions the GPU's budget has refused so far (one 8-byte read).

        When it moves, some instance wants memory that others hold: pools give back the
        free memory they hold beyond what they use (``kvpolicy.alloc``, "Pressure").
        """
        return self.seg.words[PRESSURE]

    def beat(self, now: float | None = None) -> None:
        """The controller is alive (a single store; no lock)."""
        self.writer.beat(int((time.time() if now is None else now) * 1e9))

    def touch(self, index: int, now_ns: int | None = None) -> None:
        """Record activity of the instance in slot ``index`` (a single store; no lock)."""
        self.writer.touch(self._slots[index], time.time_ns() if now_ns is None else now_ns)

    # --- lock-free reads -------------------------------------------------------------------------

    def figures(self) -> GpuFigures:
        return self.reader.figures()

    def totals(self) -> Totals:
        return self.reader.totals()

    def slot(self, index: int) -> SlotView | None:
        """The instance in slot ``index`` (None if free), read consistently; CorruptSegment if invalid."""
        return self.reader.slot(index)

    def slots(self) -> tuple[list[SlotView], list[str]]:
        """Every attached instance, and a message per slot that failed its checks."""
        return self.reader.slots()

    # --- changes ---------------------------------------------------------------------------------

    def change(self, *, engine: bool = True) -> Change:
        """Hold the write lock around a change; repair totals a dead writer left; bump the generation."""
        return Change(self.writer, engine)

    def _own(self, claim: Claim) -> None:
        """The slot still belongs to ``claim`` (one word compared), else Detached."""
        if self._slots[claim.index].identity.seq(self.seg.words) != claim.identity_seq:
            raise Detached(
                f"{self.where} slot {claim.index}: this instance no longer owns the slot (it was detached, or "
                "reclaimed because its owner lock was dropped). Attach again."
            )

    # --- liveness and reclaim --------------------------------------------------------------------

    def owner_alive(self, view: SlotView) -> bool:
        """Whether the slot's owner lives: it holds the slot lock, and (same pid namespace) its pid and start time match."""
        return self.owners.alive(view)

    def reclaim_dead(self) -> list[SlotView]:
        """Free every slot whose owner died (its reservations and admitted bytes return to the GPU)."""
        views, problems = self.slots()
        if not problems and self.writer.header_readable() and all(self.owner_alive(v) for v in views):
            return []  # the common case: nothing to do, and no lock taken
        with self.change():  # repairs the header's records on the way in
            return self._reclaim_locked()

    def _reclaim_locked(self) -> list[SlotView]:
        """Free the slots of dead owners, and damaged slots nobody holds (under the lock); the dead ones' views."""
        gone: list[SlotView] = []
        to_free = []
        for slot in self.records.slots:
            try:
                v = self.reader.slot(slot.index)
            except CorruptSegment:
                if not self.owners.held_anywhere(slot.index):
                    to_free.append(slot)  # damaged and ownerless: safe to wipe
                continue
            if v is not None and not self.owner_alive(v):
                to_free.append(slot)
                gone.append(v)
        if to_free:
            self.writer.free(to_free)
        return gone

    # --- claim and free --------------------------------------------------------------------------

    def claim(
        self,
        *,
        id: str,
        model: str,
        engine: str,
        engine_id: str | None,
        rank: int,
        guarantee: int,
        elastic: bool,
        other_ids: frozenset[str] = frozenset(),
    ) -> Claim:
        """Take a free slot for a new instance (reclaiming dead ones first); its limit is ``guarantee``."""
        text = {
            "id": codec.encode_text(id, L.ID_WIDTH, "instance id"),
            "model": codec.encode_text(model, L.MODEL_WIDTH, "model"),
            "engine": codec.encode_text(engine, L.ENGINE_WIDTH, "engine"),
            "engine_id": codec.encode_text(engine_id or "", L.ENGINE_ID_WIDTH, "engine_id"),
        }
        if not id:
            raise LedgerError("kvpolicy ledger: the instance id must not be empty")
        if guarantee < 0 or rank < 0:
            raise LedgerError(f"kvpolicy ledger: guarantee ({guarantee}) and rank ({rank}) must be ≥ 0")
        if id in other_ids:
            raise DuplicateInstance(f"kvpolicy ledger: an instance {id!r} is attached on another GPU of this ledger")
        me = self._me = self._me or this_process()
        with self.change():
            self._reclaim_locked()
            # A free slot may still be held for a moment by the process that just freed it (it drops
            # the owner lock after its change): try the next one rather than report the GPU full.
            free = next((i for i in self._free_slots_for(id) if self.owners.take(i)), None)
            if free is None:
                raise SlotsFull(
                    f"kvpolicy ledger: all {self.slot_count} slots of {self.gpu} belong to live instances "
                    f"({self.seg.path}); detach one, or recreate the ledger with more slots"
                )
            slot = self._slots[free]
            _, old = slot.identity.read(self.seg.mm, self.seg.words)
            epoch = next_epoch(old.epoch)
            identity = codec.identity(
                **text, rank=rank, elastic=elastic, epoch=epoch, pid=me.pid, start_time=me.start_time,
                pidns=me.pidns, uid=os.geteuid(), attached_at_ns=time.time_ns(),
            )
            return Claim(free, epoch, self.writer.claim(slot, identity, guarantee))

    def _free_slots_for(self, id: str) -> list[int]:
        """The free slots no open file of this process holds, in order; DuplicateInstance if ``id`` is attached here."""
        free = []
        for i in range(self.slot_count):
            try:
                v = self.reader.slot(i)
            except CorruptSegment:
                continue  # a damaged slot whose owner lives (reclaim wiped the others): not free
            if v is None:
                if not self.owners.holds(i):
                    free.append(i)
            elif v.id == id:
                raise DuplicateInstance(
                    f"kvpolicy ledger: instance {id!r} is already attached on {self.gpu} (slot {i}, pid {v.pid}, "
                    f"model {v.model!r}). Give each engine process its own id (e.g. model/rank)."
                )
        return free

    def free(self, claim: Claim) -> None:
        """Detach: the slot's reservations and elastic bytes return to the GPU."""
        with self.change():
            self._own(claim)
            self.writer.free([self._slots[claim.index]])
        self.owners.drop(claim.index)

    def set_elastic(self, claim: Claim) -> Claim:
        """Mark the instance as having an elastic pool (its guarantee starts counting in G)."""
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, ident = slot.identity.read(self.seg.mm, self.seg.words)
            if codec.is_elastic(ident):
                return claim
            return Claim(claim.index, claim.epoch, self.writer.mark_elastic(slot, ident))

    # --- static admission ------------------------------------------------------------------------

    def _resolve_figures(
        self, capacity: int | None, headroom: int | None, other_used: int | None
    ) -> tuple[GpuFigures, bool]:
        """The figures static admission uses: published ones, else provisional merged with the caller's."""
        f = self.figures()
        if f.source == "published":
            return f, False
        if capacity is None:
            if f.source == "provisional":
                return f, False
            raise LedgerError(
                f"kvpolicy ledger: no controller has published figures for {self.gpu}, and the caller gave no GPU "
                "capacity. Start `kvpolicy run`, or pass capacity= (e.g. cuMemGetInfo's total) and headroom= "
                "(the policy's headroom for this GPU)."
            )
        h, u = headroom or 0, other_used or 0
        for what, value in (("capacity", capacity), ("headroom", h), ("other_used", u)):
            check_bytes(f"the GPU's {what}", value)
        if f.source == "provisional":  # several engines' figures: keep the most cautious of each
            capacity, h, u = min(capacity, f.capacity), max(h, f.headroom), max(u, f.other_used)
        merged = GpuFigures("provisional", 0, capacity, h, u, None, 0.0, 0)
        return merged, merged != f

    def provide_figures(self, *, capacity: int, headroom: int | None = None, other_used: int | None = None) -> GpuFigures:
        """Offer an engine's own GPU figures; kept (most cautious wins) only while no controller has published."""
        with self.change():
            f, store = self._resolve_figures(capacity, headroom, other_used)
            if store:
                self.writer.figures(codec.provisional_figures(f))
            return f

    def admit_static(
        self,
        claim: Claim,
        nbytes: int,
        *,
        reserve: int | None = None,
        capacity: int | None = None,
        headroom: int | None = None,
        other_used: int | None = None,
    ) -> int:
        """Admit a runtime-owned reservation of ``nbytes`` (replacing the instance's current one), or AdmissionRefused."""
        if nbytes < 0:
            raise LedgerError(f"kvpolicy ledger: cannot admit a negative reservation ({nbytes} B)")
        refusal = refuse_reserve(nbytes, reserve)
        if refusal is not None:
            raise refusal.error(self.gpu)
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            f, store = self._resolve_figures(capacity, headroom, other_used)
            _, res = slot.reservation.read(self.seg.mm, self.seg.words)
            refusal = refuse_static(nbytes, f, self.totals(), own=codec.runtime_reserved(res, self.where))
            if refusal is not None:
                raise refusal.error(self.gpu)
            if store:
                self.writer.figures(codec.provisional_figures(f))
            self.writer.reserve(slot, codec.reservation(claim.epoch, nbytes, reserve, {}))
            return nbytes

    def withdraw_static(self, claim: Claim) -> None:
        """Give back the instance's static admission (its reported pools stay); never refused: it only lowers R."""
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, res = slot.reservation.read(self.seg.mm, self.seg.words)
            if res.static_admitted == 0:
                return
            pools = codec.decode_pools(res, self.where)
            self.writer.reserve(slot, codec.reservation(claim.epoch, 0, codec.decode_reserve(res), pools))

    def report_pools(self, claim: Claim, pools: Mapping[str, PoolFacts]) -> None:
        """The instance's real pools replace its admission (and any earlier report) in R."""
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, res = slot.reservation.read(self.seg.mm, self.seg.words)
            self.writer.reserve(slot, codec.reservation(claim.epoch, 0, codec.decode_reserve(res), pools))

    # --- elastic admission -----------------------------------------------------------------------

    def admit_elastic(self, claim: Claim, nbytes: int) -> Refusal | None:
        """Reserve ``nbytes`` for mapping against the instance's limit and the GPU's budget; None if admitted."""
        if nbytes < 0:
            raise LedgerError(f"kvpolicy ledger: cannot admit {nbytes} bytes")
        mm, words = self.seg.mm, self.seg.words
        slot = self._slots[claim.index]
        reader = self.reader
        with self.change():
            self._own(claim)
            _, ident = slot.identity.read(mm, words)
            _, pub = slot.published.read(mm, words)
            _, use = slot.usage.read(mm, words)
            own = Holding(pub.limit, use.mapped + use.pending, codec.counted_guarantee(ident, pub))
            refusal = refuse_elastic(nbytes, reader.figures(), reader.totals(), own)
            if refusal is None:
                self.writer.admit(slot, use, nbytes, own.guarantee)
            elif refusal.reason == "budget":
                self.writer.bump_pressure()  # the others' pools see it and give back what they hold unused
            return refusal

    def settle_elastic(self, claim: Claim, *, commit: int = 0, rollback: int = 0, release: int = 0) -> None:
        """Move admitted bytes to mapped (commit), give them back (rollback), or unmap mapped bytes (release)."""
        if min(commit, rollback, release) < 0:
            raise LedgerError(f"kvpolicy ledger: negative byte count (commit {commit}, rollback {rollback}, release {release})")
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, use = slot.usage.read(self.seg.mm, self.seg.words)
            if commit + rollback > use.pending:
                raise LedgerError(
                    f"kvpolicy ledger: {commit + rollback} bytes committed or rolled back, but only {use.pending} "
                    "are admitted and pending: every commit/rollback needs a matching admit"
                )
            if release > use.mapped + commit:
                raise LedgerError(
                    f"kvpolicy ledger: {release} bytes released, but only {use.mapped + commit} are mapped"
                )
            self.writer.settle(slot, use, commit=commit, rollback=rollback, release=release)

    def report_usage(self, claim: Claim, used: int, waiting: int = 0) -> None:
        """Bytes in live blocks, and bytes the pool was refused in its last period (stored in whole MiB, rounded up)."""
        check_bytes("used", used)
        check_bytes("waiting", waiting)
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, use = slot.usage.read(self.seg.mm, self.seg.words)
            self.writer.report_usage(slot, use, used, codec.encode_waiting(waiting))

    def acknowledge(self, claim: Claim, revision: int, status: str) -> None:
        """Record that the instance applied (or defers) ``revision``; a deferral keeps the time it began."""
        if status not in L.ACK_CODES:
            raise LedgerError(f"kvpolicy ledger: acknowledgement status {status!r} must be 'applied' or 'deferred'")
        slot = self._slots[claim.index]
        with self.change():
            self._own(claim)
            _, use = slot.usage.read(self.seg.mm, self.seg.words)
            now = time.time_ns()
            since = 0
            if status == "deferred":
                since = use.deferred_since_ns if use.ack_status == L.ACK_DEFERRED and use.deferred_since_ns else now
            self.writer.acknowledge(slot, use, revision, L.ACK_CODES[status], since, now)

    # --- the controller's side -------------------------------------------------------------------

    def publish(
        self,
        revision: int,
        gpu: GpuLimits | None,
        instances: Mapping[tuple[int, int], InstanceLimits],
        controller: ProcessIdentity | None = None,
    ) -> list[str]:
        """Publish revisioned limits: the GPU's figures and, per (slot, epoch), limit/target/guarantee.

        An entry whose slot changed hands since it was read is skipped (it is named in the result),
        so limits computed for a dead instance never reach its successor.
        """
        skipped: list[str] = []
        now = time.time_ns()
        ctl = controller or this_process()
        with self.change(engine=False):
            if gpu is not None:
                self.writer.figures(codec.published_figures(revision, gpu, now, ctl.pid, ctl.start_time))
            for (index, epoch), lim in instances.items():
                slot = self._slots[index]
                _, ident = slot.identity.read(self.seg.mm, self.seg.words)
                if ident.state != L.SLOT_ACTIVE or ident.epoch != epoch:
                    skipped.append(f"{self.gpu} slot {index} (epoch {epoch}) changed hands")
                    continue
                self.writer.limits(slot, ident, revision, lim, now)
        return skipped

