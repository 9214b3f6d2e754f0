"""Against the real sglang 0.5.23 classes on CPU: configurator, pools, hooks, activation."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.adapters.sglang_dsv4 import hooks, plan as closed
from kvpolicy.adapters.sglang_dsv4.facts import OTHER, measure_pool
from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry, load_geometry
from kvpolicy.adapters.sglang_dsv4.ports import Reserve
from kvpolicy.units import GiB, MiB
from tests.support.ledgers import SharedLedger
from tests.sglang.sglang_support import (
    HERE,
    MODELS,
    TINY_RATIOS,
    build_pool_through_sglang,
    build_pools_through_sglang,
    kv_cache_configurator,
    real_sizes,
    tensor_bytes_by_pool,
)

pytestmark = pytest.mark.sglang

TINY = ModelGeometry(num_hidden_layers=7, compress_ratios=TINY_RATIOS, max_position_embeddings=65536)
FLASH = load_geometry(MODELS / "deepseek-v4-flash.json")
PRO = load_geometry(MODELS / "deepseek-v4-pro.json")
SHAPES = {"tiny": TINY, "flash": FLASH, "pro": PRO}


CASES = [
    ("tiny", 64 * MiB, dict(max_running_requests=16)),
    ("tiny", 300 * MiB, dict(max_running_requests=4, swa_full_tokens_ratio=0.25)),
    ("tiny", 40 * GiB, dict()),
    ("flash", 40 * GiB, dict()),
    ("flash", 24 * GiB, dict(max_running_requests=256, chunked_prefill_size=8192)),  # cap mode
    ("flash", 3 * GiB, dict(max_running_requests=32, swa_full_tokens_ratio=0.1)),
    ("pro", 96 * GiB, dict(max_total_tokens=2_000_000)),
    ("pro", 12 * GiB, dict(max_running_requests=64, chunked_prefill_size=4096, disable_radix_cache=True)),
]


@pytest.mark.parametrize("shape,budget,flags", CASES, ids=[f"{c[0]}-{c[1] >> 20}MiB-{i}" for i, c in enumerate(CASES)])
def test_plan_equals_the_real_configurator(server_args, shape, budget, flags):
    geometry = SHAPES[shape]
    args = server_args(**flags)
    kvc = kv_cache_configurator(geometry, args)
    real = real_sizes(kvc, budget)
    ours = closed.size_from_budget(geometry, hooks.live_settings(kvc), budget)
    assert (ours.tokens.full, ours.tokens.swa, ours.tokens.c4, ours.tokens.c128) == (
        real.max_total_num_tokens, real.swa_max_total_num_tokens,
        real.c4_max_total_num_tokens, real.c128_max_total_num_tokens,
    )
    assert (ours.c4_state_pool_size, ours.c128_state_pool_size, ours.max_running_requests) == (
        real.c4_state_pool_size, real.c128_state_pool_size, real.max_running_requests,
    )


POOL_CASES = [
    ("tiny", 64 * MiB, dict(max_running_requests=16)),
    ("tiny", 20 * MiB, dict(max_running_requests=2, swa_full_tokens_ratio=0.3)),
    ("flash", 600 * MiB, dict(max_running_requests=8, swa_full_tokens_ratio=0.1)),
    ("pro", 2560 * MiB, dict(max_running_requests=16, chunked_prefill_size=2048)),  # cap mode
]


@pytest.mark.parametrize("shape,budget,flags", POOL_CASES, ids=[f"{c[0]}-{c[1] >> 20}MiB" for c in POOL_CASES])
def test_facts_and_plan_equal_the_real_pool(server_args, shape, budget, flags):
    geometry = SHAPES[shape]
    kvc = kv_cache_configurator(geometry, server_args(**flags))
    hooks.uninstall()
    original = type(kvc)._profile_available_bytes
    type(kvc)._profile_available_bytes = lambda self, pre: budget  # only the free-memory probe is replaced
    try:
        built = build_pools_through_sglang(kvc)
    finally:
        type(kvc)._profile_available_bytes = original
    real = tensor_bytes_by_pool(built.pool, built.req_to_token_pool)
    m = measure_pool(built.pool, built.req_to_token_pool)
    assert {k: f.tensor_bytes for k, f in m.facts.items()} == real  # nothing under "other" on this path
    assert m.cross_check_ok and m.enumerated_bytes == sum(real.values()) - real["req_to_token"]
    predicted = closed.plan_for_budget(geometry, hooks.live_settings(kvc), budget)
    assert {k: p.bytes for k, p in predicted.pools.items()} == real
    assert {k: p.footprint for k, p in predicted.pools.items()} == {k: f.bytes for k, f in m.facts.items()}
    parts = m.facts["compressor_state"].parts
    assert set(parts) == {"c4", "c4_indexer", "c128"} and sum(parts.values()) == real["compressor_state"]
    assert sum(real.values()) > budget  # SGLang allocates above its budget: why the hook searches it


def test_an_unknown_buffer_is_reported_under_other_and_the_cross_check_complains(server_args, caplog):
    import torch

    kvc = kv_cache_configurator(TINY, server_args(max_running_requests=4))
    original = type(kvc)._profile_available_bytes
    type(kvc)._profile_available_bytes = lambda self, pre: 32 * MiB
    try:
        _c, _s, pool = build_pool_through_sglang(kvc)
    finally:
        type(kvc)._profile_available_bytes = original
    pool.kv_pools[128].future_buffer = [torch.zeros(3000, dtype=torch.uint8)]
    with caplog.at_level(logging.ERROR, logger="kvpolicy.adapters.sglang_dsv4"):
        m = measure_pool(pool)
    assert m.facts[OTHER].tensor_bytes == 3000
    assert m.facts[OTHER].parts == {"kv_pools[128].future_buffer[0]": 3000}
    assert not m.cross_check_ok
    assert str(m.tensor_bytes) in caplog.text and str(m.enumerated_bytes) in caplog.text


def fixed_reserve(nbytes, file="policy.kvp", line=7):
    return lambda model: Reserve(bytes=nbytes, model=model, file=file, line=line)


@pytest.fixture
def adapter(tmp_path):
    """Install the real hooks for one test, against the shared-memory ledger in the test's directory."""
    def install(reserve, unreserved, model="deepseek-v4-flash"):
        ledger = SharedLedger(tmp_path / "ledger", unreserved)
        state = hooks.AdapterState(reserve_source=fixed_reserve(reserve), connect=ledger.connect, model_name=model)
        hooks.install(state)
        return ledger, state

    yield install
    hooks.uninstall()


