"""The model fields that size DeepSeek-V4's KV pools, read from a ``config.json``.

Pure data: no torch, no sglang. Accepts a model's full Hugging Face ``config.json``
or the trimmed copies in ``policies/models/`` (unknown fields are ignored).
"""

from __future__ import annotations

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

from kvpolicy.document_codes import VALUE_NOT_ALLOWED
from kvpolicy.json_text import CarriesProblems
from kvpolicy.validation import Conflict, Conflicts

from ..common import read_config_json
from ..hf_config_kinds import FIELD_KINDS, Kinds, refused
from .rope import MIN_CONTEXT_LENGTH, NO_ROOM, RopeProblem, scaled_length
from .rope import problems as scaling_problems

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
    """Read as SGLang 0.5.23 reads it (``context_problems``); a falsy value is none, as transformers takes it."""
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
    def context_key(self) -> str:
        """The first of ``CONTEXT_LENGTH_KEYS`` the config has (``max_position_embeddings`` at the latest)."""
        return next(key for key in CONTEXT_LENGTH_KEYS if getattr(self, key) is not None)

    @property
    def context_key_length(self) -> int:
        return int(getattr(self, self.context_key))

    @property
    def rope(self) -> tuple[str, dict[str, Any]] | None:
        """The scaling SGLang reads and the field it comes from: ``rope_scaling`` unless that is none, then
        ``rope_parameters``; None when neither scales."""
        if self.rope_scaling:
            return "rope_scaling", self.rope_scaling
        return ("rope_parameters", self.rope_parameters) if self.rope_parameters else None

    def context_problems(self) -> list[RopeProblem]:
        """What stops SGLang 0.5.23 getting a context length from the scaling (``rope.problems``), or starting
        with the length of a context key no written factor multiplies (one under ``MIN_CONTEXT_LENGTH``); empty
        when there is none."""
        if self.rope is not None:
            field, rope = self.rope
            found = scaling_problems(field, rope, self.context_key_length, self.max_position_embeddings)
            if found:
                return found
        length = self._context_length  # here the key's own: a written factor that scales under 2 is found above
        if length < MIN_CONTEXT_LENGTH:
            return [RopeProblem(VALUE_NOT_ALLOWED, (self.context_key,),
                                f"{self.context_key}: {length} is the context length SGLang derives",
                                f"{NO_ROOM}: write the model's own length")]
        return []

    @property
    def derived_context_length(self) -> int:
        """The context length SGLang derives from the config when --context-length is not given.

        SGLang's ``get_context_length``: the first of ``CONTEXT_LENGTH_KEYS`` the config has, times the
        RoPE scaling factor where it applies (``rope.factor_applies``); ValueError for a scaling SGLang gets no
        context length from, or a length it does not start with (``context_problems``, which ``read_geometry``
        places in the file).
        Checked against the real resolution over random configs in the tests.
        """
        found = self.context_problems()
        if found:
            raise ValueError(found[0].message)
        return self._context_length

    @property
    def _context_length(self) -> int:
        """The length ``get_context_length`` computes, unchecked: callers have ruled out ``context_problems``'s
        scaling problems first."""
        return self.context_key_length if self.rope is None else scaled_length(self.rope[1], self.context_key_length)


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
    context = config.geometry.context_problems()
    if context:
        raise GeometryError(f"{path}: SGLang derives no context length it can start with from it: "
                            f"{'; '.join(p.message for p in context)}",
                            DocumentInvalid([config.diagnostic(p.code, p.key, p.message, p.hint) for p in context]))
    if not at:
        _check_field_kinds(config)
    return config


STRICT_CLASSES: dict[str, tuple[tuple[str, dict[str, Kinds]], ...]] = {
    "deepseek_v4": (("transformers' DeepseekV4Config", FIELD_KINDS["DeepseekV4Config"]),
                    ("DeepseekV3Config (SGLang's deepseek_v4 alias of it)", FIELD_KINDS["DeepseekV3Config"])),
    "deepseek_v41": (("DeepseekV3Config (SGLang's DeepseekV41Config is one)", FIELD_KINDS["DeepseekV3Config"]),),
}
"""The strict classes SGLang 0.5.23 loads a config.json of each model type with, and the kinds each takes."""


def _check_field_kinds(config: GeometryConfig) -> None:
    """Refuse the first field, in the file's order, whose value a class of ``STRICT_CLASSES`` does not take
    (after the geometry's own checks, which say more about the fields the plan reads)."""
    from kvpolicy.document_codes import WRONG_TYPE
    from kvpolicy.json_text import DocumentInvalid
    from kvpolicy.validation import shown

    for key, value in config.document.data.items():
        for name, table in STRICT_CLASSES.get(config.geometry.model_type, ()):
            wanted = refused(table, key, value)
            if wanted is not None:
                message = (f"{key} {shown(value, 200)}: {name} takes {wanted} only, so SGLang 0.5.23 cannot load "
                           "the config")
                raise GeometryError(f"{config.document.file}: {message}", DocumentInvalid([config.diagnostic(
                    WRONG_TYPE, (key,), message, "write the value as DeepSeek-V4's own config.json does")]))


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
