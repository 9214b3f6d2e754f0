"""The plugin through vLLM's real entry-point loading, in real subprocesses.

Each test runs a script in a fresh interpreter that calls vLLM's own
``load_general_plugins()``, which finds kvpolicy through its installed package
metadata (``pip install -e .``). The GPU worker's model runner and memory snapshot
are stand-ins (no GPU here); ``Worker.determine_available_memory`` itself is vLLM's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.vllm_adapter.identity import InstanceKey
from kvpolicy.adapters.vllm_adapter.static import sizing
from kvpolicy.adapters.vllm_adapter.ledger import set_static_ledger
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.runtime.errors import AdmissionRefused
from kvpolicy.units import GiB
from tests.support.ledgers import SharedLedger
from tests.support.processes import last_json

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]

QWEN = CONFIGS / "qwen3-8b"
POLICY = """\
version 1
model "qwen3-8b" {
  engine vllm
  reserve 3 GiB
}
"""

# Builds a real gpu Worker on the CPU and asks it for its KV budget.
WORKER_SCRIPT = """
import json, os, sys
from types import SimpleNamespace
from vllm.plugins import load_general_plugins
from vllm.v1.worker.gpu_worker import Worker
from kvpolicy.runtime.directory import LedgerDir

load_general_plugins()  # vLLM's own loader: finds kvpolicy through its entry point
hooked = getattr(Worker.determine_available_memory, "__kvpolicy_hook__", False)
# The plugin admits in the shared-memory ledger under KVPOLICY_LEDGER_DIR, which the test made.

from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, load_format="dummy", max_model_len=4096).create_engine_config()
worker = Worker(cfg, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")

class ModelRunner:  # stands in for the GPU model runner: records the profile run
    profiled = 0
    def profile_run(self, **kwargs):
        ModelRunner.profiled += 1
worker.model_runner = ModelRunner()
worker.init_snapshot = SimpleNamespace(free_memory=100 * 2**30)  # stands in for the CUDA snapshot

try:
    available = worker.determine_available_memory() if hooked else None
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
print(json.dumps({
    "hooked": hooked,
    "available": available,
    "kv_cache_memory_bytes": worker.cache_config.kv_cache_memory_bytes,
    "profiled": ModelRunner.profiled,
    "admitted": {v.id: [v.gpu, v.static_admitted] for v in LedgerDir(os.environ["KVPOLICY_LEDGER_DIR"]).read().instances()}
                if "KVPOLICY_LEDGER_DIR" in os.environ else {},
}))
"""


def run_script(script: str, *args: str, env: dict[str, str] | None = None, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_")}
    full_env.update({"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "3"})
    if pythonpath:
        full_env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, timeout=300, env=full_env, check=False,
    )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.kvp"
    path.write_text(POLICY)
    return path


def test_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    points = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert points.get("kvpolicy") == "kvpolicy.adapters.vllm_adapter.plugin:register"


def test_plugin_sizes_the_kv_cache_from_the_policy(policy_file: Path) -> None:
    ledger = SharedLedger(policy_file.parent / "ledger", {"cuda:3": 80 * GiB})
    result = run_script(
        WORKER_SCRIPT, str(QWEN),
        env={"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(policy_file), "KVPOLICY_MODEL": "qwen3-8b",
             "KVPOLICY_ENGINE_ID": "qwen-test", "KVPOLICY_LEDGER_DIR": str(ledger.root)},
        pythonpath=[REPO],
    )
    out = last_json(result)
    assert "error" not in out, out
    assert out["hooked"] is True
    # vLLM's own determine_available_memory returns the admitted reserve, after its profile run.
    assert out["available"] == out["kv_cache_memory_bytes"] == 3 * GiB
    assert out["profiled"] == 1
    assert out["admitted"] == {"qwen-test/0": ["cuda:3", 3 * GiB]}  # local rank 0 is GPU 3 here
    # And what vLLM then plans from it is what `kvpolicy plan --budget 3GiB` says.
    plan = make_plan(load_config(QWEN / "config.json"), PlanSettings(max_model_len=4096), budget=out["available"])
    assert plan.total_bytes <= 3 * GiB < plan.total_bytes + plan.bytes_per_block


def test_admission_refused_stops_the_start(policy_file: Path) -> None:
    ledger = SharedLedger(policy_file.parent / "ledger", {"cuda:3": 2 * GiB})
    result = run_script(
        WORKER_SCRIPT, str(QWEN), env={"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(policy_file),
                                       "KVPOLICY_MODEL": "qwen3-8b", "KVPOLICY_LEDGER_DIR": str(ledger.root)},
        pythonpath=[REPO],
    )
    error = last_json(result)["error"]
    # The hook (the adapter's edge) turns the ledger's refusal into the AdapterError that stops the start.
    assert error.startswith("AdapterError: kvpolicy ledger: cannot admit 3 GiB"), error
    assert "on cuda:3: unreserved = C − H − U − R − G" in error and "= 2 GiB (2147483648 B)" in error
    assert f"{policy_file}:4" in error  # where the policy sets the reserve
    assert ledger.instances("cuda:3") == []  # the refused rank left nothing behind


def test_disabled_plugin_installs_nothing() -> None:
    result = run_script(WORKER_SCRIPT, str(QWEN), env={"KVPOLICY_ENABLE": "0"}, pythonpath=[REPO])
    out = last_json(result)
    assert out["hooked"] is False and out["kv_cache_memory_bytes"] is None


def test_wrong_vllm_version_fails_loudly(tmp_path: Path) -> None:
    """A vllm whose metadata says 0.31.0: vLLM's plugin loader lets the error through."""
    dist = tmp_path / "vllm-0.31.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    result = run_script(
        "from vllm.plugins import load_general_plugins\nload_general_plugins()\nprint('started')\n",
        env={"KVPOLICY_ENABLE": "1"}, pythonpath=[tmp_path],
    )
    assert result.returncode != 0 and "started" not in result.stdout
    assert "AdapterError: kvpolicy: vLLM 0.31.0 is not a validated version" in result.stderr
    assert "validated: 0.32.0, 0.33.0" in result.stderr


