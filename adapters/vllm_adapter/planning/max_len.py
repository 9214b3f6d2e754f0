"""The max_model_len vLLM serves a model with, and the ``--max-model-len`` it refuses.

vLLM 0.32 and 0.33 derive it the same way from the (text) config (``ModelConfig`` →
``_get_and_verify_max_len``, the length keys from the arch-config convertor):

1. the smallest of the length keys the config sets (``LENGTH_KEYS``); a truthy
   ``model_max_length`` then replaces it, larger or not;
2. times the RoPE scaling ``factor``, except for the RoPE types that keep
   ``max_position_embeddings`` already scaled (yarn, llama3, longrope, su and
   DeepSeek's yarn variants) and for Gemma-3, whose length is stated scaled;
3. without ``--max-model-len``: that length, cut to an integer; with longrope the
   config's ``original_max_position_embeddings`` instead (short-context performance);
4. a ``--max-model-len`` above the derived length is refused unless it is at most
   ``model_max_length`` or ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set.

The config is read with its class's defaults (``class_defaults``: Qwen3's 32768) for the model types the
plan knows; for another, a key config.json lacks is taken as absent, where its config class may hold a
default (Phi-3's original length). So without ``max_position_embeddings`` (or a ``model_max_length``, which
decides alone) the default is then not derived and the plan asks for ``--max-model-len``; the keys present
still bound it from above (a class default can only lower the smallest), so a ``--max-model-len`` above them
is refused.
Pure code; tests/vllm/test_vllm_max_model_len.py compares it with vLLM's own resolution over
random configs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvpolicy.document_codes import LAUNCH_REFUSED, VALUE_NOT_ALLOWED, WRONG_TYPE

from .class_defaults import class_default
from .config_values import ConfigKey, ModelSpecError
from .config_values import shown as _shown

LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)
"""The keys vLLM takes the smallest of, in its order (the first smallest names the length)."""
UNSCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
"""RoPE types whose max_position_embeddings already includes the scaling: vLLM does not multiply."""
LEGACY_ROPE_TYPES = {"su": "longrope", "mrope": "default", "telechat3-yarn": "yarn"}
"""Old names vLLM renames when it loads a config."""
NESTED_ROPE_KEYS = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "linear_attention", "sparse", "dense", "main", "compress",
})
"""Keys of RoPE parameters given per layer type (transformers' layer types, DeepSeek-V4's main/compress)."""
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclass(frozen=True)
class ModelLength:
    """What vLLM derives from a config: the ceiling and the default."""

    derived: float
    """The longest --max-model-len vLLM takes without the override (the length keys × RoPE factor)."""
    key: str
    """The config key the length comes from."""
    factor: float
    default: int
    """What vLLM serves without --max-model-len."""
    model_max_length: float | None
    """The config's model_max_length, which also admits a --max-model-len up to it."""
    longrope_original: bool = False
    """The default is longrope's original_max_position_embeddings."""
    known: bool = True
    """The config says enough for ``derived`` and ``default`` to be vLLM's; else ``derived`` only bounds
    vLLM's from above (the class default for max_position_embeddings, unknown here, may be smaller)."""
    key_class: str | None = None
    """The config class whose default ``key`` is (``class_defaults``); None: the file gave it."""
    at: tuple[str, ...] = ()
    """Where the keys are in the config: ``("text_config",)`` for a multimodal one."""

    @property
    def why(self) -> str:
        """Where ``default`` comes from, in the plan's ``assumed`` words."""
        if self.longrope_original:
            return "the config's original_max_position_embeddings, as vLLM serves longrope models"
        scaled = f" × RoPE factor {_number(self.factor)}" if self.factor != 1 else ""
        given = f"{self.key_class}'s default {self.key}" if self.key_class else f"the config's {self.key}"
        return f"{given}{scaled}, as vLLM derives it"


def model_length(config: Mapping[str, Any]) -> ModelLength | None:
    """vLLM's length for this config (``known`` False: only a bound), or None when it sets no length key."""
    text, at = _text_config(config)
    lengths = {key: _length(text, key, at) for key in LENGTH_KEYS}
    model_max = lengths["model_max_length"]
    if all(v is None for v in lengths.values()):
        return None
    # The smallest length; of equal ones, the first key in vLLM's order.
    derived, _, key = min((v, i, k) for i, (k, v) in enumerate(lengths.items()) if v is not None)
    if model_max:
        key, derived = "model_max_length", model_max
    rope = list(_rope_parameters(text, at))
    factor = _scaling_factor(text, rope)
    derived *= factor
    # A longrope model serves its original (pre-scaling) length by default.
    longrope = any(p["rope_type"] == "longrope" for _, p in rope)
    default = _original_length(text, derived, at) if longrope else int(derived)
    original = longrope and "original_max_position_embeddings" in text
    known = lengths["max_position_embeddings"] is not None or bool(model_max)
    return ModelLength(derived, key, factor, default, model_max, original, known, class_default(text, key), at)


def check_rope_parameters(config: Mapping[str, Any]) -> None:
    """Refuse the RoPE parameters vLLM refuses as it loads the config (a ``rope_type`` and a ``type`` that
    conflict): ModelSpecError. vLLM loads the config before it checks the dtype or the length."""
    for _ in _rope_parameters(*_text_config(config)):
        pass


