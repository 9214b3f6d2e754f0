"""vLLM refuses a config.json whose value its transformers config class refuses.

vLLM loads a model's config with transformers' class for its model type (``class_defaults.CONFIG_CLASSES``),
which checks each declared field's kind (and Llama's ``initializer_range``, its range) as the config loads
(``kvpolicy.adapters.hf_config_kinds``), so vLLM does not start: a ``"rms_norm_eps": 1`` where a float goes, a
null ``hidden_act``. The plan reads only some fields, and those with checks of its own; this refuses the rest
as the class would. vLLM 0.32 loads DeepSeek-V4 with a class of its own, which checks nothing
(``deepseek_v4_032`` holds what 0.32 fails with instead). Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from kvpolicy.validation import shown

from ...hf_config_kinds import FIELD_KINDS, out_of_range, refused
from .class_defaults import class_default, config_class
from .config_values import ModelSpecError


def check_field_kinds(config: Mapping[str, Any], engine_version: str) -> None:
    """Refuse the first field, in the file's order, of a config whose value its config class does not take
    (ModelSpecError at the value: WRONG_TYPE for its kind, VALUE_NOT_ALLOWED outside a validator's range); a
    field the class filled, a model type the plan knows no class of, or DeepSeek-V4 for vLLM 0.32, passes. A
    multimodal wrapper's text config is checked against its class (the wrapper's own fields are not)."""
    cls = config_class(config)
    if cls is None or (config.get("model_type") == "deepseek_v4" and engine_version.startswith("0.32.")):
        return
    table = FIELD_KINDS[cls.name]
    text = config.get("text_config") if getattr(config, "home", ()) else None
    fields: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    as_written: Mapping[str, Any] = getattr(fields, "as_written", {})
    for key in fields:
        if key not in table or class_default(fields, key) is not None:
            continue
        value = as_written.get(key, fields[key])  # what the class's type check sees, before it recomputes
        wanted = refused(table, key, value)
        if wanted is not None:
            raise ModelSpecError(
                f"{key} {shown(value, 200)}: {cls.name} takes {wanted} only, so transformers refuses the config "
                "and vLLM cannot load it", (key,), WRONG_TYPE,
                "write the value as the model's own config.json does",
            )
        bounds = out_of_range(cls.name, key, value)
        if bounds is not None:
            raise ModelSpecError(
                f"{key} {shown(value)}: {cls.name} takes a value {bounds} only, so transformers refuses the "
                "config and vLLM cannot load it", (key,), VALUE_NOT_ALLOWED,
                "write the value as the model's own config.json does",
            )
