"""What vLLM 0.32 cannot start a DeepSeek-V4 model without, and the kinds of value it cannot start with.

vLLM 0.33 loads a ``deepseek_v4`` config with transformers' ``DeepseekV4Config``, which gives every key its
model reads a default (``class_defaults`` holds those the plan reads) and checks each value's kind
(``field_kinds``). vLLM 0.32 registers a ``DeepseekV4Config`` of its own, whose only default is
``max_position_embeddings`` and which checks nothing: a key the file omits is no attribute at all, and the first
module that reads it fails (``AttributeError``) while vLLM builds its config or the model, at start-up; a value
passes into the model as it is, and a null or a string where a size goes fails as the model or its KV cache is
built. ``READ_WITHOUT_DEFAULT`` lists the keys that must be there, ``TAKES_032`` the kinds of value a key can
hold, as found by building 0.32's model (its CPU build, on the meta device) and planning its KV cache from a
DeepSeek-V4-Flash config with each key removed, and set to a value of each kind, in turn
(tests/vllm_e2e/test_vllm_plan_v4_032.py repeats both). A value the model reads only in its forward pass
(``rms_norm_eps``, ``hc_eps``, ...) is not seen there: start-up on a GPU also runs a forward pass, which may
refuse more. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kvpolicy.document_codes import MISSING_FIELD, WRONG_TYPE
from kvpolicy.validation import shown

from .class_defaults import class_default
from .config_values import ModelSpecError, is_int

READ_WITHOUT_DEFAULT = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
    "q_lora_rank", "o_lora_rank", "o_groups", "sliding_window", "compress_ratios", "compress_rope_theta",
    "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_eps", "hc_sinkhorn_iters", "hidden_act",
    "rms_norm_eps", "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "num_hash_layers", "norm_topk_prob", "swiglu_limit",
)
"""The keys vLLM 0.32's DeepSeek-V4 model reads and its config class does not default (not
``max_position_embeddings``, ``num_key_value_heads``, ``num_nextn_predict_layers``, ``rope_theta``,
``scoring_func``: 0.32 builds without them)."""

JsonKind = Literal["int", "float", "bool", "str", "list", "dict", "null"]

TAKES_032: dict[str, tuple[JsonKind, ...]] = {
    # the kind DeepSeek-V4's own config.json writes first; true is the number 1 to the model
    **dict.fromkeys(("vocab_size", "head_dim", "index_head_dim", "hc_mult", "hidden_size", "q_lora_rank",
                     "n_routed_experts"), ("int",)),
    **dict.fromkeys(("num_experts_per_tok", "index_n_heads", "index_topk", "moe_intermediate_size",
                     "num_hidden_layers", "num_attention_heads", "o_groups", "o_lora_rank"), ("int", "bool")),
    **dict.fromkeys(("qk_rope_head_dim", "sliding_window", "num_hash_layers"), ("int", "float", "bool")),
    **dict.fromkeys(("max_position_embeddings", "rope_theta", "compress_rope_theta"), ("int", "float")),
    "num_key_value_heads": ("int", "float", "bool", "str"),
    "n_shared_experts": ("int", "bool", "null"),
    "swiglu_limit": ("float", "int", "bool", "str", "null"),
    "torch_dtype": ("str", "int", "float", "bool", "dict", "null"),
    "hidden_act": ("str",),
    "architectures": ("list", "null"),
    "compress_ratios": ("list",),
}
"""A key of a DeepSeek-V4 config → the kinds of JSON value vLLM 0.32 starts with there (for a value of the kind
DeepSeek-V4's config has); a key not listed takes any kind as far as start-up without a GPU shows
(``num_nextn_predict_layers``, ``rms_norm_eps``, ``scoring_func``, ``hc_eps``, ``hc_sinkhorn_iters``,
``norm_topk_prob``), or is not one DeepSeek-V4's config has."""

_KIND_NAMES: dict[JsonKind, str] = {
    "int": "a whole number", "float": "a number with a decimal point", "bool": "true or false", "str": "a string",
    "list": "a list", "dict": "an object", "null": "null",
}


def json_kind(value: object) -> JsonKind:
    """The kind of a value as JSON loads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if is_int(value):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "dict"


def check_v4_config_032(config: Mapping[str, Any], engine_version: str) -> None:
    """Refuse a ``deepseek_v4`` config that vLLM 0.32 cannot start, when planning for 0.32: one that lacks a key
    0.32 reads without a default (ModelSpecError at the first, naming them all), then one with a value of a kind
    0.32 fails with (at the first such value); anything else passes."""
    if not engine_version.startswith("0.32.") or config.get("model_type") != "deepseek_v4":
        return
    _check_present(config)
    _check_kinds(config)


def _check_present(config: Mapping[str, Any]) -> None:
    missing = [key for key in READ_WITHOUT_DEFAULT if key not in config or class_default(config, key) is not None]
    if not missing:
        return
    named = ", ".join(repr(key) for key in missing)
    raise ModelSpecError(
        f"the model config has no {named}: vLLM 0.32's DeepseekV4Config gives no default for "
        f"{'them' if len(missing) > 1 else 'it'} (transformers' class, which vLLM 0.33 loads, does), so vLLM 0.32 "
        f"fails at start-up (AttributeError) when its model reads {'one' if len(missing) > 1 else 'it'}",
        (missing[0],), MISSING_FIELD,
        "write the key in config.json (the released config has it), or plan for vLLM 0.33 (--vllm-version 0.33)",
    )


def _check_kinds(config: Mapping[str, Any]) -> None:
    for key, value in config.items():
        kinds = TAKES_032.get(key)
        if kinds is None or json_kind(value) in kinds:
            continue
        raise ModelSpecError(
            f"{key} {shown(value)}: vLLM 0.32's DeepseekV4Config checks no value, and vLLM 0.32 fails at start-up "
            f"with {_KIND_NAMES[json_kind(value)]} there", (key,), WRONG_TYPE,
            f"write {_KIND_NAMES[kinds[0]]}, as DeepSeek-V4's own config.json does",
        )
