"""The plan's quantization-method refusals against vLLM's own deciding functions (0.33 here; 0.32's lists are
the same): ModelConfig's ``_verify_quantization`` for random method names, and each method's
``get_supported_act_dtypes`` and ``get_min_capability`` (which vLLM's CPU build cannot reach through a real
config for most methods: their configs need real kernels or fields this harness does not draw)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.quant_method import (
    ACT_DTYPES,
    DEPRECATED_METHODS,
    QUANTIZATION_METHODS,
    RENAMED,
    SIXTEEN_BIT,
    check_act_dtype,
    check_quant_method,
)
from kvpolicy.document_codes import LAUNCH_REFUSED, VALUE_NOT_ALLOWED
from tests.vllm.test_vllm_plan_random import EXAMPLES, SETTINGS

pytestmark = pytest.mark.vllm
HOPPER = 90
DTYPES = ["bfloat16", "float16", "float32"]


def vllm_verdict(method: str) -> str:
    """What vLLM's ModelConfig makes of a checkpoint's (normalised) quant_method: the method, or its refusal."""
    from transformers import PretrainedConfig
    from vllm.config.model import ModelConfig

    stand_in = SimpleNamespace(quantization=None, allow_deprecated_quantization=False, hf_config=PretrainedConfig(),
                               model_arch_config=SimpleNamespace(quantization_config={"quant_method": method}))
    try:
        ModelConfig._verify_quantization(stand_in)  # type: ignore[arg-type]
    except ValueError as exc:
        return f"refused: {exc}"
    return str(stand_in.quantization)


def method_names() -> st.SearchStrategy[str]:
    known = st.sampled_from([*QUANTIZATION_METHODS, *RENAMED, "bitsandbytes", "gguf", "hqq", "ptpc_fp8"])
    cased = known.flatmap(lambda m: st.lists(st.booleans(), min_size=len(m), max_size=len(m)).map(
        lambda up: "".join(c.upper() if u else c for c, u in zip(m, up, strict=True))))
    return st.one_of(known, cased, st.text("abcdefgpqtwx_-", max_size=10))


@settings(SETTINGS, max_examples=max(EXAMPLES * 5, 50))
@given(method=method_names())
def test_random_quant_methods_are_refused_where_vllm_refuses(method: str) -> None:
    config = {"quantization_config": {"quant_method": method}}
    theirs = vllm_verdict(method.lower())  # vLLM lower-cases it as it reads the config
    try:
        mine = check_quant_method(config)
    except ModelSpecError as exc:
        assert theirs.startswith("refused"), (method, theirs, str(exc))
        assert exc.key == ("quantization_config", "quant_method") and exc.code == VALUE_NOT_ALLOWED
        if "Unknown quantization method" in theirs:
            assert "Unknown quantization method" in str(exc), str(exc)
        else:
            assert "deprecated" in theirs and "deprecated" in str(exc), (theirs, str(exc))
        return
    assert (mine or "None") == theirs, (method, mine, theirs)


def vllm_act_dtypes(method: str) -> set[str]:
    """The model dtypes vLLM's config class for ``method`` takes (instance methods read nothing of the instance)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    cls: Any = get_quantization_config(method)
    try:
        dtypes = cls.get_supported_act_dtypes()
    except TypeError:  # an instance method
        dtypes = cls.get_supported_act_dtypes(object.__new__(cls))
    return {str(d).removeprefix("torch.") for d in dtypes}


@pytest.mark.parametrize("method", [m for m in QUANTIZATION_METHODS if m not in RENAMED])
def test_each_methods_model_dtypes_are_vllms(method: str) -> None:
    taken = vllm_act_dtypes(method) & set(DTYPES)
    assert set(ACT_DTYPES.get(method, SIXTEEN_BIT)) == taken
    for dtype in DTYPES:
        config = {"torch_dtype": "bfloat16", "quantization_config": {"quant_method": method}}
        if dtype in taken:
            check_act_dtype(config, dtype, dtype, "torch_dtype")
            continue
        with pytest.raises(ModelSpecError, match="is not supported for quantization method") as refused:
            check_act_dtype(config, dtype, dtype, "torch_dtype")
        assert refused.value.key == ("torch_dtype",) and refused.value.code == LAUNCH_REFUSED


@pytest.mark.parametrize("method", QUANTIZATION_METHODS)
def test_hopper_reaches_every_methods_minimum_capability_but_deprecated_ones(method: str) -> None:
    """Why the plan checks no compute capability: on Hopper only a method refused earlier would fail it."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    minimum = get_quantization_config(method).get_min_capability()
    assert minimum <= HOPPER or method in DEPRECATED_METHODS, (method, minimum)
