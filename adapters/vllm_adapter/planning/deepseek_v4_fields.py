"""The kinds of value vLLM 0.33 takes in a DeepSeek-V4 config: those of transformers' ``DeepseekV4Config``.

vLLM 0.33 loads a ``deepseek_v4`` config with transformers 5.19's ``DeepseekV4Config``, a strict dataclass: as
the config loads, each field the class declares is checked against its declared type, and a value of another
kind fails the load (``StrictDataclassFieldValidationError``), so vLLM does not start. The checks are exact: an
``int`` field takes a JSON integer only (not ``true``, not ``3.0``), a ``float`` field a JSON float only (``10.0``,
not ``10``), a ``float | int`` field either, and ``| None`` adds null. ``FIELD_KINDS`` holds the declared types
(tests/vllm/test_vllm_v4_field_kinds.py compares them with the class over random values). vLLM 0.32 loads its own
class, which checks nothing. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kvpolicy.document_codes import WRONG_TYPE
from kvpolicy.validation import shown

from .class_defaults import class_default
from .config_values import ModelSpecError, is_int

Kind = Literal["int", "float", "str", "bool", "dict", "int list", "str list", "null"]

_INT: tuple[Kind, ...] = ("int",)
_FLOAT: tuple[Kind, ...] = ("float",)
_BOOL: tuple[Kind, ...] = ("bool",)
_STR: tuple[Kind, ...] = ("str",)
FIELD_KINDS: dict[str, tuple[Kind, ...]] = {
    **dict.fromkeys((
        "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "q_lora_rank", "num_experts_per_tok", "n_routed_experts",
        "n_shared_experts", "max_position_embeddings", "hc_mult", "hc_sinkhorn_iters", "sliding_window", "o_groups",
        "o_lora_rank", "index_n_heads", "index_head_dim", "index_topk", "num_nextn_predict_layers",
    ), _INT),
    **dict.fromkeys((
        "routed_scaling_factor", "hc_eps", "swiglu_limit", "router_aux_loss_coef", "router_jitter_noise",
        "initializer_range", "rms_norm_eps", "attention_dropout",
    ), _FLOAT),
    **dict.fromkeys(("rope_theta", "compress_rope_theta"), ("float", "int")),
    **dict.fromkeys(("scoring_func", "hidden_act"), _STR),
    **dict.fromkeys((
        "norm_topk_prob", "output_router_logits", "use_cache", "tie_word_embeddings", "attention_bias", "mlp_bias",
    ), _BOOL),
    **dict.fromkeys(("layer_types", "mlp_layer_types"), ("str list", "null")),
    **dict.fromkeys(("compress_rates", "rope_parameters"), ("dict", "null")),
    **dict.fromkeys(("pad_token_id", "bos_token_id"), ("int", "null")),
    "eos_token_id": ("int", "int list", "null"),
    "partial_rotary_factor": ("float", "null"),
}
"""Each field ``DeepseekV4Config`` declares (transformers 5.19) → the kinds of JSON value it takes."""

_NAMES: dict[Kind, str] = {"int": "a whole number", "float": "a number with a decimal point (10.0, not 10)",
                           "str": "a string", "bool": "true or false", "dict": "an object",
                           "int list": "a list of whole numbers", "str list": "a list of strings", "null": "null"}


def is_kind(value: object, kind: Kind) -> bool:
    """Whether ``value`` (as JSON loads it) is of ``kind`` as the class's type check sees it."""
    if kind == "int":
        return is_int(value)
    if kind == "float":
        return isinstance(value, float)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    element: Kind = "int" if kind == "int list" else "str"
    return isinstance(value, list) and all(is_kind(v, element) for v in value)


def check_v4_field_kinds(config: Mapping[str, Any], engine_version: str) -> None:
    """Refuse the first field of a ``deepseek_v4`` config whose value ``DeepseekV4Config`` does not take, when
    planning for 0.33 (ModelSpecError, WRONG_TYPE at the value); a field the class filled, or anything else, passes."""
    if engine_version.startswith("0.32.") or config.get("model_type") != "deepseek_v4":
        return
    for key, kinds in FIELD_KINDS.items():
        if key not in config or class_default(config, key) is not None:
            continue
        value = config[key]
        if not any(is_kind(value, kind) for kind in kinds):
            wanted = " or ".join(_NAMES[kind] for kind in kinds)
            raise ModelSpecError(
                f"{key} {shown(value, 200)}: DeepseekV4Config takes {wanted} only, so transformers refuses the config "
                "and vLLM cannot load it", (key,), WRONG_TYPE,
                "write the value as DeepSeek-V4's own config.json does (vLLM 0.32's own config class does not check it)",
            )
