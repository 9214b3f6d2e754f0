"""Per-pool reservation facts read from a live ``DeepSeekV4TokenToKVPool`` and its request table.

The five policy pools are read where SGLang 0.5.23 keeps them (``_recognised``).
The request-to-token table (``ReqToTokenPool.req_to_token``, one int32 row per
request slot) is the instance's too: SGLang allocates it just before
the V4 pool, outside the configurator's budget, and it is reported as the pool
``req_to_token``. Anything else the pool holds — tensors of
paths this adapter does not know (HIP unified pools, V4.1 request windows,
ratio-1/2 pools, small per-slot tensors) — is found by walking the pool's
objects and reported under ``other``: never dropped. Each tensor is counted once
per storage (views share it). The total is checked against the pool's own buffer
enumerations; a mismatch is logged as an error with both figures.

Imports torch lazily (callers hand in a live pool); nothing at module level.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpolicy.facts import PoolFacts

from . import footprint as fp
from .plan import REQ_TO_TOKEN

if TYPE_CHECKING:
    import torch

# SGLang's pools are Any (SGLang ships no types).

logger = logging.getLogger("kvpolicy.adapters.sglang_dsv4")

OTHER = "other"
_POOL_MODULE_PREFIX = "sglang.srt.mem_cache"
# The pool's own enumerations of its buffers; together they cover every buffer
# SGLang ships for PD/HiCache, which is every buffer it allocates on the known paths.
ENUMERATIONS = (
    "get_contiguous_buf_infos",
    "get_state_buf_infos",
    "get_request_state_buf_infos",
    "get_unified_swa_ring_buf_infos",
    "get_swa_valid_from_buf_infos",
)


@dataclass(frozen=True)
class LiveTensor:
    pool: str
    part: str
    nbytes: int
    where: str
    """The attribute path it was found at, for messages."""


@dataclass
class PoolMeasurement:
    """What a live pool holds: tensors in allocation order, and the cross-check."""

    tensors: list[LiveTensor]
    enumerated_bytes: int | None
    device_type: str
    facts: dict[str, PoolFacts] = field(default_factory=dict)

    @property
    def tensor_bytes(self) -> int:
        """Everything measured: the V4 pool's tensors and the request-to-token table."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def pool_tensor_bytes(self) -> int:
        """The V4 pool's tensors alone (what its own buffer enumerations cover)."""
        return sum(t.nbytes for t in self.tensors if t.pool != REQ_TO_TOKEN)

    @property
    def footprint(self) -> int:
        return sum(f.bytes for f in self.facts.values())

    @property
    def cross_check_ok(self) -> bool:
        return self.enumerated_bytes is None or self.enumerated_bytes == self.pool_tensor_bytes


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr())


def _recognised(pool: Any) -> Iterator[tuple[str, str, str, object]]:
    """(pool, part, where, tensor) for the five policy pools, in the order SGLang allocates them."""
    swa = getattr(pool, "swa_kv_pool", None)
    if swa is not None:
        for i, t in enumerate(swa.kv_buffer):
            yield "swa", "kv", f"swa_kv_pool.kv_buffer[{i}]", t
    kv_pools = getattr(pool, "kv_pools", {}) or {}
    for ratio, name in ((4, "c4"), (128, "c128")):
        sub = kv_pools.get(ratio)
        if sub is not None:
            for i, t in enumerate(sub.kv_buffer):
                yield name, "kv", f"kv_pools[{ratio}].kv_buffer[{i}]", t
    indexer = (getattr(pool, "index_pools", {}) or {}).get(4)
    if indexer is not None:
        for i, t in enumerate(indexer.contiguous_page_row_buffers()):
            yield "indexer", "k", f"index_pools[4].buffer[{i}]", t
    states = getattr(pool, "compress_state_pools", []) or []
    index_states = getattr(pool, "indexer_compress_state_pools", []) or []
    for i in range(max(len(states), len(index_states))):
        for label, pools in (("", states), ("_indexer", index_states)):
            state = pools[i] if i < len(pools) else None
            if state is None or getattr(state, "ratio", None) not in (4, 128):
                continue  # ratio-2 pair state is not a policy pool: the walk puts it under other
            yield (
                "compressor_state",
                f"c{state.ratio}{label}",
                f"{'indexer_' if label else ''}compress_state_pools[{i}].kv_score",
                state.kv_score_buffer.kv_score,
            )


