"""Where SGLang 0.5.23 finds a DeepSeek-V4 model's fields in a ``config.json``, and the problem a reader of
them reports (``ConfigProblem``).

A ``deepseek_v41`` config (``deepseek_v41_text`` alike) loads through SGLang's ``DeepseekV41Config``, which
lays a multimodal release's nesting out flat: the fields of ``text_config`` but its ``model_type``, then the
top level's over them; ``vision_config``'s go to ``vision_*`` fields (none sizes a pool), ``model_type``
becomes ``deepseek_v41`` and the architecture list ``["DeepseekV41ForCausalLM"]`` becomes
``["DeepseekV4ForCausalLM"]``. It reads each nested value as ``dict(value)`` (null: nothing), and passes the
fields on as keyword arguments. A ``deepseek_v4`` config is read at its top level. A config of no model type
stops transformers before SGLang; one of another type the plan does not read (it would load through another
class, with other defaults).

SGLang's text-config lookup (``get_hf_text_config``) then looks, in the laid-out fields, for a sub-config to
read the language model from: ``thinker_config``, ``llm_config``, ``language_config``, ``text_config``, the
first present (``SUB_CONFIGS``). From one it reads the layer count and context length, while the pools'
geometry (window, compress ratios) stays the top level's; where it cannot (``llm_config`` and ``text_config``
without ``num_attention_heads``, null too; any value no object), it stops. The plan reads one level, so it
refuses the key either way. A null ``thinker_config`` or ``language_config`` ends the lookup at the top level,
the keys after it unread. Before the lookup SGLang gives each sub-config that is no object the config's
``dtype``, which a JSON list, string, number or boolean cannot take: with a dtype in the config, such a value
stops it under any of the four keys.

Pure data: no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE

if TYPE_CHECKING:
    from kvpolicy.document_codes import DocumentCode

V4_MODEL_TYPE = "deepseek_v4"
V41_MODEL_TYPE = "deepseek_v41"
V41_LOADED_AS_ONE = (V41_MODEL_TYPE, "deepseek_v41_text")
"""The model types ``DeepseekV41Config.__init__`` loads (its text config shares it), flat, as ``deepseek_v41``."""
V4_ARCHITECTURE = "DeepseekV4ForCausalLM"
"""The architecture SGLang 0.5.23 builds DeepSeek-V4 pools for (V4 and V4.1 configs alike)."""
V41_ARCHITECTURES = ["DeepseekV41ForCausalLM"]
TEXT_CONFIG, VISION_CONFIG = "text_config", "vision_config"
SUB_CONFIGS = ("thinker_config", "llm_config", "language_config", TEXT_CONFIG)
"""The keys SGLang 0.5.23's text-config lookup reads the language model from, in the order it tries them."""
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"
)
"""Where SGLang looks for a model's context length, first match wins
(sglang/srt/utils/hf_transformers/common.py, ``CONTEXT_LENGTH_KEYS``)."""
ENDS_LOOKUP_WHEN_NULL = ("thinker_config", "language_config")
"""The sub-config keys whose null value sends the lookup to the top level (the others' null stops SGLang)."""
FLAT_HINT = "write the language model's fields at the top level, or make the config a deepseek_v41 one"


@dataclass(frozen=True)
class ConfigProblem:
    """Why SGLang 0.5.23 cannot start with a config: the diagnostic's code, the key of the value it is about,
    the message and the hint. The key is a path in the flat fields (``("rope_scaling", "factor")``), which
    ``ConfigFields.path`` places in the file; a ``ConfigShapeError``'s is a path in the file itself."""

    code: DocumentCode
    key: tuple[str | int, ...]
    message: str
    hint: str


