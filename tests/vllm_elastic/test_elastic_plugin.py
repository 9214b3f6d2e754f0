"""The elastic KV cache through vLLM's real plugin loading, in fresh processes, on the real ledger.

``engine_script.py`` runs one engine's start and a few hundred steps of vLLM's real
``Scheduler`` (see its docstring for what is real and what stands in); these tests
check what it reports and what the ledger shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import last_json

pytestmark = pytest.mark.vllm

HERE = Path(__file__).parent
REPO = HERE.parents[1]  # the scripts import tests.vllm.real_vllm from it
MiB = 2**20
GiB = 2**30

POLICY = """\
version 1
model "qwen3-8b" {
  engine vllm
  min 16 MiB
  max 1 GiB
  pool full { owner elastic }
}
"""


def run(script: Path | str, *args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_")}
    full.update({"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "3", **env})
    cmd = [sys.executable, str(script), *args] if isinstance(script, Path) else [sys.executable, "-c", script, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, check=False)


def engine_env(tmp_path: Path, policy: str = POLICY) -> dict[str, str]:
    path = tmp_path / "policy.kvp"
    path.write_text(policy)
    return {
        "KVPOLICY_ENABLE": "1", "KVPOLICY_POLICY": str(path), "KVPOLICY_MODEL": "qwen3-8b",
        "KVPOLICY_ENGINE_ID": "qwen-e2e", "KVPOLICY_LEDGER_DIR": str(tmp_path / "ledger"),
        "KVPOLICY_REPORT_INTERVAL": "0",
    }


def test_an_elastic_engine_end_to_end(tmp_path: Path) -> None:
    out = last_json(run(HERE / "engine_script.py", str(REPO), "300", env=engine_env(tmp_path)))
    # vLLM planned the policy's max, as address space, in the block-outermost layout.
    assert out["layout_env"] == "BLHNC"
    assert out["available"] == out["virtual"] == 1 * GiB and out["guarantee"] == 16 * MiB
    assert out["num_blocks"] == 1 * GiB // out["bytes_per_block"]
    assert out["view_in_buffer"] and out["pool_class"] == "BlockPool" and out["elastic_class"] == "ElasticPool"
    # The null block's chunks: two 2 MiB chunks for a 2.25 MiB block; runtime-owned, all of R.
    assert out["pinned"] == 4 * MiB
    slot = out["slot"]
    assert slot["elastic"] and slot["engine"] == "vllm"
    assert slot["static_admitted"] == 0 and slot["runtime_reserved"] == out["pinned"]
    assert slot["pools"]["padding"] == ["runtime", out["pinned"]]
    assert slot["pools"]["full"][0] == "elastic"
    # Served under the limits the controller published: grew to 96 MiB, deferred 24 MiB, then applied.
    assert out["peak"] == 96 * MiB
    assert [2, "deferred"] in out["acks"] and [2, "applied"] in out["acks"]
    assert out["final_held"] <= 24 * MiB and slot["mapped"] == out["final_held"]
    assert out["refusals"].get("limit", 0) > 0 and out["finished"] > 20
    # The live split the engine core sent equals what the ledger's elastic `used` counts.
    assert out["live_pools"]["full"][1] == out["live_used"] > 0
    assert out["live_used"] % out["bytes_per_block"] == 0
    assert slot["idle"] < 60


WORKER_SCRIPT = """
import json, sys
from types import SimpleNamespace
sys.path.append(sys.argv[1])
from tests.vllm.real_vllm import Case, vllm_config
from vllm.plugins import load_general_plugins
from vllm.v1.worker.gpu_worker import Worker
load_general_plugins()
sys.modules["cuda.bindings"] = None
from kvpolicy.runtime.client import resolve_access, resolve_ledger_dir
from kvpolicy.runtime.ledger import GpuLedger
GpuLedger.open(resolve_ledger_dir(), "cuda:3", resolve_access()).provide_figures(capacity=8 * 2**30)
cfg = vllm_config(Case(sys.argv[2], 16, max_model_len=1024, max_num_batched_tokens=1024))
if sys.argv[3] != "default":
    cfg.parallel_config.distributed_executor_backend = sys.argv[3]
worker = Worker(cfg, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")
worker.model_runner = SimpleNamespace(profile_run=lambda **kw: None)
worker.init_snapshot = SimpleNamespace(free_memory=8 * 2**30)
try:
    print(json.dumps({"available": worker.determine_available_memory()}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def test_multi_process_executor_sizes_the_rank_like_one_process(tmp_path: Path) -> None:
    """vLLM's CPU platform runs even one worker in its own process ('mp'): the rank is sized from the
    policy's max as with 'uni' (the engine core keeps the books of its buffer, ``elastic.group``)."""
    out = last_json(run(WORKER_SCRIPT, str(REPO), "qwen3-8b", "default", env=engine_env(tmp_path)))
    assert out == {"available": 1 * GiB}


def test_percent_max_resolves_against_the_gpu_capacity(tmp_path: Path) -> None:
    policy = POLICY.replace("max 1 GiB", "max 25%")
    out = last_json(run(WORKER_SCRIPT, str(REPO), "qwen3-8b", "uni", env=engine_env(tmp_path, policy)))
    assert out == {"available": 2 * GiB}  # 25% of the 8 GiB the ledger's figures say


def test_deepseek_v4_pools_stay_runtime_owned(tmp_path: Path) -> None:
    policy = 'version 1\nmodel "qwen3-8b" {\n  engine vllm\n  pool c4 { owner elastic }\n}\n'
    out = last_json(run(WORKER_SCRIPT, str(REPO), "qwen3-8b", "uni", env=engine_env(tmp_path, policy)))
    assert "cannot run pool 'c4' elastically" in out["error"]


V2_SCRIPT = """
import json, sys
sys.path.append(sys.argv[1])
import torch
from tests.vllm.real_vllm import Case, layer_specs, vllm_config, real_plan
from tests.vllm_elastic.elastic_harness import make_buffer
from vllm.v1.worker.gpu.attn_utils import init_kv_cache
from kvpolicy.adapters.vllm_adapter.elastic.buffer import allocation_context, check_views
from kvpolicy.alloc import HostDriver, StaticLimit

case = Case("qwen3-8b", 16, max_model_len=1024, layout="BLHNC", max_num_batched_tokens=1024)
cfg = vllm_config(case)
plan = real_plan(case, 512 * 2**20)
kv = plan.kv_cache_config
kv.kv_cache_layout = "BLHNC"
cfg.cache_config.kv_cache_layout = "BLHNC"
buffer = make_buffer(kv, HostDriver(capacity=2**30), 2 * 2**20, StaticLimit(64 * 2**20))
ctx = allocation_context(buffer, "cpu")
forward = cfg.compilation_config.static_forward_context
caches = init_kv_cache(forward, kv, torch.device("cpu"), [16], cfg, kv_cache_allocation_context=ctx)
bound = {name: forward[name].kv_cache for name in kv.kv_cache_groups[0].layer_names}
check_views(buffer, bound)
print(json.dumps({"served": ctx.served, "layers": len(bound), "in_buffer": all(
    buffer.va <= t.data_ptr() < buffer.va + buffer.size for t in caches.values())}))
"""


def test_model_runner_v2_allocates_through_the_same_context(tmp_path: Path) -> None:
    """vLLM's default runner on GPUs (Model Runner V2, vllm/v1/worker/gpu) allocates with its own
    init_kv_cache: under the elastic allocation context its buffer is the arena too."""
    out = last_json(run(V2_SCRIPT, str(REPO), env={}))
    assert out == {"served": 1, "layers": 36, "in_buffer": True}
