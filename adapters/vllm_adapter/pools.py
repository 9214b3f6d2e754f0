"""Per-pool facts of a vLLM instance: which bytes of its one KV buffer belong to which pool.

vLLM 0.33 allocates one backing buffer per rank (``num_blocks × bytes_per_block``)
and every KV cache group draws blocks from one shared pool. So the static
reservation is one number, and the split into pools is a live figure: a block a
group holds carries that group's pages (each page belongs to one kvpolicy pool);
the rest of the block is ``padding``; blocks nobody holds are ``free_blocks``.
The pools always add up to the backing buffer (plus the allocator's rounding).

This module imports nothing from vLLM: it reads vLLM's objects by attribute, so the
same code serves the adapter (real ``KVCacheConfig`` and scheduler) and tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpolicy.engines import DEEPSEEK_V4_POOL_NAMES, VLLM_ELASTIC_POOL_NAMES
from kvpolicy.facts import PoolFacts
from kvpolicy.units import MiB

# The pool names the vLLM adapter reports (the linter's vLLM vocabulary, kvpolicy.engines, has them all).
DEEPSEEK_V4_POOLS = DEEPSEEK_V4_POOL_NAMES
"""DeepSeek-V4's five policy pools (the same names as the SGLang adapter's)."""
STANDARD_POOLS = (
    "full",  # FullAttentionSpec (and its subclasses other than MLA)
    "mla",  # MLAAttentionSpec
    "sliding_window",  # SlidingWindowSpec
    "sliding_window_mla",  # SlidingWindowMLASpec outside DeepSeek-V4
    "chunked_local",  # ChunkedLocalAttentionSpec
    "mamba",  # MambaSpec (state of Mamba / linear-attention layers)
    "cross_attention",  # CrossAttentionSpec (encoder-decoder)
    "other",  # any other spec class; the class name is the part
)
"""Other models: one pool per spec type."""
PADDING_POOL = "padding"
FREE_POOL = "free_blocks"
ACCOUNTING_POOLS = (PADDING_POOL, FREE_POOL)
"""Bytes of the buffer that hold no KV: block tails, the null block, rounding; unheld blocks."""
VLLM_POOLS = DEEPSEEK_V4_POOLS + STANDARD_POOLS + ACCOUNTING_POOLS
VLLM_ELASTIC_POOLS = VLLM_ELASTIC_POOL_NAMES
"""Pools the vLLM adapter can back with the elastic allocator (standard attention; not DeepSeek-V4)."""

ALLOCATOR_GRANULE = 2 * MiB
"""PyTorch's caching allocator rounds a large allocation up to a multiple of 2 MiB."""

_SPEC_CLASS_POOL = {
    "SlidingWindowMLASpec": "sliding_window_mla",
    "MLAAttentionSpec": "mla",
    "ChunkedLocalAttentionSpec": "chunked_local",
    "SlidingWindowSpec": "sliding_window",
    "MambaSpec": "mamba",
    "CrossAttentionSpec": "cross_attention",
    "FullAttentionSpec": "full",
}
_V4_STATE_WINDOW_PART = {8: "c4", 128: "c128"}  # compressor state window = overlap × ratio


def standard_pool(spec: Any) -> tuple[str, str]:
    """(pool, part) of a vLLM spec by its class, most specific class first."""
    for cls in type(spec).__mro__:
        pool = _SPEC_CLASS_POOL.get(cls.__name__)
        if pool is not None:
            return pool, ""
    return "other", type(spec).__name__


def is_deepseek_v4(specs: Sequence[Any]) -> bool:
    return any(getattr(s, "model_version", None) == "deepseek_v4" for s in specs)


