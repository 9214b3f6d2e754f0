"""vLLM 0.33 refuses a DeepSeek-V4 config whose value transformers' strict ``DeepseekV4Config`` refuses.

vLLM 0.33 loads a ``deepseek_v4`` config with that class, which checks each field's kind as the config loads
(``kvpolicy.adapters.deepseek_config_kinds``), so vLLM does not start. vLLM 0.32 loads its own class, which
checks nothing (``deepseek_v4_032`` holds what 0.32 fails with instead). Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.document_codes import WRONG_TYPE
from kvpolicy.validation import shown

from ...deepseek_config_kinds import V4_FIELD_KINDS, refused
from .class_defaults import class_default
from .config_values import ModelSpecError


def check_v4_field_kinds(config: Mapping[str, Any], engine_version: str) -> None:
    """Refuse the first field of a ``deepseek_v4`` config whose value ``DeepseekV4Config`` does not take, when
    planning for 0.33 (ModelSpecError, WRONG_TYPE at the value); a field the class filled, or anything else, passes."""
    if engine_version.startswith("0.32.") or config.get("model_type") != "deepseek_v4":
        return
    for key in V4_FIELD_KINDS:
        if key not in config or class_default(config, key) is not None:
            continue
        value = config[key]
        wanted = refused(V4_FIELD_KINDS, key, value)
        if wanted is not None:
            raise ModelSpecError(
                f"{key} {shown(value, 200)}: DeepseekV4Config takes {wanted} only, so transformers refuses the config "
                "and vLLM cannot load it", (key,), WRONG_TYPE,
                "write the value as DeepSeek-V4's own config.json does (vLLM 0.32's own config class does not check it)",
            )
