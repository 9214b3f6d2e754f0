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
declared types of the classes the plans know, in their order, ``FIELD_RANGES`` the one field a validator bounds
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

_GEMMA: dict[str, Kinds] = {
    "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
    "num_attention_heads": INT, "num_key_value_heads": INT, "head_dim": INT, "hidden_activation": STR,
    "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
    "pad_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS, "bos_token_id": INT_OR_NULL, "tie_word_embeddings": BOOL,
    "rope_parameters": DICT_OR_NULL, "attention_bias": BOOL, "attention_dropout": NUMBER_OR_NULL,
    "query_pre_attn_scalar": INT, "sliding_window": INT_OR_NULL, "layer_types": NAMES_OR_NULL,
    "final_logit_softcapping": FLOAT_OR_NULL, "attn_logit_softcapping": FLOAT_OR_NULL,
    "use_bidirectional_attention": BOOL_OR_NULL,
}
"""Gemma-2's fields, and Gemma-3's text config's: the same."""

FIELD_KINDS: dict[str, dict[str, Kinds]] = {
    "LlamaConfig": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS,
        "pretraining_tp": INT_OR_NULL, "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL,
        "attention_bias": BOOL, "attention_dropout": NUMBER_OR_NULL, "mlp_bias": BOOL, "head_dim": INT_OR_NULL,
    },
    "MistralConfig": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT, "head_dim": INT_OR_NULL, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS,
        "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL, "sliding_window": INT_OR_NULL,
        "attention_dropout": NUMBER,
    },
    "Qwen2Config": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL, "use_sliding_window": BOOL,
        "sliding_window": INT_OR_NULL, "max_window_layers": INT, "layer_types": NAMES_OR_NULL,
        "attention_dropout": NUMBER, "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL,
        "eos_token_id": TOKEN_IDS,
    },
    "Qwen3Config": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL, "head_dim": INT, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL, "attention_bias": BOOL,
        "use_sliding_window": BOOL, "sliding_window": INT_OR_NULL, "max_window_layers": INT,
        "layer_types": NAMES_OR_NULL, "attention_dropout": NUMBER, "pad_token_id": INT_OR_NULL,
        "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS,
    },
    "Gemma2Config": _GEMMA,
    "Gemma3TextConfig": _GEMMA,
    "GptOssConfig": {
        "num_hidden_layers": INT, "num_local_experts": INT, "vocab_size": INT, "hidden_size": INT,
        "intermediate_size": INT, "head_dim": INT, "num_attention_heads": INT, "num_key_value_heads": INT,
        "sliding_window": INT_OR_NULL, "tie_word_embeddings": BOOL, "hidden_act": STR, "initializer_range": FLOAT,
        "max_position_embeddings": INT, "rms_norm_eps": FLOAT, "rope_parameters": DICT_OR_NULL,
        "attention_dropout": NUMBER, "num_experts_per_tok": INT, "swiglu_alpha": FLOAT, "swiglu_limit": FLOAT,
        "router_aux_loss_coef": FLOAT, "output_router_logits": BOOL, "use_cache": BOOL, "layer_types": NAMES_OR_NULL,
        "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS, "attention_bias": BOOL,
    },
    "DeepseekV2Config": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS,
        "pretraining_tp": INT_OR_NULL, "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL,
        "attention_bias": BOOL, "attention_dropout": FLOAT_OR_NULL, "mlp_bias": BOOL, "head_dim": INT_OR_NULL,
        "first_k_dense_replace": INT, "kv_lora_rank": INT, "q_lora_rank": INT_OR_NULL, "n_group": INT_OR_NULL,
        "n_routed_experts": INT, "output_router_logits": BOOL, "n_shared_experts": INT, "qk_nope_head_dim": INT,
        "qk_rope_head_dim": INT, "routed_scaling_factor": FLOAT, "topk_group": INT_OR_NULL, "topk_method": STR_OR_NULL,
        "norm_topk_prob": BOOL_OR_NULL, "v_head_dim": INT, "num_experts_per_tok": INT_OR_NULL,
        "moe_intermediate_size": INT,
    },
    "DeepseekV3Config": {
        "vocab_size": INT, "hidden_size": INT, "intermediate_size": INT, "moe_intermediate_size": INT,
        "num_hidden_layers": INT, "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL,
        "n_shared_experts": INT, "n_routed_experts": INT, "output_router_logits": BOOL, "routed_scaling_factor": FLOAT,
        "kv_lora_rank": INT, "q_lora_rank": INT_OR_NULL, "qk_rope_head_dim": INT, "v_head_dim": INT_OR_NULL,
        "qk_nope_head_dim": INT, "n_group": INT_OR_NULL, "topk_group": INT_OR_NULL, "num_experts_per_tok": INT_OR_NULL,
        "first_k_dense_replace": INT_OR_NULL, "norm_topk_prob": BOOL_OR_NULL, "hidden_act": STR,
        "max_position_embeddings": INT, "initializer_range": FLOAT, "rms_norm_eps": FLOAT, "use_cache": BOOL,
        "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL, "eos_token_id": TOKEN_IDS,
        "pretraining_tp": INT_OR_NULL, "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL,
        "rope_interleave": BOOL_OR_NULL, "attention_bias": BOOL, "attention_dropout": NUMBER_OR_NULL,
        "num_mtp_layers": INT,
    },
    "DeepseekV4Config": {
        "vocab_size": INT, "hidden_size": INT, "moe_intermediate_size": INT, "num_hidden_layers": INT,
        "num_attention_heads": INT, "num_key_value_heads": INT, "head_dim": INT, "q_lora_rank": INT,
        "num_experts_per_tok": INT, "n_routed_experts": INT, "n_shared_experts": INT, "scoring_func": STR,
        "norm_topk_prob": BOOL, "routed_scaling_factor": FLOAT, "max_position_embeddings": INT, "rope_theta": NUMBER,
        "layer_types": NAMES_OR_NULL, "compress_rates": DICT_OR_NULL, "compress_rope_theta": NUMBER, "hc_mult": INT,
        "hc_sinkhorn_iters": INT, "hc_eps": FLOAT, "mlp_layer_types": NAMES_OR_NULL, "swiglu_limit": FLOAT,
        "sliding_window": INT, "o_groups": INT, "o_lora_rank": INT, "index_n_heads": INT, "index_head_dim": INT,
        "index_topk": INT, "num_nextn_predict_layers": INT, "output_router_logits": BOOL,
        "router_aux_loss_coef": FLOAT, "router_jitter_noise": FLOAT, "hidden_act": STR, "initializer_range": FLOAT,
        "rms_norm_eps": FLOAT, "use_cache": BOOL, "pad_token_id": INT_OR_NULL, "bos_token_id": INT_OR_NULL,
        "eos_token_id": TOKEN_IDS, "tie_word_embeddings": BOOL, "rope_parameters": DICT_OR_NULL,
        "partial_rotary_factor": FLOAT_OR_NULL, "attention_bias": BOOL, "mlp_bias": BOOL, "attention_dropout": FLOAT,
    },
    # The multimodal Gemma-3's wrapper: its own fields (its text config's are Gemma3TextConfig's, above)
    "Gemma3Config": {
        "text_config": DICT_OR_NULL, "vision_config": DICT_OR_NULL,  # a config object or null (the defaults)
        "mm_tokens_per_image": INT_OR_NULL, "boi_token_index": INT_OR_NULL, "eoi_token_index": INT_OR_NULL,
        "image_token_index": INT_OR_NULL, "initializer_range": FLOAT_OR_NULL, "tie_word_embeddings": BOOL_OR_NULL,
    },
    "SiglipVisionConfig": {  # Gemma-3's vision config
        "hidden_size": INT, "intermediate_size": INT, "num_hidden_layers": INT, "num_attention_heads": INT,
        "num_channels": INT, "image_size": INT_OR_INTS, "patch_size": INT_OR_INTS, "hidden_act": STR,
        "layer_norm_eps": FLOAT, "attention_dropout": NUMBER,
    },
}
"""Config class (by name) → each field it declares, in the order it declares them → the kinds of JSON value it
takes. The order is the class's own: it checks its fields in that order, whatever the file's, so of two fields it
refuses, the earlier here is the one named."""

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


def declared_at(table: dict[str, Kinds], key: str) -> int:
    """Where ``table``'s class declares ``key``, which is where it checks it (it checks its fields in that order);
    past the last field for a key it does not declare, which it does not check."""
    return next((index for index, declared in enumerate(table) if declared == key), len(table))


def out_of_range(class_name: str, key: str, value: object) -> str | None:
    """The range ``class_name``'s validator holds ``key`` to ("from 0.0 to 1.0") where ``value`` (a number of a
    kind the class takes) is outside it; None where it is inside, or nothing bounds the field."""
    bounds = FIELD_RANGES.get(class_name, {}).get(key)
    if bounds is None or not isinstance(value, (int, float)) or bounds[0] <= value <= bounds[1]:
        return None
    return f"from {bounds[0]} to {bounds[1]}"
