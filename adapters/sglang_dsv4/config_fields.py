"""Where SGLang 0.5.23 finds a DeepSeek-V4 model's fields in a ``config.json``, and the problem a reader of
them reports (``ConfigProblem``).

A ``deepseek_v41`` config (``deepseek_v41_text`` alike) loads through SGLang's ``DeepseekV41Config``, which
lays a multimodal release's nesting out flat: the fields of ``text_config`` but its ``model_type``, then the
top level's over them; ``vision_config``'s go to ``vision_*`` fields (none sizes a pool), ``model_type``
becomes ``deepseek_v41`` and the architecture list ``["DeepseekV41ForCausalLM"]`` becomes
``["DeepseekV4ForCausalLM"]``. It reads each nested value as ``dict(value)`` (null: nothing), and passes the
fields on as keyword arguments. A ``deepseek_v4`` config is read at its top level, and a ``text_config`` in it
(of any value) stops SGLang: its text-config lookup asserts that the value has a ``num_attention_heads``
attribute, which no JSON value has. So does a V4.1 ``text_config`` that holds one. A config of no model type
stops transformers before SGLang; one of another type the plan does not read (it would load through another
class, with other defaults).

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
    if data["model_type"] == V4_MODEL_TYPE:
        if TEXT_CONFIG in data:
            raise ConfigShapeError(ConfigProblem(
                VALUE_NOT_ALLOWED, (TEXT_CONFIG,),
                f"{TEXT_CONFIG}: SGLang 0.5.23 lays one out only in a {V41_MODEL_TYPE} config, and stops at it in "
                f"a {V4_MODEL_TYPE} one (its text-config lookup asserts the value has num_attention_heads as an "
                "attribute)", FLAT_HINT))
        return ConfigFields(data)
    text = _as_fields(data, TEXT_CONFIG)
    _as_fields(data, VISION_CONFIG)  # read for its vision_* fields only: it need be one dict() takes
    text.pop("model_type", None)
    top = {k: v for k, v in data.items() if k not in (TEXT_CONFIG, VISION_CONFIG)}
    fields = {**text, **top, "model_type": V41_MODEL_TYPE}
    if fields.get("architectures") == V41_ARCHITECTURES:
        fields["architectures"] = [V4_ARCHITECTURE]
    nested = frozenset(text) - frozenset(top)
    absent_at = (TEXT_CONFIG,) if isinstance(data.get(TEXT_CONFIG), dict) else ()
    if TEXT_CONFIG in nested:
        raise ConfigShapeError(ConfigProblem(
            VALUE_NOT_ALLOWED, (TEXT_CONFIG, TEXT_CONFIG),
            f"{TEXT_CONFIG}.{TEXT_CONFIG}: SGLang 0.5.23 lays {TEXT_CONFIG} out flat, and stops at one left in it "
            "(its text-config lookup asserts the value has num_attention_heads as an attribute)",
            f"write the language model's fields in {TEXT_CONFIG} itself"))
    return ConfigFields(fields, nested, absent_at)


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