def test_missing_hook_target_fails_loudly() -> None:
    script = """
    from vllm.v1.worker.gpu_worker import Worker
    del Worker.determine_available_memory  # as if a vLLM release renamed it
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    print('started')
    """
    result = run_script(script, env={"KVPOLICY_ENABLE": "1"})
    assert result.returncode != 0 and "started" not in result.stdout
    assert "cannot install the KV cache sizing hook: Worker.determine_available_memory does not exist" in result.stderr


# The whole start of one rank on a CPU, against the real shared-memory ledger: vLLM's
# own Worker.determine_available_memory and Worker.initialize_from_config run (their
# model runner allocates with vLLM's allocate_kv_cache on the CPU), vLLM plans in between.
END_TO_END_SCRIPT = """
import json, sys
from types import SimpleNamespace
import torch
sys.path.append(sys.argv[1])
from tests.vllm.real_vllm import Case, layer_specs, vllm_config
from vllm.plugins import load_general_plugins
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.gpu_worker import Worker
from vllm.v1.worker.utils import allocate_kv_cache
from kvpolicy.runtime.client import resolve_access, resolve_ledger_dir
from kvpolicy.runtime.ledger import GpuLedger

load_general_plugins()
# No CUDA driver on this machine: kvpolicy.adapters.ledger_port.measure_gpu would raise from
# cuda-python's driver loader (it only expects ImportError); hide cuda.bindings instead.
sys.modules["cuda.bindings"] = None
ledger = GpuLedger.open(resolve_ledger_dir(), "cuda:3", resolve_access())
ledger.provide_figures(capacity=8 * 2**30, headroom=0, other_used=0)  # no GPU to measure here

case = Case("qwen3-8b", 16, max_model_len=1024, max_num_batched_tokens=1024)
cfg = vllm_config(case)
specs = layer_specs(case)
worker = Worker(cfg, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")

class ModelRunner:  # stands in for the GPU model runner: profiles nothing, allocates on the CPU
    def profile_run(self, **kwargs):
        pass
    def initialize_kv_cache(self, kv_cache_config, kv_cache_allocation_context=None):
        layout = KVCacheLayout[kv_cache_config.kv_cache_layout]
        self.kv_caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout)
worker.model_runner = ModelRunner()
worker.init_snapshot = SimpleNamespace(free_memory=8 * 2**30)

available = worker.determine_available_memory()
cfg.cache_config.kv_cache_layout = "LBNHC"
groups = get_global_kv_cache_groups(cfg, [dict(specs)])
(kv_cache_config,) = get_kv_cache_configs(cfg, [dict(specs)], [available], groups)
kv_cache_config.kv_cache_layout = "LBNHC"
before = {v.id: v.runtime_reserved for v in ledger.slots()[0]}
worker.initialize_from_config(kv_cache_config)
storage = next(iter(worker.model_runner.kv_caches.values())).untyped_storage()
views, _ = ledger.slots()
(slot,) = views
print(json.dumps({
    "available": available,
    "num_blocks": kv_cache_config.num_blocks,
    "buffer": storage.nbytes(),
    "reserved_before_report": before,
    "slot": {"id": slot.id, "engine": slot.engine, "engine_id": slot.engine_id, "model": slot.model,
             "static_admitted": slot.static_admitted, "runtime_reserved": slot.runtime_reserved,
             "pools": {k: [p.bytes, p.tensor_bytes] for k, p in slot.pools.items()}},
}))
"""


