"""A config's RoPE scaling as SGLang 0.5.23 reads it for the context length: which scaling it takes, whether
its factor scales the length, and what stops SGLang getting a length from it (each a ``ConfigProblem`` that
``geometry.read_geometry`` places in the file).

Pure code: checked against SGLang's own resolution over random scalings (tests/sglang/test_sglang_rope_scaling.py).
"""

from __future__ import annotations

import math
from typing import Any

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE
from kvpolicy.validation import shown

from .config_fields import ConfigProblem

MIN_CONTEXT_LENGTH = 2
"""The least context length SGLang 0.5.23 starts with: TpModelWorker asserts, after allocating the pools, that the
longest request (the context length − 1 tokens) holds a token ("Memory pool size is too small"), although its
ModelConfig resolves any length."""
NO_ROOM = (f"SGLang 0.5.23 stops at start-up with a context length under {MIN_CONTEXT_LENGTH}: its worker requires "
           "the longest request (the context length − 1 tokens) to hold a token (\"Memory pool size is too small\")")

# How SGLang 0.5.23 reads rope_scaling (transformers 5 loads it first, as rope_parameters):
# - transformers (modeling_rope_utils: convert_rope_params_to_dict, standardize_rope_params, validate_rope): it
#   takes `rope_scaling or rope_parameters`, so a falsy rope_scaling (null, false, 0, "", [], {}) leaves
#   rope_parameters, which must be an object or null (its strict field) and any other non-object rope_scaling is
#   refused. The type is rope_type if the key is there (even null), else type, else "default"; llama3, yarn and
#   longrope get original_max_position_embeddings (max_position_embeddings) unless they have their own; each known
#   type's validator raises KeyError for a missing key (ROPE_NEEDS), the yarn one divides max_position_embeddings by
#   original_max_position_embeddings, the llama3 one compares them. DeepseekV4Config validates the "main" and
#   "compress" parameters of a nested one (both objects) so; SGLang's DeepseekV3Config alias sees it flat.
# - get_context_length: int(factor * length) unless original_max_position_embeddings is in it or the type is llama3.
# - ModelConfig._init_mla_scaling (compute_mla_mscale_scaling): unless the type is "default" (rope_type, or type if
#   that is falsy) or apply_yarn_scaling / apply_scale is falsy, float(mscale_all_dim) and factor <= 1.
SCALED_BY_ORIGINAL = ("llama3", "yarn", "longrope")
"""Rope types transformers gives an ``original_max_position_embeddings``: SGLang never applies their factor."""
ROPE_NEEDS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "longrope": ("short_factor", "long_factor"),
}
"""The keys transformers' rope validation requires of each type that a config must give itself (it fills
``rope_type``, ``rope_theta`` and ``original_max_position_embeddings``)."""


def factor_applies(rope: dict[str, Any]) -> bool:
    """Whether ``get_context_length`` multiplies by the factor: not when the scaling has (or transformers
    gives it) its own ``original_max_position_embeddings``, nor for llama3."""
    return "original_max_position_embeddings" not in rope and rope_type(rope) not in SCALED_BY_ORIGINAL


def scaled_length(rope: dict[str, Any], length: int) -> int:
    """The context length ``get_context_length`` derives from ``length`` under a scaling without problems."""
    return int(rope.get("factor", 1) * length) if factor_applies(rope) else length