def _walk(obj: object, where: str, seen: set[int]) -> Iterator[tuple[str, object]]:
    """Every tensor reachable from ``obj`` through SGLang memory-pool objects and containers."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield where, obj
        return
    if id(obj) in seen:
        return
    if isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, item in enumerate(obj):
            yield from _walk(item, f"{where}[{i}]", seen)
        return
    if isinstance(obj, dict):
        seen.add(id(obj))
        for key, item in obj.items():
            yield from _walk(item, f"{where}[{key!r}]", seen)
        return
    if not type(obj).__module__.startswith(_POOL_MODULE_PREFIX):
        return  # not pool state (loggers, memory-saver adapters, enums, ints)
    seen.add(id(obj))
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        names += [s for s in getattr(cls, "__slots__", ()) if isinstance(s, str)]
    for name in names:
        try:
            value = getattr(obj, name)
        except AttributeError:
            continue
        yield from _walk(value, f"{where}.{name}" if where else name, seen)


def _enumerated_bytes(pool: Any) -> int | None:
    total = 0
    for name in ENUMERATIONS:
        method = getattr(pool, name, None)
        if method is None:
            return None  # an engine version without it: nothing to check against
        try:
            _ptrs, lens, _items = method()
        except NotImplementedError:
            return None
        total += sum(lens)
    return total


def measure_pool(pool: Any, req_to_token_pool: Any = None, *, elastic_swa: bool = False) -> PoolMeasurement:
    """Read every tensor of a live pool (and of the request table, if given, allocated first);
    per policy pool, its tensor bytes and footprint. With ``elastic_swa`` the SWA tensors are
    views over the allocator's reservation, not the caching allocator's: they are left out
    (the elastic pool reports them itself, ``with_elastic_swa``)."""
    seen_storage: set[tuple[str, int]] = set()
    skipped = 0
    if elastic_swa:
        for t in pool.swa_kv_pool.kv_buffer:
            seen_storage.add(_storage_key(t))
            skipped += t.nbytes
    tensors: list[LiveTensor] = []
    device_type = "cpu"

    def add(pool_name: str, part: str, where: str, t: torch.Tensor) -> None:
        nonlocal device_type
        key = _storage_key(t)
        if key in seen_storage:
            return
        seen_storage.add(key)
        device_type = t.device.type
        tensors.append(LiveTensor(pool_name, part, t.untyped_storage().nbytes(), where))

    if req_to_token_pool is not None:
        add(REQ_TO_TOKEN, REQ_TO_TOKEN, "req_to_token_pool.req_to_token", req_to_token_pool.req_to_token)
    for pool_name, part, where, t in _recognised(pool):
        add(pool_name, part, where, t)
    for where, t in _walk(pool, "", set()):
        add(OTHER, where, where, t)

    enumerated = _enumerated_bytes(pool)
    if enumerated is not None:
        enumerated -= skipped  # the enumerations list the SWA views' bytes
    m = PoolMeasurement(tensors=tensors, enumerated_bytes=enumerated, device_type=device_type)
    m.facts = facts_from_tensors(tensors)
    if not m.cross_check_ok:
        logger.error(
            "kvpolicy: DeepSeek-V4 pool cross-check failed: the adapter counts %d bytes in %d "
            "tensors, the pool's own buffer enumerations (%s) add up to %d bytes (difference %+d). "
            "The ledger gets the adapter's figure, which includes everything it found.",
            m.pool_tensor_bytes,
            sum(t.pool != REQ_TO_TOKEN for t in tensors),
            ", ".join(ENUMERATIONS),
            enumerated,
            m.pool_tensor_bytes - (enumerated or 0),
        )
    return m


def facts_from_tensors(tensors: list[LiveTensor]) -> dict[str, PoolFacts]:
    """Per pool: footprint as ``bytes`` (what budgets use), tensor bytes, and parts."""
    charges = fp.footprints(t.nbytes for t in tensors)
    acc: dict[str, dict] = {}
    for t, charge in zip(tensors, charges):
        entry = acc.setdefault(t.pool, {"bytes": 0, "tensor_bytes": 0, "parts": {}})
        entry["bytes"] += charge
        entry["tensor_bytes"] += t.nbytes
        if t.pool in ("compressor_state", OTHER):
            entry["parts"][t.part] = entry["parts"].get(t.part, 0) + t.nbytes
    return {name: PoolFacts(owner="runtime", **entry) for name, entry in acc.items()}


def with_elastic_swa(static: dict[str, PoolFacts], elastic: dict[str, PoolFacts]) -> dict[str, PoolFacts]:
    """The measured runtime-owned pools with an elastic SWA pool's facts (``ElasticSWA.facts``): ``swa``
    as the elastic pool, and its pinned chunks added to ``other``."""
    merged = dict(static)
    for name, facts in elastic.items():
        had = merged.get(name)
        if had is None:
            merged[name] = facts
            continue
        if had.owner != facts.owner:
            raise ValueError(f"pool {name!r} is both {had.owner} and {facts.owner}")
        parts = dict(had.parts)
        for part, nbytes in facts.parts.items():
            parts[part] = parts.get(part, 0) + nbytes
        merged[name] = PoolFacts(owner=had.owner, bytes=had.bytes + facts.bytes,
                                 tensor_bytes=(had.tensor_bytes or 0) + (facts.tensor_bytes or 0), parts=parts)
    return merged
