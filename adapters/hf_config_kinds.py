"""The kinds of value transformers 5.19's strict config classes take, field by field (5.20's are the same;
5.16-5.18 did not declare four of these fields yet, docs/vllm.md says which).

vLLM loads a model's config.json with transformers' config class for its model type (0.32 and 0.33 alike,
with transformers 5.19, but for DeepSeek-V4 on 0.32: vLLM registers a class of its own there, and
``DeepseekV3Config`` for ``kimi_k2``); SGLang 0.5.23, which pins transformers 5.19, a ``deepseek_v4`` one with
``DeepseekV4Config`` and its own alias of ``DeepseekV3Config``. These classes are strict dataclasses: as the
config loads, each field the class declares is checked against its declared type, and a value of another kind
fails the load (``StrictDataclassFieldValidationError``), so the engine does not start. The checks are exact:
an ``int`` field takes a JSON integer only (not ``true``, not ``3.0``), a ``float`` field a JSON float only
(``10.0``, not ``10``), a ``float | int`` field either, and ``| None`` adds null. ``FIELD_KINDS`` holds the
declared types of the classes the plans know, ``FIELD_RANGES`` the one field a validator bounds
(tests/vllm/test_vllm_field_kinds.py compares them with the classes' annotations and validators, and with
vLLM's loading over random values; tests/sglang/test_sglang_field_kinds.py with SGLang's). Pure data.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["int", "float", "str", "bool", "dict", "int list", "str list", "null"]
Kinds = tuple[Kind, ...]

INT: Kinds = ("int",)
INT_OR_NULL: Kinds = ("int", "null")
FLOAT: Kinds = ("float",)
FLOAT_OR_NULL: Kinds = ("float", "null")
NUMBER: Kinds = ("float", "int")
NUMBER_OR_NULL: Kinds = ("float", "int", "null")
STR: Kinds = ("str",)
STR_OR_NULL: Kinds = ("str", "null")
BOOL: Kinds = ("bool",)
BOOL_OR_NULL: Kinds = ("bool", "null")
DICT_OR_NULL: Kinds = ("dict", "null")
NAMES_OR_NULL: Kinds = ("str list", "null")
TOKEN_IDS: Kinds = ("int", "int list", "null")
INT_OR_INTS: Kinds = ("int", "int list")


def _table(groups: dict[Kinds, tuple[str, ...]]) -> dict[str, Kinds]:
    """A class's fields by the kinds they take: ``{INT: ("vocab_size", ...)}`` → {"vocab_size": INT, ...}."""
    return {key: kinds for kinds, keys in groups.items() for key in keys}


_GEMMA = _table({
    INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "query_pre_attn_scalar"),
    STR: ("hidden_activation",),
    FLOAT: ("initializer_range", "rms_norm_eps"),
    BOOL: ("use_cache", "tie_word_embeddings", "attention_bias"),
    INT_OR_NULL: ("pad_token_id", "bos_token_id", "sliding_window"),
    TOKEN_IDS: ("eos_token_id",),
    DICT_OR_NULL: ("rope_parameters",),
    NUMBER_OR_NULL: ("attention_dropout",),
    NAMES_OR_NULL: ("layer_types",),
    FLOAT_OR_NULL: ("final_logit_softcapping", "attn_logit_softcapping"),
    BOOL_OR_NULL: ("use_bidirectional_attention",),
})
"""Gemma-2's fields, and Gemma-3's text config's: the same."""

