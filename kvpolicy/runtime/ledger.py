"""One GPU's ledger: slots, both kinds of admission, publishing, reclaim — over one segment.

``GpuLedger`` is the only code that reads or writes the records of a segment. Every
change happens under the segment's write lock; readers without the lock (the
controller, ``kvpolicy status``, an engine's hot path) use the records' sequence
words and never see half an update (``records``).

The header keeps running totals (Σ runtime reservations, Σ elastic mapped and
pending, Σ guarantees) so that an admission reads a handful of records instead of
every slot. A change that touches a slot record and the totals sets ``dirty`` to its
pid first and clears it last; whoever takes the lock next and finds ``dirty`` set
(its writer died in between) rebuilds the totals from the slots, which are always
complete thanks to the two-copy records.

Admission (docs/ledger.md, "Admission"):
- static: ``n ≤ C − H − U − (R − R_own) − G``, where R is the runtime reservations
  of the GPU (admissions not yet replaced by reports, plus reported runtime-owned
  pool bytes) and G the guarantees of its elastic instances;
- elastic: ``mapped + pending + n ≤ limit`` for the instance, and
  ``Σ (mapped + pending) + n ≤ B`` for the GPU, with
  ``B = min(A_published, C − H − U − R)`` once a controller published, ``C − H − U − R``
  from engines' provisional figures before that, and 0 with no figures at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpolicy.facts import ElasticFacts, InstanceFacts, PoolFacts
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import (
    AdmissionRefused,
    CorruptSegment,
    Detached,
    DuplicateInstance,
    LedgerError,
    SlotsFull,
)
from kvpolicy.runtime.liveness import (
    ProcessIdentity,
    is_alive,
    pid_namespace,
    this_process,
)
from kvpolicy.runtime.records import Record
from kvpolicy.runtime.segment import Access, Segment, pack_header
from kvpolicy.units import format_bytes

ADMITTED_POOL = "admitted"
"""The pool name under which facts show a static admission not yet replaced by a pool report."""

SLOT_READ_RETRIES = 1000


# --- what readers get -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFigures:
    """The GPU's C, H, U (and A once published), and where they come from."""

    source: str
    """``none``, ``provisional`` (engines' own figures before any controller) or ``published``."""
    revision: int
    capacity: int
    headroom: int
    other_used: int
    elastic_budget: int | None
    published_at: float
    controller_pid: int

    @property
    def known(self) -> bool:
        return self.source != "none"


@dataclass(frozen=True)
class Totals:
    runtime_reserved: int
    elastic_mapped: int
    elastic_pending: int
    guarantees: int
    active: int
    unmet_guarantees: int = 0
    """Σ max(0, g_i − held_i): guaranteed memory not yet held, kept free for its owners."""

    @property
    def elastic_committed(self) -> int:
        """Σ mapped + pending: what elastic admission has let through and not yet seen released."""
        return self.elastic_mapped + self.elastic_pending


@dataclass(frozen=True)
class SlotView:
    """One attached instance as read from its slot, consistent across its records."""

    index: int
    epoch: int
    gpu: str
    id: str
    model: str
    engine: str
    engine_id: str | None
    rank: int
    pid: int
    start_time: int
    pidns: int
    uid: int
    attached_at: float
    elastic: bool
    revision: int
    limit: int
    target: int
    guarantee: int
    published_at: float
    used: int
    mapped: int
    pending: int
    ack_revision: int
    ack: str | None
    deferred_since: float | None
    static_admitted: int
    reserve: int | None
    pools: dict[str, PoolFacts]
    last_activity: float

    @property
    def runtime_reserved(self) -> int:
        """R_i: the admission not yet replaced by a report, plus reported runtime-owned pool bytes."""
        return self.static_admitted + sum(p.bytes for p in self.pools.values() if p.owner == "runtime")

    def idle_seconds(self, now: float) -> float:
        return max(0.0, now - self.last_activity)

    def stuck(self, now: float, after: float) -> bool:
        """A deferral older than ``after`` seconds."""
        return self.ack == "deferred" and self.deferred_since is not None and now - self.deferred_since > after

    def facts(self, now: float) -> InstanceFacts:
        """The instance as ``kvpolicy.evaluate`` sees it."""
        pools = dict(self.pools)
        if self.static_admitted:
            pools[ADMITTED_POOL] = PoolFacts(owner="runtime", bytes=self.static_admitted)
        return InstanceFacts(
            id=self.id,
            model=self.model,
            engine=self.engine,
            engine_id=self.engine_id,
            gpu=self.gpu,
            rank=self.rank,
            pid=self.pid,
            pools=pools,
            elastic=ElasticFacts(used=self.used, mapped=self.mapped) if self.elastic else None,
            idle_seconds=self.idle_seconds(now),
        )


