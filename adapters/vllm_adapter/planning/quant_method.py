"""What vLLM refuses of a checkpoint's quantization method as it builds its config (vLLM 0.32 and 0.33 alike,
tests/vllm/test_vllm_quant_method.py):

- **ModelConfig** (``_verify_quantization``, after the model dtype and max_model_len): the method, as
  ``quantization()`` normalises it and vLLM's override lookups rename it (``gptq`` → ``auto_gptq``,
  ``auto-round`` → ``inc``; a ModelOpt config by its ``quant_algo``, ``MODELOPT_OVERRIDES``), must be one of
  vLLM's ``QUANTIZATION_METHODS`` ("Unknown quantization method"; bitsandbytes, GGUF, HQQ are none in these
  versions), and not a deprecated one (fbgemm_fp8, fp_quant: refused without
  ``--allow-deprecated-quantization``, a flag the plan does not take). The CUDA and CPU platforms restrict no
  method further.
- **VllmConfig** (``_get_quantization_config``, after the tensor parallel size, the heads and the config's
  own checks, ``check_quant_config``): on CUDA, the GPU's compute capability must reach the method's minimum
  (every method but the deprecated fp_quant runs on Hopper, 9.0; the CPU platform has none to check); then the
  model dtype must be one the method's kernels take (``get_supported_act_dtypes``): 16-bit for most, bfloat16
  only for MXFP4/MXFP8 (a flat ModelOpt ``quant_algo: MXFP8`` is served as ``modelopt_mxfp8``), float32 too for
  compressed-tensors and torchao. Before that, ModelOpt's MXFP8 config refuses a nested (hf_quant_config.json
  style) ``quantization`` without ``kv_cache_quant_algo`` and ``exclude_modules``, and its mixed-precision config
  the ``quantized_layers`` it cannot read (``modelopt_mixed``; both in ``check_method_fields``).

Pure code (no torch, no vllm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpolicy.document_codes import LAUNCH_REFUSED, MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE

from .config_values import ModelSpecError
from .config_values import shown as _shown
from .modelopt_mixed import check_mixed_layers
from .quant_config import Quantization, quantization

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
NVFP4_NESTED_FIELDS = ("group_size", "kv_cache_quant_algo", "exclude_modules")
"""What ModelOpt's NVFP4 config needs in a nested ``quantization``."""
CLASS_NAMES = {"modelopt": "FP8", "modelopt_fp4": "NVFP4", "modelopt_mxfp8": "MXFP8", "mxfp8": "MXFP8",
               "modelopt_mixed": "MIXED_PRECISION"}
"""The ModelOpt config class serving a method, by the format it names."""
MODELOPT_ALGOS = {
    "modelopt": ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"), "modelopt_fp4": ("NVFP4", "W4A16_NVFP4"),
    "modelopt_mxfp8": ("MXFP8",), "mxfp8": ("MXFP8",), "modelopt_mixed": ("MIXED_PRECISION",),
}
"""A ModelOpt config class (by the method it serves; MiniMax's ``mxfp8`` is ModelOpt's MXFP8 class) → the
``quant_algo`` values it takes (upper-cased); any other of them is refused as vLLM builds the config."""


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
    """Refuse what a ModelOpt config class refuses of the checkpoint's fields as vLLM builds its config
    (``from_config``): no ``quant_algo``, one vLLM or the class serving it does not take, an exclude list that is
    no list, a group size that is no integer, nested NVFP4 or MXFP8 configs without their fields, the
    mixed-precision class's ``quantized_layers`` (``modelopt_mixed``); ModelSpecError."""
    quant = quantization(config)
    if quant is None or not quant.method:
        return
    served = _served(quant)
    if served not in MODELOPT_ALGOS:
        return
    nested = "quantization" in quant.data
    if CLASS_NAMES[served] == "MXFP8" and not nested and not quant.data.get("quant_algo"):
        return  # MiniMax's layout (no algorithm), which vLLM's MXFP8 class rewrites as a complete nested config
    inner = quant.data["quantization"] if nested else quant.data
    if not isinstance(inner, Mapping):
        return  # refused as the KV algorithm is read (kv_dtype)
    prefix = ("quantization",) if nested else ()
    algo = _check_base_fields(quant, inner, prefix, nested)
    _check_class_fields(quant, inner, prefix, served, algo)


def _check_base_fields(quant: Quantization, inner: Mapping[str, Any], prefix: tuple[str, ...], nested: bool) -> str:
    """What every ModelOpt config class reads alike; the algorithm, upper-cased."""
    algo = inner.get("quant_algo")
    where = ".".join((*prefix, "quant_algo"))
    if not algo:
        raise ModelSpecError(f"{quant.named} gives no {where} (vLLM: \"Missing 'quant_algo' in quantization "
                             "config\"), and vLLM refuses the config", quant.at(*prefix, "quant_algo"), MISSING_FIELD)
    exclude_key = "exclude_modules" if nested or "ignore" not in inner else "ignore"
    exclude = inner.get(exclude_key, [])
    if not isinstance(exclude, list):
        raise ModelSpecError(f"{quant.named}.{'.'.join((*prefix, exclude_key))} must be a list (vLLM refuses "
                             f"{_shown(exclude)})", quant.at(*prefix, exclude_key), WRONG_TYPE)
    group_size = inner.get("group_size")
    if group_size is not None and not _is_int_like(group_size):
        raise ModelSpecError(f"{quant.named}.{'.'.join((*prefix, 'group_size'))} must be an integer (vLLM refuses "
                             f"{_shown(group_size)})", quant.at(*prefix, "group_size"), WRONG_TYPE)
    upper = str(algo).upper()
    known = sorted({a for algos in MODELOPT_ALGOS.values() for a in algos})
    if upper not in known:
        raise ModelSpecError(f"{quant.named}.{where} {_shown(algo)}: vLLM's ModelOpt configs take "
                             f"{', '.join(known)} (\"ModelOpt currently only supports\"), and vLLM refuses the config",
                             quant.at(*prefix, "quant_algo"))
    return upper


def _is_int_like(value: Any) -> bool:
    """Whether vLLM's ``int()`` takes the value (an integer, a float, a string of an integer)."""
    try:
        int(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _check_class_fields(quant: Quantization, inner: Mapping[str, Any], prefix: tuple[str, ...], served: str,
                        algo: str) -> None:
    """What the class serving the checkpoint reads: a nested config's fields, then the algorithms it takes."""
    name = CLASS_NAMES[served]
    fields = {"NVFP4": NVFP4_NESTED_FIELDS, "MXFP8": MXFP8_NESTED_FIELDS}.get(name, ())
    missing = [field for field in fields if field not in inner]
    if prefix and missing and name in algo:  # a serialized checkpoint's only (its algorithm names the format)
        raise ModelSpecError(
            f"{quant.named}.quantization: vLLM's ModelOpt {name} config needs {' and '.join(missing)} there "
            f"(\"{name} quantization requires the following fields\") and refuses the config",
            quant.at("quantization", missing[0]), MISSING_FIELD)
    if served == "modelopt_mixed":
        check_mixed_layers(quant, inner, prefix)
        return
    if algo in MODELOPT_ALGOS[served]:
        return
    raise ModelSpecError(
        f"{quant.named}.{'.'.join((*prefix, 'quant_algo'))} {_shown(inner.get('quant_algo'))}: vLLM serves the "
        f"checkpoint ({quant.method}) with its ModelOpt {name} config, which takes {', '.join(MODELOPT_ALGOS[served])} "
        "only, and refuses the config", quant.at(*prefix, "quant_algo"))


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