def test_end_to_end_on_the_real_ledger(tmp_path: Path) -> None:
    policy = tmp_path / "policy.kvp"
    policy.write_text(POLICY.replace("reserve 3 GiB", "reserve 256 MiB"))
    result = run_script(
        END_TO_END_SCRIPT, str(REPO),
        env={"KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(policy), "KVPOLICY_MODEL": "qwen3-8b",
             "KVPOLICY_ENGINE_ID": "qwen-e2e", "KVPOLICY_LEDGER_DIR": str(tmp_path / "ledger")},
    )
    out = last_json(result)
    reserve = 256 * 2**20
    assert out["available"] == reserve
    assert out["reserved_before_report"] == {"qwen-e2e/0": reserve}  # the admission counts until the report
    slot = out["slot"]
    assert (slot["id"], slot["engine"], slot["engine_id"], slot["model"]) == ("qwen-e2e/0", "vllm", "qwen-e2e", "qwen3-8b")
    pools = slot["pools"]
    assert sum(tensor for _, tensor in pools.values()) == out["buffer"]  # the real CPU allocation
    assert slot["static_admitted"] == 0  # the report replaced the admission
    assert slot["runtime_reserved"] == sum(b for b, _ in pools.values()) <= reserve
    assert set(pools) == {"full", "padding", "free_blocks"}
    assert pools["full"] == [0, 0] and pools["free_blocks"][0] == out["buffer"] - out["buffer"] // out["num_blocks"]


# ------------------------------------------------ sizing rules, in process, on a real CacheConfig


@pytest.fixture
def worker():
    from vllm.config import CacheConfig

    vllm_config = type("Cfg", (), {})()
    vllm_config.model_config = type("M", (), {"served_model_name": "qwen3-8b", "model": "/m"})()
    vllm_config.parallel_config = type("P", (), {"data_parallel_rank": 0, "assigned_physical_gpu_ids": None,
                                                 "world_size": 1, "data_parallel_size": 1})()
    cache = CacheConfig()
    return type(
        "W", (), {"cache_config": cache, "vllm_config": vllm_config, "parallel_config": vllm_config.parallel_config,
                  "rank": 1, "local_rank": 0},
    )()


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("KVPOLICY_ENABLE", "1")
    monkeypatch.setenv("KVPOLICY_ENGINE_ID", "eng")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    ledger = SharedLedger(tmp_path / "ledger", {"cuda:2": 10 * GiB})
    set_static_ledger(ledger.vllm())
    sizing.forget_admissions()
    yield ledger
    set_static_ledger(None)
    sizing.forget_admissions()