@dataclass(frozen=True)
class Refusal:
    """Why an elastic admission said no, with the figures."""

    nbytes: int
    reason: str
    """``limit`` (the instance's limit) or ``budget`` (the GPU's elastic budget)."""
    limit: int
    instance_committed: int
    budget: int
    gpu_committed: int
    figures: str

    def __str__(self) -> str:
        if self.reason == "limit":
            return (
                f"{format_bytes(self.nbytes)} more would take the instance to "
                f"{format_bytes(self.instance_committed + self.nbytes)}, above its limit {format_bytes(self.limit)}"
            )
        return (
            f"{format_bytes(self.nbytes)} more would take the GPU's elastic pools to "
            f"{format_bytes(self.gpu_committed + self.nbytes)}, above its elastic budget "
            f"{format_bytes(self.budget)} ({self.figures})"
        )


@dataclass(frozen=True)
class GpuLimits:
    """What the controller publishes for a GPU."""

    capacity: int
    headroom: int
    other_used: int
    elastic_budget: int


@dataclass(frozen=True)
class InstanceLimits:
    """What the controller publishes for an instance."""

    limit: int
    target: int
    guarantee: int


@dataclass(frozen=True)
class Claim:
    index: int
    epoch: int
    identity_seq: int


@dataclass
class SlotProblems:
    """Slots that could not be read as a consistent, valid instance (reported, never trusted)."""

    problems: list[str] = field(default_factory=list)


# --- the ledger -----------------------------------------------------------------------------------


def _text(raw: bytes, what: str, where: str) -> str:
    body = raw.rstrip(b"\0")
    if b"\0" in body:
        raise CorruptSegment(f"{where}: {what} holds a NUL byte inside")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptSegment(f"{where}: {what} is not valid UTF-8") from None


def encode_text(value: str, width: int, what: str) -> bytes:
    """``value`` as a fixed-width field, or a LedgerError naming the limit."""
    if not isinstance(value, str):
        raise LedgerError(f"kvpolicy ledger: {what} must be a string, not {type(value).__name__}")
    raw = value.encode("utf-8")
    if len(raw) > width:
        raise LedgerError(
            f"kvpolicy ledger: {what} {value!r} is {len(raw)} bytes of UTF-8; at most {width} fit in the ledger"
        )
    if b"\0" in raw:
        raise LedgerError(f"kvpolicy ledger: {what} {value!r} holds a NUL character")
    return raw


def elastic_budget(f: GpuFigures, t: Totals) -> int:
    """B, the GPU's elastic budget now (docs/ledger.md, "Admission")."""
    if f.source == "none":
        return 0
    live = max(0, f.capacity - f.headroom - f.other_used - t.runtime_reserved)
    if f.source == "provisional":
        return live
    assert f.elastic_budget is not None, "published figures without an elastic budget"
    return min(f.elastic_budget, live)


def explain_budget(f: GpuFigures, t: Totals) -> str:
    """How B was found, in words (for refusals and status)."""
    if f.source == "none":
        return "no GPU figures yet: no controller published and no engine gave its capacity"
    live = max(0, f.capacity - f.headroom - f.other_used - t.runtime_reserved)
    if f.source == "provisional":
        return f"provisional: C − H − U − R = {format_bytes(live)}"
    return f"published A {format_bytes(f.elastic_budget or 0)}, C − H − U − R now {format_bytes(live)}"


def _unmet(guarantee: int, held: int) -> int:
    """The part of a guarantee its instance does not hold yet."""
    return guarantee - held if guarantee > held else 0


def _ns(seconds_ns: int) -> float:
    return seconds_ns / 1e9


def initialise_segment(seg: Segment) -> None:
    """Write a fresh segment: header, GPU figures unknown, zero totals, every slot free."""
    header = pack_header(seg.gpu, seg.slot_count)
    seg.mm[: len(header)] = header
    led = GpuLedger(seg)
    led._gpu.initialise(seg.mm, seg.words, led._gpu.zero())
    led._totals.initialise(seg.mm, seg.words, led._totals.zero())
    for slot in led._slots:
        for rec in slot:
            rec.initialise(seg.mm, seg.words, rec.zero())


class _Change:
    """The write lock around one change (a class, not a generator: it is on the admission path)."""

    __slots__ = ("engine", "led")

    def __init__(self, led: GpuLedger, engine: bool) -> None:
        self.led = led
        self.engine = engine

    def __enter__(self) -> None:
        led = self.led
        led.seg.lock()
        try:
            words = led.seg.words
            if words[_DIRTY]:
                led._rebuild_totals()
            words[_DIRTY] = led.seg.opened_by if led.seg.fd is not None else os.getpid()
        except BaseException:
            led.seg.unlock()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        led = self.led
        words = led.seg.words
        try:
            if exc_type is not None and not issubclass(exc_type, LedgerError):
                led._rebuild_totals()  # a change that stopped half-way may have moved the totals
            if self.engine:
                words[_GENERATION] += 1
            words[_DIRTY] = 0
        finally:
            led.seg.unlock()


_DIRTY = L.OFF_DIRTY // 8
_SOURCES = {L.FIGURES_NONE: "none", L.FIGURES_PROVISIONAL: "provisional", L.FIGURES_PUBLISHED: "published"}
_GENERATION = L.OFF_GENERATION // 8
_PRESSURE = L.OFF_PRESSURE // 8


