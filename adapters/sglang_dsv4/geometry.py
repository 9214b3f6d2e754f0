"""The model fields that size DeepSeek-V4's KV pools, read from a ``config.json``.

Pure data: no torch, no sglang. Accepts a model's full Hugging Face ``config.json``
or the trimmed copies in ``policies/models/`` (unknown fields are ignored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE
from kvpolicy.json_text import CarriesProblems
from kvpolicy.validation import Conflict, Conflicts, shown

from ..common import read_config_json

if TYPE_CHECKING:
    from kvpolicy.diagnostics import Diagnostic
    from kvpolicy.document_codes import DocumentCode
    from kvpolicy.json_text import DocumentInvalid, JsonObjectFile
    from kvpolicy.validation import Problem

# What the V4 paged layout stores per token: 448 fp8 NoPE values, 64 bf16 RoPE
# values, 7 fp8 scales and one pad byte (SGLang asserts this in the pool).
V4_NOPE_DIM = 448
V4_ROPE_DIM = 64
SUPPORTED_RATIOS = frozenset({0, 4, 128})
V4_ARCHITECTURE = "DeepseekV4ForCausalLM"
"""The architecture SGLang 0.5.23 builds DeepSeek-V4 pools for (V4 and V4.1 configs alike)."""
# Where SGLang looks for a model's context length, first match wins
# (sglang/srt/utils/hf_transformers/common.py, CONTEXT_LENGTH_KEYS).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"
)

# SGLang 0.5.23 loads a deepseek_v4 config through transformers' DeepseekV4Config and then its own
# DeepseekV3Config alias, both strict dataclasses (huggingface_hub): an int field refuses true, "43"
# and 43.0 alike. So the plan reads every integer strictly, where pydantic's lax mode would plan them.
Count = Annotated[int, Field(strict=True, gt=0)]
"""A positive JSON integer: no bool, string or float."""
Int = Annotated[int, Field(strict=True)]
STRICT_HINT = ("SGLang 0.5.23 reads it through transformers' strict DeepseekV4Config, which refuses true, "
               "\"43\" and 43.0: write a bare integer")
NULL_HINT = "SGLang 0.5.23 (transformers' strict DeepseekV4Config) refuses null too: leave the key out for its default"
ROPE_OBJECT_HINT = ("SGLang 0.5.23 (transformers' strict config) takes an object here, such as {\"type\": \"yarn\", "
                    "\"factor\": 16}, or none: leave the key out")

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


@dataclass(frozen=True)
class RopeProblem:
    """Why SGLang 0.5.23 gets no context length from a ``rope_scaling`` (or ``rope_parameters``): the
    diagnostic's code, its key in the geometry (``("rope_scaling", "factor")``), the message and the hint."""

    code: DocumentCode
    key: tuple[str, ...]
    message: str
    hint: str