def deepseek_v4_pool(layer: str, spec: Any) -> tuple[str, str]:
    """(pool, part) of one DeepSeek-V4 cache layer, from its spec.

    SWA cache and compressor states are SlidingWindowMLASpec (the states are float32);
    compressed KV is MLAAttentionSpec of model_version deepseek_v4 (4 or 128 tokens per
    state); the indexer cache is MLAAttentionSpec without a model_version. The layer
    name only tells the indexer's compressor state from the layer's own (a part).
    """
    mro = {cls.__name__ for cls in type(spec).__mro__}
    if "SlidingWindowMLASpec" in mro:
        if str(getattr(spec, "dtype", "")) == "torch.float32":
            if ".indexer." in layer:
                return "compressor_state", "indexer"
            return "compressor_state", _V4_STATE_WINDOW_PART.get(spec.sliding_window, str(spec.sliding_window))
        return "swa", ""
    if "MLAAttentionSpec" in mro:
        if getattr(spec, "model_version", None) == "deepseek_v4":
            ratio = spec.tokens_per_state
            if ratio in (4, 128):
                return f"c{ratio}", ""
        elif getattr(spec, "tokens_per_state", 1) > 1:
            return "indexer", ""
    return standard_pool(spec)


@dataclass(frozen=True)
class GroupPools:
    """What one block of a KV cache group holds, per pool (bytes)."""

    pool_bytes: dict[str, int]
    part_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    on_device: bool = True

    @property
    def page_bytes(self) -> int:
        return sum(self.pool_bytes.values())