class GpuLedger:
    """The records of one GPU's segment and every operation on them."""

    def __init__(self, segment: Segment) -> None:
        self.seg = segment
        self.gpu = segment.gpu
        where = f"kvpolicy ledger: {segment.path}"
        self.where = where
        self._gpu = Record(L.GPU_RECORD, L.OFF_GPU_RECORD, where)
        self._totals = Record(L.TOTALS_RECORD, L.OFF_TOTALS_RECORD, where)
        self._slots: list[tuple[Record, Record, Record, Record]] = []
        for i in range(segment.slot_count):
            base = L.slot_offset(i)
            w = f"{where} slot {i}"
            self._slots.append(
                (
                    Record(L.IDENTITY_RECORD, base + L.SLOT_OFF_IDENTITY, w),
                    Record(L.PUBLISHED_RECORD, base + L.SLOT_OFF_PUBLISHED, w),
                    Record(L.USAGE_RECORD, base + L.SLOT_OFF_USAGE, w),
                    Record(L.RESERVATION_RECORD, base + L.SLOT_OFF_RESERVATION, w),
                )
            )
        self._activity = [(L.slot_offset(i) + L.SLOT_OFF_ACTIVITY) // 8 for i in range(segment.slot_count)]
        self._held: set[int] = set()  # slots whose owner lock this descriptor holds
        self._me: ProcessIdentity | None = None
        self._proc_readable = os.path.exists("/proc/self/stat")

    @classmethod
    def open(
        cls,
        directory: Path,
        gpu: str,
        access: Access | None = None,
        *,
        create: bool = True,
        slot_count: int = L.DEFAULT_SLOTS,
    ) -> GpuLedger:
        """Open (or create) the GPU's segment under ``directory``, checked before use."""
        return cls(Segment.open(Path(directory), gpu, access or Access(), create=create, slot_count=slot_count))

    def close(self) -> None:
        self.seg.close()

    @property
    def slot_count(self) -> int:
        return self.seg.slot_count

    # --- single words ----------------------------------------------------------------------------

    def generation(self) -> int:
        """Changes whenever an engine changes anything in this segment (one 8-byte read)."""
        return self.seg.words[L.OFF_GENERATION // 8]

    def heartbeat(self) -> float | None:
        """Wall-clock time of the controller's last heartbeat, or None if none ever beat."""
        ns = self.seg.words[L.OFF_HEARTBEAT // 8]
        return _ns(ns) if ns else None

    def pressure(self) -> int:
        """How many elastic admissions the GPU's budget has refused so far (one 8-byte read).

        When it moves, some instance wants memory that others hold: pools give back the
        free memory they hold beyond what they use (``kvpolicy.alloc``, "Pressure").
        """
        return self.seg.words[_PRESSURE]

    def beat(self, now: float | None = None) -> None:
        """The controller is alive (a single store; no lock)."""
        self.seg.words[L.OFF_HEARTBEAT // 8] = int((time.time() if now is None else now) * 1e9)

    def touch(self, index: int, now_ns: int | None = None) -> None:
        """Record activity of the instance in slot ``index`` (a single store; no lock)."""
        self.seg.words[self._activity[index]] = time.time_ns() if now_ns is None else now_ns

    # --- lock-free reads -------------------------------------------------------------------------

    def figures(self) -> GpuFigures:
        _, g = self._gpu.read(self.seg.mm, self.seg.words)
        return self._figures(g)

    def _figures(self, g: Any) -> GpuFigures:
        source = _SOURCES
        if g.source not in source:
            raise CorruptSegment(f"{self.where}: the GPU record has an unknown source {g.source}")
        return GpuFigures(
            source=source[g.source],
            revision=g.revision,
            capacity=g.capacity,
            headroom=g.headroom,
            other_used=g.other_used,
            elastic_budget=None if g.elastic_budget == L.NONE_U64 or g.source != L.FIGURES_PUBLISHED else g.elastic_budget,
            published_at=_ns(g.published_at_ns),
            controller_pid=g.controller_pid,
        )

    def totals(self) -> Totals:
        _, t = self._totals.read(self.seg.mm, self.seg.words)
        return Totals(t.runtime_reserved, t.elastic_mapped, t.elastic_pending, t.guarantees, t.active, t.unmet_guarantees)

    def slot(self, index: int) -> SlotView | None:
        """The instance in slot ``index`` (None if free), read consistently; CorruptSegment if invalid."""
        mm, words = self.seg.mm, self.seg.words
        ident_rec, pub_rec, use_rec, res_rec = self._slots[index]
        for _ in range(SLOT_READ_RETRIES):
            s1, ident = ident_rec.read(mm, words)
            if ident.state == L.SLOT_FREE:
                return None
            _, pub = pub_rec.read(mm, words)
            _, use = use_rec.read(mm, words)
            _, res = res_rec.read(mm, words)
            activity = words[self._activity[index]]
            if ident_rec.seq(words) != s1:
                continue  # the slot was claimed, freed or changed meanwhile
            if not pub.epoch == use.epoch == res.epoch == ident.epoch:
                continue  # a claim is in progress; its identity is not visible yet
            return self._view(index, ident, pub, use, res, activity)
        raise CorruptSegment(f"{self.where} slot {index}: no consistent read in {SLOT_READ_RETRIES} tries")

    def slots(self) -> tuple[list[SlotView], list[str]]:
        """Every attached instance, and a message per slot that failed its checks."""
        views: list[SlotView] = []
        problems: list[str] = []
        for i in range(self.slot_count):
            try:
                v = self.slot(i)
            except CorruptSegment as exc:
                problems.append(str(exc))
                continue
            if v is not None:
                views.append(v)
        return views, problems

    def _view(self, index: int, ident: Any, pub: Any, use: Any, res: Any, activity: int) -> SlotView:
        where = f"{self.where} slot {index}"
        if ident.state != L.SLOT_ACTIVE:
            raise CorruptSegment(f"{where}: unknown slot state {ident.state}")
        if use.ack_status not in L.ACK_NAMES:
            raise CorruptSegment(f"{where}: unknown acknowledgement status {use.ack_status}")
        pools = self._decode_pools(res, where)
        engine_id = _text(ident.engine_id, "engine_id", where)
        return SlotView(
            index=index,
            epoch=ident.epoch,
            gpu=self.gpu,
            id=_text(ident.id, "id", where),
            model=_text(ident.model, "model", where),
            engine=_text(ident.engine, "engine", where),
            engine_id=engine_id or None,
            rank=ident.rank,
            pid=ident.pid,
            start_time=ident.start_time,
            pidns=ident.pidns,
            uid=ident.uid,
            attached_at=_ns(ident.attached_at_ns),
            elastic=bool(ident.flags & L.FLAG_ELASTIC),
            revision=pub.revision,
            limit=pub.limit,
            target=pub.target,
            guarantee=pub.guarantee,
            published_at=_ns(pub.published_at_ns),
            used=use.used,
            mapped=use.mapped,
            pending=use.pending,
            ack_revision=use.ack_revision,
            ack=L.ACK_NAMES[use.ack_status],
            deferred_since=_ns(use.deferred_since_ns) if use.deferred_since_ns else None,
            static_admitted=res.static_admitted,
            reserve=None if res.reserve == L.NONE_U64 else res.reserve,
            pools=pools,
            last_activity=_ns(activity),
        )

    # --- pools in the reservation record ---------------------------------------------------------

    @staticmethod
    def _decode_pools(res: Any, where: str) -> dict[str, PoolFacts]:
        if res.pool_count > L.MAX_POOLS or res.part_count > L.MAX_PARTS:
            raise CorruptSegment(f"{where}: {res.pool_count} pools / {res.part_count} parts exceed the layout")
        names: list[str] = []
        fields: list[dict[str, Any]] = []
        for i in range(res.pool_count):
            name = _text(getattr(res, f"pool{i}_name"), f"pool {i} name", where)
            owner = getattr(res, f"pool{i}_owner")
            if not name or owner not in L.OWNER_NAMES:
                raise CorruptSegment(f"{where}: pool {i} has an empty name or unknown owner {owner}")
            tb = getattr(res, f"pool{i}_tensor_bytes")
            names.append(name)
            fields.append(
                {
                    "owner": L.OWNER_NAMES[owner],
                    "bytes": getattr(res, f"pool{i}_bytes"),
                    "tensor_bytes": None if tb == L.NONE_U64 else tb,
                    "parts": {},
                }
            )
        for j in range(res.part_count):
            p = getattr(res, f"part{j}_pool")
            if p >= res.pool_count:
                raise CorruptSegment(f"{where}: part {j} belongs to pool {p}, beyond the {res.pool_count} pools")
            fields[p]["parts"][_text(getattr(res, f"part{j}_name"), f"part {j} name", where)] = getattr(
                res, f"part{j}_bytes"
            )
        return {n: PoolFacts(**f) for n, f in zip(names, fields)}

    def _encode_reservation(
        self, epoch: int, static_admitted: int, reserve: int | None, pools: Mapping[str, PoolFacts]
    ) -> Any:
        if len(pools) > L.MAX_POOLS:
            raise LedgerError(
                f"kvpolicy ledger: {len(pools)} pools reported ({', '.join(pools)}); a slot holds at most "
                f"{L.MAX_POOLS}. Merge the smallest ones into `other`."
            )
        values: dict[str, Any] = {
            "epoch": epoch,
            "static_admitted": static_admitted,
            "reserve": L.NONE_U64 if reserve is None else reserve,
            "pool_count": len(pools),
        }
        parts: list[tuple[int, bytes, int]] = []
        for i in range(L.MAX_POOLS):
            values.update({f"pool{i}_name": b"", f"pool{i}_owner": 0, f"pool{i}_bytes": 0, f"pool{i}_tensor_bytes": 0})
        for i, (name, p) in enumerate(pools.items()):
            if not isinstance(p, PoolFacts):
                p = PoolFacts.model_validate(p)
            if not name:
                raise LedgerError("kvpolicy ledger: a pool name must not be empty")
            values[f"pool{i}_name"] = encode_text(name, L.POOL_NAME_WIDTH, "pool name")
            values[f"pool{i}_owner"] = L.OWNER_CODES[p.owner]
            values[f"pool{i}_bytes"] = p.bytes
            values[f"pool{i}_tensor_bytes"] = L.NONE_U64 if p.tensor_bytes is None else p.tensor_bytes
            for part, nbytes in p.parts.items():
                parts.append((i, encode_text(part, L.PART_NAME_WIDTH, f"part name of pool {name!r}"), nbytes))
        if len(parts) > L.MAX_PARTS:
            raise LedgerError(
                f"kvpolicy ledger: {len(parts)} pool parts reported; a slot holds at most {L.MAX_PARTS} over all pools"
            )
        values["part_count"] = len(parts)
        for j in range(L.MAX_PARTS):
            pool, name, nbytes = parts[j] if j < len(parts) else (0, b"", 0)
            values.update({f"part{j}_pool": pool, f"part{j}_name": name, f"part{j}_bytes": nbytes})
        return self._slots[0][3].make(**values)

    # --- locked changes --------------------------------------------------------------------------

    def _change(self, *, engine: bool = True) -> _Change:
        """Hold the write lock around a change; repair totals a dead writer left; bump the generation."""
        return _Change(self, engine)

    def _rebuild_totals(self) -> Totals:
        """Σ over the slots, written as the totals record (under the lock)."""
        runtime = mapped = pending = guarantees = active = unmet = 0
        for i in range(self.slot_count):
            v = self.slot(i)
            if v is None:
                continue
            active += 1
            runtime += v.runtime_reserved
            mapped += v.mapped
            pending += v.pending
            if v.elastic:
                guarantees += v.guarantee
                unmet += _unmet(v.guarantee, v.mapped + v.pending)
        t = Totals(runtime, mapped, pending, guarantees, active, unmet)
        self._write_totals(t)
        return t

    def _write_totals(self, t: Totals) -> None:
        self._totals.write(
            self.seg.mm,
            self.seg.words,
            (t.runtime_reserved, t.elastic_mapped, t.elastic_pending, t.guarantees, t.active, t.unmet_guarantees),
        )

    def _adjust_totals(
        self,
        runtime_reserved: int = 0,
        elastic_mapped: int = 0,
        elastic_pending: int = 0,
        guarantees: int = 0,
        active: int = 0,
        unmet_guarantees: int = 0,
    ) -> None:
        _, t = self._totals.read(self.seg.mm, self.seg.words)
        values = (
            t.runtime_reserved + runtime_reserved,
            t.elastic_mapped + elastic_mapped,
            t.elastic_pending + elastic_pending,
            t.guarantees + guarantees,
            t.active + active,
            t.unmet_guarantees + unmet_guarantees,
        )
        assert min(values) >= 0, f"totals went negative: {values} (ledger bug)"
        self._totals.write(self.seg.mm, self.seg.words, values)

    def _own(self, claim: Claim) -> None:
        """The slot still belongs to ``claim`` (one word compared), else Detached."""
        if self._slots[claim.index][0].seq(self.seg.words) != claim.identity_seq:
            raise Detached(
                f"{self.where} slot {claim.index}: this instance no longer owns the slot (it was detached, or "
                "reclaimed because its owner lock was dropped). Attach again."
            )

    # --- liveness and reclaim --------------------------------------------------------------------

    def owner_alive(self, view: SlotView) -> bool:
        """Whether the slot's owner lives: it holds the slot lock, and (same pid namespace) its pid and start time match."""
        if view.index in self._held:
            return True
        if not self.seg.slot_held_elsewhere(view.index):
            return False
        if self._proc_readable and view.pidns and view.pidns == pid_namespace():
            return is_alive(view.pid, view.start_time)
        return True

    def reclaim_dead(self) -> list[SlotView]:
        """Free every slot whose owner died (its reservations and admitted bytes return to the GPU)."""
        views, problems = self.slots()
        if not problems and all(self.owner_alive(v) for v in views):
            return []  # the common case: nothing to do, and no lock taken
        with self._change():
            return self._reclaim_locked()

    def _reclaim_locked(self) -> list[SlotView]:
        gone: list[SlotView] = []
        wiped = False
        for i in range(self.slot_count):
            try:
                v = self.slot(i)
            except CorruptSegment:
                if i not in self._held and not self.seg.slot_held_elsewhere(i):
                    self._free_slot(i)  # damaged and ownerless: safe to wipe
                    wiped = True
                continue
            if v is not None and not self.owner_alive(v):
                self._free_slot(i)
                gone.append(v)
        if gone or wiped:
            self._rebuild_totals()
        return gone

    def _free_slot(self, index: int) -> None:
        """Reset the slot's records and mark it free (epoch + 1); the caller fixes the totals."""
        mm, words = self.seg.mm, self.seg.words
        ident_rec, pub_rec, use_rec, res_rec = self._slots[index]
        try:
            _, ident = ident_rec.read(mm, words)
            epoch = ident.epoch + 1
        except CorruptSegment:
            epoch = (ident_rec.seq(words) << 20) + 1  # unknown epoch: any value unlike the old ones
        for rec in (pub_rec, use_rec, res_rec):
            rec.write(mm, words, rec.zero()._replace(epoch=epoch))
        ident_rec.write(mm, words, ident_rec.zero()._replace(epoch=epoch))

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
        raw = {
            "id": encode_text(id, L.ID_WIDTH, "instance id"),
            "model": encode_text(model, L.MODEL_WIDTH, "model"),
            "engine": encode_text(engine, L.ENGINE_WIDTH, "engine"),
            "engine_id": encode_text(engine_id or "", L.ENGINE_ID_WIDTH, "engine_id"),
        }
        if not id:
            raise LedgerError("kvpolicy ledger: the instance id must not be empty")
        if guarantee < 0 or rank < 0:
            raise LedgerError(f"kvpolicy ledger: guarantee ({guarantee}) and rank ({rank}) must be ≥ 0")
        if id in other_ids:
            raise DuplicateInstance(f"kvpolicy ledger: an instance {id!r} is attached on another GPU of this ledger")
        me = self._me = self._me or this_process()
        mm, words = self.seg.mm, self.seg.words
        with self._change():
            self._reclaim_locked()
            free = None
            for i in range(self.slot_count):
                v = self.slot(i)
                if v is None:
                    if free is None and i not in self._held:
                        free = i
                elif v.id == id:
                    raise DuplicateInstance(
                        f"kvpolicy ledger: instance {id!r} is already attached on {self.gpu} (slot {i}, pid {v.pid}, "
                        f"model {v.model!r}). Give each engine process its own id (e.g. model/rank)."
                    )
            if free is None or not self.seg.try_hold_slot(free):
                raise SlotsFull(
                    f"kvpolicy ledger: all {self.slot_count} slots of {self.gpu} belong to live instances "
                    f"({self.seg.path}); detach one, or recreate the ledger with more slots"
                )
            self._held.add(free)
            ident_rec, pub_rec, use_rec, res_rec = self._slots[free]
            _, old = ident_rec.read(mm, words)
            epoch = old.epoch + 1
            now = time.time_ns()
            pub_rec.write(mm, words, pub_rec.make(epoch=epoch, revision=0, limit=guarantee, target=guarantee,
                                                    guarantee=guarantee, published_at_ns=0))
            use_rec.write(mm, words, use_rec.zero()._replace(epoch=epoch, updated_at_ns=now))
            res_rec.write(mm, words, self._encode_reservation(epoch, 0, None, {}))
            words[self._activity[free]] = now
            seq = ident_rec.write(
                mm,
                words,
                ident_rec.make(
                    state=L.SLOT_ACTIVE,
                    flags=L.FLAG_ELASTIC if elastic else 0,
                    epoch=epoch,
                    pid=me.pid,
                    start_time=me.start_time,
                    pidns=me.pidns,
                    uid=os.geteuid(),
                    rank=rank,
                    attached_at_ns=now,
                    **raw,
                ),
            )
            self._adjust_totals(
                active=1, guarantees=guarantee if elastic else 0, unmet_guarantees=guarantee if elastic else 0
            )
            return Claim(free, epoch, seq)

    def free(self, claim: Claim) -> None:
        """Detach: the slot's reservations and elastic bytes return to the GPU."""
        with self._change():
            self._own(claim)
            self._free_slot(claim.index)
            self._rebuild_totals()
        self._held.discard(claim.index)
        self.seg.drop_slot(claim.index)

    def set_elastic(self, claim: Claim) -> Claim:
        """Mark the instance as having an elastic pool (its guarantee starts counting in G)."""
        mm, words = self.seg.mm, self.seg.words
        ident_rec, pub_rec = self._slots[claim.index][:2]
        with self._change():
            self._own(claim)
            _, ident = ident_rec.read(mm, words)
            if ident.flags & L.FLAG_ELASTIC:
                return claim
            seq = ident_rec.write(mm, words, ident._replace(flags=ident.flags | L.FLAG_ELASTIC))
            _, pub = pub_rec.read(mm, words)
            _, use = self._slots[claim.index][2].read(mm, words)
            self._adjust_totals(guarantees=pub.guarantee, unmet_guarantees=_unmet(pub.guarantee, use.mapped + use.pending))
            return Claim(claim.index, claim.epoch, seq)

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
        if min(capacity, h, u) < 0:
            raise LedgerError(f"kvpolicy ledger: capacity {capacity}, headroom {h}, other_used {u} must be ≥ 0")
        if f.source == "provisional":  # several engines' figures: keep the most cautious of each
            capacity, h, u = min(capacity, f.capacity), max(h, f.headroom), max(u, f.other_used)
        merged = GpuFigures("provisional", 0, capacity, h, u, None, 0.0, 0)
        return merged, merged != f

    def provide_figures(self, *, capacity: int, headroom: int | None = None, other_used: int | None = None) -> GpuFigures:
        """Offer an engine's own GPU figures; kept (most cautious wins) only while no controller has published."""
        with self._change():
            f, store = self._resolve_figures(capacity, headroom, other_used)
            if store:
                self._store_provisional(f)
            return f

    def _store_provisional(self, f: GpuFigures) -> None:
        self._gpu.write(self.seg.mm, self.seg.words, self._gpu.make(
            source=L.FIGURES_PROVISIONAL, revision=0, capacity=f.capacity, headroom=f.headroom,
            other_used=f.other_used, elastic_budget=L.NONE_U64, published_at_ns=0,
            controller_pid=0, controller_start=0))

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
        if reserve is not None and nbytes > reserve:
            raise AdmissionRefused(
                f"kvpolicy ledger: {format_bytes(nbytes)} ({nbytes} B) asked for on {self.gpu} is more than the "
                f"model's reserve {format_bytes(reserve)} ({reserve} B)",
                {"asked": nbytes, "reserve": reserve},
            )
        mm, words = self.seg.mm, self.seg.words
        res_rec = self._slots[claim.index][3]
        with self._change():
            self._own(claim)
            f, store = self._resolve_figures(capacity, headroom, other_used)
            _, res = res_rec.read(mm, words)
            own = res.static_admitted + sum(
                p.bytes for p in self._decode_pools(res, self.where).values() if p.owner == "runtime"
            )
            t = self.totals()
            others = t.runtime_reserved - own
            unreserved = f.capacity - f.headroom - f.other_used - others - t.guarantees
            figures = {
                "asked": nbytes,
                "capacity": f.capacity,
                "headroom": f.headroom,
                "other_used": f.other_used,
                "reserved_by_others": others,
                "guarantees": t.guarantees,
                "unreserved": unreserved,
                "elastic_mapped": t.elastic_mapped,
            }
            if nbytes > unreserved:
                raise AdmissionRefused(
                    f"kvpolicy ledger: cannot admit {format_bytes(nbytes)} ({nbytes} B) of runtime-owned KV memory on "
                    f"{self.gpu}: unreserved = C − H − U − R − G = {format_bytes(f.capacity)} − "
                    f"{format_bytes(f.headroom)} − {format_bytes(f.other_used)} − {format_bytes(others)} − "
                    f"{format_bytes(t.guarantees)} = {format_bytes(unreserved)} ({unreserved} B) "
                    f"[capacity, headroom, other use from {f.source} figures; R reserved by other instances; "
                    f"G guarantees of elastic instances]. Lower the model's reserve, or free memory on {self.gpu}.",
                    figures,
                )
            if store:
                self._store_provisional(f)
            res_rec.write(mm, words, self._encode_reservation(claim.epoch, nbytes, reserve, {}))
            self._adjust_totals(runtime_reserved=nbytes - own)
            return nbytes

    def report_pools(self, claim: Claim, pools: Mapping[str, PoolFacts]) -> None:
        """The instance's real pools replace its admission (and any earlier report) in R."""
        mm, words = self.seg.mm, self.seg.words
        res_rec = self._slots[claim.index][3]
        with self._change():
            self._own(claim)
            _, res = res_rec.read(mm, words)
            old = res.static_admitted + sum(
                p.bytes for p in self._decode_pools(res, self.where).values() if p.owner == "runtime"
            )
            rec = self._encode_reservation(claim.epoch, 0, None if res.reserve == L.NONE_U64 else res.reserve, pools)
            new = sum(p.bytes for p in self._decode_pools(rec, self.where).values() if p.owner == "runtime")
            res_rec.write(mm, words, rec)
            self._adjust_totals(runtime_reserved=new - old)

    # --- elastic admission -----------------------------------------------------------------------

    def admit_elastic(self, claim: Claim, nbytes: int) -> Refusal | None:
        """Reserve ``nbytes`` for mapping against the instance's limit and the GPU's budget; None if admitted."""
        if nbytes < 0:
            raise LedgerError(f"kvpolicy ledger: cannot admit {nbytes} bytes")
        mm, words = self.seg.mm, self.seg.words
        ident_rec, pub_rec, use_rec, _ = self._slots[claim.index]
        with self._change():
            self._own(claim)
            _, pub = pub_rec.read(mm, words)
            _, use = use_rec.read(mm, words)
            mine = use.mapped + use.pending
            if mine + nbytes > pub.limit:
                return Refusal(nbytes, "limit", pub.limit, mine, 0, 0, "")
            guarantee = self._counted_guarantee(ident_rec, pub)
            t = self.totals()
            f = self.figures()
            budget = elastic_budget(f, t)
            # What others are guaranteed but do not hold yet stays theirs: two instances growing
            # at once cannot take a third one's guarantee between them.
            unmet_before = _unmet(guarantee, mine)
            others_unmet = t.unmet_guarantees - unmet_before
            if t.elastic_committed + nbytes + others_unmet > budget:
                why = explain_budget(f, t)
                if others_unmet:
                    why += f"; {format_bytes(others_unmet)} of it is guaranteed to other instances and not yet theirs"
                words[_PRESSURE] += 1  # the others' pools see it and give back what they hold unused
                return Refusal(nbytes, "budget", pub.limit, mine, budget, t.elastic_committed + others_unmet, why)
            use_rec.write(mm, words, use._replace(pending=use.pending + nbytes, updated_at_ns=time.time_ns()))
            self._adjust_totals(elastic_pending=nbytes, unmet_guarantees=_unmet(guarantee, mine + nbytes) - unmet_before)
            return None

    def settle_elastic(self, claim: Claim, *, commit: int = 0, rollback: int = 0, release: int = 0) -> None:
        """Move admitted bytes to mapped (commit), give them back (rollback), or unmap mapped bytes (release)."""
        if min(commit, rollback, release) < 0:
            raise LedgerError(f"kvpolicy ledger: negative byte count (commit {commit}, rollback {rollback}, release {release})")
        mm, words = self.seg.mm, self.seg.words
        ident_rec, pub_rec, use_rec, _ = self._slots[claim.index]
        with self._change():
            self._own(claim)
            _, use = use_rec.read(mm, words)
            if commit + rollback > use.pending:
                raise LedgerError(
                    f"kvpolicy ledger: {commit + rollback} bytes committed or rolled back, but only {use.pending} "
                    "are admitted and pending: every commit/rollback needs a matching admit"
                )
            if release > use.mapped + commit:
                raise LedgerError(
                    f"kvpolicy ledger: {release} bytes released, but only {use.mapped + commit} are mapped"
                )
            use_rec.write(
                mm,
                words,
                use._replace(
                    pending=use.pending - commit - rollback,
                    mapped=use.mapped + commit - release,
                    updated_at_ns=time.time_ns(),
                ),
            )
            unmet = 0
            if rollback or release:  # a commit moves pending to mapped: what the instance holds stays
                held = use.mapped + use.pending
                g = self._counted_guarantee(ident_rec, pub_rec.read(mm, words)[1])
                unmet = _unmet(g, held - rollback - release) - _unmet(g, held)
            self._adjust_totals(
                elastic_pending=-commit - rollback, elastic_mapped=commit - release, unmet_guarantees=unmet
            )

    def _counted_guarantee(self, ident_rec, pub) -> int:
        """The guarantee in published record ``pub`` as the totals count it: only elastic instances have one."""
        _, ident = ident_rec.read(self.seg.mm, self.seg.words)
        return pub.guarantee if ident.flags & L.FLAG_ELASTIC else 0

    def report_usage(self, claim: Claim, used: int) -> None:
        mm, words = self.seg.mm, self.seg.words
        use_rec = self._slots[claim.index][2]
        with self._change():
            self._own(claim)
            _, use = use_rec.read(mm, words)
            use_rec.write(mm, words, use._replace(used=used, updated_at_ns=time.time_ns()))

    def acknowledge(self, claim: Claim, revision: int, status: str) -> None:
        """Record that the instance applied (or defers) ``revision``; a deferral keeps the time it began."""
        if status not in L.ACK_CODES:
            raise LedgerError(f"kvpolicy ledger: acknowledgement status {status!r} must be 'applied' or 'deferred'")
        mm, words = self.seg.mm, self.seg.words
        use_rec = self._slots[claim.index][2]
        with self._change():
            self._own(claim)
            _, use = use_rec.read(mm, words)
            now = time.time_ns()
            since = 0
            if status == "deferred":
                since = use.deferred_since_ns if use.ack_status == L.ACK_DEFERRED and use.deferred_since_ns else now
            use_rec.write(
                mm,
                words,
                use._replace(ack_revision=revision, ack_status=L.ACK_CODES[status], deferred_since_ns=since, updated_at_ns=now),
            )

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
        mm, words = self.seg.mm, self.seg.words
        skipped: list[str] = []
        now = time.time_ns()
        ctl = controller or this_process()
        with self._change(engine=False):
            if gpu is not None:
                self._gpu.write(mm, words, self._gpu.make(
                    source=L.FIGURES_PUBLISHED, revision=revision, capacity=gpu.capacity, headroom=gpu.headroom,
                    other_used=gpu.other_used, elastic_budget=gpu.elastic_budget, published_at_ns=now,
                    controller_pid=ctl.pid, controller_start=ctl.start_time))
            for (index, epoch), lim in instances.items():
                if min(lim.limit, lim.target, lim.guarantee) < 0:
                    raise LedgerError(f"kvpolicy ledger: negative limits for slot {index}: {lim}")
                ident_rec, pub_rec = self._slots[index][:2]
                _, ident = ident_rec.read(mm, words)
                if ident.state != L.SLOT_ACTIVE or ident.epoch != epoch:
                    skipped.append(f"{self.gpu} slot {index} (epoch {epoch}) changed hands")
                    continue
                _, old = pub_rec.read(mm, words)
                pub_rec.write(mm, words, pub_rec.make(
                    epoch=epoch, revision=revision, limit=lim.limit, target=lim.target,
                    guarantee=lim.guarantee, published_at_ns=now))
                if ident.flags & L.FLAG_ELASTIC and lim.guarantee != old.guarantee:
                    _, use = self._slots[index][2].read(mm, words)
                    held = use.mapped + use.pending
                    self._adjust_totals(
                        guarantees=lim.guarantee - old.guarantee,
                        unmet_guarantees=_unmet(lim.guarantee, held) - _unmet(old.guarantee, held),
                    )
        return skipped


def __getattr__(name: str) -> Any:
    # The engine adapters look their glue up here (``kvpolicy.runtime.ledger.attach_static`` /
    # ``connect_vllm_ledger``); it lives in ``engines`` and loads on first use.
    if name in ("attach_static", "connect_vllm_ledger"):
        from kvpolicy.runtime import engines

        return getattr(engines, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
