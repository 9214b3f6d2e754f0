"""ModelOpt's MXFP8 in the plan against vLLM 0.33 (``planning/quant_method.py``, ``planning/kv_dtype.py``).

vLLM serves a ModelOpt checkpoint by its ``quant_algo`` (the config classes' ``override_quantization_method``):
a flat ``quant_algo: MXFP8`` as ``modelopt_mxfp8``, whose kernels take bfloat16 only. Random ModelOpt configs go
through vLLM's own ``ModelConfig._verify_quantization``; the served method's dtypes, the KV cache dtype and the
refusals go through vLLM's real config (``create_engine_config``), and the attention layer's KV quantization
through vLLM's own ``_init_kv_cache_quant`` with the real quantization config: vLLM's CPU build has no MXFP8
linear kernel, so it cannot build the whole model here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import KvDtype, check_attention_kv, kv_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from kvpolicy.adapters.vllm_adapter.planning.quant_method import check_method_fields, check_quant_method
from kvpolicy.document_codes import LAUNCH_REFUSED, MISSING_FIELD
from tests.vllm.quant_configs import ABSENT, put, random_case
from tests.vllm.test_vllm_plan_random import EXAMPLES, SETTINGS
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

QWEN = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
MLA = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
SMALL = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 128, "vocab_size": 1024,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "bfloat16"}
MXFP8 = {"quant_method": "modelopt", "quant_algo": "MXFP8"}
ALGOS = ["MXFP8", "FP8", "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION", "FP8_PB_WO", "MXFP4", "W4A8_AWQ", ""]


def served_by_vllm(quant: dict[str, Any]) -> str:
    """The method vLLM's ModelConfig serves a checkpoint's quantization config with, or its refusal."""
    from transformers import PretrainedConfig
    from vllm.config.model import ModelConfig

    stand_in = SimpleNamespace(quantization=None, allow_deprecated_quantization=False, hf_config=PretrainedConfig(),
                               model_arch_config=SimpleNamespace(quantization_config=quant))
    try:
        ModelConfig._verify_quantization(stand_in)  # type: ignore[arg-type]
    except ValueError as exc:
        return f"refused: {exc}"
    return str(stand_in.quantization)


@st.composite
def modelopt_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A ModelOpt config as vLLM's ModelConfig meets it (``quant_method`` lower-cased, as vLLM's config loader
    leaves it): flat or nested, any algorithm in random case, at times none."""
    method = draw(st.sampled_from(["modelopt", "modelopt", "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8"]))
    algo = draw(st.sampled_from([*ALGOS, ABSENT]).flatmap(
        lambda a: random_case(a) if isinstance(a, str) else st.just(a)))
    config: dict[str, Any] = {"quant_method": method}
    if draw(st.booleans()):
        put(config, "quant_algo", algo)
    else:
        inner: dict[str, Any] = {}
        put(inner, "quant_algo", algo)
        config["quantization"] = inner
    return config


@settings(SETTINGS, max_examples=max(EXAMPLES, 30))
@given(quant=modelopt_configs())
def test_modelopt_checkpoints_are_served_with_vllms_method(quant: dict[str, Any]) -> None:
    """The method vLLM serves, by quant_algo: MXFP8 → modelopt_mxfp8, FP4 names → modelopt_fp4, FP8 → modelopt,
    MIXED_PRECISION → modelopt_mixed; other algorithms keep the checkpoint's quant_method."""
    theirs = served_by_vllm(json.loads(json.dumps(quant)))
    mine = check_quant_method({"quantization_config": quant})
    assert mine == theirs, (quant, mine, theirs)
    event(f"served: {mine}")


def checkpoint(folder: Path, base: dict[str, Any], quant: dict[str, Any]) -> Path:
    (folder / "config.json").write_text(json.dumps({**base, **SMALL, "quantization_config": quant}))
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_mxfp8_takes_bfloat16_only(tmp_path: Path, dtype: str) -> None:
    """vLLM's config refuses another model dtype for modelopt_mxfp8 (``get_supported_act_dtypes``)."""
    from tests.vllm.real_vllm import Case, vllm_config

    folder = checkpoint(tmp_path, QWEN, MXFP8)
    settings_ = PlanSettings(max_model_len=4096, block_size=16, dtype=dtype)
    if dtype == "bfloat16":
        assert vllm_config(Case(str(folder), 16, max_model_len=4096, dtype=dtype)).model_config.quantization \
            == "modelopt_mxfp8"
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
        return
    with pytest.raises(Exception, match=f"torch.{dtype} is not supported for quantization method modelopt_mxfp8"):
        vllm_config(Case(str(folder), 16, max_model_len=4096, dtype=dtype))
    with pytest.raises(ModelSpecError, match="modelopt_mxfp8") as refused:
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
    assert refused.value.code == LAUNCH_REFUSED