FIELD_KINDS: dict[str, dict[str, Kinds]] = {
    "LlamaConfig": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings"),
        INT_OR_NULL: ("num_key_value_heads", "pad_token_id", "bos_token_id", "pretraining_tp", "head_dim"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps"),
        BOOL: ("use_cache", "tie_word_embeddings", "attention_bias", "mlp_bias"),
        TOKEN_IDS: ("eos_token_id",),
        DICT_OR_NULL: ("rope_parameters",),
        NUMBER_OR_NULL: ("attention_dropout",),
    }),
    "MistralConfig": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings"),
        INT_OR_NULL: ("head_dim", "pad_token_id", "bos_token_id", "sliding_window"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps"),
        BOOL: ("use_cache", "tie_word_embeddings"),
        TOKEN_IDS: ("eos_token_id",),
        DICT_OR_NULL: ("rope_parameters",),
        NUMBER: ("attention_dropout",),
    }),
    "Qwen2Config": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings", "max_window_layers"),
        INT_OR_NULL: ("num_key_value_heads", "sliding_window", "pad_token_id", "bos_token_id"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps"),
        BOOL: ("use_cache", "tie_word_embeddings", "use_sliding_window"),
        DICT_OR_NULL: ("rope_parameters",),
        NAMES_OR_NULL: ("layer_types",),
        NUMBER: ("attention_dropout",),
        TOKEN_IDS: ("eos_token_id",),
    }),
    "Qwen3Config": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "head_dim", "max_position_embeddings", "max_window_layers"),
        INT_OR_NULL: ("num_key_value_heads", "sliding_window", "pad_token_id", "bos_token_id"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps"),
        BOOL: ("use_cache", "tie_word_embeddings", "attention_bias", "use_sliding_window"),
        DICT_OR_NULL: ("rope_parameters",),
        NAMES_OR_NULL: ("layer_types",),
        NUMBER: ("attention_dropout",),
        TOKEN_IDS: ("eos_token_id",),
    }),
    "Gemma2Config": _GEMMA,
    "Gemma3TextConfig": _GEMMA,
    "GptOssConfig": _table({
        INT: ("num_hidden_layers", "num_local_experts", "vocab_size", "hidden_size", "intermediate_size", "head_dim",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "num_experts_per_tok"),
        INT_OR_NULL: ("sliding_window", "pad_token_id", "bos_token_id"),
        BOOL: ("tie_word_embeddings", "output_router_logits", "use_cache", "attention_bias"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps", "swiglu_alpha", "swiglu_limit", "router_aux_loss_coef"),
        DICT_OR_NULL: ("rope_parameters",),
        NUMBER: ("attention_dropout",),
        NAMES_OR_NULL: ("layer_types",),
        TOKEN_IDS: ("eos_token_id",),
    }),
    "DeepseekV2Config": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings", "first_k_dense_replace", "kv_lora_rank", "n_routed_experts",
            "n_shared_experts", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "moe_intermediate_size"),
        INT_OR_NULL: ("num_key_value_heads", "pad_token_id", "bos_token_id", "pretraining_tp", "head_dim",
            "q_lora_rank", "n_group", "topk_group", "num_experts_per_tok"),
        STR: ("hidden_act",),
        FLOAT: ("initializer_range", "rms_norm_eps", "routed_scaling_factor"),
        BOOL: ("use_cache", "tie_word_embeddings", "attention_bias", "mlp_bias", "output_router_logits"),
        TOKEN_IDS: ("eos_token_id",),
        DICT_OR_NULL: ("rope_parameters",),
        FLOAT_OR_NULL: ("attention_dropout",),
        STR_OR_NULL: ("topk_method",),
        BOOL_OR_NULL: ("norm_topk_prob",),
    }),
    "DeepseekV3Config": _table({
        INT: ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank", "qk_rope_head_dim",
            "qk_nope_head_dim", "max_position_embeddings", "num_mtp_layers"),
        INT_OR_NULL: ("num_key_value_heads", "q_lora_rank", "v_head_dim", "n_group", "topk_group",
            "num_experts_per_tok", "first_k_dense_replace", "pad_token_id", "bos_token_id", "pretraining_tp"),
        BOOL: ("output_router_logits", "use_cache", "tie_word_embeddings", "attention_bias"),
        FLOAT: ("routed_scaling_factor", "initializer_range", "rms_norm_eps"),
        BOOL_OR_NULL: ("norm_topk_prob", "rope_interleave"),
        STR: ("hidden_act",),
        TOKEN_IDS: ("eos_token_id",),
        DICT_OR_NULL: ("rope_parameters",),
        NUMBER_OR_NULL: ("attention_dropout",),
    }),
    "DeepseekV4Config": _table({
        INT: ("vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "q_lora_rank", "num_experts_per_tok", "n_routed_experts",
            "n_shared_experts", "max_position_embeddings", "hc_mult", "hc_sinkhorn_iters", "sliding_window",
            "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "index_topk", "num_nextn_predict_layers"),
        STR: ("scoring_func", "hidden_act"),
        BOOL: ("norm_topk_prob", "output_router_logits", "use_cache", "tie_word_embeddings", "attention_bias",
            "mlp_bias"),
        FLOAT: ("routed_scaling_factor", "hc_eps", "swiglu_limit", "router_aux_loss_coef", "router_jitter_noise",
            "initializer_range", "rms_norm_eps", "attention_dropout"),
        NUMBER: ("rope_theta", "compress_rope_theta"),
        NAMES_OR_NULL: ("layer_types", "mlp_layer_types"),
        DICT_OR_NULL: ("compress_rates", "rope_parameters"),
        INT_OR_NULL: ("pad_token_id", "bos_token_id"),
        TOKEN_IDS: ("eos_token_id",),
        FLOAT_OR_NULL: ("partial_rotary_factor",),
    }),
    # The multimodal Gemma-3's wrapper: its own fields (its text config's are Gemma3TextConfig's, above)
    "Gemma3Config": _table({
        INT_OR_NULL: ("mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index"),
        FLOAT_OR_NULL: ("initializer_range",),
        BOOL_OR_NULL: ("tie_word_embeddings",),
        DICT_OR_NULL: ("text_config", "vision_config"),  # a config object or null (the class's defaults)
    }),
    "SiglipVisionConfig": _table({  # Gemma-3's vision config
        INT: ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels"),
        INT_OR_INTS: ("image_size", "patch_size"),
        STR: ("hidden_act",),
        FLOAT: ("layer_norm_eps",),
        NUMBER: ("attention_dropout",),
    }),
}
"""Config class (by name) → each field it declares → the kinds of JSON value it takes."""