def check_max_model_len(length: ModelLength | None, asked: int, allow_long: bool | None = None) -> None:
    """Refuse an asked --max-model-len as vLLM does (ModelSpecError), unless the override is set."""
    if length is None or asked <= length.derived:
        return
    if length.model_max_length is not None and asked <= length.model_max_length:
        return
    if allow_long is None:
        allow_long = allow_long_max_model_len()
    if allow_long:
        return
    factor = f" × RoPE factor {_number(length.factor)}" if length.factor != 1 else ""
    raise ModelSpecError(
        f"--max-model-len {asked} is more than the {_number(length.derived)} vLLM derives from the config "
        f"({length.key}{factor}), and vLLM refuses it at start-up; lower --max-model-len, or set "
        f"{ALLOW_LONG_ENV}=1 (for vLLM and for this plan) if the model really takes longer inputs",
        (*length.at, length.key), LAUNCH_REFUSED,
    )


def allow_long_max_model_len() -> bool:
    """vLLM's own reading of VLLM_ALLOW_LONG_MAX_MODEL_LEN (a variable of vLLM's, not kvpolicy's: its name is
    written out, so tests/adapters/test_settings.py sees that no KVPOLICY_ variable is read here)."""
    return os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true")


def _text_config(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The language model's config, and where it is: vLLM reads a multimodal config's text_config alone."""
    text = config.get("text_config")
    return (text, ("text_config",)) if isinstance(text, dict) else (config, ())


def _length(config: Mapping[str, Any], key: str, at: tuple[str, ...]) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    return _positive(value, f"{key!r} must be a positive number of tokens", (*at, key))


RopeParameters = tuple[ConfigKey, dict[str, Any]]
"""Where a set of RoPE parameters is in the config, and the set, its type named as vLLM names it."""


def _rope_parameters(config: Mapping[str, Any], at: tuple[str, ...]) -> Iterator[RopeParameters]:
    """Each RoPE parameter set (one per layer type if given so)."""
    name = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    given = config.get(name)
    if not given:
        return
    where: ConfigKey = (*at, name)
    if not isinstance(given, dict):
        raise ModelSpecError(f"rope_scaling must be a mapping, got {_shown(given)}", where, WRONG_TYPE)
    if _is_gemma3(config) and config.get("rope_scaling"):
        # transformers' Gemma-3 config lays rope_scaling over its full-attention parameters, whose
        # rope_type is "default": a legacy "type" then conflicts with it, as vLLM checks.
        given = {"rope_type": "default", **given}
    nested = set(given) <= NESTED_ROPE_KEYS
    for path, params in (((*where, k), v) for k, v in given.items()) if nested else [(where, given)]:
        if isinstance(params, dict) and params:
            yield path, {**params, "rope_type": _rope_type(params, path)}


def _rope_type(params: Mapping[str, Any], where: ConfigKey) -> str:
    modern, legacy = params.get("rope_type"), params.get("type")
    if modern is not None and legacy is not None and modern != legacy and \
            (legacy, modern) not in (("su", "longrope"), ("mrope", "default")):
        raise ModelSpecError(
            f"rope_scaling gives rope_type {modern!r} and type {legacy!r}; vLLM refuses the conflict: keep one", where
        )
    name = modern if modern is not None else legacy if legacy is not None else "default"
    if not isinstance(name, str):
        raise ModelSpecError(f"rope_type must be a name, got {_shown(name)}",
                             (*where, "rope_type" if modern is not None else "type"), WRONG_TYPE)
    return LEGACY_ROPE_TYPES.get(name, name)


def _scaling_factor(config: Mapping[str, Any], rope: list[RopeParameters]) -> float:
    """The factor vLLM multiplies the length by: the last scaled type's (1 without one)."""
    if not rope or _is_gemma3(config):
        return 1.0
    factor: Any = 1.0
    where: ConfigKey = ()
    for path, params in rope:
        if params["rope_type"] not in UNSCALED_ROPE_TYPES and "factor" in params:
            factor, where = params["factor"], (*path, "factor")
    if factor is None:  # vLLM falls back to 1 for an explicit null
        return 1.0
    return _positive(factor, "the RoPE scaling factor must be a positive number", where)


def _is_gemma3(config: Mapping[str, Any]) -> bool:
    """Gemma-3's length is stated scaled already (vLLM skips the factor)."""
    return "gemma3" in str(config.get("model_type", ""))


def _original_length(config: Mapping[str, Any], derived: float, at: tuple[str, ...]) -> int:
    value = config.get("original_max_position_embeddings", derived)
    return int(_positive(value, "'original_max_position_embeddings' must be a positive number",
                         (*at, "original_max_position_embeddings")))


def _positive(value: Any, must: str, key: ConfigKey) -> float:
    """``value`` if it is a number above 0 (not a bool); else ModelSpecError at ``key``: ``must``, and what it was."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ModelSpecError(f"{must}, got {_shown(value)}", key, WRONG_TYPE)
    if not value > 0:
        raise ModelSpecError(f"{must}, got {_shown(value)}", key, VALUE_NOT_ALLOWED)
    return value


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