def problems(field: str, rope: dict[str, Any], length: int, max_position_embeddings: int) -> list[ConfigProblem]:
    """What stops SGLang 0.5.23 getting a context length from the scaling ``rope`` (the config's ``field``) of a
    config whose context length key gives ``length``, in the order it fails (loading the config,
    ``get_context_length``, the MLA scale), then a factor that scales the length to one SGLang cannot start with
    (``MIN_CONTEXT_LENGTH``); empty when there is none."""
    loaded: list[tuple[tuple[str, ...], dict[str, Any]]] = [((field,), rope)]
    if isinstance(rope.get("main"), dict) and isinstance(rope.get("compress"), dict):
        loaded = [((field, "main"), rope["main"]), ((field, "compress"), rope["compress"]), *loaded]
    for at, parameters in loaded:
        found = _load_problems(at, parameters, max_position_embeddings)
        if found:
            return found
    found = _length_problems(field, rope, length) + _mscale_problems(field, rope)
    if found:
        return found[:1]
    factor = rope.get("factor", 1)
    if factor_applies(rope) and "factor" in rope and int(factor * length) < MIN_CONTEXT_LENGTH:
        return [ConfigProblem(VALUE_NOT_ALLOWED, (field, "factor"),
                              f"{field}.factor: {shown(factor)} scales the context length {length} to "
                              f"{int(factor * length)}",
                              f"SGLang 0.5.23 derives int(factor × length); {NO_ROOM}: write a factor of 1 or more, "
                              "or leave the key out")]
    return []


def _length_problems(field: str, rope: dict[str, Any], length: int) -> list[ConfigProblem]:
    """What ``get_context_length``'s ``int(factor * length)`` fails on, where the factor applies."""
    if not factor_applies(rope):
        return []
    factor = rope.get("factor", 1)
    formula = f"SGLang 0.5.23 derives the context length as int(factor × {length}) (get_context_length)"
    if not _is_number(factor):
        return [_factor_wrong_type(field, factor, f"{formula}, which {_fails_on(factor, repeats=True)}")]
    product = factor * length  # an int for an int factor, which may be past any float
    if isinstance(product, float) and not math.isfinite(product):
        return [ConfigProblem(VALUE_NOT_ALLOWED, (field, "factor"),
                              f"{field}.factor: {shown(factor)} × {length} is no finite number",
                              f"{formula}, which fails on an infinite or NaN product")]
    return []


def _mscale_problems(field: str, rope: dict[str, Any]) -> list[ConfigProblem]:
    """What ``compute_mla_mscale_scaling`` fails on: ``float(mscale_all_dim)`` and ``factor <= 1``, unless the
    type is "default" (``rope_type``, or ``type`` where that is falsy) or the scale is switched off."""
    kind = rope_type(rope)
    if (kind or rope.get("type", kind)) == "default":
        return []
    if not (rope.get("apply_yarn_scaling", True) and rope.get("apply_scale", True)):
        return []
    where = "SGLang 0.5.23 scales MLA attention by it (compute_mla_mscale_scaling)"
    mscale_all_dim = rope.get("mscale_all_dim", False)
    if not _floats(mscale_all_dim):
        return [ConfigProblem(WRONG_TYPE, (field, "mscale_all_dim"),
                              f"{field}.mscale_all_dim: must be a number, not {shown(mscale_all_dim)}",
                              f"{where} through float(), which fails on it")]
    factor = rope.get("factor", 1)
    if not _is_number(factor):
        return [_factor_wrong_type(field, factor, f"{where} after comparing it with 1, which {_fails_on(factor)}")]
    return []


def rope_type(rope: dict[str, Any]) -> Any:
    """The rope type transformers settles on: ``rope_type`` if given (null too), else ``type``, else
    ``"default"``; any JSON value."""
    return rope["rope_type"] if "rope_type" in rope else rope.get("type", "default")