def test_size_kv_cache_admits_then_sets_the_switch(worker, enabled) -> None:
    admitted = sizing.size_kv_cache(worker, reserve_of=lambda env, model: 4 * GiB)
    assert admitted == worker.cache_config.kv_cache_memory_bytes == 4 * GiB
    assert enabled.admitted("cuda:2") == {InstanceKey("eng", "qwen3-8b", rank=1).id: 4 * GiB}
    # Profiling again (wake-up) keeps the one admission.
    assert sizing.size_kv_cache(worker, reserve_of=lambda env, model: 4 * GiB) == 4 * GiB
    assert enabled.unreserved("cuda:2") == 6 * GiB


def test_budget_is_whole_allocator_granules(worker, enabled) -> None:
    """An odd reserve: vLLM gets whole 2 MiB granules, so its rounded-up buffer fits the admission."""
    odd = 3 * GiB + 12_345
    assert sizing.size_kv_cache(worker, reserve_of=lambda env, model: odd) == 3 * GiB
    assert worker.cache_config.kv_cache_memory_bytes == 3 * GiB
    assert enabled.unreserved("cuda:2") == 10 * GiB - odd  # the ledger holds what it admitted


def test_block_override_is_refused(worker, enabled) -> None:
    worker.cache_config.num_gpu_blocks_override = 1000
    with pytest.raises(AdapterError, match="--num-gpu-blocks-override=1000 would size"):
        sizing.size_kv_cache(worker, reserve_of=lambda env, model: GiB)
    assert enabled.admitted("cuda:2") == {}


def test_conflicting_kv_cache_memory_is_refused(worker, enabled) -> None:
    worker.cache_config.kv_cache_memory_bytes = 2 * GiB
    with pytest.raises(AdapterError, match="disagrees with the policy's reserve of 1073741824 bytes"):
        sizing.size_kv_cache(worker, reserve_of=lambda env, model: GiB)


def test_admission_refusal_has_figures(worker, enabled) -> None:
    with pytest.raises(AdmissionRefused, match=r"cannot admit 12 GiB .* = 10 GiB \(10737418240 B\)"):
        sizing.size_kv_cache(worker, reserve_of=lambda env, model: 12 * GiB)
    assert worker.cache_config.kv_cache_memory_bytes is None


def test_plan_policy_gives_vllm_the_budget_the_adapter_sets(worker, enabled, tmp_path, monkeypatch, capsys) -> None:
    """``kvpolicy plan --policy`` against the adapter's own start-up sizing (the real policy read, the real
    admission, ``kv_cache_memory_bytes`` set on a real CacheConfig) for a reserve of no whole granules;
    vLLM's own planning of that budget then gives the plan's blocks."""
    import json

    from kvpolicy.cli import main
    from tests.vllm.real_vllm import Case, real_plan

    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\n\nmodel "qwen3-8b" {\n  engine vllm\n  reserve 5001 MiB\n}\n')
    monkeypatch.setenv("KVPOLICY_POLICY", str(policy))
    set_by_adapter = sizing.size_kv_cache(worker)
    assert set_by_adapter == worker.cache_config.kv_cache_memory_bytes == 5000 * 2**20
    assert main(["plan", "--policy", str(policy), "--model", "qwen3-8b", "--gpu", "cuda:2", "--model-config",
                 str(CONFIGS / "qwen3-8b" / "config.json"), "--max-model-len", "4096", "--format", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["budget"] == set_by_adapter
    real = real_plan(Case("qwen3-8b", 16, max_model_len=4096), set_by_adapter)
    assert (planned["num_blocks"], planned["bytes_per_block"]) == (real.kv_cache_config.num_blocks, real.bytes_per_block)