@pytest.mark.parametrize("kv", [ABSENT, "FP8", "fp8", "NVFP4", "INT8"])
def test_mxfp8s_kv_algorithm_gives_the_cache_dtype_vllm_resolves(tmp_path: Path, kv: Any) -> None:
    """ModelOpt's KV algorithm, as for any ModelOpt checkpoint: fp8 → fp8_e4m3, nvfp4 → nvfp4, else the model's."""
    from tests.vllm.real_vllm import Case, vllm_config

    quant = dict(MXFP8)
    put(quant, "kv_cache_quant_algo", kv)
    folder = checkpoint(tmp_path, QWEN, quant)
    theirs = vllm_config(Case(str(folder), 16, max_model_len=4096)).cache_config.cache_dtype
    try:
        mine = kv_dtype(load_config(folder / "config.json"), "auto", "standard").cache
    except ModelSpecError as exc:  # nvfp4, which the plan does not plan
        assert theirs == "nvfp4", str(exc)
        return
    assert mine == theirs


def attention_refusal(quant_config: Any, family: str, kv_cache_dtype: str) -> str | None:
    """What vLLM's attention layer (``Attention`` or ``MLAAttention``) refuses as it loads its KV quantization
    from ``quant_config`` (None: nothing)."""
    import torch
    from vllm.model_executor.layers.attention import Attention, MLAAttention
    from vllm.model_executor.layers.attention.attention import _init_kv_cache_quant

    cls = MLAAttention if family == "mla" else Attention
    layer = cls.__new__(cls)  # only what _init_kv_cache_quant reads: the module and its cache dtype
    torch.nn.Module.__init__(layer)
    layer.kv_cache_dtype = kv_cache_dtype
    try:
        _init_kv_cache_quant(layer, quant_config, "model.layers.0.self_attn.attn")
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("quant", [MXFP8, {**MXFP8, "kv_cache_quant_algo": "FP8"}, {"quant_method": "mxfp8"}],
                         ids=["modelopt-mxfp8", "modelopt-mxfp8-fp8-kv", "minimax-mxfp8"])
@pytest.mark.parametrize("family", ["standard", "mla"])
def test_mxfp8_attention_refuses_fp8_e5m2_as_vllm_does(tmp_path: Path, quant: dict[str, Any], family: str) -> None:
    """ModelOpt's MXFP8 config gives standard and MLA attention its KV cache method (MiniMax's ``mxfp8``, served
    by the same config, too): vLLM refuses fp8_e5m2 there."""
    from tests.vllm.real_vllm import Case, vllm_config

    folder = checkpoint(tmp_path, QWEN if family == "standard" else MLA, quant)
    real = vllm_config(Case(str(folder), 16, max_model_len=4096, kv_cache_dtype="fp8_e5m2"))
    theirs = attention_refusal(real.quant_config, family, "fp8_e5m2")
    assert theirs is not None and "fp8_e5m2 kv-cache is not supported with fp8 checkpoints" in theirs
    with pytest.raises(ModelSpecError, match="vLLM refuses fp8_e5m2 with them"):
        check_attention_kv(load_config(folder / "config.json"), KvDtype("fp8_e5m2", "fp8_e5m2", "fp8_e5m2"), family)


@pytest.mark.parametrize("fields", [(), ("kv_cache_quant_algo",), ("exclude_modules",),
                                    ("kv_cache_quant_algo", "exclude_modules")])
def test_nested_mxfp8_needs_its_fields(tmp_path: Path, fields: tuple[str, ...]) -> None:
    """ModelOpt's MXFP8 config refuses a nested ``quantization`` without kv_cache_quant_algo and exclude_modules
    (present, even null or empty)."""
    from tests.vllm.real_vllm import Case, vllm_config

    inner: dict[str, Any] = {"quant_algo": "MXFP8", **{f: None if f == "kv_cache_quant_algo" else [] for f in fields}}
    folder = checkpoint(tmp_path, QWEN, {"quant_method": "modelopt", "quantization": inner})
    settings_ = PlanSettings(max_model_len=4096, block_size=16)
    if len(fields) == 2:
        assert vllm_config(Case(str(folder), 16, max_model_len=4096)).model_config.quantization == "modelopt_mxfp8"
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
        return
    with pytest.raises(Exception, match="MXFP8 quantization requires the following fields"):
        vllm_config(Case(str(folder), 16, max_model_len=4096))
    with pytest.raises(ModelSpecError, match="MXFP8 quantization requires the following fields") as refused:
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
    assert refused.value.code == MISSING_FIELD


