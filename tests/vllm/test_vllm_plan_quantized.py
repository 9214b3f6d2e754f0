"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's own planning for random quantized checkpoints.

Each example draws a config as tests/vllm/test_vllm_plan_random.py does (Qwen3-shaped standard attention,
Gemma-3-shaped sliding-window and full layers, or DeepSeek-V2-shaped MLA) and gives it a quantization config
(``quant_configs.planned_quant_configs``): ModelOpt FP8 with KV algorithms in random case (fp8, nvfp4, unknown)
or KV schemes, flat in config.json or nested, in config.json or in an hf_quant_config.json beside it;
compressed-tensors with a valid, an invalid or no ``kv_cache_scheme``; Fp8Config; Quark; or none. The launch is
drawn as there, mostly with ``--kv-cache-dtype auto``, and at times bfloat16, fp8 or fp8_e5m2. vLLM builds its
real ``VllmConfig`` and the real model on the meta device (quantized layers included: their weights' kernels
are vLLM's CPU ones), and plans it. The plan must agree on every figure or refuse where vLLM refuses, for vLLM's
reason (``plan_and_compare``), and vLLM's cache dtype once the model is built must be what the plan says its
layers store (``kv_dtype``): ModelOpt's KV algorithm under auto, fp8 for a compressed-tensors scheme in
standard attention, the model's dtype in MLA layers.

The ``quant_method`` is drawn in random case, at times replaced by one vLLM does not know (bitsandbytes, GGUF,
random text), which vLLM refuses as it builds its model config; ``--dtype float32`` with a method whose kernels take
only 16-bit activations (fp8, ModelOpt, Quark) is refused once its configs are built. The example count
follows KVPOLICY_PLAN_RANDOM_EXAMPLES (default 40) as for the other random plans: half of it for each of the
three groups of methods.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config, model_family
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import ModelSpecError, kv_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.vllm.quant_configs import FP8_SCHEME, PLANNED_KINDS, planned_quant_configs
from tests.vllm.test_vllm_plan_random import (
    EXAMPLES,
    REFUSALS,
    SETTINGS,
    Launch,
    attention,
    hybrid,
    launches,
    mla,
    plan_and_compare,
)
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

QUANT_REFUSALS = {
    **REFUSALS,
    "fp8_e5m2 kv-cache is not supported with fp8 checkpoints": "vLLM refuses fp8_e5m2 with them",
    "Currently supported kv cache quantization is num_bits=8, type=float": "takes num_bits 8 and type float only",
    "is not a valid QuantizationStrategy": "is no compressed-tensors strategy",
    "Invalid strategy for compressed-tensors KV cache": "is a strategy it does not take",
    "Only support symmetric scaling factor": "takes symmetric scales only",
    "Unknown quantization method": "knows no such quantization method",
    "is not supported for quantization method": "is not supported for quantization method",
}
"""vLLM's refusals of a checkpoint's KV quantization → the plan's words (with the others of random configs)."""
KV_DTYPES = ["auto", "auto", "auto", "auto", "bfloat16", "fp8", "fp8_e5m2"]
UNKNOWN_METHODS = ["bitsandbytes", "gguf", "hqq", "intel/auto-round", "ptpc_fp8"]
"""Methods vLLM 0.33 does not know (some older or other platforms' vLLMs do)."""


def method_names(method: str) -> st.SearchStrategy[str]:
    """``method`` in random case (vLLM lower-cases it), or mostly so: at times a method vLLM does not know."""
    cased = st.lists(st.booleans(), min_size=len(method), max_size=len(method)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(method, upper, strict=True)))
    unknown = st.sampled_from(UNKNOWN_METHODS) | st.text("abcxyz_-", min_size=1, max_size=8)
    return st.one_of(st.just(method), cased, unknown)
FAMILIES = {  # the drawn config's shape → (its strategy, the block sizes vLLM's CPU backends keep for it)
    "standard": (attention("qwen3-8b"), [16, 32, 64]),
    "sliding": (hybrid(), [32, 64, 128]),
    "mla": (mla(), [16]),
}