class ConfigShapeError(ValueError):
    """The file's model type or nesting stops SGLang (or is a type the plan does not read) before any field is
    read: ``problem`` says where (a path in the file)."""

    def __init__(self, problem: ConfigProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


@dataclass(frozen=True)
class ConfigFields:
    """The fields SGLang builds the model config from, and where each is in the file."""

    data: dict[str, Any]
    nested: frozenset[str] = frozenset()
    """The fields taken from ``text_config`` (the top level has none of them)."""
    absent_at: tuple[str, ...] = ()
    """Where a field neither level has belongs: in ``text_config`` where that is an object."""

    def path(self, key: tuple[str | int, ...]) -> tuple[str | int, ...]:
        """The path in the file of ``key`` (a path in ``data``)."""
        if not key:
            return key
        if key[0] in self.nested:
            return (TEXT_CONFIG, *key)
        return key if key[0] in self.data else (*self.absent_at, *key)


def config_fields(data: dict[str, Any]) -> ConfigFields:
    """The fields of the config ``data`` (a file's top level) as SGLang 0.5.23 reads them; ConfigShapeError where
    its model type or nesting stops SGLang first, or is not a DeepSeek-V4 one."""
    _check_model_type(data)
    fields = ConfigFields(data) if data["model_type"] == V4_MODEL_TYPE else _laid_out_flat(data)
    _check_text_config_lookup(fields)
    return fields


def _laid_out_flat(data: dict[str, Any]) -> ConfigFields:
    """A V4.1 config's fields as ``DeepseekV41Config`` lays them out (the module's docstring)."""
    text = _as_fields(data, TEXT_CONFIG)
    _as_fields(data, VISION_CONFIG)  # read for its vision_* fields only: it need be one dict() takes
    text.pop("model_type", None)
    top = {k: v for k, v in data.items() if k not in (TEXT_CONFIG, VISION_CONFIG)}
    fields = {**text, **top, "model_type": V41_MODEL_TYPE}
    if fields.get("architectures") == V41_ARCHITECTURES:
        fields["architectures"] = [V4_ARCHITECTURE]
    nested = frozenset(text) - frozenset(top)
    absent_at = (TEXT_CONFIG,) if isinstance(data.get(TEXT_CONFIG), dict) else ()
    return ConfigFields(fields, nested, absent_at)


def _check_text_config_lookup(fields: ConfigFields) -> None:
    """ConfigShapeError where SGLang's text-config lookup stops at a sub-config, or would read the language model
    from one (the module's docstring): at the key, where it is written."""
    from kvpolicy.validation import shown

    data = fields.data
    if data.get("dtype") is not None or data.get("torch_dtype") is not None:
        for key in SUB_CONFIGS:
            value = data.get(key)
            if value is not None and not isinstance(value, dict):
                where = fields.path((key,))
                raise ConfigShapeError(ConfigProblem(
                    WRONG_TYPE, where, f"{_dotted(where)} {shown(value)}: SGLang 0.5.23 gives a sub-config that is "
                    "no object the config's dtype, which this value cannot take",
                    f"leave {key} out: the plan reads the model at the top level"))
    for key in SUB_CONFIGS:
        if key not in data:
            continue
        if data[key] is None and key in ENDS_LOOKUP_WHEN_NULL:
            return
        where = fields.path((key,))
        raise ConfigShapeError(ConfigProblem(
            VALUE_NOT_ALLOWED, where,
            f"{_dotted(where)}: SGLang 0.5.23 reads the model's layer count and context length from "
            f"{key} (the pools' window and compress ratios from the top level), or stops at it; the plan reads "
            "one level",
            FLAT_HINT if where == (TEXT_CONFIG,) else f"leave {key} out and write the language model's fields "
            + (f"in {TEXT_CONFIG} itself" if len(where) > 1 else "at the top level")))


def _dotted(key: tuple[str | int, ...]) -> str:
    return ".".join(map(str, key))


def _check_model_type(data: dict[str, Any]) -> None:
    """ConfigShapeError unless ``model_type`` names a DeepSeek-V4 config: transformers, which loads the config for
    SGLang, picks the class by it and stops without it (or with a name it does not know); the plan knows what
    SGLang reads of the V4 and V4.1 types only."""
    from kvpolicy.validation import shown

    known = (V4_MODEL_TYPE, *V41_LOADED_AS_ONE)
    hint = f"write \"{V4_MODEL_TYPE}\" (or \"{V41_MODEL_TYPE}\"), as DeepSeek-V4's own config.json does"
    if "model_type" not in data:
        raise ConfigShapeError(ConfigProblem(
            MISSING_FIELD, ("model_type",), "model_type: required, not given",
            f"transformers, which loads the config for SGLang 0.5.23, picks the config class by it: {hint}"))
    model_type = data["model_type"]
    if model_type not in known:
        raise ConfigShapeError(ConfigProblem(
            VALUE_NOT_ALLOWED if isinstance(model_type, str) else WRONG_TYPE, ("model_type",),
            f"model_type {shown(model_type)}: the plan reads the DeepSeek-V4 types {', '.join(known)} only",
            hint))


def _as_fields(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``dict(data[key])`` as ``DeepseekV41Config`` takes it (absent or null: none); ConfigShapeError where it
    raises, or where the fields could not be keyword arguments."""
    value = data.get(key)
    if value is None:
        return {}
    try:
        fields = dict(value)
    except (TypeError, ValueError) as exc:
        raise ConfigShapeError(ConfigProblem(
            WRONG_TYPE, (key,), f"{key}: SGLang 0.5.23 reads it as dict({key}), which fails: {exc}",
            "write an object ({...}) of the fields, or null")) from None
    if key == TEXT_CONFIG and not all(isinstance(name, str) for name in fields):
        raise ConfigShapeError(ConfigProblem(
            WRONG_TYPE, (key,), f"{key}: SGLang 0.5.23 passes its fields as keyword arguments, whose names are "
            "strings", "write an object ({...}) of the fields, or null"))
    return fields
