"""The keys vLLM 0.32 cannot start a DeepSeek-V4 model without, and those it cannot start with a null.

vLLM 0.33 loads a ``deepseek_v4`` config with transformers' ``DeepseekV4Config``, which gives every key its
model reads a default (``class_defaults`` holds those the plan reads). vLLM 0.32 registers a
``DeepseekV4Config`` of its own, whose only default is ``max_position_embeddings``: a key the file omits is no
attribute at all, and the first module that reads it fails (``AttributeError``) while vLLM builds its config or
the model, at start-up. ``READ_WITHOUT_DEFAULT`` lists them, as found by building 0.32's model (its CPU build)
from a DeepSeek-V4-Flash config with each key removed in turn (tests/vllm_e2e/test_vllm_plan_v4_032.py checks
it, key by key); the CUDA model class reads each of them too. The class checks no value either, so a null
passes into the model: ``NULL_FAILS`` lists the keys whose null vLLM 0.32 then fails with at start-up, found the
same way with each key set to null in turn. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.document_codes import MISSING_FIELD, WRONG_TYPE

from .class_defaults import class_default
from .config_values import ModelSpecError

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

NULL_FAILS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "sliding_window", "compress_ratios",
    "compress_rope_theta", "rope_theta", "max_position_embeddings", "index_n_heads", "index_head_dim", "index_topk",
    "hc_mult", "hidden_act", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "num_hash_layers",
)
"""The keys whose null vLLM 0.32 cannot start with: ModelConfig's validation refuses it, the model computes with
it as it builds (``TypeError``), or, for ``sliding_window``, the KV cache planning does. A null of ``hc_eps``,
``hc_sinkhorn_iters``, ``rms_norm_eps``, ``n_shared_experts``, ``norm_topk_prob``, ``swiglu_limit``,
``num_nextn_predict_layers``, ``scoring_func``, ``torch_dtype`` or ``architectures`` starts."""


def check_v4_config_032(config: Mapping[str, Any], engine_version: str) -> None:
    """Refuse a ``deepseek_v4`` config that vLLM 0.32 cannot start, when planning for 0.32: one that lacks a key
    0.32 reads without a default (ModelSpecError at the first, naming them all), then one with a null 0.32 fails
    with (at the first such value); anything else passes."""
    if not engine_version.startswith("0.32.") or config.get("model_type") != "deepseek_v4":
        return
    _check_present(config)
    _check_not_null(config)


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


def _check_not_null(config: Mapping[str, Any]) -> None:
    for key, value in config.items():
        if value is None and key in NULL_FAILS:
            raise ModelSpecError(
                f"{key} null: vLLM 0.32's DeepseekV4Config checks no value and keeps the null, which vLLM 0.32 "
                "fails with at start-up", (key,), WRONG_TYPE,
                "write the value DeepSeek-V4's own config.json has",
            )