class ModelGeometry(BaseModel):
    """DeepSeek-V4 fields that matter for the KV pools (names as in ``config.json``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    architectures: tuple[str, ...] = (V4_ARCHITECTURE,)
    model_type: str = "deepseek_v4"
    """``deepseek_v4`` or ``deepseek_v41``: SGLang's launch defaults differ (see ``launch.py``)."""
    num_hidden_layers: Count
    head_dim: Count = 512
    qk_rope_head_dim: Count = 64
    index_head_dim: Count = 128
    sliding_window: Count = 128
    """Absent: transformers' default, 128; null is refused, as transformers refuses it (no Optional)."""
    compress_ratios: tuple[Int, ...]
    kv_source_layer_ids: tuple[Int, ...] = ()
    max_position_embeddings: Count
    # SGLang reads these four untyped, as int(factor * value): a string would be repeated, a float
    # truncated; the plan takes whole numbers only (stricter than SGLang for a float here).
    max_sequence_length: Count | None = None
    seq_length: Count | None = None
    max_seq_len: Count | None = None
    model_max_length: Count | None = None
    rope_scaling: dict[str, Any] | None = None
    """Read as SGLang 0.5.23 reads it (``rope_problems``); a falsy value is none, as transformers takes it."""
    rope_parameters: dict[str, Any] | None = None
    """transformers 5's name for it, read where ``rope_scaling`` is none."""

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _falsy_is_none(cls, value: Any) -> Any:
        # transformers keeps `rope_scaling or rope_parameters`: false, 0, "" and [] scale nothing.
        return value if value else None

    @model_validator(mode="after")
    def _v4_shaped(self) -> ModelGeometry:
        """The fields V4's pools need of each other, each refused at its own place (``Conflicts``)."""
        if len(self.compress_ratios) < self.num_hidden_layers:
            raise Conflicts([Conflict(("compress_ratios",), (
                f"{len(self.compress_ratios)} entries, fewer than "
                f"num_hidden_layers={self.num_hidden_layers}"))])
        unknown = sorted(set(self.stage_ratios) - SUPPORTED_RATIOS)
        if unknown:
            first = next(i for i, r in enumerate(self.stage_ratios) if r not in SUPPORTED_RATIOS)
            raise Conflicts([Conflict(("compress_ratios", first), (
                f"compress ratios {unknown} are not DeepSeek-V4 ratios (0, 4, 128); "
                "ratio-1/2 layers (V4.1) are not covered by these closed forms"))])
        if (self.qk_nope_head_dim, self.qk_rope_head_dim) != (V4_NOPE_DIM, V4_ROPE_DIM):
            raise Conflicts([Conflict(("qk_rope_head_dim",) if self.qk_rope_head_dim != V4_ROPE_DIM else ("head_dim",), (
                f"head_dim={self.head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}: the V4 KV "
                f"layout needs {V4_NOPE_DIM} NoPE + {V4_ROPE_DIM} RoPE dims (head_dim 512, rope 64)"))])
        return self

    @property
    def qk_nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def stage_ratios(self) -> tuple[int, ...]:
        """Ratios of the target model's layers; entries past ``num_hidden_layers`` are MTP layers."""
        return self.compress_ratios[: self.num_hidden_layers]

    def layers(self, ratio: int) -> int:
        """How many of the target model's layers have compress ratio ``ratio``."""
        return self.stage_ratios.count(ratio)

    @property
    def context_key_length(self) -> int:
        """The first of ``CONTEXT_LENGTH_KEYS`` the config has (``max_position_embeddings`` at the latest)."""
        return next(getattr(self, key) for key in CONTEXT_LENGTH_KEYS if getattr(self, key) is not None)

    @property
    def rope(self) -> tuple[str, dict[str, Any]] | None:
        """The scaling SGLang reads and the field it comes from: ``rope_scaling`` unless that is none, then
        ``rope_parameters``; None when neither scales."""
        if self.rope_scaling:
            return "rope_scaling", self.rope_scaling
        return ("rope_parameters", self.rope_parameters) if self.rope_parameters else None

    @property
    def _factor_applies(self) -> bool:
        """Whether ``get_context_length`` multiplies by the factor: not when the scaling has (or transformers
        gives it) its own ``original_max_position_embeddings``, nor for llama3."""
        if self.rope is None:
            return False
        rope = self.rope[1]
        return "original_max_position_embeddings" not in rope and _rope_type(rope) not in SCALED_BY_ORIGINAL

    def rope_problems(self) -> list[RopeProblem]:
        """What stops SGLang 0.5.23 getting a context length from the scaling, in the order it fails (loading
        the config, ``get_context_length``, the MLA scale), then a length under 1; empty when there is none."""
        if self.rope is None:
            return []
        field, rope = self.rope
        loaded: list[tuple[tuple[str, ...], dict[str, Any]]] = [((field,), rope)]
        if isinstance(rope.get("main"), dict) and isinstance(rope.get("compress"), dict):
            loaded = [((field, "main"), rope["main"]), ((field, "compress"), rope["compress"]), *loaded]
        for at, parameters in loaded:
            problems = _rope_load_problems(at, parameters, self.max_position_embeddings)
            if problems:
                return problems
        kind = _rope_type(rope)
        factor = rope.get("factor", 1)
        length = self.context_key_length
        if self._factor_applies:
            formula = f"SGLang 0.5.23 derives the context length as int(factor × {length}) (get_context_length)"
            if not _is_number(factor):
                return [_factor_wrong_type(field, factor, f"{formula}, which {_fails_on(factor, repeats=True)}")]
            product = factor * length  # an int for an int factor, which may be past any float
            if isinstance(product, float) and not math.isfinite(product):
                return [RopeProblem(VALUE_NOT_ALLOWED, (field, "factor"),
                                    f"{field}.factor: {shown(factor)} × {length} is no finite number",
                                    f"{formula}, which fails on an infinite or NaN product")]
        mscale_kind = kind or rope.get("type", kind)
        if mscale_kind != "default" and rope.get("apply_yarn_scaling", True) and rope.get("apply_scale", True):
            where = "SGLang 0.5.23 scales MLA attention by it (compute_mla_mscale_scaling)"
            mscale_all_dim = rope.get("mscale_all_dim", False)
            if not _floats(mscale_all_dim):
                return [RopeProblem(WRONG_TYPE, (field, "mscale_all_dim"),
                                    f"{field}.mscale_all_dim: must be a number, not {shown(mscale_all_dim)}",
                                    f"{where} through float(), which fails on it")]
            if not _is_number(factor):
                return [_factor_wrong_type(field, factor, f"{where} after comparing it with 1, which {_fails_on(factor)}")]
        if self._factor_applies and int(factor * length) < 1:
            return [RopeProblem(VALUE_NOT_ALLOWED, (field, "factor"),
                                f"{field}.factor: {shown(factor)} scales the context length {length} to "
                                f"{int(factor * length)}",
                                "SGLang 0.5.23 derives int(factor × length), and no request fits a context length "
                                "under 1: write a factor of 1 or more, or leave the key out")]
        return []

    @property
    def derived_context_length(self) -> int:
        """The context length SGLang derives from the config when --context-length is not given.

        SGLang's ``get_context_length``: the first of ``CONTEXT_LENGTH_KEYS`` the config has, times the
        RoPE scaling factor where it applies (``_factor_applies``); ValueError for a scaling SGLang gets no
        context length from (``rope_problems``, which ``read_geometry`` places in the file).
        Checked against the real resolution over random configs in the tests.
        """
        problems = self.rope_problems()
        if problems:
            raise ValueError(problems[0].message)
        length = self.context_key_length
        if self.rope is None or not self._factor_applies:
            return length
        return int(self.rope[1].get("factor", 1) * length)


