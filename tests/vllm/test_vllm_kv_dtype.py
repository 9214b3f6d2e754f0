"""``--kv-cache-dtype`` as vLLM 0.33 resolves it for a checkpoint's quantization config (``planning/kv_dtype.py``).

For random quantization configs (``quant_configs.kv_quant_configs``: ModelOpt flat, nested and named by its
producer, KV algorithms in random case, known and not, KV scheme dicts, compressed-tensors with and without a
scheme, other methods, none, and parts vLLM cannot read) and a random flag, vLLM's own code runs on a copy of the
config: ``ModelArchConfigConvertorBase._normalize_quantization_config`` (as ``ModelConfig`` does when it loads
the checkpoint's config), then ``get_kv_cache_quant_algo_string`` and ``resolve_kv_cache_dtype_string`` (as
``EngineArgs.create_engine_config`` does for the cache config). kvpolicy's ``modelopt_kv_algo`` and
``cache_dtype`` must give vLLM's answers, and refuse exactly where vLLM's code fails. No model is built
(microseconds an example); tests/vllm/test_vllm_plan_quantized.py plans real quantized models end to end, and
tests/vllm_e2e/test_vllm_kv_dtype_032.py runs these functions under vLLM 0.32.0.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import ModelSpecError, cache_dtype, kv_dtype, modelopt_kv_algo
from kvpolicy.adapters.vllm_adapter.planning.quant_config import quantization
from tests.vllm.quant_configs import kv_quant_configs

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_RANDOM_EXAMPLES", "40")) * 5
"""Five times the plan tests' count: each example is a few dictionary look-ups on either side."""

FLAGS = ["auto", "auto", "auto", "bfloat16", "fp8", "fp8_e5m2", "nvfp4"]


def vllm_resolution(quant: dict[str, Any] | None, flag: str) -> tuple[str, str | None] | BaseException:
    """vLLM's (cache dtype, KV algorithm string) for a checkpoint with ``quant`` as its quantization config, or
    the exception its code raises."""
    import vllm.config  # noqa: F401 - the convertor module imports it back (an import cycle otherwise)
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    from vllm.utils.torch_utils import get_kv_cache_quant_algo_string, resolve_kv_cache_dtype_string

    hf_config = SimpleNamespace(quantization_config=copy.deepcopy(quant))
    try:
        # The convertor's method reads only the config it is given (it normalises it in place).
        ModelArchConfigConvertorBase._normalize_quantization_config(None, hf_config)  # type: ignore[arg-type]
        resolved = resolve_kv_cache_dtype_string(flag, SimpleNamespace(hf_config=hf_config))  # type: ignore[arg-type]
        algo = get_kv_cache_quant_algo_string(hf_config.quantization_config) if quant is not None else None
    except (AttributeError, ValueError, TypeError) as exc:
        return exc
    return resolved, algo


def ours(quant: dict[str, Any] | None, flag: str, version: str = "0.33.0") -> tuple[str, str | None] | ModelSpecError:
    """The plan's (cache dtype, KV algorithm string) for vLLM ``version``, or its refusal."""
    config = {} if quant is None else {"quantization_config": copy.deepcopy(quant)}
    try:
        found = quantization(config, version)
        resolved = cache_dtype(config, flag)
        algo = modelopt_kv_algo(found).dtype if found is not None else None
    except ModelSpecError as exc:
        return exc
    return resolved, algo


@settings(max_examples=EXAMPLES, deadline=None)
@given(quant=kv_quant_configs(), flag=st.sampled_from(FLAGS))
def test_the_kv_cache_dtype_is_vllms_for_random_quantization_configs(quant: dict[str, Any] | None,
                                                                       flag: str) -> None:
    theirs = vllm_resolution(quant, flag)
    mine = ours(quant, flag)
    if isinstance(theirs, BaseException):
        # vLLM's code fails on the config: the plan refuses it (the algorithm string is read for the plan's words
        # whatever the flag, so it refuses what vLLM reads only under auto too).
        assert isinstance(mine, ModelSpecError), (quant, flag, theirs, mine)
        event(f"refused: {type(theirs).__name__}")
        return
    if isinstance(mine, ModelSpecError):  # only what vLLM reads under auto alone, with another flag
        assert flag != "auto", (quant, theirs, mine)
        assert isinstance(vllm_resolution(quant, "auto"), BaseException), (quant, mine)
        event("refused: unreadable under auto only")
        return
    assert mine == theirs, (quant, flag)
    event(f"{flag} -> {theirs[0]} (algorithm {theirs[1]})")


def test_each_modelopt_kv_algorithm_resolves_as_vllm_maps_it() -> None:
    """The fixed points the random test reaches by chance: every spelling vLLM maps, one it does not, and the
    order vLLM reads the keys in (the scheme before the algorithm, the nested config before the outer)."""
    cases: list[tuple[dict[str, Any], str]] = [
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}, "fp8_e4m3"),
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "Fp8"}, "fp8_e4m3"),
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "nvfp4"}, "nvfp4"),
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "INT8"}, "auto"),
        ({"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}},
         "fp8_e4m3"),
        ({"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": True, "num_bits": 8, "type": "float"}}, "auto"),
        ({"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 4, "type": "float"}}, "nvfp4"),
        ({"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 4, "type": "float"},
          "kv_cache_quant_algo": "FP8"}, "nvfp4"),
        ({"quant_method": "modelopt", "quantization": {"kv_cache_quant_algo": "NVFP4"}, "kv_cache_quant_algo": "FP8"},
         "nvfp4"),
        ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
         "fp8_e4m3"),
        ({"quant_method": "MODELOPT_FP4", "kv_cache_quant_algo": "fp8"}, "fp8_e4m3"),
        ({"quant_method": "compressed-tensors", "kv_cache_quant_algo": "FP8"}, "auto"),
        ({"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}, "auto"),
    ]
    for quant, expected in cases:
        theirs = vllm_resolution(quant, "auto")
        assert not isinstance(theirs, BaseException) and theirs[0] == expected, (quant, theirs)
        assert ours(quant, "auto") == theirs, quant
        assert cache_dtype({"quantization_config": quant}, "bfloat16") == "bfloat16"  # a flag is kept as it is


@pytest.mark.parametrize("family", ["standard", "mla", "deepseek_v4"])
def test_an_auto_nvfp4_cache_is_refused_naming_the_quantization_config(family: str) -> None:
    config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                      "kv_cache_quant_algo": "NVFP4"}}
    with pytest.raises(ModelSpecError, match=r"quantization_config \(modelopt\) gives kv_cache_quant_algo 'NVFP4'"
                                             r": nvfp4\).*kvpolicy does not plan") as refused:
        kv_dtype(config, "auto", family)
    assert refused.value.key == ("quantization_config", "kv_cache_quant_algo")
    assert kv_dtype(config, "fp8", family).layers == "fp8"  # an explicit dtype is vLLM's, and planned


def test_the_plan_names_the_value_vllm_took() -> None:
    """The outer scheme comes before the nested algorithm (vLLM's order): its place is the one a refusal or the
    plan's words name."""
    quant = {"quant_method": "modelopt", "quantization": {"kv_cache_quant_algo": "NVFP4"},
             "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}
    theirs = vllm_resolution(quant, "auto")
    assert not isinstance(theirs, BaseException) and theirs[0] == "fp8_e4m3"
    kv = kv_dtype({"quantization_config": quant}, "auto", "standard")
    assert (kv.layers, kv.key) == ("fp8_e4m3", ("quantization_config", "kv_cache_scheme"))
    assert "gives kv_cache_scheme {" in kv.why
