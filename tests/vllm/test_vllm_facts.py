"""Per-pool facts from vLLM's real KVCacheConfig, real CPU allocation and real block pool.

The facts must add up to the backing buffer ``allocate_kv_cache`` really allocates,
and the live split must follow the blocks the real group managers hold.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvpolicy.adapters.vllm_adapter.identity import InstanceKey
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config, model_specs
from kvpolicy.adapters.vllm_adapter.pools import (
    FREE_POOL,
    PADDING_POOL,
    VLLM_POOLS,
    PoolLayout,
    deepseek_v4_pool,
    held_blocks_per_group,
    pool_facts,
)

from kvpolicy.units import MiB
from tests.support.ledgers import SharedLedger

pytestmark = pytest.mark.vllm

# Small caches: max_model_len 1024, so a CPU allocation of a few hundred MiB suffices.
FACT_CASES = [
    ("deepseek-v4-flash", 256, "BLHNC", "fp8", 512 * MiB),
    ("deepseek-v4-pro", 256, "BLHNC", "fp8", 768 * MiB),
    ("qwen3-8b", 16, "LBNHC", "auto", 256 * MiB),
    ("gemma-3-1b", 32, "LBNHC", "auto", 64 * MiB),
    ("gpt-oss-20b", 32, "LBNHC", "auto", 128 * MiB),
    ("deepseek-v2-lite", 16, "LBNHC", "auto", 64 * MiB),
]


def _case(name: str, block: int, layout: str, dtype: str):
    from tests.vllm.real_vllm import Case

    return Case(name, block, max_model_len=1024, kv_cache_dtype=dtype, layout=layout, max_num_batched_tokens=1024)


@pytest.fixture(scope="module", params=FACT_CASES, ids=[c[0] for c in FACT_CASES])
def allocated(request):
    """(case, real plan, PoolLayout, real backing buffer bytes) for one model."""
    import torch
    from tests.vllm.real_vllm import real_plan
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    name, block, layout, dtype, budget = request.param
    case = _case(name, block, layout, dtype)
    plan = real_plan(case, budget)
    views = allocate_kv_cache(plan.kv_cache_config, torch.device("cpu"), KVCacheLayout[layout])
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in views.values()}
    assert len(storages) == 1, "vLLM allocates one backing buffer per rank"
    yield case, plan, PoolLayout.from_kv_cache_config(plan.kv_cache_config), storages.popitem()[1]
    del views


def test_idle_facts_add_up_to_the_backing_buffer(allocated) -> None:
    _, plan, layout, buffer_bytes = allocated
    facts = pool_facts(layout, [0] * len(layout.groups), plan.kv_cache_config.num_blocks - 1)
    assert layout.backing_bytes == buffer_bytes
    assert sum(f.tensor_bytes for f in facts.values()) == buffer_bytes
    assert facts[FREE_POOL].tensor_bytes == buffer_bytes - layout.bytes_per_block  # all but the null block
    assert facts[PADDING_POOL].parts["null_block"] == layout.bytes_per_block
    assert set(facts) <= set(VLLM_POOLS)


def test_layout_matches_the_plan(allocated) -> None:
    """The adapter's view of the real config equals kvpolicy plan's groups, pool by pool."""
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan

    case, plan, layout, _ = allocated
    ours = make_plan(
        load_config(case.config_dir / "config.json"),
        PlanSettings(
            max_model_len=case.max_model_len,
            block_size=case.block_size,
            kv_cache_dtype=case.kv_cache_dtype,
            kv_cache_layout=case.layout,
            max_num_batched_tokens=plan.config.scheduler_config.max_num_batched_tokens,
            max_concurrent_batches=plan.config.max_concurrent_batches,
        ),
        num_blocks=plan.kv_cache_config.num_blocks,
    )
    assert [g.pool_bytes for g in layout.groups] == [g.pool_bytes_per_block for g in ours.groups]
    assert layout.bytes_per_block == ours.bytes_per_block


@pytest.mark.parametrize("case_spec", [c for c in FACT_CASES if c[0].startswith("deepseek-v4")], ids=lambda c: c[0])
def test_v4_layers_classify_like_the_plan(case_spec) -> None:
    """Each real V4 cache layer lands in the pool (and part) the plan gives it."""
    from tests.vllm.real_vllm import real_plan

    name, block, layout, dtype, budget = case_spec
    case = _case(name, block, layout, dtype)
    plan = real_plan(case, budget)
    mine = model_specs(load_config(case.config_dir / "config.json")).layers
    seen = set()
    for group in plan.kv_cache_config.kv_cache_groups:
        for layer in group.layer_names:
            spec = group.kv_cache_spec.kv_cache_specs[layer]
            assert deepseek_v4_pool(layer, spec) == (mine[layer].pool, mine[layer].part), layer
            seen.add(deepseek_v4_pool(layer, spec))
    assert {pool for pool, _ in seen} == {"swa", "c4", "c128", "indexer", "compressor_state"}


def _manager(plan):
    from tests.vllm.real_vllm import scheduler_block_sizes
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    scheduler_config = generate_scheduler_kv_cache_config([plan.kv_cache_config])
    block, hash_block = scheduler_block_sizes(scheduler_config)
    return KVCacheManager(
        scheduler_config,
        max_model_len=plan.config.model_config.max_model_len,
        scheduler_block_size=block,
        hash_block_size=hash_block,
        max_in_flight_tokens=plan.config.max_in_flight_tokens,
        enable_caching=False,
    )


def test_live_split_follows_the_real_block_pool(allocated) -> None:
    _, plan, layout, buffer_bytes = allocated
    manager = _manager(plan)
    coordinator = manager.coordinator
    tokens = {"a": 700, "b": 130}
    for group_manager in coordinator.single_type_managers:
        for request, n in tokens.items():
            group_manager.allocate_new_blocks(request, n, n)
    held, free = held_blocks_per_group(coordinator)
    block_sizes = [g.kv_cache_spec.block_size for g in plan.kv_cache_config.kv_cache_groups]
    assert held == [sum(-(-n // bs) for n in tokens.values()) for bs in block_sizes]
    assert free == plan.kv_cache_config.num_blocks - 1 - sum(held)

    facts = pool_facts(layout, held, free)
    assert sum(f.tensor_bytes for f in facts.values()) == buffer_bytes
    for pool in layout.pools:
        assert facts[pool].bytes == sum(h * g.pool_bytes.get(pool, 0) for h, g in zip(held, layout.groups))
    tails = sum(h * (layout.bytes_per_block - g.page_bytes) for h, g in zip(held, layout.groups))
    assert facts[PADDING_POOL].parts["block_tails"] == tails
    assert facts[PADDING_POOL].parts["unattributed_blocks"] == 0

    # Freeing a request gives its blocks back to free_blocks.
    for group_manager in coordinator.single_type_managers:
        group_manager.free("a")
    held_after, free_after = held_blocks_per_group(coordinator)
    assert free_after > free and sum(held_after) < sum(held)
    assert sum(f.tensor_bytes for f in pool_facts(layout, held_after, free_after).values()) == buffer_bytes


def test_engine_core_sends_the_live_split_to_the_workers(allocated, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The hooks around Worker.initialize_from_config, EngineCore._initialize_kv_caches and
    EngineCore.step, with vLLM's real configs, block pool, UniProcExecutor.collective_rpc and
    run_method; the engine core and worker objects stand in for ones that need a GPU."""
    from kvpolicy.adapters.vllm_adapter import hooks
    from kvpolicy.adapters.vllm_adapter.ledger import set_static_ledger
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    _, plan, layout, buffer_bytes = allocated
    monkeypatch.setenv("KVPOLICY_ENGINE_ID", "eng")
    monkeypatch.setenv("KVPOLICY_MODEL", "m")
    monkeypatch.setenv("KVPOLICY_REPORT_INTERVAL", "0")
    key = InstanceKey("eng", "m", rank=0)
    shared = SharedLedger(tmp_path / "ledger", {"cuda:0": 2 * buffer_bytes})
    ranks = shared.vllm()
    ranks.admit(key, "cuda:0", buffer_bytes)  # what the sizing hook did at start-up
    set_static_ledger(ranks)
    try:
        # Worker: vLLM allocated its buffer; the hook reports all blocks free.
        worker = SimpleNamespace(vllm_config=plan.config, rank=0)
        allocated_hook = hooks.allocated_hook(lambda self, config: None)
        allocated_hook(worker, plan.kv_cache_config)
        idle = shared.reports("cuda:0")[key.id]
        assert idle[FREE_POOL].tensor_bytes == buffer_bytes - layout.bytes_per_block

        # Engine core: the scheduler's block pool, and an executor whose worker is `worker`.
        executor = SimpleNamespace(driver_worker=SimpleNamespace(worker=worker), sent=0)

        def collective_rpc(method, timeout=None, args=(), kwargs=None, non_block=False):
            executor.sent += 1
            assert non_block, "the report must not wait for the workers"
            return UniProcExecutor.collective_rpc(executor, method, timeout, args, kwargs, non_block)

        executor.collective_rpc = collective_rpc
        manager = _manager(plan)
        core = SimpleNamespace(model_executor=executor, scheduler=SimpleNamespace(kv_cache_manager=manager))
        start = hooks.start_report_hook(lambda self, cfg: manager.coordinator.kv_cache_config)
        start(core, plan.config)
        step = hooks.step_report_hook(lambda self: ("outputs", True))

        for group_manager in manager.coordinator.single_type_managers:
            group_manager.allocate_new_blocks("r", 200, 200)
        assert step(core) == ("outputs", True)
        live = shared.reports("cuda:0")[key.id]
        held, _ = held_blocks_per_group(manager.coordinator)
        assert live[FREE_POOL].tensor_bytes == idle[FREE_POOL].tensor_bytes - sum(held) * layout.bytes_per_block
        assert sum(f.tensor_bytes for f in live.values()) == buffer_bytes
        assert executor.sent == 1
        step(core)  # nothing changed: nothing sent
        assert executor.sent == 1
    finally:
        set_static_ledger(None)