def _load_problems(at: tuple[str, ...], rope: dict[str, Any], max_position_embeddings: int) -> list[ConfigProblem]:
    """What transformers' rope validation refuses in the parameters at ``at`` (SGLang 0.5.23 loading the config)."""
    kind = rope_type(rope)
    where = ".".join(at)
    missing = [key for key in ROPE_NEEDS.get(kind, ()) if key not in rope] if isinstance(kind, str) else []
    if missing:
        return [ConfigProblem(MISSING_FIELD, (*at, key), f"{where}.{key}: required, not given",
                              f"transformers, which loads the config for SGLang 0.5.23, refuses a {kind} rope scaling "
                              f"without {key}") for key in missing]
    compared = _uncomparable(at, rope, kind)
    if compared is not None:
        return [compared]
    if kind not in ("yarn", "llama3") or "original_max_position_embeddings" not in rope:
        return []
    original = rope["original_max_position_embeddings"]
    how = (f"divides max_position_embeddings ({max_position_embeddings}) by it" if kind == "yarn"
           else f"compares it with max_position_embeddings ({max_position_embeddings})")
    fix = "write the pretraining context length, or leave the key out for max_position_embeddings"
    key = (*at, "original_max_position_embeddings")
    if not _is_number(original):
        return [ConfigProblem(WRONG_TYPE, key, f"{where}.original_max_position_embeddings: must be a number, not "
                              f"{shown(original)}", f"transformers' {kind} check (SGLang 0.5.23 loading the config) "
                              f"{how}: {fix}")]
    if kind == "yarn" and original == 0:
        return [ConfigProblem(VALUE_NOT_ALLOWED, key, f"{where}.original_max_position_embeddings: must not be 0",
                              f"transformers' yarn check (SGLang 0.5.23 loading the config) {how}: {fix}")]
    return []


def _uncomparable(at: tuple[str, ...], rope: dict[str, Any], kind: object) -> ConfigProblem | None:
    """The value transformers' yarn, llama3 or longrope check fails on before it reaches
    ``original_max_position_embeddings``: yarn compares ``beta_fast or 32`` with ``beta_slow or 1``, llama3
    ``high_freq_factor`` with ``low_freq_factor``, longrope takes the length of ``short_factor`` and ``long_factor``."""
    where = ".".join(at)
    check = f"transformers' {kind} check (SGLang 0.5.23 loading the config)"
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            if not hasattr(rope[key], "__len__"):
                return ConfigProblem(WRONG_TYPE, (*at, key), f"{where}.{key}: must be a list ([...]), not "
                                     f"{shown(rope[key])}", f"{check} takes its length: write one number per rotary "
                                     "frequency")
        return None
    if kind == "yarn":  # an absent or falsy beta is its default
        keys, values = ("beta_fast", "beta_slow"), (rope.get("beta_fast") or 32, rope.get("beta_slow") or 1)
    elif kind == "llama3":  # both required: ROPE_NEEDS
        keys, values = ("high_freq_factor", "low_freq_factor"), (rope["high_freq_factor"], rope["low_freq_factor"])
    else:
        return None
    try:
        values[0] < values[1]  # noqa: B015 - only whether Python can compare them, as transformers does
    except TypeError:
        key = next(k for k, v in zip(keys, values, strict=True) if not _is_number(v))
        return ConfigProblem(WRONG_TYPE, (*at, key), f"{where}.{key}: must be a number, not {shown(rope.get(key))}",
                             f"{check} compares {keys[0]} with {keys[1]}, and fails on it")
    return None


def _is_number(value: object) -> bool:
    """Whether Python arithmetic takes ``value`` as SGLang uses it: a JSON number, or true/false (1/0)."""
    return isinstance(value, (int, float))


def _floats(value: object) -> bool:
    """Whether ``float(value)`` succeeds (a number, a bool or a numeric string)."""
    try:
        float(value)  # type: ignore[arg-type]  # any JSON value: the point is to see whether it converts
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _fails_on(value: object, *, repeats: bool = False) -> str:
    """How Python arithmetic goes wrong on a non-number ``value``."""
    if isinstance(value, str) and repeats:
        return "repeats a string rather than scaling it"
    if value is None:
        return "fails on null"
    return f"fails on {'a string' if isinstance(value, str) else 'a list' if isinstance(value, list) else 'an object'}"


def _factor_wrong_type(field: str, factor: object, hint: str) -> ConfigProblem:
    return ConfigProblem(WRONG_TYPE, (field, "factor"), f"{field}.factor: must be a number, not {shown(factor)}", hint)