def free_memory_is(kvc, nbytes, monkeypatch):
    """The original probe reads this machine's free memory; pin it for the test."""
    import sglang.srt.mem_cache.kv_cache_configurator as mod

    monkeypatch.setattr(mod, "get_available_gpu_memory", lambda *a, **k: nbytes / GiB)


@pytest.mark.parametrize("shape,reserve,flags", [
    ("tiny", 48 * MiB, dict(max_running_requests=8)),
    ("flash", 700 * MiB, dict(max_running_requests=8, swa_full_tokens_ratio=0.1)),
    ("pro", 3 * GiB, dict(max_running_requests=16, chunked_prefill_size=2048)),
])
def test_the_budget_hook_makes_the_real_pool_fit_the_admitted_reserve(server_args, adapter, monkeypatch,
                                                                      shape, reserve, flags):
    geometry = SHAPES[shape]
    kvc = kv_cache_configurator(geometry, server_args(mem_fraction_static=0.9, **flags))
    free_memory_is(kvc, 64 * GiB, monkeypatch)
    ledger, state = adapter(reserve, {"cuda:0": 80 * GiB})
    built = build_pools_through_sglang(kvc, pre_model_load_memory_gb=80.0)
    config, pool = built.config, built.pool
    m = state.measurements[-1]
    assert m.footprint <= reserve  # the V4 pools and the request table
    assert reserve - m.footprint < 64 * MiB + len(m.tensors) * 2 * MiB  # and the reserve is used
    assert sum(tensor_bytes_by_pool(pool, built.req_to_token_pool).values()) == m.tensor_bytes
    (instance_id, report), = ledger.reports("cuda:0").items()
    assert instance_id == f"deepseek-v4-flash@{os.getppid()}/0"  # the engine (launcher) and the TP rank
    assert set(report) == {"swa", "c4", "c128", "indexer", "compressor_state", "req_to_token"}
    assert report["req_to_token"].tensor_bytes == built.req_to_token_pool.req_to_token.nbytes
    assert ledger.admitted("cuda:0") == {}  # the report replaced the admission
    assert ledger.held("cuda:0") == m.footprint
    assert pool.mem_usage == pytest.approx(m.pool_tensor_bytes / GiB)  # SGLang's metric: the KV pool
    assert config.max_total_num_tokens == state.admitted[0].reserve.tokens.full


