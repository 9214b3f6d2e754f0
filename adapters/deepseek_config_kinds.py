"""The kinds of value transformers 5.19's strict DeepSeek config classes take, field by field.

vLLM 0.33 loads a ``deepseek_v4`` config with transformers' ``DeepseekV4Config``; SGLang 0.5.23 (which pins
transformers 5.19) with it and with its own ``deepseek_v4`` alias of ``DeepseekV3Config``. Both are strict
dataclasses: as the config loads, each field the class declares is checked against its declared type, and a
value of another kind fails the load (``StrictDataclassFieldValidationError``), so the engine does not start. The
checks are exact: an ``int`` field takes a JSON integer only (not ``true``, not ``3.0``), a ``float`` field a JSON
float only (``10.0``, not ``10``), a ``float | int`` field either, and ``| None`` adds null. The tables hold the
declared types (tests/vllm/test_vllm_v4_field_kinds.py and tests/sglang/test_sglang_field_kinds.py compare
them with the classes, and with each engine's loading, over random values). Pure data.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["int", "float", "str", "bool", "dict", "int list", "str list", "null"]

_INT: tuple[Kind, ...] = ("int",)
_INT_OR_NULL: tuple[Kind, ...] = ("int", "null")
_FLOAT: tuple[Kind, ...] = ("float",)
_BOOL: tuple[Kind, ...] = ("bool",)
_STR: tuple[Kind, ...] = ("str",)
_TOKEN_IDS: dict[str, tuple[Kind, ...]] = {
    **dict.fromkeys(("pad_token_id", "bos_token_id"), _INT_OR_NULL),
    "eos_token_id": ("int", "int list", "null"),
}

V4_FIELD_KINDS: dict[str, tuple[Kind, ...]] = {
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
    **_TOKEN_IDS,
    "partial_rotary_factor": ("float", "null"),
}
"""Each field ``DeepseekV4Config`` declares → the kinds of JSON value it takes."""

V3_FIELD_KINDS: dict[str, tuple[Kind, ...]] = {
    **dict.fromkeys((
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
        "num_attention_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank", "qk_rope_head_dim",
        "qk_nope_head_dim", "max_position_embeddings", "num_mtp_layers",
    ), _INT),
    **dict.fromkeys((
        "num_key_value_heads", "q_lora_rank", "v_head_dim", "n_group", "topk_group", "num_experts_per_tok",
        "first_k_dense_replace", "pretraining_tp",
    ), _INT_OR_NULL),
    **dict.fromkeys(("routed_scaling_factor", "initializer_range", "rms_norm_eps"), _FLOAT),
    "attention_dropout": ("float", "int", "null"),
    "hidden_act": _STR,
    **dict.fromkeys(("output_router_logits", "use_cache", "tie_word_embeddings", "attention_bias"), _BOOL),
    **dict.fromkeys(("norm_topk_prob", "rope_interleave"), ("bool", "null")),
    "rope_parameters": ("dict", "null"),
    **_TOKEN_IDS,
}
"""Each field ``DeepseekV3Config`` declares → the kinds of JSON value it takes."""

KIND_NAMES: dict[Kind, str] = {"int": "a whole number", "float": "a number with a decimal point (10.0, not 10)",
                               "str": "a string", "bool": "true or false", "dict": "an object",
                               "int list": "a list of whole numbers", "str list": "a list of strings", "null": "null"}


def is_kind(value: object, kind: Kind) -> bool:
    """Whether ``value`` (as JSON loads it) is of ``kind`` as the classes' type checks see it."""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
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


def refused(table: dict[str, tuple[Kind, ...]], key: str, value: object) -> str | None:
    """What ``table``'s class takes for ``key`` ("a whole number or null") where it refuses ``value``; None
    where it takes the value or declares no such field."""
    kinds = table.get(key)
    if kinds is None or any(is_kind(value, kind) for kind in kinds):
        return None
    return " or ".join(KIND_NAMES[kind] for kind in kinds)
