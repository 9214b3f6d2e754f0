"""Pool facts arithmetic and the vLLM adapter's admissions in the shared-memory ledger, on a bare install.

(The same arithmetic on vLLM's real objects is in test_vllm_facts.py.)
"""

from __future__ import annotations

import sys

import threading
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.vllm_adapter.identity import InstanceKey, gpu_of, worker_gpu
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config, model_specs
from kvpolicy.adapters.vllm_adapter.planning.kv_cache_planning import (
    KVCacheLayout,
    bytes_per_block,
    kv_cache_groups,
)
from kvpolicy.adapters.vllm_adapter.plugin import wrap
from kvpolicy.adapters.vllm_adapter.pools import (
    ACCOUNTING_POOLS,
    ALLOCATOR_GRANULE,
    DEEPSEEK_V4_POOLS,
    PADDING_POOL,
    VLLM_ELASTIC_POOLS,
    VLLM_POOLS,
    PoolLayout,
    pool_facts,
)
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.runtime.errors import AdmissionRefused
from kvpolicy.units import GiB, MiB
from tests.support.ledgers import SharedLedger

MODELS = ["deepseek-v4-flash", "deepseek-v4-pro", "qwen3-8b", "gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite"]


def layout_of(name: str, num_blocks: int) -> PoolLayout:
    layers = model_specs(load_config(CONFIGS / name / "config.json")).layers
    layout = KVCacheLayout.BLHNC if name.startswith("deepseek-v4") else KVCacheLayout.LBNHC
    groups = kv_cache_groups(layers, layout)
    return PoolLayout.from_plan_groups(groups, num_blocks, bytes_per_block(groups, layout))


@st.composite
def usage(draw):
    name = draw(st.sampled_from(MODELS))
    num_blocks = draw(st.integers(min_value=2, max_value=5000))
    layout = layout_of(name, num_blocks)
    budget = num_blocks - 1  # all but the null block
    held = []
    for _ in layout.groups:
        n = draw(st.integers(min_value=0, max_value=budget))
        held.append(n)
        budget -= n
    free = draw(st.integers(min_value=0, max_value=budget))  # the rest: held outside any group
    return layout, held, free


@settings(max_examples=150, deadline=None)
@given(usage())
def test_facts_always_add_up(case) -> None:
    layout, held, free = case
    facts = pool_facts(layout, held, free)
    assert sum(f.tensor_bytes for f in facts.values()) == layout.backing_bytes
    total = sum(f.bytes for f in facts.values())
    assert total % ALLOCATOR_GRANULE == 0 and 0 <= total - layout.backing_bytes < ALLOCATOR_GRANULE
    assert sum(facts[PADDING_POOL].parts.values()) == facts[PADDING_POOL].bytes
    for pool in layout.pools:
        assert facts[pool].bytes == sum(h * g.pool_bytes.get(pool, 0) for h, g in zip(held, layout.groups))
        if facts[pool].parts:
            assert sum(facts[pool].parts.values()) == facts[pool].bytes
    assert set(facts) <= set(VLLM_POOLS)


def test_block_counted_twice_is_a_broken_invariant() -> None:
    layout = layout_of("qwen3-8b", 10)
    with pytest.raises(AssertionError, match="counted in two groups"):
        pool_facts(layout, [9], 1)


@pytest.mark.parametrize("name", MODELS)
def test_model_pools_are_in_the_vocabulary(name: str) -> None:
    facts = pool_facts(layout_of(name, 100), [0] * len(layout_of(name, 100).groups), 99)
    assert set(facts) <= set(VLLM_POOLS)
    if name.startswith("deepseek-v4"):
        assert set(facts) == set(DEEPSEEK_V4_POOLS) | set(ACCOUNTING_POOLS)


def test_vocabulary_is_consistent_with_the_engine_table() -> None:
    """Everything kvpolicy.engines lists for vllm is a pool this adapter can report."""
    from kvpolicy.engines import ENGINES

    assert ENGINES["vllm"].pools <= set(VLLM_POOLS)
    assert ENGINES["vllm"].elastic_pools == set(VLLM_ELASTIC_POOLS)


def test_engine_table_lists_every_reported_pool() -> None:
    from kvpolicy.engines import ENGINES

    assert set(VLLM_POOLS) <= ENGINES["vllm"].pools


# ------------------------------------------------------------------ ledger


