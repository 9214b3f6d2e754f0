"""An elastic SWA pool at SGLang's start-up, through the real hooks, the real ledger and the real SGLang classes.

``activate`` installs the hooks as SGLang's plugin entry point does (the default
connector: ``EngineSession`` in a shared-memory ledger under a temporary directory);
SGLang's own ``_resolve_memory_pool_config``, ``_derive_pool_sizes`` and ``_init_pools``
then build the request table, the ``DeepSeekV4TokenToKVPool`` and the
``SWATokenToKVPoolAllocator`` on CPU, the SWA tensors over the host driver. What this
machine lacks is stood in for: its free GPU memory (pinned) and the GPU's figures
(offered once by another instance, as an engine on a GPU offers its measurement).
"""

from __future__ import annotations

import dataclasses

import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.units import GiB, MiB
from tests.sglang.sglang_support import (
    REPO,
    kv_cache_configurator,
    published_server_args,
    single_process_parallel,
)
from tests.sglang.test_sglang_swa_elastic import GROUP, TINY, Built, Scheduler

pytestmark = pytest.mark.sglang

GPU = "cuda:0"
CAPACITY = 80 * GiB
GUARANTEE = 2 * GROUP  # the model's `min`, two chunk groups of the 7-layer SWA pool
ENGINE_ARGS = dict(max_running_requests=16, swa_full_tokens_ratio=0.5, _swa_full_tokens_ratio_explicitly_set=True)
"""--max-running-requests 16 --swa-full-tokens-ratio 0.5: SWA sized by ratio, half the full tokens."""
POLICY = f"""version 1
model "tiny" {{
  engine sglang
  reserve 96 MiB
  min {GUARANTEE // MiB} MiB
  max 1 GiB
  pool swa {{ owner elastic }}
}}
"""


def offer_figures(ledger_dir: Path):
    """Another instance on the GPU, which offered the GPU's figures (capacity, nothing else in use)."""
    from kvpolicy.runtime.client import attach

    return attach(id="figures/0", model="other", gpu=GPU, engine="vllm", capacity=CAPACITY, headroom=0,
                  other_used=0, ledger_dir=ledger_dir, handle_signals=False)


def publish(ledger_dir: Path, revision: int, limits: dict, gpu: str = GPU) -> None:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.ledger import GpuLimits

    with LedgerDir(ledger_dir) as ld:
        skipped = ld.publish(ld.read(), revision, {gpu: GpuLimits(CAPACITY, 0, 0, CAPACITY)}, limits)
    assert not skipped


def build_engine(kvc):
    """What ``KVCacheConfigurator.configure`` does for a V4 target on CPU, through ``_init_pools``: the
    request table, the V4 pool and its allocator (configure itself refuses an fp8 KV cache on a CPU)."""
    config = kvc._resolve_memory_pool_config(80.0)
    sizes = kvc._derive_pool_sizes(config=config)
    return sizes, kvc._init_pools(sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)


@pytest.fixture
def engine(sglang_env, tmp_path, ledger_dir, monkeypatch):
    """The adapter activated for an elastic SWA policy; ``start(tp_size=1)`` builds the engine's pools."""
    import sglang.srt.mem_cache.kv_cache_configurator as mod
    from sglang.srt.runtime_context import get_parallel

    from kvpolicy.adapters.sglang_dsv4 import activate, hooks

    policy = tmp_path / "p.kvp"
    policy.write_text(POLICY)
    env = AdapterEnv(enabled=True, policy=policy, model="tiny", ledger_dir=ledger_dir)
    figures = offer_figures(ledger_dir)
    monkeypatch.setattr(mod, "get_available_gpu_memory", lambda *a, **k: 64.0)  # GiB free, as measured
    stack = ExitStack()
    made: list = []

    def start(tp_size: int = 1, device: str = "cpu", give_back_chunks: int | None = env.give_back_chunks):
        stack.enter_context(single_process_parallel())
        stack.enter_context(get_parallel().override(tp_size=tp_size))
        args = stack.enter_context(published_server_args(**ENGINE_ARGS, device=device))
        kvc = kv_cache_configurator(TINY, args)
        kvc.device = device
        targets = activate(dataclasses.replace(env, give_back_chunks=give_back_chunks), version="0.5.23")
        state = _state()
        sizes, pools = build_engine(kvc)
        made.extend(swa for _, swa in state.elastic_pools)
        return targets, state, sizes, pools

    yield start
    for swa in made:
        swa.close()
    hooks.uninstall()
    stack.close()
    figures.detach()