@dataclass(frozen=True)
class PoolLayout:
    """One rank's KV buffer: its groups, block count and size."""

    groups: tuple[GroupPools, ...]
    num_blocks: int
    bytes_per_block: int

    @property
    def backing_bytes(self) -> int:
        """The backing buffer vLLM allocates (``KVCacheTensor.size``)."""
        return self.num_blocks * self.bytes_per_block

    @property
    def pools(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for g in self.groups:
            names.update(dict.fromkeys(g.pool_bytes))
        return tuple(names)

    @classmethod
    def from_kv_cache_config(cls, config: Any) -> PoolLayout:
        """From a real ``vllm.v1.kv_cache_interface.KVCacheConfig`` (one rank's)."""
        device_sizes = {t.size for t in config.kv_cache_tensors if not getattr(t, "host_resident", False)}
        if len(device_sizes) != 1:
            raise ValueError(
                f"expected one device backing buffer, got sizes {sorted(device_sizes)}: "
                "this KV cache placement is not one vLLM 0.33 makes by default"
            )
        size = device_sizes.pop()
        num_blocks = config.num_blocks
        assert size % num_blocks == 0, f"backing buffer {size} B is not {num_blocks} whole blocks"
        layer_specs = []
        for group in config.kv_cache_groups:
            inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            layer_specs.append(
                [(name, inner[name] if inner is not None else group.kv_cache_spec) for name in group.layer_names]
            )
        v4 = is_deepseek_v4([s for layers in layer_specs for _, s in layers])
        groups = []
        for group, layers in zip(config.kv_cache_groups, layer_specs):
            pool_bytes: dict[str, int] = {}
            part_bytes: dict[str, dict[str, int]] = {}
            for name, spec in layers:
                pool, part = deepseek_v4_pool(name, spec) if v4 else standard_pool(spec)
                pool_bytes[pool] = pool_bytes.get(pool, 0) + spec.page_size_bytes
                if part:
                    parts = part_bytes.setdefault(pool, {})
                    parts[part] = parts.get(part, 0) + spec.page_size_bytes
            groups.append(GroupPools(pool_bytes, part_bytes, on_device=not getattr(group, "host_resident", False)))
        return cls(tuple(groups), num_blocks, size // num_blocks)

    @classmethod
    def from_plan_groups(cls, groups: Sequence[Any], num_blocks: int, bytes_per_block: int) -> PoolLayout:
        """From planning.Group objects (pools named by the model spec builder)."""
        return cls(
            tuple(GroupPools(g.pool_bytes(), g.part_bytes()) for g in groups), num_blocks, bytes_per_block
        )


def _held_by_pool(layout: PoolLayout, held_blocks: Sequence[int]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Bytes each pool (and each part of a pool) holds, given the blocks each group holds."""
    if len(held_blocks) != len(layout.groups):
        raise ValueError(f"{len(held_blocks)} held-block counts for {len(layout.groups)} groups")
    totals: dict[str, int] = dict.fromkeys(layout.pools, 0)
    parts: dict[str, dict[str, int]] = {}
    for group, held in zip(layout.groups, held_blocks):
        for pool, nbytes in group.pool_bytes.items():
            totals[pool] += held * nbytes
        for pool, pool_parts in group.part_bytes.items():
            acc = parts.setdefault(pool, {})
            for part, nbytes in pool_parts.items():
                acc[part] = acc.get(part, 0) + held * nbytes
    return totals, parts


def pool_facts(
    layout: PoolLayout,
    held_blocks: Sequence[int],
    free_blocks: int,
    allocator_granule: int = ALLOCATOR_GRANULE,
) -> dict[str, PoolFacts]:
    """Facts per pool, given the blocks each group holds and the pool's free blocks.

    A held block of group g carries g's bytes of each pool; its tail is padding, as
    are the null block, blocks held outside any group (``unattributed``) and the
    caching allocator's rounding of the buffer. ``tensor_bytes`` add up to the
    backing buffer; ``bytes`` add up to what the GPU loses to it.
    """
    totals, parts = _held_by_pool(layout, held_blocks)
    bpb = layout.bytes_per_block
    tails = sum(held * (bpb - group.page_bytes) for group, held in zip(layout.groups, held_blocks))
    in_use = sum(held_blocks)
    unattributed = layout.num_blocks - 1 - free_blocks - in_use  # block 0 is the null block
    assert unattributed >= 0, (
        f"{in_use} held + {free_blocks} free + 1 null block > {layout.num_blocks} blocks: a block was "
        "counted in two groups (is the block-pool snapshot taken off the scheduler thread?)"
    )
    rounding = 0
    if allocator_granule:
        rounding = -(-layout.backing_bytes // allocator_granule) * allocator_granule - layout.backing_bytes
    padding_parts = {"block_tails": tails, "null_block": bpb, "unattributed_blocks": unattributed * bpb}
    padding = sum(padding_parts.values())
    facts = {
        pool: PoolFacts(owner="runtime", bytes=nbytes, tensor_bytes=nbytes, parts=parts.get(pool, {}))
        for pool, nbytes in totals.items()
    }
    facts[PADDING_POOL] = PoolFacts(
        owner="runtime",
        bytes=padding + rounding,
        tensor_bytes=padding,
        parts={**padding_parts, "allocator_rounding": rounding},
    )
    free = free_blocks * bpb
    facts[FREE_POOL] = PoolFacts(owner="runtime", bytes=free, tensor_bytes=free)
    return facts


def held_blocks_per_group(coordinator: Any) -> tuple[list[int], int]:
    """(blocks held per group, free blocks) from a vLLM ``KVCacheCoordinator``.

    Counts distinct non-null blocks in each group manager's ``req_to_blocks`` (a
    prefix-cache hit shares one block between requests). Blocks cached but unused
    sit in the free queue: they count as free, since vLLM reuses them on demand.
    Call it on the scheduler's thread: the managers are not thread-safe.
    """
    pool = coordinator.block_pool
    held: list[int] = []
    for manager in coordinator.single_type_managers:
        if manager.block_pool is not pool:  # a host-resident group's own pool
            held.append(0)
            continue
        ids = {b.block_id for blocks in manager.req_to_blocks.values() for b in blocks if not b.is_null}
        held.append(len(ids))
    return held, pool.get_num_free_blocks()


NULL_BLOCK_PART = "null_block_chunks"


def elastic_pool_facts(layout: PoolLayout, held_blocks: Sequence[int], pinned_bytes: int) -> dict[str, PoolFacts]:
    """Facts of an elastic rank: each KV pool's live split as ``owner elastic`` (informational: the
    ledger counts the rank's elastic bytes through admission), and the chunks pinned for the null
    block as runtime-owned ``padding`` — the only part of the buffer that counts in the GPU's R.
    """
    totals, parts = _held_by_pool(layout, held_blocks)
    facts = {
        pool: PoolFacts(owner="elastic", bytes=nbytes, tensor_bytes=nbytes, parts=parts.get(pool, {}))
        for pool, nbytes in totals.items()
    }
    facts[PADDING_POOL] = PoolFacts(
        owner="runtime", bytes=pinned_bytes, tensor_bytes=layout.bytes_per_block, parts={NULL_BLOCK_PART: pinned_bytes}
    )
    return facts