def test_admission_is_refused_with_the_policy_line_and_the_figures(server_args, adapter, monkeypatch):
    kvc = kv_cache_configurator(TINY, server_args(max_running_requests=8))
    free_memory_is(kvc, 64 * GiB, monkeypatch)
    ledger, _ = adapter(48 * MiB, {"cuda:0": 100 * MiB})
    ledger.connect(hooks.InstanceIdentity(model="other", gpu="cuda:0", rank=0)).admit_static(60 * MiB)
    with pytest.raises(AdapterError) as exc:
        build_pool_through_sglang(kvc)
    msg = str(exc.value)
    assert "cannot admit 48 MiB" in msg and "40 MiB" in msg and "policy.kvp:7" in msg


def test_a_reserve_larger_than_the_free_memory_refuses_to_start(server_args, adapter, monkeypatch):
    kvc = kv_cache_configurator(TINY, server_args(max_running_requests=8, mem_fraction_static=0.9))
    free_memory_is(kvc, 1 * GiB, monkeypatch)
    adapter(2 * GiB, {"cuda:0": 80 * GiB})
    with pytest.raises(AdapterError, match=r"reserve 2 GiB at policy.kvp:7 needs .* only .* is free"):
        build_pool_through_sglang(kvc, pre_model_load_memory_gb=1.0)


def test_unsupported_engine_settings_are_refused_by_name(server_args, adapter, monkeypatch):
    kvc = kv_cache_configurator(TINY, server_args(max_running_requests=8))
    kvc.pp_size = 2
    free_memory_is(kvc, 64 * GiB, monkeypatch)
    adapter(48 * MiB, {"cuda:0": 80 * GiB})
    with pytest.raises(AdapterError, match=r"pipeline parallel \(pp_size=2\)"):
        build_pool_through_sglang(kvc)


def test_activation_with_a_wrong_version_fails_loudly(tmp_path):
    from kvpolicy.adapters.sglang_dsv4 import activate

    policy = tmp_path / "p.kvp"
    policy.write_text("version 1\n")
    env = AdapterEnv(enabled=True, policy=policy, model=None, ledger_dir=tmp_path)
    with pytest.raises(AdapterError, match=r"SGLang 0\.5\.22 is not a validated version.*validated: 0\.5\.23"):
        activate(env, version="0.5.22")


