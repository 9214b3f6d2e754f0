"""The planning's errors, and reading one value of a model config with them.

Shared by the modules that read a config (``hf_config``, ``model_build``, ``max_len``); pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ModelSpecError(ValueError):
    """The config cannot be planned; the message names the field and what was expected."""


class ConfigUnreadable(ModelSpecError):
    """The model config file cannot be read at all (missing, a directory, no permission)."""


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message names a value, it does not dump it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def config_int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """``config[key]``, a non-negative integer; absent or null: ``default`` (as the config classes take a null),
    and without one a ModelSpecError naming the key."""
    value = config.get(key)
    if value is None:
        value = default
    if value is None:
        raise ModelSpecError(f"the model config has no {key!r}, which sizes the KV cache")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelSpecError(f"{key!r} must be a non-negative integer, got {shown(value)}")
    return value