@pytest.mark.parametrize("kinds", sorted(PLANNED_KINDS))
@settings(SETTINGS, max_examples=max(EXAMPLES // 2, 5))
@given(data=st.data(), shape=st.sampled_from(sorted(FAMILIES)), in_file=st.booleans(),
       budget=st.integers(1 << 20, 64 << 30))
def test_random_quantized_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, kinds: str,
                                                    data: st.DataObject, shape: str, in_file: bool,
                                                    budget: int) -> None:
    """Each group of quantization methods (ModelOpt, compressed-tensors, the others) by turns, half the random
    plans' examples each."""
    kind, quantization = data.draw(planned_quant_configs(PLANNED_KINDS[kinds]))
    strategy, block_sizes = FAMILIES[shape]
    config = data.draw(strategy)
    if quantization is not None and isinstance(quantization.get("quant_method"), str):
        quantization = {**quantization, "quant_method": data.draw(method_names(quantization["quant_method"]))}
    files = {}
    if quantization is not None and in_file and "producer" in quantization:  # ModelOpt 0.29's own file
        files["hf_quant_config.json"] = quantization
    elif quantization is not None:
        config["quantization_config"] = quantization
    launch = data.draw(launches(config, block_sizes, KV_DTYPES))
    event(f"{shape}, {kind}{' in hf_quant_config.json' if files else ''}, --kv-cache-dtype {launch.kv_cache_dtype}")
    if refused_as_nvfp4(tmp_path_factory, config, files, launch):
        return
    real = plan_and_compare(tmp_path_factory, config, budget, launch, QUANT_REFUSALS, files)
    if real is None:
        return
    mine = planned_config(tmp_path_factory, config, files)
    kv = kv_dtype(mine, launch.kv_cache_dtype, model_family(mine))
    # What vLLM's cache config says once its layers are built (a compressed-tensors layer writes its fp8 there).
    assert real.cache_config.cache_dtype == kv.layers, (kind, quantization, launch)
    event(f"planned: {shape} stores {kv.layers} for {launch.kv_cache_dtype}")


def folder_of(tmp_path_factory: pytest.TempPathFactory, config: dict, files: dict) -> Path:
    """A folder with ``config`` as its config.json and ``files`` beside it (name → JSON)."""
    folder = tmp_path_factory.mktemp("quantized-config")
    (folder / "config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    return folder


def planned_config(tmp_path_factory: pytest.TempPathFactory, config: dict, files: dict) -> dict:
    """``config`` as the plan reads it from its folder (with hf_quant_config.json beside it)."""
    return load_config(folder_of(tmp_path_factory, config, files) / "config.json")


def refused_as_nvfp4(tmp_path_factory: pytest.TempPathFactory, config: dict, files: dict, launch: Launch) -> bool:
    """An auto cache a ModelOpt checkpoint makes nvfp4, which the plan refuses, naming the checkpoint's
    quantization config (vLLM's CPU backends refuse it too); False for any other launch."""
    from tests.vllm.real_vllm import Case, layer_specs

    folder = folder_of(tmp_path_factory, config, files)
    mine = load_config(folder / "config.json")
    try:
        kv_dtype(mine, launch.kv_cache_dtype, model_family(mine))
    except ModelSpecError as exc:
        if "nvfp4" not in str(exc):
            raise
        assert "kvpolicy does not plan" in str(exc), str(exc)
        assert "quantization_config" in str(exc) or "hf_quant_config.json" in str(exc), str(exc)
        with pytest.raises((ValueError, AssertionError)):  # vLLM: no CPU attention backend takes nvfp4
            layer_specs(Case(str(folder), launch.block_size, max_model_len=launch.max_model_len,
                             kv_cache_dtype=launch.kv_cache_dtype, dtype=launch.dtype))
        event("refused: an nvfp4 cache (not planned)")
        return True
    return False


SMALL_QWEN = {"num_hidden_layers": 2, "hidden_size": 384, "intermediate_size": 192, "vocab_size": 3072,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}
SCHEMES = {  # a compressed-tensors kv_cache_scheme → vLLM's words when it refuses it (None: it stores fp8)
    "per head": ({**FP8_SCHEME, "strategy": "attn_head"}, None),
    "4 bits": ({**FP8_SCHEME, "num_bits": 4}, "Currently supported kv cache quantization is num_bits=8, type=float"),
    "int": ({**FP8_SCHEME, "type": "int"}, "Currently supported kv cache quantization is num_bits=8, type=float"),
    "empty": ({}, "Currently supported kv cache quantization is num_bits=8, type=float"),
    "per channel": ({**FP8_SCHEME, "strategy": "channel"}, "Invalid strategy for compressed-tensors KV cache"),
    "no such strategy": ({**FP8_SCHEME, "strategy": "per_tensor"}, "is not a valid QuantizationStrategy"),
    "no strategy": ({k: v for k, v in FP8_SCHEME.items() if k != "strategy"}, "is not a valid QuantizationStrategy"),
    "asymmetric": ({**FP8_SCHEME, "symmetric": False}, "Only support symmetric scaling factor"),
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_compressed_tensors_kv_scheme_is_stored_or_refused_as_vllm_does(tmp_path: Path, name: str) -> None:
    """The schemes the random test may draw seldom: every way vLLM's compressed-tensors KV cache method refuses
    one, and the per-head scales it takes (fp8 all the same)."""
    from tests.vllm.real_vllm import Case, layer_specs, vllm_config

    scheme, words = SCHEMES[name]
    base = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
    quant = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
             "ignore": ["lm_head"], "kv_cache_scheme": scheme}
    (tmp_path / "config.json").write_text(json.dumps({**base, **SMALL_QWEN, "quantization_config": quant}))
    case = Case(str(tmp_path), 16, max_model_len=4096)
    settings_ = PlanSettings(max_model_len=4096, block_size=16)
    mine = load_config(tmp_path / "config.json")
    if words is None:
        specs = layer_specs(case)
        assert vllm_config(case).cache_config.cache_dtype == "fp8"
        plan = make_plan(mine, settings_, budget=1 << 30, platform="cpu")
        assert plan.bytes_per_block == sum(s.page_size_bytes for s in specs.values())
        return
    with pytest.raises((ValueError, NotImplementedError), match=words):
        layer_specs(case)
    with pytest.raises(ModelSpecError, match=QUANT_REFUSALS[words]) as refused:
        make_plan(mine, settings_, budget=1 << 30, platform="cpu")
    assert refused.value.key == ("quantization_config", "kv_cache_scheme")