LAYER_ALGOS = ["FP8", "NVFP4", "W4A16_NVFP4", "FP8_PB_WO", "FP8_BLOCK_SCALES", "MXFP8", "iq2_xs", "IQ2_XXS", "q8_0",
               "Q8_0", "fp8_block_scales", ""]
CODEC_CONTRACTS = [{"group_size": 256, "block_payload_bytes": 74, "packing": "ggml"},
                   {"group_size": 256, "block_payload_bytes": 66, "packing": "ggml"},
                   {"group_size": 32, "block_payload_bytes": 34, "packing": "ggml"},
                   {"group_size": 32.0, "block_payload_bytes": 34, "packing": "ggml"}]


@st.composite
def recipes(draw: st.DrawFn) -> Any:
    """A layer's recipe in a mixed-precision config: an algorithm (GGML codecs with their block contract, or
    part of one), a group size of any kind; at times no object, or an algorithm that is no name."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([None, [], "FP8", 3, {"quant_algo": None}, {"quant_algo": 8}]))
    recipe: dict[str, Any] = {}
    put(recipe, "quant_algo", draw(st.sampled_from([ABSENT, *LAYER_ALGOS])))
    if draw(st.booleans()):
        recipe.update(draw(st.sampled_from(CODEC_CONTRACTS)))
        if draw(st.booleans()):
            key = draw(st.sampled_from(sorted(recipe)))
            recipe[key] = draw(st.sampled_from([None, 0, "ggml", 256, "x"]))
    elif draw(st.booleans()):
        recipe["group_size"] = draw(st.sampled_from([16, 64, 128, 128.0, "128", "x", None, True]))
    return recipe


QUANTIZED_LAYERS = st.one_of(
    st.dictionaries(st.sampled_from(["model.layers.0.mlp.experts", "model.layers.1.mlp.experts",
                                     "model.layers.0.self_attn.qkv_proj", "lm_head"]), recipes(), max_size=4),
    st.sampled_from([ABSENT, None, [], "x", 0, True, [{"quant_algo": "FP8"}]]))
"""What a mixed-precision config gives as its ``quantized_layers``: an object of recipes (empty too), or not."""


@st.composite
def modelopt_fields(draw: st.DrawFn) -> dict[str, Any]:
    """A ModelOpt config with the fields its config classes read beside the algorithm (exclude lists, group
    size, the KV algorithm, a mixed-precision config's ``quantized_layers``), each absent, valid or of a wrong
    kind; at times MiniMax's ``mxfp8`` layout."""
    if draw(st.integers(0, 7)) == 0:
        return {"quant_method": "mxfp8", **draw(st.sampled_from([{}, {"ignored_layers": ["lm_head"]},
                                                                  {"quant_algo": "FP8"}]))}
    config = draw(modelopt_configs())
    inner = config.get("quantization", config)
    for key, values in (("exclude_modules", [["lm_head"], "lm_head", None]), ("ignore", [["lm_head"], {}]),
                        ("group_size", [16, "16", "x", 16.5, None]), ("kv_cache_quant_algo", ["FP8", None])):
        if draw(st.integers(0, 2)) == 0:
            inner[key] = draw(st.sampled_from(values))
    if isinstance(inner, dict) and draw(st.integers(0, 3)) > 0:
        put(inner, "quantized_layers", draw(QUANTIZED_LAYERS))
    return config


@settings(SETTINGS, max_examples=max(EXAMPLES, 30))
@given(quant=modelopt_fields())
def test_modelopt_config_classes_refuse_what_vllm_refuses(quant: dict[str, Any]) -> None:
    """The served class's ``from_config``, vLLM's own (the mixed-precision class's fails reading a recipe as
    well as with its own ValueErrors)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    served = served_by_vllm(copy.deepcopy(quant))
    if served.startswith("refused"):
        return
    theirs = class_refusal(get_quantization_config(served), quant)
    mine = plan_refusal(quant)
    assert (mine is None) == (theirs is None), (quant, served, mine, theirs)
    event(f"{served}: {'refused' if theirs else 'taken'}")


def class_refusal(config_class: Any, quant: dict[str, Any]) -> str | None:
    """What a vLLM quantization config class's ``from_config`` raises for ``quant`` (None: it builds)."""
    try:
        config_class.from_config(copy.deepcopy(quant))
    except (ValueError, AttributeError, TypeError) as exc:  # each stops vLLM building its config
        return f"{type(exc).__name__}: {exc}"
    return None


def plan_refusal(quant: dict[str, Any]) -> ModelSpecError | None:
    """What the plan refuses of the ModelOpt config classes' fields in ``quant`` (None: nothing)."""
    try:
        check_method_fields({"quantization_config": quant})
    except ModelSpecError as exc:
        return exc
    return None


@st.composite
def mixed_precision_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A ModelOpt mixed-precision config whose other fields vLLM takes, flat or nested, with random recipes."""
    inner: dict[str, Any] = {"quant_algo": draw(random_case("MIXED_PRECISION"))}
    put(inner, "group_size", draw(st.sampled_from([ABSENT, ABSENT, 16])))  # given: vLLM reads no recipe's
    put(inner, "quantized_layers", draw(QUANTIZED_LAYERS))
    if draw(st.booleans()):
        return {"quant_method": draw(st.sampled_from(["modelopt", "modelopt_mixed"])), **inner}
    return {"quant_method": "modelopt", "quantization": {**inner, "kv_cache_quant_algo": None, "exclude_modules": []}}


def test_mixed_precision_recipes_are_refused_where_vllm_refuses() -> None:
    """vLLM's ``ModelOptMixedPrecisionConfig.from_config`` over random ``quantized_layers``: the plan refuses
    exactly the configs it fails on, at a place in ``quantized_layers``."""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig

    seen: set[str] = set()

    @settings(SETTINGS, max_examples=max(EXAMPLES * 5, 100))
    @given(quant=mixed_precision_configs())
    @example(quant={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {"a": {"quant_algo": "IQ2_XS", "group_size": 256.0,
                                               "block_payload_bytes": 74, "packing": "ggml"}}})
    @example(quant={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {"a": {"quant_algo": "FP8_PB_WO"},
                                         "b": {"quant_algo": "fp8_block_scales", "group_size": "128"}}})
    def check(quant: dict[str, Any]) -> None:
        assert served_by_vllm(copy.deepcopy(quant)) == "modelopt_mixed"
        theirs = class_refusal(ModelOptMixedPrecisionConfig, quant)
        mine = plan_refusal(quant)
        assert (mine is None) == (theirs is None), (quant, mine, theirs)
        assert mine is None or (mine.key is not None and "quantized_layers" in mine.key), mine
        seen.add("refused" if theirs else "taken")
        event("refused" if theirs else "taken")

    check()
    assert seen == {"refused", "taken"}


@pytest.mark.parametrize("layers", [
    {"model.layers.0.mlp": {"quant_algo": "FP8"}},
    {},
    {"model.layers.0.mlp": None},
    {"model.layers.0.mlp": {"quant_algo": "q8_0"}},
    {"model.layers.0.mlp": {"quant_algo": "FP8_PB_WO"}, "model.layers.1.mlp": {"quant_algo": "FP8_PB_WO",
                                                                                "group_size": 64}},
], ids=["taken", "empty", "no-object", "codec-contract", "two-block-sizes"])
def test_vllm_refuses_mixed_precision_recipes_at_start_up(tmp_path: Path, layers: dict[str, Any]) -> None:
    """What the random test finds in the config class stops vLLM's real config (``create_engine_config``)."""
    from tests.vllm.real_vllm import Case, vllm_config

    folder = checkpoint(tmp_path, QWEN, {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                         "quantized_layers": layers})
    settings_ = PlanSettings(max_model_len=4096, block_size=16)
    if layers == {"model.layers.0.mlp": {"quant_algo": "FP8"}}:
        assert vllm_config(Case(str(folder), 16, max_model_len=4096)).model_config.quantization == "modelopt_mixed"
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
        return
    with pytest.raises((ValueError, AttributeError)):  # pydantic's ValidationError is a ValueError
        vllm_config(Case(str(folder), 16, max_model_len=4096))
    with pytest.raises(ModelSpecError) as refused:
        make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
    assert refused.value.key is not None and refused.value.key[:2] == ("quantization_config", "quantized_layers")