def _rope_type(rope: dict[str, Any]) -> Any:
    """The rope type transformers settles on: ``rope_type`` if given (null too), else ``type``, else
    ``"default"``; any JSON value."""
    return rope["rope_type"] if "rope_type" in rope else rope.get("type", "default")


def _rope_load_problems(at: tuple[str, ...], rope: dict[str, Any], max_position_embeddings: int) -> list[RopeProblem]:
    """What transformers' rope validation refuses in the parameters at ``at`` (SGLang 0.5.23 loading the config)."""
    kind = _rope_type(rope)
    where = ".".join(at)
    missing = [key for key in ROPE_NEEDS.get(kind, ()) if key not in rope] if isinstance(kind, str) else []
    if missing:
        return [RopeProblem(MISSING_FIELD, (*at, key), f"{where}.{key}: required, not given",
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
        return [RopeProblem(WRONG_TYPE, key, f"{where}.original_max_position_embeddings: must be a number, not "
                            f"{shown(original)}", f"transformers' {kind} check (SGLang 0.5.23 loading the config) "
                            f"{how}: {fix}")]
    if kind == "yarn" and original == 0:
        return [RopeProblem(VALUE_NOT_ALLOWED, key, f"{where}.original_max_position_embeddings: must not be 0",
                            f"transformers' yarn check (SGLang 0.5.23 loading the config) {how}: {fix}")]
    return []


def _uncomparable(at: tuple[str, ...], rope: dict[str, Any], kind: object) -> RopeProblem | None:
    """The value transformers' yarn, llama3 or longrope check fails on before it reaches
    ``original_max_position_embeddings``: yarn compares ``beta_fast or 32`` with ``beta_slow or 1``, llama3
    ``high_freq_factor`` with ``low_freq_factor``, longrope takes the length of ``short_factor`` and ``long_factor``."""
    where = ".".join(at)
    check = f"transformers' {kind} check (SGLang 0.5.23 loading the config)"
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            if not hasattr(rope[key], "__len__"):
                return RopeProblem(WRONG_TYPE, (*at, key), f"{where}.{key}: must be a list ([...]), not "
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
        return RopeProblem(WRONG_TYPE, (*at, key), f"{where}.{key}: must be a number, not {shown(rope.get(key))}",
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


def _factor_wrong_type(field: str, factor: object, hint: str) -> RopeProblem:
    return RopeProblem(WRONG_TYPE, (field, "factor"), f"{field}.factor: must be a number, not {shown(factor)}", hint)


class GeometryError(CarriesProblems, ValueError):
    """A model config file that cannot describe a DeepSeek-V4 pool; the message names the file, ``problems``
    place its problems in it (``kvpolicy.document_codes``)."""

    def __init__(self, message: str, problems: DocumentInvalid | None = None) -> None:
        super().__init__(message)
        self.problems = problems


class ConfigUnreadable(GeometryError):
    """The model config file cannot be read at all (missing, a directory, no permission)."""


@dataclass(frozen=True)
class GeometryConfig:
    """A ``config.json`` read for its DeepSeek-V4 geometry: the geometry, the file, and where its fields are in
    it (``("text_config",)`` for a multimodal wrapper's)."""

    geometry: ModelGeometry
    document: JsonObjectFile
    at: tuple[str, ...] = ()

    def diagnostic(self, code: DocumentCode, key: tuple[str | int, ...], message: str,
                   hint: str | None = None) -> Diagnostic:
        """``code``'s diagnostic at the geometry's field ``key`` in the file."""
        return self.document.diagnostic(code, (*self.at, *key), message, hint)


def read_geometry(path: str | Path) -> GeometryConfig:
    """Read a ``config.json`` (full or trimmed) into a checked ``ModelGeometry``, keeping the file to place the
    problems found later; GeometryError with the diagnostics of each problem of the file."""
    from kvpolicy.json_text import DocumentInvalid
    from kvpolicy.validation import describe

    path = Path(path)
    try:
        document = read_config_json(path)
    except OSError as exc:
        raise ConfigUnreadable(f"{path}: cannot read the model config: {exc.strerror}") from None
    except DocumentInvalid as exc:
        raise GeometryError(str(exc), exc) from None
    data: dict[str, Any] = document.data
    at: tuple[str, ...] = ()
    # Multimodal wrappers keep the language model's fields under text_config.
    if "compress_ratios" not in data and isinstance(data.get("text_config"), dict):
        data, at = data["text_config"], ("text_config",)
    try:
        config = GeometryConfig(ModelGeometry.model_validate(data), document, at)
    except ValidationError as exc:
        raise GeometryError(f"{path}: not a DeepSeek-V4 config: {describe(exc, ModelGeometry)}",
                            document.refusal(exc, ModelGeometry, at=at, hint_for=_sglang_hint)) from None
    rope = config.geometry.rope_problems()
    if rope:
        raise GeometryError(f"{path}: SGLang gets no context length from it: {'; '.join(p.message for p in rope)}",
                            DocumentInvalid([config.diagnostic(p.code, p.key, p.message, p.hint) for p in rope]))
    return config


def _sglang_hint(problem: Problem) -> str | None:
    """Why SGLang refuses an integer refused for its type (true, "43", 43.0, null), where a bare "must be a
    whole number, not 43.0" would puzzle, or a ``rope_scaling`` that is no object; None for any other problem."""
    from kvpolicy.validation import WHOLE_NUMBER_ERRORS

    error = problem.error
    if error is None:
        return None
    if error["type"] == "dict_type" and problem.path in (("rope_scaling",), ("rope_parameters",)):
        return ROPE_OBJECT_HINT
    if error["type"] not in WHOLE_NUMBER_ERRORS:
        return None
    return NULL_HINT if "input" in error and error["input"] is None else STRICT_HINT


def load_geometry(path: str | Path) -> ModelGeometry:
    """Read a ``config.json`` (full or trimmed) into a checked ``ModelGeometry``."""
    return read_geometry(path).geometry
