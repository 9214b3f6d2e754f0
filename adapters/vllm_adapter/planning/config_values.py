"""The planning's errors, and reading one value of a model config with them.

Shared by the modules that read a config (``hf_config``, ``model_build``, ``max_len``); pure code. An error
about a value of the config names the key it read (``ModelSpecError.key``) and what is wrong with it (a code of
``kvpolicy.document_codes``), so that ``config_places`` can place it in the config.json it came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE, DocumentCode
from kvpolicy.json_text import CarriesProblems

from .class_defaults import ConfigKey, config_class

if TYPE_CHECKING:
    from kvpolicy.json_text import DocumentInvalid

class ModelSpecError(ValueError):
    """The config cannot be planned; the message names the field and what was expected.

    ``key`` is the value of the config at fault (None: none is, a flag alone is refused); ``code`` what is wrong
    with it: ``WRONG_TYPE``, ``VALUE_NOT_ALLOWED``, ``MISSING_FIELD`` (``key``: the one missing) or
    ``LAUNCH_REFUSED`` (a value the launch's flags do not fit); ``hint`` what to do, where the message
    does not say."""

    def __init__(self, message: str, key: Sequence[str | int] | None = None, code: DocumentCode = VALUE_NOT_ALLOWED,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.key: ConfigKey | None = tuple(key) if key is not None else None
        self.code, self.hint = code, hint


class ConfigUnreadable(ModelSpecError):
    """The model config file cannot be read at all (missing, a directory, no permission)."""


class ConfigInvalid(CarriesProblems, ModelSpecError):
    """The model config file is no JSON object (not UTF-8, not JSON, too large...): ``problems`` place each
    problem of its text (``kvpolicy.document_codes``); the message is them."""

    problems: DocumentInvalid

    def __init__(self, problems: DocumentInvalid) -> None:
        super().__init__(str(problems))
        self.problems = problems


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
        raise ModelSpecError(f"the model config has no {key!r}, which sizes the KV cache", (key,), MISSING_FIELD,
                             _missing_hint(config))
    if not is_int(value):
        raise ModelSpecError(f"{key!r} must be a non-negative integer, got {shown(value)}", (key,), WRONG_TYPE)
    if value < 0:
        raise ModelSpecError(f"{key!r} must be a non-negative integer, got {shown(value)}", (key,))
    return value


def is_int(value: object) -> bool:
    """A whole number as JSON writes one (``true`` is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_code(config: Mapping[str, Any], key: str) -> DocumentCode:
    """What is wrong with ``config[key]`` where a whole number in range goes: it is missing, of the wrong type,
    or a whole number out of range."""
    if key not in config:
        return MISSING_FIELD
    return VALUE_NOT_ALLOWED if is_int(config[key]) else WRONG_TYPE


def _missing_hint(config: Mapping[str, Any]) -> str | None:
    """For a model type whose config class kvpolicy does not know: the class may have a default, unknown here."""
    if config_class(config) is not None:
        return None
    return (f"the config class of model_type {shown(config.get('model_type'))} may have a default for it, which "
            "kvpolicy does not know: write it in the config")