def _state():
    """The state ``activate`` installed (the hooks keep it in their patch)."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    return KVCacheConfigurator._profile_available_bytes.__kvpolicy_hook__["state"]


def ledger_slot(ledger_dir: Path, instance_id: str):
    from kvpolicy.runtime.directory import LedgerDir

    with LedgerDir(ledger_dir) as ld:
        view = ld.read().find(instance_id)
    assert view is not None, f"{instance_id} is not in the ledger"
    return view


def test_the_start_up_builds_the_swa_pool_on_the_allocator_under_the_ledger(engine, ledger_dir):
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    from kvpolicy.adapters.sglang_dsv4.hooks import ALLOCATOR_HOOK

    targets, state, _sizes, pools = engine()
    assert ALLOCATOR_HOOK in targets
    (pool, swa), = state.elastic_pools
    allocator = pools.token_to_kv_pool_allocator
    assert pool is pools.token_to_kv_pool and type(allocator) is SWATokenToKVPoolAllocator
    assert swa.allocator is allocator.swa_attn_allocator  # SGLang's own SWA page allocator, bound
    views = pool.swa_kv_pool.kv_buffer
    assert [v.data_ptr() for v in views] == [a.va for a in swa.mapping.arenas]
    entry = state.admitted[0]
    planned = entry.elastic
    assert (planned.layers, planned.pages) == (TINY.num_hidden_layers, swa.pages)
    assert planned.guarantee == GUARANTEE and planned.pinned == swa.pinned == GROUP
    # Idle: the static pools and the one pinned chunk group; nothing of the guarantee is mapped yet.
    assert swa.held_bytes == GROUP
    slot = ledger_slot(ledger_dir, entry.identity.instance_id)
    assert slot.elastic and slot.guarantee == GUARANTEE
    facts = slot.pools
    assert facts["swa"].owner == "elastic" and facts["swa"].bytes == 0
    assert facts["other"].parts["swa_pinned"] == GROUP
    static = {k: f for k, f in facts.items() if f.owner == "runtime"}
    assert set(static) >= {"c4", "c128", "indexer", "compressor_state", "req_to_token", "other"}
    assert sum(f.bytes for f in static.values()) <= entry.admitted == 96 * MiB
    assert pool.mem_usage * GiB == pytest.approx(state.measurements[-1].pool_tensor_bytes + GROUP)


def test_the_give_back_bound_reaches_the_swa_pool(engine):
    """``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS`` (``AdapterEnv.give_back_chunks``) bounds the give-back of the
    SWA pool the start-up builds, in whole chunk groups of one chunk per layer (its effect:
    tests/sglang/test_sglang_swa_elastic.py)."""
    _targets, state, _sizes, _pools = engine(give_back_chunks=3 * 7 + 6)
    (_pool, swa), = state.elastic_pools
    assert swa.layers == 7 and swa.give_back.release_chunks == 3


def test_the_swa_pool_gives_back_at_most_128_chunks_a_tick_by_default(engine):
    _targets, state, _sizes, _pools = engine()
    (_pool, swa), = state.elastic_pools
    assert swa.give_back.release_chunks == 128 // 7


def test_a_served_load_maps_under_the_ledger_and_an_idle_engine_gives_back_to_its_guarantee(engine, ledger_dir):
    serve_then_idle(engine, ledger_dir, device="cpu")


def serve_then_idle(engine, ledger_dir: Path, device: str):
    """Serve until the guarantee is full, grow into a published limit, finish, give back to the guarantee;
    returns (the adapter's state, SGLang's pools). The GPU test runs the same on ``cuda``."""
    _targets, state, sizes, pools = engine(device=device)
    (pool, swa), = state.elastic_pools
    outer = pools.token_to_kv_pool_allocator
    identity = state.admitted[0].identity  # on a GPU with NVML, its ledger is keyed by the GPU's UUID
    instance = identity.instance_id
    swa.give_back_interval = swa.report_interval = 0.0  # every tick gives back and reports (no wall clock)
    s = Scheduler(Built(pool, sizes, swa, None, None), outer, device)  # type: ignore[arg-type]
    # No controller yet: the limit is the guarantee (plus the pinned group); a reached limit refuses.
    while s.refused == 0:
        s.admit(256)
        s.check()
    assert swa.held_bytes == GROUP + GUARANTEE and swa.refusals >= 1
    # A controller publishes more room: the pool grows into it (and no further than the policy's max).
    publish(ledger_dir, 1, {instance: _limits(limit=6 * GROUP, target=GUARANTEE)}, gpu=identity.gpu)
    before = len(s.running)
    for _ in range(40):
        s.admit(256)
        s.decode()
        s.check()
    assert len(s.running) > before and GROUP + GUARANTEE < swa.held_bytes <= 7 * GROUP
    outer.available_size()  # the scheduler's next round: a tick reports
    slot = ledger_slot(ledger_dir, instance)
    assert slot.mapped == swa.elastic_bytes and slot.used == swa.used_bytes
    # Everything finishes; the next rounds give back down to the target (the guarantee).
    while s.running:
        s.finish(0, cache=False)
    s.cached.clear()
    outer.available_size()
    s.check()
    assert swa.held_bytes <= GROUP + GUARANTEE
    assert ledger_slot(ledger_dir, instance).mapped == swa.elastic_bytes <= GUARANTEE
    return state, pools


def _limits(limit: int, target: int):
    from kvpolicy.runtime.values import InstanceLimits

    return InstanceLimits(limit=limit, target=target, guarantee=GUARANTEE)


def test_tensor_parallel_above_one_is_refused_at_start_before_anything_is_admitted(engine, ledger_dir):
    with pytest.raises(AdapterError) as info:
        engine(tp_size=2)
    assert "needs tensor parallel 1" in str(info.value) and "--tp-size 2" in str(info.value)
    from kvpolicy.runtime.directory import LedgerDir

    with LedgerDir(ledger_dir) as ld:
        assert [v.id for v in ld.read().instances()] == ["figures/0"]


def test_sglangs_plugin_entry_point_builds_the_elastic_swa_pool_in_a_real_process(tmp_path, ledger_dir):
    """SGLang's own ``load_plugins()`` in a fresh process, as every SGLang process runs it, then SGLang's
    pool set-up: the SWA pool comes out on the allocator and the ledger sees the elastic instance."""
    policy = tmp_path / "p.kvp"
    policy.write_text(POLICY)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.sglang import sglang_standins; sglang_standins.install()
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sglang.srt.mem_cache.kv_cache_configurator as mod
        mod.get_available_gpu_memory = lambda *a, **k: 64.0
        from tests.sglang.test_sglang_swa_elastic import TINY
        from tests.sglang.test_sglang_swa_wiring import ENGINE_ARGS, build_engine
        from tests.sglang.sglang_support import kv_cache_configurator, published_server_args, single_process_parallel
        with single_process_parallel(), published_server_args(**ENGINE_ARGS) as args:
            sizes, pools = build_engine(kv_cache_configurator(TINY, args))
        swa = pools.token_to_kv_pool_allocator.swa_attn_allocator
        print("BOUND", type(swa.alloc_extend).__name__, swa.alloc_extend.__wrapped__.__self__ is swa)
        from kvpolicy.runtime.directory import LedgerDir
        with LedgerDir({str(ledger_dir)!r}) as ld:
            slot = ld.read().find("tiny@test/0")
        print("SLOT", slot.elastic, slot.guarantee, slot.pools["swa"].owner, slot.pools["other"].parts["swa_pinned"])
    """)
    figures = offer_figures(ledger_dir)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOLICY_", "SGLANG_PLUGINS"))}
        env.update({"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(policy), "KVPOLICY_MODEL": "tiny",
                    "KVPOLICY_LEDGER_DIR": str(ledger_dir), "KVPOLICY_ENGINE_ID": "tiny@test",
                    "PYTHONPATH": str(REPO)})
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=900)  # a hang guard: importing sglang is slow on a loaded machine
        assert done.returncode == 0, done.stderr[-3000:]
        assert "BOUND function True" in done.stdout  # SGLang's SWA page allocator, wrapped by the pool
        assert f"SLOT True {GUARANTEE} elastic {GROUP}" in done.stdout
    finally:
        figures.detach()
    from kvpolicy.runtime.directory import LedgerDir

    with LedgerDir(ledger_dir) as ld:
        assert ld.read().find("tiny@test/0") is None  # the engine left the ledger at exit