SUB_CONFIGS: dict[str, dict[str, str]] = {"Gemma3Config": {"vision_config": "SiglipVisionConfig"}}
"""Wrapper class → its field that holds a config of another class, written as an object → that class, whichever
``model_type`` the object names (the text config's class is the plan's own, by model type)."""

FIELD_RANGES: dict[str, dict[str, tuple[float, float]]] = {"LlamaConfig": {"initializer_range": (0.0, 1.0)}}
"""Config class → the fields whose value a validator of the class bounds → (least, most), both taken: the
only field validators of the classes above (the classes' cross-field checks, of token ids, layer types and
RoPE parameters, are not here)."""

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


def refused(table: dict[str, Kinds], key: str, value: object) -> str | None:
    """What ``table``'s class takes for ``key`` ("a whole number or null") where it refuses ``value``; None
    where it takes the value or declares no such field."""
    kinds = table.get(key)
    if kinds is None or any(is_kind(value, kind) for kind in kinds):
        return None
    return " or ".join(KIND_NAMES[kind] for kind in kinds)


def out_of_range(class_name: str, key: str, value: object) -> str | None:
    """The range ``class_name``'s validator holds ``key`` to ("from 0.0 to 1.0") where ``value`` (a number of a
    kind the class takes) is outside it; None where it is inside, or nothing bounds the field."""
    bounds = FIELD_RANGES.get(class_name, {}).get(key)
    if bounds is None or not isinstance(value, (int, float)) or bounds[0] <= value <= bounds[1]:
        return None
    return f"from {bounds[0]} to {bounds[1]}"