def run_sglang_plugins(tmp_path, env_extra, before=""):
    """A real Python process that runs SGLang's own ``load_plugins()``, as every SGLang process does."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.append({str(HERE.parents[1])!r})
        from tests.sglang import sglang_standins; sglang_standins.install()
        {before}
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator as K
        hooked = hasattr(K._profile_available_bytes, "__kvpolicy_hook__")
        print("HOOKED", hooked, "ADAPTER_IMPORTED", "kvpolicy.adapters.sglang_dsv4.hooks" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOLICY_", "SGLANG_PLUGINS"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


@pytest.fixture(scope="module")
def v4_policy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "p.kvp"
    path.write_text('version 1\nmodel "deepseek-v4-flash" { engine sglang; reserve 40 GiB }\n')
    return path


def test_plugin_installs_the_hooks_in_a_real_process_when_enabled(tmp_path, v4_policy_file):
    done = run_sglang_plugins(tmp_path, {"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(v4_policy_file)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HOOKED True ADAPTER_IMPORTED True" in done.stdout
    assert "DeepSeek-V4 adapter active" in done.stderr


def test_plugin_does_nothing_when_not_enabled(tmp_path):
    done = run_sglang_plugins(tmp_path, {})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HOOKED False ADAPTER_IMPORTED False" in done.stdout


def test_plugin_with_a_wrong_sglang_version_stops_the_process(tmp_path, v4_policy_file):
    done = run_sglang_plugins(
        tmp_path, {"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(v4_policy_file)},
        before="import sglang.version; sglang.version.__version__ = '0.5.22'",
    )
    assert done.returncode == 1
    assert "HOOKED" not in done.stdout  # SGLang's loader did not swallow the refusal
    assert "SGLang 0.5.22 is not a validated version" in done.stderr and "validated: 0.5.23" in done.stderr


def test_plugin_with_a_missing_hook_target_stops_the_process(tmp_path, v4_policy_file):
    done = run_sglang_plugins(
        tmp_path, {"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(v4_policy_file)},
        before=("import sglang.srt.mem_cache.kv_cache_configurator as m; "
                "delattr(m.KVCacheConfigurator, '_profile_available_bytes')"),
    )
    assert done.returncode == 1
    assert "KVCacheConfigurator._profile_available_bytes does not exist" in done.stderr


def test_plugin_without_a_policy_stops_the_process(tmp_path):
    done = run_sglang_plugins(tmp_path, {"KVPOLICY_ENABLE": "1"})
    assert done.returncode == 1 and "KVPOLICY_POLICY is not set" in done.stderr


def test_plan_with_a_policy_plans_what_the_budget_hook_builds(sglang_env, tmp_path, monkeypatch, capsys):
    """``kvpolicy plan --policy`` against the adapter at start-up: a real resolution, the real hooks reading
    the same policy, the real configurator and pools."""
    import json

    from kvpolicy.adapters.sglang_dsv4.launch import Hardware
    from kvpolicy.adapters.sglang_dsv4.ports import policy_reserve
    from kvpolicy.cli import main
    from tests.sglang.sglang_support import engine_reading, published_resolution, resolve_for_real, single_process_parallel

    model_dir = tmp_path / "tiny-v4"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "num_hidden_layers": 7,
        "num_nextn_predict_layers": 1, "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128,
        "sliding_window": 128, "max_position_embeddings": 65536, "compress_ratios": list(TINY_RATIOS),
    }))
    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\n\nmodel "tiny-v4" {\n  engine sglang\n  reserve 48 MiB\n}\n')
    flags = ["--max-running-requests", "8"]
    code = main(["plan", "--policy", str(policy), "--model", "tiny-v4", "--model-config",
                 str(model_dir / "config.json"), *flags, "--format", "json"])
    planned = json.loads(capsys.readouterr().out)
    assert code == 0 and planned["policy"] == {
        "policy": str(policy), "model": "tiny-v4", "block": "tiny-v4", "line": 3, "gpu": "cuda:0", "reserve": 48 * MiB,
    }

    real = resolve_for_real(model_dir, Hardware(), flags)
    ledger = SharedLedger(tmp_path / "ledger", {"cuda:0": 80 * GiB})
    env = AdapterEnv(enabled=True, policy=policy, model="tiny-v4", ledger_dir=ledger.root)
    state = hooks.AdapterState(reserve_source=policy_reserve(env), connect=ledger.connect, model_name="tiny-v4")
    with single_process_parallel(), published_resolution(real):
        _live, _dtype, kvc = engine_reading(real, device="cpu")
        free_memory_is(kvc, 64 * GiB, monkeypatch)
        hooks.install(state)
        try:
            build_pools_through_sglang(kvc)
        finally:
            hooks.uninstall()
    m = state.measurements[-1]
    assert planned["budget"] == state.admitted[0].reserve.budget  # the budget the hook handed SGLang
    assert {k: p["bytes"] for k, p in planned["pools"].items() if p["tensors"]} == {
        k: f.tensor_bytes for k, f in m.facts.items()
    }
    assert {k: p["footprint"] for k, p in planned["pools"].items() if p["tensors"]} == {
        k: f.bytes for k, f in m.facts.items()
    }
    assert planned["total_footprint"] == m.footprint <= 48 * MiB
    assert planned["pools"]["req_to_token"]["bytes"] == 9 * (65536 + 4) * 4  # 8 requests + 1 padding row
