"""``--kv-cache-dtype`` as vLLM 0.32.0 resolves it for a checkpoint's quantization config, and the quantized models
it builds (``planning/kv_dtype.py``; tests/vllm/test_vllm_kv_dtype.py and test_vllm_plan_quantized.py run 0.33.0).

vLLM 0.32 resolves the cache dtype with the same code as 0.33 (``resolve_kv_cache_dtype_string``,
``get_kv_cache_quant_algo_string``), but normalises a ModelOpt export named by its producer without knowing
MIXED_PRECISION, and its CPU MLA attention takes an fp8 cache (0.33's refuses it). ``kv_dtype_probe.py`` runs
vLLM 0.32's functions on random quantization configs, and builds a few quantized models on the meta device, in one
process of the e2e venv's python; the plan for 0.32 must give the same dtypes and page sizes, and refuse where
vLLM refuses.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config, model_family, model_specs
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import kv_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.vllm.quant_configs import FP8_SCHEME, kv_quant_configs
from tests.vllm.test_vllm_kv_dtype import FLAGS, ours
from tests.vllm.vllm_paths import CONFIGS

pytestmark = [pytest.mark.vllm_engine]

HERE = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_RANDOM_EXAMPLES", "40")) * 5
"""Resolutions, all in one process (microseconds each once vLLM is imported)."""


def probe(python: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = subprocess.run([str(python), str(HERE / "kv_dtype_probe.py")], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-4000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), out.stderr[-4000:]
    return results


def drawn(examples: int) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(quant=kv_quant_configs(), flag=st.sampled_from(FLAGS))
    def collect(quant: dict[str, Any] | None, flag: str) -> None:
        cases.append({"quant": quant, "flag": flag})

    collect()
    return cases


def test_the_kv_cache_dtype_is_vllm_032s_for_random_quantization_configs(e2e_python: Path) -> None:
    cases = drawn(EXAMPLES)
    refused = 0
    for case, real in zip(cases, probe(e2e_python, cases)):
        mine = ours(case["quant"], case["flag"], "0.32.0")
        if "error" in real:
            assert isinstance(mine, ModelSpecError), (case, real)
            refused += 1
        elif isinstance(mine, ModelSpecError):  # what vLLM reads under auto alone, with another flag
            assert case["flag"] != "auto", (case, real, mine)
        else:
            assert mine == (real["resolved"], real["algo"]), case
    assert 0 < refused < len(cases)


SMALL = {"num_hidden_layers": 2, "hidden_size": 384, "intermediate_size": 192, "vocab_size": 3072}
QWEN = {**json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text()), **SMALL,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}
DEEPSEEK = {**json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text()), **SMALL,
            "first_k_dense_replace": 1, "moe_intermediate_size": 96, "n_routed_experts": 8, "num_experts_per_tok": 2}
CT = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}, "ignore": ["lm_head"],
      "kv_cache_scheme": FP8_SCHEME}
MODELOPT = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
QUARK_FP8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}


def quark(exclude: list[str], kv_group: bool = False) -> dict[str, Any]:
    """A Quark FP8 checkpoint, with a KV config for its k/v projections where ``kv_group``."""
    group = ["*k_proj", "*v_proj"] if kv_group else []
    return {"quant_method": "quark", "export": {"kv_cache_group": group}, "exclude": exclude,
            "global_quant_config": {"weight": QUARK_FP8, "input_tensors": QUARK_FP8, "output_tensors": None},
            "layer_quant_config": {g: {"weight": QUARK_FP8, "input_tensors": QUARK_FP8, "output_tensors": QUARK_FP8}
                                   for g in group}, "layer_type_quant_config": {}}


BUILDS = [  # (name, model config, quantization config, --kv-cache-dtype)
    ("compressed-tensors, standard", QWEN, CT, "auto"),
    ("compressed-tensors, MLA", DEEPSEEK, CT, "auto"),
    ("ModelOpt, standard", QWEN, MODELOPT, "auto"),
    ("ModelOpt, MLA (0.32's CPU MLA takes fp8)", DEEPSEEK, MODELOPT, "auto"),
    ("Fp8Config, fp8_e5m2", QWEN, {"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_e5m2"),
    ("compressed-tensors without a scheme, fp8_e5m2", QWEN, {**CT, "kv_cache_scheme": None}, "fp8_e5m2"),
    ("ModelOpt, MLA, fp8_e5m2", DEEPSEEK, MODELOPT, "fp8_e5m2"),
    ("Fp8Config, MLA, fp8_e5m2 (no KV scales in MLA layers)", DEEPSEEK,
     {"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_e5m2"),
    ("Quark with a KV group: auto stays the model's", QWEN, quark(["lm_head"], kv_group=True), "auto"),
    ("Quark, fp8_e5m2, layer 1's attention not excluded", QWEN, quark(["lm_head", "model.layers.0.self_attn.attn"]),
     "fp8_e5m2"),
    ("Quark, fp8_e5m2, every attention layer excluded", QWEN, quark(["lm_head", "re:.*attn$"]), "fp8_e5m2"),
]


def test_quantized_models_store_what_the_plan_says_under_vllm_032(e2e_python: Path, tmp_path: Path) -> None:
    cases = []
    for i, (_, model, quant, flag) in enumerate(BUILDS):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**model, "quantization_config": quant}))
        cases.append({"config_dir": str(folder), "flag": flag, "block_size": 16})
    for (name, _, _, flag), case, real in zip(BUILDS, cases, probe(e2e_python, cases)):
        config = load_config(Path(case["config_dir"]) / "config.json")
        settings = PlanSettings(max_model_len=4096, block_size=16, kv_cache_dtype=flag)
        if "error" in real:
            assert "fp8_e5m2 kv-cache is not supported with fp8 checkpoints" in real["error"], (name, real)
            with pytest.raises(ModelSpecError, match="vLLM refuses fp8_e5m2 with them"):
                make_plan(config, settings, budget=1 << 30, engine_version="0.32.0", platform="cpu")
            continue
        make_plan(config, settings, budget=1 << 30, engine_version="0.32.0", platform="cpu")
        assert real["cache_dtype"] == kv_dtype(config, flag, model_family(config)).layers, name
        pages = [spec.page_size_bytes for spec in model_specs(config, settings).layers.values()]
        assert pages == [page for _, page in real["layers"].values()], name