def test_admission_is_all_or_nothing_under_races(tmp_path) -> None:
    """Sixteen ranks race for 10 GiB in 1 GiB admissions: exactly ten win, none half-way."""
    shared = SharedLedger(tmp_path, {"cuda:0": 10 * GiB + 5 * MiB})
    ledger = shared.vllm()
    wins, losses = [], []
    barrier = threading.Barrier(16)

    def admit(rank: int) -> None:
        barrier.wait()
        try:
            wins.append(ledger.admit(InstanceKey("e", "m", rank=rank), "cuda:0", GiB))
        except AdmissionRefused as exc:
            losses.append(str(exc))

    threads = [threading.Thread(target=admit, args=(r,)) for r in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 10 and len(losses) == 6
    assert shared.unreserved("cuda:0") == 5 * MiB
    assert all("= 5 MiB (5242880 B)" in message for message in losses), losses[0]


def test_a_second_admission_replaces_the_first_and_release_returns_it(tmp_path) -> None:
    shared = SharedLedger(tmp_path, {"cuda:0": 4 * GiB})
    ledger, key = shared.vllm(), InstanceKey("e", "m")
    assert ledger.admit(key, "cuda:0", 3 * GiB) == 3 * GiB
    assert ledger.admit(key, "cuda:0", GiB) == GiB  # (a wake-up's profile run sizes the cache again)
    assert shared.admitted("cuda:0") == {key.id: GiB} and shared.unreserved("cuda:0") == 3 * GiB
    ledger.release(key)
    assert shared.admitted("cuda:0") == {} and shared.unreserved("cuda:0") == 4 * GiB


def test_a_gpu_without_figures_refuses_once_the_wait_is_over(tmp_path, monkeypatch) -> None:
    """No controller publishes for cuda:7 and this process cannot measure it: the admission says how to fix it."""
    monkeypatch.setenv("KVPOLICY_FIGURES_WAIT", "0")
    shared = SharedLedger(tmp_path, {"cuda:0": GiB})
    ledger = shared.vllm()
    with pytest.raises(AdapterError, match=r"waited 0 s for a controller to publish figures for cuda:7"):
        ledger.admit(InstanceKey("e", "m"), "cuda:7", 1)
    assert shared.instances("cuda:7") == []  # the rank that gave up left the ledger


def test_instance_ids() -> None:
    assert InstanceKey("eng", "m", rank=3).id == "eng/3"
    assert InstanceKey("eng", "m", rank=0, dp_rank=2).id == "eng/dp2/0"


U = ["GPU-5a0e4f2c-1b3d-4e5f-8a9b-0c1d2e3f4a5b", "GPU-9c7d1e2f-3a4b-4c5d-9e6f-7a8b9c0d1e2f",
     "GPU-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "GPU-c0ffee00-1234-4abc-9def-0123456789ab"]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    """NVML of a machine with four GPUs (a stand-in: this one has none)."""
    from tests.support import fake_nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.module([fake_nvml.FakeGpu(u) for u in U]))


@pytest.mark.parametrize(
    ("visible", "local", "gpu"),
    [("", 1, U[1]), ("3,1", 1, U[1]), (f"{U[2]},{U[0]}", 0, U[2]), ("GPU-c0ffee", 0, U[3])],
)
def test_gpu_ids_are_the_uuids_cuda_visible_devices_names(nvml, visible: str, local: int, gpu: str) -> None:
    assert gpu_of(local, {"CUDA_VISIBLE_DEVICES": visible}) == gpu


@pytest.mark.parametrize(("visible", "local", "gpu"), [("", 1, "cuda:1"), ("4,6", 1, "cuda:6"), (U[2], 0, U[2])])
def test_without_nvml_gpu_ids_fall_back_to_indices(monkeypatch: pytest.MonkeyPatch, visible: str, local: int,
                                                   gpu: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu_of(local, {"CUDA_VISIBLE_DEVICES": visible}) == gpu


def test_a_device_not_in_cuda_visible_devices_is_refused(nvml) -> None:
    with pytest.raises(ValueError, match="CUDA device 3 is not among CUDA_VISIBLE_DEVICES='2'"):
        gpu_of(3, {"CUDA_VISIBLE_DEVICES": "2"})


def test_the_workers_device_then_assigned_physical_gpus(nvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    worker = SimpleNamespace(local_rank=1, parallel_config=SimpleNamespace(assigned_physical_gpu_ids=[1, 0]))
    assert worker_gpu(worker) == U[0]  # vLLM's physical id 0 is NVML's GPU 0
    worker.device = SimpleNamespace(type="cuda", index=0)  # an initialized worker: its CUDA ordinal wins
    assert worker_gpu(worker) == U[3]


def test_missing_hook_target_names_it() -> None:
    class Engine:
        pass

    with pytest.raises(AdapterError, match=r"cannot install the live pool report hook: .*Engine\.step does not exist"):
        wrap(Engine, "step", "live pool report", lambda original: original)


def test_reporter_is_throttled_and_sends_only_changes() -> None:
    from kvpolicy.adapters.vllm_adapter.reports import EngineReporter


    clock = iter([0.0, 0.4, 1.5])
    reporter = EngineReporter(interval=1.0, clock=lambda: next(clock))
    sent = []
    pool = SimpleNamespace(get_num_free_blocks=lambda: 5)
    coordinator = SimpleNamespace(block_pool=pool, single_type_managers=())
    core = SimpleNamespace(
        scheduler=SimpleNamespace(kv_cache_manager=SimpleNamespace(coordinator=coordinator)),
        model_executor=SimpleNamespace(collective_rpc=lambda method, args, non_block: sent.append(args)),
    )
    assert reporter.maybe_report(core) is True
    assert reporter.maybe_report(core) is False  # 0.4 s later
    pool.get_num_free_blocks = lambda: 4
    assert reporter.maybe_report(core) is True
    assert sent == [([], 5), ([], 4)]
