"""What vLLM refuses of a checkpoint's quantization method as it builds its config (vLLM 0.32 and 0.33 alike,
tests/vllm/test_vllm_quant_method.py):

- **ModelConfig** (``_verify_quantization``, after the model dtype and max_model_len): the method, as
  ``quantization()`` normalises it and vLLM's override lookups rename it (``gptq`` → ``auto_gptq``,
  ``auto-round`` → ``inc``; a ModelOpt config by its ``quant_algo``, ``MODELOPT_OVERRIDES``), must be one of vLLM's ``QUANTIZATION_METHODS`` ("Unknown quantization method";
  bitsandbytes, GGUF, HQQ are none in these versions), and not a deprecated one (fbgemm_fp8, fp_quant: refused
  without ``--allow-deprecated-quantization``, a flag the plan does not take). The CUDA and CPU platforms
  restrict no method further.
- **VllmConfig** (``_get_quantization_config``, after the tensor parallel size, the heads and the config's
  own checks, ``check_quant_config``): on CUDA, the GPU's compute capability must reach the method's minimum
  (every method but the deprecated fp_quant runs on Hopper, 9.0; the CPU platform has none to check); then the
  model dtype must be one the method's kernels take (``get_supported_act_dtypes``): 16-bit for most, bfloat16
  only for MXFP4/MXFP8 (a flat ModelOpt ``quant_algo: MXFP8`` is served as ``modelopt_mxfp8``), float32 too for
  compressed-tensors and torchao. Before that, ModelOpt's MXFP8 config refuses a nested (hf_quant_config.json
  style) ``quantization`` without ``kv_cache_quant_algo`` and ``exclude_modules`` (``check_method_fields``).

Pure code (no torch, no vllm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpolicy.document_codes import LAUNCH_REFUSED, MISSING_FIELD, VALUE_NOT_ALLOWED

from .config_values import ModelSpecError
from .config_values import shown as _shown
from .kv_dtype import Quantization, quantization

QUANTIZATION_METHODS = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
    "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token",
    "mxfp8",
)
"""vLLM 0.32's and 0.33's ``QUANTIZATION_METHODS``."""
DEPRECATED_METHODS = ("fbgemm_fp8", "fp_quant")
RENAMED = {"gptq": "auto_gptq", "auto-round": "inc"}
"""A checkpoint's method → what vLLM's override lookups make of it whatever the rest of the config says (others
rename by it: gptq → gptq_marlin on CUDA, mxfp4 → gpt_oss_mxfp4 for GPT-OSS; the dtypes they take are the same)."""
SIXTEEN_BIT = ("bfloat16", "float16")
ACT_DTYPES = {
    "compressed-tensors": ("float32", *SIXTEEN_BIT), "torchao": ("float32", *SIXTEEN_BIT),
    "fp_quant": ("bfloat16",), "mxfp4": ("bfloat16",), "gpt_oss_mxfp4": ("bfloat16",),
    "modelopt_mxfp8": ("bfloat16",), "mxfp8": ("bfloat16",),
}
"""The model dtypes a method's kernels take (``get_supported_act_dtypes``) where not 16-bit."""
MODELOPT_OVERRIDES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("modelopt", lambda algo: algo == "FP8"),
    ("modelopt_fp4", lambda algo: "FP4" in algo),  # NVFP4, W4A16_NVFP4 (and any other FP4 name)
    ("modelopt_mxfp8", lambda algo: "MXFP8" in algo),
    ("modelopt_mixed", lambda algo: algo == "MIXED_PRECISION"),
)
"""In vLLM's order, the ModelOpt config classes' ``override_quantization_method``: the method each serves a
ModelOpt checkpoint (``quant_method`` modelopt...) with, by its upper-cased ``quant_algo``; the first that claims it
wins, and where none does the checkpoint's own ``quant_method`` stays."""
MXFP8_NESTED_FIELDS = ("kv_cache_quant_algo", "exclude_modules")
"""What ModelOpt's MXFP8 config needs in a nested ``quantization``."""


