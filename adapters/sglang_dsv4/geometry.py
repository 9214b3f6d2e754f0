"""The model fields that size DeepSeek-V4's KV pools, read from a ``config.json``.

Pure data: no torch, no sglang. Accepts a model's full Hugging Face ``config.json``
or the trimmed copies in ``policies/models/`` (unknown fields are ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED
from kvpolicy.json_text import CarriesProblems, refused
from kvpolicy.validation import Conflict, Conflicts
from kvpolicy.validation import problems as problems_of

from ..common import read_config_json
from ..hf_base_config import BaseProblem, base_problem, layer_types_problem, renamed_layer_types_problem
from ..hf_dtype import dtype_problem
from ..hf_config_kinds import FIELD_KINDS, Kinds, declared_at
from ..hf_config_kinds import refused as kinds_wanted
from .config_fields import (
    CONTEXT_LENGTH_KEYS,
    V4_ARCHITECTURE,
    V4_MODEL_TYPE,
    V41_MODEL_TYPE,
    ConfigFields,
    ConfigProblem,
    ConfigShapeError,
    config_fields,
)
from .layer_types import v4_layer_types_problem
from .refusal_order import (
    LATER,
    MOVED_TO,
    READING_ORDER,
    ROPE_KEYS,
    class_stage,
    is_number,
    missing_rank,
    reading_rank,
)
from .rope import MIN_CONTEXT_LENGTH, NO_ROOM, scaled_length
from .rope import problems as scaling_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from kvpolicy.diagnostics import Diagnostic
    from kvpolicy.document_codes import DocumentCode
    from kvpolicy.json_text import DocumentInvalid, JsonObjectFile
    from kvpolicy.validation import Problem

# What the V4 paged layout stores per token: 448 fp8 NoPE values, 64 bf16 RoPE
# values, 7 fp8 scales and one pad byte (SGLang asserts this in the pool).
V4_NOPE_DIM = 448
V4_ROPE_DIM = 64
SUPPORTED_RATIOS = frozenset({0, 4, 128})

# SGLang 0.5.23 loads a deepseek_v4 config through transformers' DeepseekV4Config and then its own
# DeepseekV3Config alias (a deepseek_v41 one through the latter only), strict dataclasses (huggingface_hub):
# an int field refuses true, "43" and 43.0 alike. So the plan reads every integer strictly, where pydantic's
# lax mode would plan them.
Count = Annotated[int, Field(strict=True, gt=0)]
"""A positive JSON integer: no bool, string or float."""
Int = Annotated[int, Field(strict=True)]
STRICT_HINT = ("SGLang 0.5.23 reads it through transformers' strict config classes (DeepseekV4Config, "
               "DeepseekV3Config), which refuse true, \"43\" and 43.0: write a bare integer")
FILE_DEFAULTS: dict[str, int] = {"num_hidden_layers": 61, "max_position_embeddings": 4096, "head_dim": 64,
                                 "qk_rope_head_dim": 64}
"""What SGLang 0.5.23 takes for a geometry field a ``config.json`` leaves out: the defaults of transformers'
``DeepseekV3Config``, the class it loads ``deepseek_v4`` and ``deepseek_v41`` configs with last (not
``DeepseekV4Config``'s, which it loads a V4 config with first). Checked against the class in the tests."""
FILE_REQUIRED = ("architectures", "compress_ratios", "index_head_dim", "sliding_window")
"""The fields the pools need that ``DeepseekV3Config`` gives no default: SGLang stops without them."""
REQUIRED_HINT = ("SGLang 0.5.23 stops without it (its DeepseekV3Config gives it no default): write the model's value, "
                 "as DeepSeek-V4's own config.json does")
ROPE_OBJECT_HINT = ("SGLang 0.5.23 (transformers' strict config) takes an object here, such as {\"type\": \"yarn\", "
                    "\"factor\": 16}, or none: leave the key out")


def _a_number(value: Any) -> Any:
    """A value Python compares with a number: any JSON number, and ``true`` or ``false``."""
    if is_number(value):
        return value
    raise PydanticCustomError("float_type", "Input should be a valid number")


class ModelGeometry(BaseModel):
    """DeepSeek-V4 fields that matter for the KV pools (names as in ``config.json``).

    The defaults are DeepSeek-V4's own values, for code that builds a geometry; ``read_geometry`` reads a
    ``config.json`` with SGLang's (``FILE_DEFAULTS``, ``FILE_REQUIRED``) instead."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    architectures: tuple[str, ...] = (V4_ARCHITECTURE,)
    model_type: str = V4_MODEL_TYPE
    """``deepseek_v4`` or ``deepseek_v41``: SGLang's launch defaults differ (see ``launch.py``)."""
    num_hidden_layers: Count
    head_dim: Count = 512
    qk_rope_head_dim: Count = 64
    index_head_dim: Count = 128
    sliding_window: Count = 128
    """Null is refused, as transformers refuses it (no Optional)."""
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
    hc_mult: Annotated[Any, PlainValidator(_a_number)] = None
    """SGLang compares it with 1 (``hc_mult <= 1``), so it must be a number (``true`` is 1): for a V4 config
    DeepseekV4Config checks it first (a whole number); a V4.1 config's class does not declare it."""

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _falsy_is_none(cls, value: Any) -> Any:
        # transformers keeps `rope_scaling or rope_parameters`: false, 0, "" and [] scale nothing.
        return value if value else None

    @model_validator(mode="after")
    def _v4_shaped(self) -> ModelGeometry:
        """The fields V4's pools need of each other, each refused at its own place (``Conflicts``)."""
        # in DeepseekV4Config's order: it maps each ratio to a layer type, then compares their count with the layers
        unknown = sorted(set(self.stage_ratios) - SUPPORTED_RATIOS)
        if unknown:
            first = next(i for i, r in enumerate(self.stage_ratios) if r not in SUPPORTED_RATIOS)
            raise Conflicts([Conflict(("compress_ratios", first), (
                f"compress ratios {unknown} are not DeepSeek-V4 ratios (0, 4, 128); "
                "ratio-1/2 layers (V4.1) are not covered by these closed forms"))])
        if len(self.compress_ratios) < self.num_hidden_layers:
            raise Conflicts([Conflict(("compress_ratios",), (
                f"{len(self.compress_ratios)} entries, fewer than "
                f"num_hidden_layers={self.num_hidden_layers}"))])
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

    def context_problems(self) -> list[ConfigProblem]:
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
            return [ConfigProblem(VALUE_NOT_ALLOWED, (self.context_key,),
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
    """A ``config.json`` read for its DeepSeek-V4 geometry: the geometry, the file, and the fields it was read
    from with their places in the file (``config_fields``: a V4.1 config's ``text_config`` laid out flat)."""

    geometry: ModelGeometry
    document: JsonObjectFile
    fields: ConfigFields

    def diagnostic(self, code: DocumentCode, key: tuple[str | int, ...], message: str,
                   hint: str | None = None) -> Diagnostic:
        """``code``'s diagnostic at the geometry's field ``key`` (a path in the fields) in the file."""
        return self.document.diagnostic(code, self.fields.path(key), message, hint)


def read_geometry(path: str | Path) -> GeometryConfig:
    """Read a ``config.json`` (full or trimmed) into a checked ``ModelGeometry``, keeping the file to place the
    problems found later; GeometryError with the diagnostics of each problem of the file."""
    from kvpolicy.json_text import DocumentInvalid

    path = Path(path)
    try:
        document = read_config_json(path)
    except OSError as exc:
        raise ConfigUnreadable(f"{path}: cannot read the model config: {exc.strerror}") from None
    except DocumentInvalid as exc:
        raise GeometryError(str(exc), exc) from None
    try:
        fields = config_fields(document.data)
    except ConfigShapeError as exc:
        p = exc.problem
        raise GeometryError(f"{path}: {p.message}", DocumentInvalid([document.diagnostic(p.code, p.key, p.message,
                                                                                         p.hint)])) from None
    # SGLang's order: the strict class it builds the config with first checks each field's kind, then reads the
    # dtype and the keys every config class reads for itself, checks the RoPE parameters written under their old
    # name (``rope_scaling``) as the field they become and renames legacy layer types; DeepseekV4Config then maps
    # the compress ratios to layer types (``class_stage``) and its validator checks them, as a V4.1 config's
    # class checks its own; the RoPE parameters are converted, SGLang's alias class checks its fields' kinds, and
    # SGLang's own reading comes last (``_check_reading``). So each is refused where SGLang refuses it.
    geometry = _validated(fields)
    first, *later = STRICT_CLASSES[fields.data["model_type"]]
    v4 = fields.data["model_type"] == V4_MODEL_TYPE
    _check_field_kinds(document, fields, [first], geometry)
    _check_dtype(document, fields)
    _check_base(document, fields)
    _check_uniform_layers(document, fields)
    _check_field_kinds(document, fields, [first], geometry, moved=True)
    _check_base(document, fields, renamed_layer_types_problem)
    if v4:
        _check_as_the_class_builds(document, fields)
    _check_base(document, fields, v4_layer_types_problem if v4 else _base_layer_types)
    config = GeometryConfig(geometry, document, fields) if isinstance(geometry, ModelGeometry) else None
    context = config.geometry.context_problems() if config is not None else []
    if config is not None and context and context[0].key[:1] in ROPE_KEYS:
        raise _no_context(config, context)
    _check_field_kinds(document, fields, later, geometry)
    _check_reading(document, fields, geometry)
    assert config is not None
    if context:
        raise _no_context(config, context)
    return config


def _check_reading(document: JsonObjectFile, fields: ConfigFields, geometry: ModelGeometry | ValidationError) -> None:
    """Refuse what SGLang's own reading of the built config stops at first (``reading_rank``): the fields it
    requires that the file leaves out, or the geometry's problems."""
    missing = sorted((key for key in FILE_REQUIRED if key not in fields.data), key=missing_rank)
    invalid = geometry if isinstance(geometry, ValidationError) else None
    found = [problem for problem in problems_of(invalid, ModelGeometry) if problem.kind != "missing-field"
             ] if invalid is not None else []
    reading = partial(reading_rank, fields.data)
    if missing and missing_rank(missing[0]) <= min(map(reading, found), default=len(READING_ORDER)):
        problems = refused(document.diagnostic(MISSING_FIELD, fields.path((key,)), f"{key}: required, not given",
                                               REQUIRED_HINT) for key in missing)
        raise GeometryError(f"{document.file}: not a DeepSeek-V4 config: {', '.join(missing)} not given", problems)
    if invalid is not None:
        raise _not_v4(document, fields, invalid, order=reading)


def _check_as_the_class_builds(document: JsonObjectFile, fields: ConfigFields) -> None:
    """Refuse what DeepseekV4Config stops at as it builds (``class_stage``), the earliest of its checks."""
    stage = partial(class_stage, fields.data)

    def first_stage(error: ValidationError) -> int:
        return min(map(stage, problems_of(error, ModelGeometry)))

    earliest = min(_as_the_class_builds(fields.data), key=first_stage, default=None)
    if earliest is not None and first_stage(earliest) < LATER:
        raise _not_v4(document, fields, earliest, order=stage)


def _as_the_class_builds(data: Mapping[str, Any]) -> list[ValidationError]:
    """The geometry's problems with what DeepseekV4Config reads as it builds, each check alone (every other field
    valid, so that no other field's problem hides them): the layer count with the compress ratios, and
    ``qk_rope_head_dim``. A config that leaves one of them out is not checked for it, nor the compress ratios
    beside layer types it gives."""
    found = []
    for read, others in _CLASS_CHECKS:
        if not read <= data.keys() or ("compress_ratios" in read and data.get("layer_types") is not None):
            continue  # with layer types given, the class maps no compress ratio
        try:
            ModelGeometry.model_validate({"max_position_embeddings": FILE_DEFAULTS["max_position_embeddings"],
                                          **others, **{key: data[key] for key in read}})
        except ValidationError as exc:
            found.append(exc)
    return found


_CLASS_CHECKS: tuple[tuple[set[str], dict[str, Any]], ...] = (
    ({"num_hidden_layers", "compress_ratios"}, {}),
    ({"qk_rope_head_dim"}, {"num_hidden_layers": 1, "compress_ratios": [0]}),
)
"""``_as_the_class_builds``' checks: the fields of the config each reads, and valid values for the others the
geometry requires."""


def _no_context(config: GeometryConfig, context: Sequence[ConfigProblem]) -> GeometryError:
    """The refusal of a config SGLang derives no context length from that it starts with, each problem at its
    place."""
    from kvpolicy.json_text import DocumentInvalid

    return GeometryError(f"{config.document.file}: SGLang derives no context length it can start with from it: "
                         f"{'; '.join(p.message for p in context)}",
                         DocumentInvalid([config.diagnostic(p.code, p.key, p.message, p.hint) for p in context]))


def _validated(fields: ConfigFields) -> ModelGeometry | ValidationError:
    """The geometry of ``fields`` with SGLang's defaults for what they leave out, or why there is none."""
    try:
        return ModelGeometry.model_validate({**FILE_DEFAULTS, **fields.data})
    except ValidationError as exc:
        return exc


def _not_v4(document: JsonObjectFile, fields: ConfigFields, invalid: ValidationError, *,
            order: Callable[[Problem], int] | None = None, also: Sequence[Diagnostic] = ()) -> GeometryError:
    """The refusal of a config whose fields make no ``ModelGeometry``, each problem at its place (and ``also``
    those); the message names its problems in ``order`` (``kvpolicy.validation.describe``)."""
    from kvpolicy.validation import describe

    hint_for = partial(_sglang_hint, defaulted=set(FILE_DEFAULTS) - set(fields.data))
    problems = document.refusal(invalid, ModelGeometry, locate=fields.path, hint_for=hint_for)
    if also:
        problems = refused([*problems.diagnostics, *also])
    return GeometryError(f"{document.file}: not a DeepSeek-V4 config: {describe(invalid, ModelGeometry, order=order)}",
                         problems)


StrictClass = tuple[str, dict[str, Kinds]]
"""A strict config class's name and the kinds it takes (``hf_config_kinds``)."""
STRICT_CLASSES: dict[str, tuple[StrictClass, ...]] = {
    V4_MODEL_TYPE: (("transformers' DeepseekV4Config", FIELD_KINDS["DeepseekV4Config"]),
                    ("DeepseekV3Config (SGLang's deepseek_v4 alias of it)", FIELD_KINDS["DeepseekV3Config"])),
    V41_MODEL_TYPE: (("DeepseekV3Config (SGLang's DeepseekV41Config is one)", FIELD_KINDS["DeepseekV3Config"]),),
}
"""The strict classes SGLang 0.5.23 loads a config.json of each model type with, in its order (``config_fields``
lets no other type through), and the kinds each takes."""


def _check_field_kinds(document: JsonObjectFile, fields: ConfigFields, classes: Sequence[StrictClass],
                       geometry: ModelGeometry | ValidationError, *, moved: bool = False) -> None:
    """Refuse each field whose value one of ``classes`` does not take, each at its place; the refusal's message
    is the one SGLang stops at (each class in turn checks its fields in the order it declares them, whatever
    the file's). ``moved``: only the keys transformers moves to a field of another name (``rope_scaling``),
    checked as that field. Where the geometry refuses one of those fields too, its problems are given for it,
    and all of its others: they say more about the fields the plan reads."""
    from kvpolicy.document_codes import WRONG_TYPE
    from kvpolicy.validation import shown

    found: dict[str, tuple[tuple[int, int], str]] = {}  # key → (where SGLang checks it, the message)
    for key, value in fields.data.items():
        if (key in MOVED_TO) != moved or (moved and not value):  # a falsy one moves nothing (``_falsy_is_none``)
            continue
        for rank, (name, table) in enumerate(classes):
            field = MOVED_TO.get(key, key)
            wanted = kinds_wanted(table, field, value)
            if wanted is not None:
                found[key] = ((rank, declared_at(table, field)),
                              f"{key} {shown(value, 200)}: {name} takes {wanted} only"
                              f"{f' (as its {field})' if field != key else ''}, so SGLang 0.5.23 cannot load the "
                              "config")
                break
    if not found:
        return
    first = min(found, key=lambda key: found[key][0])
    kinds = {key: document.diagnostic(WRONG_TYPE, fields.path((key,)), message,
                                      "write the value as DeepSeek-V4's own config.json does")
             for key, (_, message) in found.items()}
    invalid = geometry if isinstance(geometry, ValidationError) else None
    read = {error["loc"][0] for error in invalid.errors() if error["loc"]} & found.keys() if invalid else set()
    if invalid is None or not read:
        raise GeometryError(f"{document.file}: {found[first][1]}", refused(kinds.values()))
    refusal = _not_v4(document, fields, invalid, order=lambda problem: problem.path[:1] != (first,),
                      also=[diagnostic for key, diagnostic in kinds.items() if key not in read])
    if first not in read:
        refusal = GeometryError(f"{document.file}: {found[first][1]}", refusal.problems)
    raise refusal


def _check_dtype(document: JsonObjectFile, fields: ConfigFields) -> None:
    """Refuse a dtype that names no torch dtype (``hf_dtype``), at its place."""
    from kvpolicy.validation import shown

    problem = dtype_problem(fields.data, shown)
    if problem is not None:
        diagnostic = document.diagnostic(problem.code, fields.path((problem.key,)), problem.message, problem.hint)
        raise GeometryError(f"{document.file}: {problem.message}", refused([diagnostic]))


def _check_base(document: JsonObjectFile, fields: ConfigFields,
                rule: Callable[[Mapping[str, Any], Callable[[Any], str]], BaseProblem | None] = base_problem) -> None:
    """Refuse what ``rule`` finds in the keys every transformers config class reads for itself (``hf_base_config``:
    the labels and derived keys by default; the layer types), at its place."""
    from kvpolicy.validation import shown

    problem = rule(fields.data, shown)
    if problem is not None:
        diagnostic = document.diagnostic(problem.code, fields.path(problem.path), problem.message, problem.hint)
        raise GeometryError(f"{document.file}: {problem.message}", refused([diagnostic]))


def _base_layer_types(data: Mapping[str, Any], shown: Callable[[Any], str]) -> BaseProblem | None:
    """The base class's validator of the layer types, counted against the layers of ``DeepseekV3Config``, which
    SGLang builds a V4.1 config with."""
    layers = data.get("num_hidden_layers", FILE_DEFAULTS["num_hidden_layers"])
    return layer_types_problem(data, layers if isinstance(layers, int) else None, shown)


def _check_uniform_layers(document: JsonObjectFile, fields: ConfigFields) -> None:
    """Refuse transformers' per-layer configs (``per_layer_config`` but null or ``{}``, where no field varies):
    the plan reads one value of each field for every layer, and SGLang reads a field that varies by layer not at
    all (transformers raises on it)."""
    if fields.data.get("per_layer_config") not in (None, {}):
        message = "per_layer_config: a model whose layers differ (transformers' per-layer configs) is not planned"
        diagnostic = document.diagnostic(VALUE_NOT_ALLOWED, fields.path(("per_layer_config",)), message,
                                         "plan a config whose layers share their fields")
        raise GeometryError(f"{document.file}: {message}", refused([diagnostic]))


def _sglang_hint(problem: Problem, defaulted: set[str]) -> str | None:
    """Why SGLang refuses an integer refused for its type (true, "43", 43.0, null), where a bare "must be a
    whole number, not 43.0" would puzzle, a ``rope_scaling`` that is no object, or a value the file does not
    give (one of ``defaulted``, ``FILE_DEFAULTS``' keys it leaves out); None for any other problem."""
    from kvpolicy.validation import WHOLE_NUMBER_ERRORS

    given_by_default = [key for key in defaulted if re.search(rf"\b{key}\b", problem.message)]
    if given_by_default:
        taken = ", ".join(f"{key}={FILE_DEFAULTS[key]}" for key in sorted(given_by_default))
        return (f"the file leaves it out, so SGLang 0.5.23 takes DeepseekV3Config's default ({taken}): "
                "write the model's value")
    error = problem.error
    if error is None:
        return None
    if error["type"] == "dict_type" and problem.path in (("rope_scaling",), ("rope_parameters",)):
        return ROPE_OBJECT_HINT
    if error["type"] not in WHOLE_NUMBER_ERRORS:
        return None
    if "input" not in error or error["input"] is not None:
        return STRICT_HINT
    key = str(problem.path[0])
    refuses = "SGLang 0.5.23 (transformers' strict config classes) refuses null"
    if key in FILE_DEFAULTS:
        return f"{refuses}: leave the key out for its default, {FILE_DEFAULTS[key]}"
    return f"{refuses} and has no default for {key}: write the model's value"


def load_geometry(path: str | Path) -> ModelGeometry:
    """Read a ``config.json`` (full or trimmed) into a checked ``ModelGeometry``."""
    return read_geometry(path).geometry
