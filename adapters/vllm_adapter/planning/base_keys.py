"""The keys every transformers config class reads for itself (``hf_base_config``), in each config transformers
builds as vLLM loads a ``config.json``: the model's, and for a multimodal wrapper its text and vision configs
and the wrapper itself, each from its own keys. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ...hf_base_config import base_problem
from .class_defaults import WRAPPER_SUB_CONFIGS
from .config_levels import refusal_at_level
from .config_values import ModelSpecError
from .config_values import shown as _shown


def check_config_base(config: Mapping[str, Any]) -> None:
    """Refuse the first fault of the base keys, in the order transformers builds the configs (a wrapper's text
    config, its vision config, then the wrapper)."""
    for level in (*WRAPPER_SUB_CONFIGS, "model"):
        refusal = base_refusal(config, level)
        if refusal is not None:
            raise refusal


def base_refusal(config: Mapping[str, Any], level: str) -> ModelSpecError | None:
    """The refusal of the base keys of one config transformers builds from the file, None where it builds it:
    ``"model"`` the model's (a wrapper's own), or a multimodal wrapper's sub-config (``config_levels``)."""
    return refusal_at_level(config, level, partial(base_problem, shown=_shown))
