"""The keys every transformers config class reads for itself (``hf_base_config``), in each config transformers
builds as vLLM loads a ``config.json``: the model's, and for a multimodal wrapper its text and vision configs
and the wrapper itself, each from its own keys. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...hf_base_config import base_problem
from .class_defaults import WRAPPER_SUB_CONFIGS, is_wrapper
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
    ``"model"`` the model's (a wrapper's own), or a multimodal wrapper's sub-config (``WRAPPER_SUB_CONFIGS``)."""
    where: tuple[str, ...] = () if level == "model" else (level,)
    if where and not is_wrapper(config):
        return None
    values = config.get(level) if where else config
    problem = base_problem(values, _shown) if isinstance(values, Mapping) else None
    if problem is None:
        return None
    prefix = f"{where[0]}." if where else ""
    return ModelSpecError(prefix + problem.message, (*where, *problem.path), problem.code, problem.hint)
