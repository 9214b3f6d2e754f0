"""A config's ``sliding_window`` as vLLM 0.33 (and 0.32) reads it, for standard attention and MLA.

vLLM takes the value in three steps, each of which may refuse it:

1. transformers builds the config class. Most classes (Mistral, Qwen2/3, Gemma-2/3, gpt-oss) declare the field
   ``int | None`` and their strict type check refuses anything else (``true``, ``4096.0``, ``"4096"``): the
   config cannot load (Qwen's checks the value before it drops it for ``use_sliding_window: false``). Llama and
   DeepSeek-V2/V3 declare none, and keep any value as it is.
2. ``ModelConfig`` turns a window equal to 0 (``0``, ``0.0``, ``false``) off (None). When ``layer_types`` is
   absent or all ``sliding_attention``, the window is then the model-level one, ``CacheConfig.sliding_window``:
   pydantic's lax ``int | None`` converts a whole float, ``true`` or a numeric string and refuses the rest.
3. vLLM's model passes each layer its window: per layer from ``layer_types`` (Llama, Gemma-2/3; gpt-oss's even
   layers) the config's value as it is, else the model-level one. A window of any integer, negative ones
   included, is planned as a sliding window; a string or a list fails vLLM's planning (a TypeError). A
   negative window plans nonsense (a negative concurrency, or a division by zero): ``hf_config`` refuses it.

``null`` is no window, and legitimate. DeepSeek-V4's window is its own (``hf_config``). Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvpolicy.document_codes import WRONG_TYPE
from kvpolicy.validation import shown

from .class_defaults import as_written, config_class
from .config_values import ModelSpecError, is_int

KEY = "sliding_window"
HINT = "write the window as a whole number of tokens (e.g. 4096), or null for none"
_WIDTH = 200
"""How much of a value a message shows (as the file writes it: ``true``, not Python's ``True``)."""
_CACHE_CONFIG_WINDOW: TypeAdapter[int | None] = TypeAdapter(int | None)
"""``CacheConfig.sliding_window``'s field, validated as vLLM's pydantic dataclass does (lax mode)."""


def check_window(config: Mapping[str, Any]) -> None:
    """Refuse a ``sliding_window`` that vLLM refuses as it builds its config (steps 1 and 2), in its order."""
    window = as_written(config, KEY)  # Qwen's class checks the type before it drops the window
    cls = config_class(config)
    if window is not None and cls is not None and cls.typed_window and not is_int(window):
        raise ModelSpecError(
            f"{KEY} {shown(window, _WIDTH)}: {cls.name} takes a whole number or null, so transformers refuses the config "
            "and vLLM cannot load it", (KEY,), WRONG_TYPE, HINT)
    model_level_window(config)


def model_level_window(config: Mapping[str, Any]) -> int | None:
    """``CacheConfig.sliding_window``: the window of the layers that take none of their own (None: no window)."""
    window = config.get(KEY)
    if window is None or window == 0 or not _all_sliding(config.get("layer_types")):
        return None
    try:
        return _CACHE_CONFIG_WINDOW.validate_python(window)
    except ValidationError:
        raise ModelSpecError(
            f"{KEY} {shown(window, _WIDTH)}: vLLM's CacheConfig takes the model's window as a whole number, and refuses "
            "this one at start-up", (KEY,), WRONG_TYPE, HINT) from None


def layer_window(config: Mapping[str, Any], layer: int) -> int | None:
    """The window a layer vLLM's model gives the config's own value takes (None: no window); refused where vLLM's
    planning fails on it, or where it is no whole number (which kvpolicy does not plan)."""
    window = config.get(KEY)
    if window is None or window == 0:
        return None
    if is_int(window):
        return int(window)
    if window is True or (isinstance(window, float) and window.is_integer()):
        return int(window)  # vLLM computes with it as with the integer it equals
    if isinstance(window, float):
        raise ModelSpecError(
            f"{KEY} {shown(window, _WIDTH)}: layer {layer} (sliding_attention) would take a window of a fraction of a "
            "token, which kvpolicy does not plan (vLLM's attention kernels take whole numbers)",
            (KEY,), WRONG_TYPE, HINT)
    raise ModelSpecError(
        f"{KEY} {shown(window, _WIDTH)}: vLLM's {config.get('model_type')} model gives it as it is to layer {layer} "
        "(sliding_attention), and vLLM fails planning the KV cache at start-up (a TypeError)",
        (KEY,), WRONG_TYPE, HINT)


def _all_sliding(layer_types: Any) -> bool:
    """vLLM sets the model-level window when ``layer_types`` is absent or all sliding_attention (every entry)."""
    if layer_types is None:
        return True
    try:
        return all(t == "sliding_attention" for t in layer_types)
    except TypeError:  # no list: refused where the plan reads layer_types
        return False
