"""A plan against what vLLM's ``allocate_kv_cache`` really built (``real_vllm.allocated_views``), pool by pool.

The bytes each layer really occupies per block are read off the allocation, per layout:

- block-outermost (BLHNC, DeepSeek-V4's): one block of every group lies in the same bytes of the one
  backing buffer, each group's layers one after another from byte 0, each in its (padded) page; a
  layer's page runs from its start to the next layer's start in its group (the group's last layer:
  to the end of the group's pages);
- layer-outermost (LBNHC, ...): each layer has a region of its own, ``blocks`` pages of ``block_stride``
  bytes; a group's regions do not overlap and lie inside the buffer.

Summing the pages over a pool's layers in every group gives the pool's bytes per block as allocated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from kvpolicy.adapters.vllm_adapter.planning.plan import VllmPlan


def check_allocation(plan: VllmPlan, pools: Mapping[str, tuple[str, str]], allocated: Mapping[str, Any]) -> None:
    """Assert that ``allocated`` (vLLM's views) is the plan: the buffer, every layer's blocks, where each
    layer's pages lie (for the layout), each group's and each pool's (and part's) bytes per block.

    ``pools`` maps each layer name to its (pool, part) as the plan classifies it."""
    layers: dict[str, dict[str, int]] = allocated["layers"]
    assert allocated["buffer_bytes"] == plan.total_bytes == plan.num_blocks * plan.bytes_per_block
    assert set(layers) == set(pools), set(layers) ^ set(pools)
    block_outermost = not plan.kv_cache_layout.startswith("L")
    by_group: dict[int, list[tuple[int, int, str]]] = {}
    for name, view in layers.items():
        assert view["blocks"] == plan.num_blocks, (name, view)
        if block_outermost:
            assert view["block_stride"] == plan.bytes_per_block, (name, view)
        else:
            assert view["extent"] <= view["block_stride"], (name, view)
        by_group.setdefault(view["group"], []).append((view["start"], view["extent"], name))
    assert sorted(by_group) == list(range(len(plan.groups)))
    pool_bytes: Counter[str] = Counter()
    part_bytes: Counter[tuple[str, str]] = Counter()
    for g, members in by_group.items():
        members.sort()
        group_pools: Counter[str] = Counter()
        for name, page in _pages(g, members, plan, layers, block_outermost):
            pool, part = pools[name]
            group_pools[pool] += page
            if part:
                part_bytes[pool, part] += page
        assert dict(group_pools) == plan.groups[g].pool_bytes_per_block, g
        pool_bytes.update(group_pools)
    assert dict(pool_bytes) == {name: p.bytes_per_block for name, p in plan.pools.items()}
    for name, p in plan.pools.items():
        assert {part: n for (pool, part), n in part_bytes.items() if pool == name} == p.parts, name
    # The bytes a block holds of no pool: the plan's padding pool (the largest group's pages fill the block).
    assert plan.bytes_per_block == max(g.bytes_per_block for g in plan.groups)


def _pages(g: int, members: list[tuple[int, int, str]], plan: VllmPlan, layers: Mapping[str, Any],
           block_outermost: bool) -> list[tuple[str, int]]:
    """(layer, the bytes of a block it occupies) for group ``g``'s layers, sorted by where they start."""
    if not block_outermost:
        ends = [start for start, _, _ in members[1:]] + [plan.total_bytes]
        for (start, _, name), end in zip(members, ends):
            assert start + plan.num_blocks * layers[name]["block_stride"] <= end, f"{name}'s region overlaps the next"
        return [(name, layers[name]["block_stride"]) for _, _, name in members]
    group_end = plan.groups[g].bytes_per_block
    assert group_end <= plan.bytes_per_block
    assert members[0][0] == 0, f"group {g} does not start at the block's first byte"
    ends = [start for start, _, _ in members[1:]] + [group_end]
    for (start, extent, name), end in zip(members, ends):
        assert start + extent <= end, f"{name}'s data ({start} + {extent}) runs past its page (to {end})"
    return [(name, end - start) for (start, _, name), end in zip(members, ends)]
