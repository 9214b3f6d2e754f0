"""Record tuples ↔ what they mean: text fields, GPU figures, totals, pools, slot views.

``records`` moves a record's tuple in and out of shared memory; this module turns
those tuples into the ledger's values (``values``) and back, and checks on the way in
what the layout cannot (states, counts, UTF-8, owners) so that damage is reported
(``CorruptSegment``) instead of believed. It does no I/O and takes no lock: every
function is a plain conversion, testable on tuples alone.

Writing refuses what the layout cannot hold (``LedgerError`` naming the limit): a
string too wide for its field, more pools or parts than a slot has room for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.facts import PoolFacts, runtime_pool_bytes
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import CorruptSegment, LedgerError
from kvpolicy.runtime.records import SlotValues, value_type
from kvpolicy.runtime.values import GpuFigures, GpuLimits, InstanceLimits, SlotView, Totals

GpuValues = value_type(L.GPU_RECORD)
TotalsValues = value_type(L.TOTALS_RECORD)
IdentityValues = value_type(L.IDENTITY_RECORD)
PublishedValues = value_type(L.PUBLISHED_RECORD)
ReservationValues = value_type(L.RESERVATION_RECORD)

SOURCES = {L.FIGURES_NONE: "none", L.FIGURES_PROVISIONAL: "provisional", L.FIGURES_PUBLISHED: "published"}


def seconds(ns: int) -> float:
    return ns / 1e9


# --- text fields ----------------------------------------------------------------------------------


def decode_text(raw: bytes, what: str, where: str) -> str:
    """A fixed-width field as text; CorruptSegment if it holds a NUL inside or is not UTF-8."""
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


# --- the header's records -------------------------------------------------------------------------


def decode_figures(g: Any, where: str) -> GpuFigures:
    if g.source not in SOURCES:
        raise CorruptSegment(f"{where}: the GPU record has an unknown source {g.source}")
    return GpuFigures(
        source=SOURCES[g.source],
        revision=g.revision,
        capacity=g.capacity,
        headroom=g.headroom,
        other_used=g.other_used,
        elastic_budget=None if g.elastic_budget == L.NONE_U64 or g.source != L.FIGURES_PUBLISHED else g.elastic_budget,
        published_at=seconds(g.published_at_ns),
        controller_pid=g.controller_pid,
    )


def provisional_figures(f: GpuFigures) -> Any:
    """The GPU record of engines' own figures (before any controller published)."""
    return GpuValues(
        source=L.FIGURES_PROVISIONAL, revision=0, capacity=f.capacity, headroom=f.headroom,
        other_used=f.other_used, elastic_budget=L.NONE_U64, published_at_ns=0, controller_pid=0, controller_start=0,
    )


def published_figures(revision: int, gpu: GpuLimits, now_ns: int, controller_pid: int, controller_start: int) -> Any:
    """The GPU record of a controller's publish."""
    return GpuValues(
        source=L.FIGURES_PUBLISHED, revision=revision, capacity=gpu.capacity, headroom=gpu.headroom,
        other_used=gpu.other_used, elastic_budget=gpu.elastic_budget, published_at_ns=now_ns,
        controller_pid=controller_pid, controller_start=controller_start,
    )


def decode_totals(t: Any) -> Totals:
    return Totals(t.runtime_reserved, t.elastic_mapped, t.elastic_pending, t.guarantees, t.active, t.unmet_guarantees)


def encode_totals(t: Totals) -> Any:
    return TotalsValues(
        t.runtime_reserved, t.elastic_mapped, t.elastic_pending, t.guarantees, t.active, t.unmet_guarantees
    )


# --- a slot's records -----------------------------------------------------------------------------


def identity(
    *, id: bytes, model: bytes, engine: bytes, engine_id: bytes, rank: int, elastic: bool,
    epoch: int, pid: int, start_time: int, pidns: int, uid: int, attached_at_ns: int,
) -> Any:
    """The identity record of a claimed slot (text fields already encoded: ``encode_text``)."""
    return IdentityValues(
        state=L.SLOT_ACTIVE, flags=L.FLAG_ELASTIC if elastic else 0, epoch=epoch, pid=pid, start_time=start_time,
        pidns=pidns, uid=uid, rank=rank, attached_at_ns=attached_at_ns, id=id, model=model, engine=engine,
        engine_id=engine_id,
    )


