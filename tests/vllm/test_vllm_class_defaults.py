"""The defaults the plan fills into a config.json (planning/class_defaults.py) are its config class's.

For every model type in ``CONFIG_CLASSES``, each example writes a config.json that gives, omits or nulls
(where the class derives a value from a null) each key the table covers, with random values, and loads it
as vLLM 0.33 does (``vllm.transformers_utils.config.get_config``: transformers' class for the model type,
or the one vLLM registers for it; milliseconds, no model is built). Every key of the table must read as the
class holds it in the text config vLLM plans with: the constants, the values derived from others
(``head_dim``, ``layer_types``) and the ones the class recomputes (Qwen's window). The Gemma-3 wrapper is
drawn with its text config, with and without the text config's own model type. What a model does with
the values (its windows, what it splits across ranks) is checked against vLLM's model classes in
test_vllm_plan_random.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.class_defaults import CONFIG_CLASSES, Derived
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_CLASS_DEFAULTS_EXAMPLES", "300"))
"""Each example is one config load (a few milliseconds once vLLM is imported)."""

ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration", "gpt_oss": "GptOssForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM", "deepseek_v4": "DeepseekV4ForCausalLM",
}
EXTRA_KEYS = {  # keys a class derives others from, drawn too
    "qwen2": ["use_sliding_window", "max_window_layers"], "qwen3": ["use_sliding_window", "max_window_layers"],
    "gemma3_text": ["sliding_window_pattern"], "gemma3": ["sliding_window_pattern"],
}
NULLABLE = {"sliding_window"}
"""Keys a null is drawn for besides the derived ones (a null window stays null), but for the classes whose field
takes no null (transformers checks the type)."""
NOT_NULLABLE = {"deepseek_v4": {"sliding_window"}}


def test_every_model_type_is_drawn() -> None:
    assert set(ARCHITECTURES) == set(CONFIG_CLASSES)


def value(draw: st.DrawFn, key: str, layers: int | None) -> Any:
    """A value transformers takes for ``key``."""
    if key == "layer_types":
        if layers is None:  # its length must be the class's layer count: drawn only with num_hidden_layers
            return None
        return draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=layers,
                             max_size=layers))
    if key == "hidden_size":
        return 128 * draw(st.integers(1, 8))  # a multiple of every head count drawn or defaulted
    choices: dict[str, st.SearchStrategy[Any]] = {
        "num_attention_heads": st.sampled_from([4, 8, 16, 32]),
        "num_key_value_heads": st.sampled_from([1, 2, 4]),
        "head_dim": st.sampled_from([64, 128, 256, 512]),
        "vocab_size": st.integers(256, 300_000),
        "max_position_embeddings": st.integers(128, 1 << 21),
        "sliding_window": st.integers(16, 8192),
        "use_sliding_window": st.booleans(),
        "max_window_layers": st.integers(0, 10),
        "sliding_window_pattern": st.integers(1, 8),
        "kv_lora_rank": st.sampled_from([128, 256, 512]),
        "qk_rope_head_dim": st.sampled_from([32, 64]),
        "n_routed_experts": st.sampled_from([8, 16, 64]),
        "n_shared_experts": st.sampled_from([1, 2]),
        "index_head_dim": st.sampled_from([64, 128]),
    }
    if key in ("intermediate_size", "moe_intermediate_size"):
        return draw(st.integers(16, 4096))
    return draw(choices.get(key, st.integers(0, 8)))


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(model type, the fields of its text config) with each key given, left out or (if derived) null."""
    model_type = draw(st.sampled_from(sorted(CONFIG_CLASSES)))
    cls = CONFIG_CLASSES[model_type]
    fields: dict[str, Any] = {}
    if draw(st.booleans()):
        fields["num_hidden_layers"] = draw(st.integers(1, 8))
    layers = fields.get("num_hidden_layers")
    for key in [*cls.defaults, *EXTRA_KEYS.get(model_type, [])]:
        if key == "num_hidden_layers" or (key == "layer_types" and layers is None):
            continue
        choice = draw(st.sampled_from(["give", "give", "omit", "null"]))
        nullable = (isinstance(cls.defaults.get(key), Derived) or key in NULLABLE) and \
            key not in NOT_NULLABLE.get(model_type, set())
        if choice == "give":
            fields[key] = value(draw, key, layers)
        elif choice == "null" and nullable:
            fields[key] = None
    if model_type == "deepseek_v4" and layers is not None:
        fields["layer_types"] = ["sliding_attention"] * layers  # the class checks them against its layer count
    if model_type == "deepseek_v4" and "head_dim" in fields:
        fields["qk_rope_head_dim"] = 64  # the class derives a RoPE share from it
    return model_type, fields


def write(folder: Path, model_type: str, fields: dict[str, Any], text_type: bool) -> Path:
    config: dict[str, Any] = {"model_type": model_type, "architectures": [ARCHITECTURES[model_type]]}
    if model_type == "gemma3":  # the multimodal wrapper: the language model's fields in text_config
        config["text_config"] = {**({"model_type": "gemma3_text"} if text_type else {}), **fields}
    else:
        config |= fields
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=configs(), text_type=st.booleans())
def test_the_plan_reads_what_the_config_class_holds(tmp_path_factory: pytest.TempPathFactory,
                                                    drawn: tuple[str, dict[str, Any]], text_type: bool) -> None:
    from vllm.transformers_utils.config import get_config

    model_type, fields = drawn
    folder = write(tmp_path_factory.mktemp("class-defaults"), model_type, fields, text_type)
    text = get_config(str(folder), trust_remote_code=False).get_text_config()
    cls = CONFIG_CLASSES[model_type]
    assert type(text).__name__ == cls.name
    ours = load_config(folder / "config.json")
    for key in [*cls.defaults, *cls.adjust]:
        assert ours.get(key) == getattr(text, key, None), (model_type, key, fields)
    event(f"{model_type}: {'some keys' if any(key not in fields for key in cls.defaults) else 'nothing'} left to "
          "the class")