def check_quant_method(config: Mapping[str, Any], version: str = "0.33.0") -> str | None:
    """The quantization method vLLM serves the checkpoint with (None: not quantized), or the ModelSpecError of
    one ModelConfig refuses: unknown, or deprecated."""
    quant = quantization(config, version)
    if quant is None or not quant.method:  # an empty quant_method is no quantization to vLLM
        return None
    method = _served(quant)
    said = f"{quant.named}.quant_method {_shown(quant.data.get('quant_method', quant.method))}"
    if method not in QUANTIZATION_METHODS:
        raise ModelSpecError(
            f"{said}: vLLM {version} knows no such quantization method (\"Unknown quantization method\") and "
            f"refuses the model config; known: {', '.join(QUANTIZATION_METHODS)}",
            quant.at("quant_method"), VALUE_NOT_ALLOWED)
    if method in DEPRECATED_METHODS:
        raise ModelSpecError(
            f"{said}: vLLM {version} refuses the deprecated quantization method {method} unless started with "
            "--allow-deprecated-quantization, which the plan does not take",
            quant.at("quant_method"), VALUE_NOT_ALLOWED)
    return method


def check_act_dtype(config: Mapping[str, Any], dtype: str, dtype_flag: str, dtype_key: str | None) -> None:
    """Refuse a model dtype the method's kernels do not take, as vLLM does once its configs are built
    (``dtype``: the model's, as ``--dtype dtype_flag`` resolves it; ``dtype_key``: the config's dtype key). The
    method is one ``check_quant_method`` let through."""
    quant = quantization(config)
    if quant is None or not quant.method:
        return
    method = _served(quant)
    taken = ACT_DTYPES.get(method, SIXTEEN_BIT)
    if dtype in taken:
        return
    raise ModelSpecError(
        f"--dtype {dtype_flag}: vLLM refuses {dtype} for the quantization method {method} of {quant.named} "
        f"(\"{dtype} is not supported for quantization method\"), whose kernels take {' or '.join(taken)}; "
        f"pass --dtype {taken[0]}",
        (dtype_key,) if dtype_key else None, LAUNCH_REFUSED)


def check_method_fields(config: Mapping[str, Any]) -> None:
    """Refuse what the served method's config class refuses of the fields it needs as vLLM builds its config
    (``from_config``): ModelOpt MXFP8's nested fields; ModelSpecError."""
    quant = quantization(config)
    if quant is None or not quant.method or _served(quant) != "modelopt_mxfp8":
        return
    inner = quant.data.get("quantization")
    if not isinstance(inner, Mapping):
        return
    missing = [field for field in MXFP8_NESTED_FIELDS if field not in inner]
    if missing:
        raise ModelSpecError(
            f"{quant.named}.quantization: vLLM's ModelOpt MXFP8 config needs {' and '.join(missing)} there "
            f"(\"MXFP8 quantization requires the following fields\") and refuses the config",
            quant.at("quantization", missing[0]), MISSING_FIELD)


def _served(quant: Quantization) -> str:
    """The method vLLM serves the checkpoint with, after its override lookups (``RENAMED``; a ModelOpt
    checkpoint's ``quant_algo``, ``MODELOPT_OVERRIDES``)."""
    algo = _modelopt_override_algo(quant)
    if algo is not None:
        served = next((method for method, claims in MODELOPT_OVERRIDES if claims(algo)), None)
        if served is not None:
            return served
    return RENAMED.get(quant.method, quant.method)


def _modelopt_override_algo(quant: Quantization) -> str | None:
    """The ``quant_algo`` ModelOpt's overrides read, upper-cased: the nested ``quantization``'s where there is
    one (None if it is no object), else the top level's ("NONE" where absent); None for other checkpoints."""
    if not quant.method.startswith("modelopt"):
        return None
    if "quantization" in quant.data:
        inner = quant.data["quantization"]
        return str(inner.get("quant_algo", "")).upper() if isinstance(inner, Mapping) else None
    return str(quant.data.get("quant_algo", "")).upper()