def published(epoch: int, revision: int, limits: InstanceLimits, published_at_ns: int) -> Any:
    return PublishedValues(
        epoch=epoch, revision=revision, limit=limits.limit, target=limits.target, guarantee=limits.guarantee,
        published_at_ns=published_at_ns,
    )


def is_elastic(ident: Any) -> bool:
    return bool(ident.flags & L.FLAG_ELASTIC)


def counted_guarantee(ident: Any, pub: Any) -> int:
    """The guarantee in published record ``pub`` as the totals count it: only elastic instances have one."""
    return pub.guarantee if ident.flags & L.FLAG_ELASTIC else 0


def decode_pools(res: Any, where: str) -> dict[str, PoolFacts]:
    """The pools of a reservation record; CorruptSegment if its counts, names, owners or parts are invalid."""
    if res.pool_count > L.MAX_POOLS or res.part_count > L.MAX_PARTS:
        raise CorruptSegment(f"{where}: {res.pool_count} pools / {res.part_count} parts exceed the layout")
    names: list[str] = []
    fields: list[dict[str, Any]] = []
    for i in range(res.pool_count):
        name = decode_text(getattr(res, f"pool{i}_name"), f"pool {i} name", where)
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
        fields[p]["parts"][decode_text(getattr(res, f"part{j}_name"), f"part {j} name", where)] = getattr(
            res, f"part{j}_bytes"
        )
    return {n: PoolFacts(**f) for n, f in zip(names, fields, strict=True)}


def runtime_reserved(res: Any, where: str) -> int:
    """R_i of a reservation record: its static admission plus its runtime-owned pools."""
    return res.static_admitted + runtime_pool_bytes(decode_pools(res, where).values())


def decode_reserve(res: Any) -> int | None:
    """The model's reserve the admission was checked against (None: none given)."""
    return None if res.reserve == L.NONE_U64 else res.reserve


def reservation(epoch: int, static_admitted: int, reserve: int | None, pools: Mapping[str, PoolFacts]) -> Any:
    """The reservation record of a slot; LedgerError if the pools do not fit the layout."""
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
        pool, part_name, nbytes = parts[j] if j < len(parts) else (0, b"", 0)
        values.update({f"part{j}_pool": pool, f"part{j}_name": part_name, f"part{j}_bytes": nbytes})
    return ReservationValues(**values)


def encode_waiting(nbytes: int) -> int:
    """Bytes the pool was refused, as the usage record keeps them: whole MiB, rounded up (never 0 for
    something waiting), at most ``WAITING_MAX``. ``decode_slot`` reads them back in bytes."""
    return min(-(-nbytes // L.WAITING_UNIT), L.WAITING_MAX)


def decode_slot(index: int, gpu: str, slot: SlotValues, where: str) -> SlotView:
    """The instance in a slot's records (read together: ``SlotRecords.read``); CorruptSegment if invalid."""
    ident, pub, use, res = slot.identity, slot.published, slot.usage, slot.reservation
    if ident.state != L.SLOT_ACTIVE:
        raise CorruptSegment(f"{where}: unknown slot state {ident.state}")
    if use.ack_status not in L.ACK_NAMES:
        raise CorruptSegment(f"{where}: unknown acknowledgement status {use.ack_status}")
    pools = decode_pools(res, where)
    engine_id = decode_text(ident.engine_id, "engine_id", where)
    return SlotView(
        index=index,
        epoch=ident.epoch,
        gpu=gpu,
        id=decode_text(ident.id, "id", where),
        model=decode_text(ident.model, "model", where),
        engine=decode_text(ident.engine, "engine", where),
        engine_id=engine_id or None,
        rank=ident.rank,
        pid=ident.pid,
        start_time=ident.start_time,
        pidns=ident.pidns,
        uid=ident.uid,
        attached_at=seconds(ident.attached_at_ns),
        elastic=is_elastic(ident),
        revision=pub.revision,
        limit=pub.limit,
        target=pub.target,
        guarantee=pub.guarantee,
        published_at=seconds(pub.published_at_ns),
        used=use.used,
        mapped=use.mapped,
        pending=use.pending,
        waiting=use.waiting_mib * L.WAITING_UNIT,
        ack_revision=use.ack_revision,
        ack=L.ACK_NAMES[use.ack_status],
        deferred_since=seconds(use.deferred_since_ns) if use.deferred_since_ns else None,
        static_admitted=res.static_admitted,
        reserve=decode_reserve(res),
        pools=pools,
        last_activity=seconds(slot.activity),
    )
