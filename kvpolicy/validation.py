"""Pydantic validation errors in the user's words: where (``gpus.0.capacity``), what, and for
an unknown key the field it was probably meant to be.

The JSON documents people write (facts, ``.kvtest.json`` files) forbid unknown keys, so
that a typo cannot silently fall back to a default; this module makes that refusal
say what to write instead.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from kvpolicy.suggest import closest

_PREFIXES = ("Value error, ", "Assertion failed, ")

_KINDS = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string", "bool_type": "true or false",
    "bool_parsing": "true or false", "model_type": "an object ({...})", "dict_type": "an object ({...})",
    "model_attributes_type": "an object ({...})", "list_type": "a list ([...])", "tuple_type": "a list ([...])",
    "finite_number": "a finite number",
}
"""Pydantic's error types that say only what kind of value was expected, in the words of JSON."""
_PYTHON_QUOTED = re.compile(r"'([^']*)'")
_BOUNDS = {"greater_than_equal": ("ge", "or more"), "less_than_equal": ("le", "or less"),
           "greater_than": ("gt", None), "less_than": ("lt", None)}


ProblemKind = Literal["wrong-type", "value-not-allowed", "missing-field", "unknown-key"]

_WRONG_TYPES = frozenset(_KINDS) - {"finite_number"}
"""Pydantic's error types for a value of the wrong kind (``finite_number``: the right kind, out of range)."""
WHOLE_NUMBER_ERRORS = frozenset(k for k, words in _KINDS.items() if words == "a whole number")
"""Pydantic's error types for a value that is no whole number (true, "43", 43.0, null where an int goes)."""
MAX_HINT_CHARS = 160


@dataclass(frozen=True)
class Problem:
    """One problem of a document, in the user's words, with where it is."""

    kind: ProblemKind
    path: tuple[str, ...]
    """Where, as the user wrote it (``("gpus", "0", "capacity")``); an unknown key's ends with the key,
    a missing field's with the field (its place is its object's)."""
    message: str
    """``gpus.0.capacity: must be 0 or more, not -5``."""
    hint: str | None
    """What to write instead (the field meant), or what the field is (its description)."""
    inline: str
    """The message with what an unknown key was probably meant to be, for text with no room for a hint."""
    error: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    """Pydantic's error behind it (``type``, ``input``...), for callers that hint by kind rather than by
    wording; None for a ``Conflict``."""

    @property
    def is_key(self) -> bool:
        """Whether its place is a key's (an unknown key) rather than a value's."""
        return self.kind == "unknown-key"


def describe(exc: ValidationError, model: type[BaseModel], limit: int = 5, *,
             order: Callable[[Problem], int] | None = None) -> str:
    """The first ``limit`` problems of ``exc`` (raised validating ``model``), ``; ``-separated, in pydantic's
    order or, given ``order``, by it (then pydantic's)."""
    listed = problems(exc, model)
    unique = list(dict.fromkeys(p.inline for p in (sorted(listed, key=order) if order else listed)))
    joined = "; ".join(unique[:limit])
    return joined + (f"; and {len(unique) - limit} more" if len(unique) > limit else "")


@dataclass(frozen=True)
class Conflict:
    """One value that does not agree with the rest of its document (an id given twice), at ``path``
    below the model whose validator found it."""

    path: tuple[str | int, ...]
    message: str
    """What is wrong with the value there: ``"cuda:0" is also gpus.0's id``."""
    hint: str | None = None


class Conflicts(ValueError):
    """What a model's validator raises for values that disagree with each other, each at its own place
    (pydantic would place a validator's error at the model as a whole)."""

    def __init__(self, conflicts: Sequence[Conflict]) -> None:
        self.conflicts = tuple(conflicts)
        super().__init__("; ".join(f"{'.'.join(map(str, c.path))}: {c.message}" for c in self.conflicts))


def problems(exc: ValidationError, model: type[BaseModel]) -> list[Problem]:
    """Every error of ``exc`` (raised validating ``model``) as ``Problem``s, in pydantic's order."""
    found: list[Problem] = []
    for error in exc.errors():
        raised = (error.get("ctx") or {}).get("error")
        if isinstance(raised, Conflicts):
            found.extend(_conflict(error, model, c) for c in raised.conflicts)
        else:
            found.append(problem(error, model))
    return found


def _conflict(error: Any, model: type[BaseModel], conflict: Conflict) -> Problem:
    where, _, _ = _walk(model, (*error["loc"], *conflict.path))
    message = f"{'.'.join(where)}: {conflict.message}"
    inline = f"{message} ({conflict.hint})" if conflict.hint else message
    return Problem("value-not-allowed", tuple(where), message, conflict.hint, inline)


def problem(error: Any, model: type[BaseModel]) -> Problem:
    """One error of ``ValidationError.errors()``."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        where, fields, _ = _walk(model, loc[:-1])
        key = str(loc[-1])
        path = (*where, key)
        message = f"{'.'.join(path)}: unknown field {key!r}"
        guess = closest(key, fields) if fields else None
        if guess:
            return Problem("unknown-key", path, message, f"did you mean {guess!r}?", f"{message}; did you mean {guess!r}?",
                           error)
        if not fields:
            return Problem("unknown-key", path, message, None, message, error)
        return Problem("unknown-key", path, message, f"fields here: {', '.join(fields)}",
                       f"{message} (fields: {', '.join(fields)})", error)
    where, _, described = _walk(model, loc)
    hint = _described(where[-1], described) if where and described is not None else None
    if kind == "missing":
        message = f"{'.'.join(where)}: required, not given"
        return Problem("missing-field", tuple(where), message, hint, message, error)
    message = f"{'.'.join(where) or '(top level)'}: {_message(error)}"
    return Problem("wrong-type" if kind in _WRONG_TYPES else "value-not-allowed", tuple(where), message, hint, message,
                   error)


def _described(key: str, field: FieldInfo) -> str | None:
    """``key: DESCRIPTION`` of a field, on one line and shortened, or None without a description."""
    if not field.description:
        return None
    text = f"{key}: {' '.join(field.description.split())}"
    return text if len(text) <= MAX_HINT_CHARS else text[: MAX_HINT_CHARS].rsplit(" ", 1)[0] + " …"


def _message(error: Any) -> str:
    """What is wrong with the value, with the value as it was written."""
    kind, ctx = error["type"], error.get("ctx") or {}
    given = f", not {shown(error['input'])}" if "input" in error else ""
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}{given}"
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        bound = shown(ctx[name])
        return f"must be {bound} {words}{given}" if words else f"must be {kind.split('_')[0]} than {bound}{given}"
    if kind == "literal_error":  # pydantic quotes the choices as Python does; people wrote them as JSON
        choices = _PYTHON_QUOTED.sub(r'"\1"', str(ctx["expected"]))
        return f"must be {choices}{given}"
    message = error["msg"]
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return message


def shown(value: Any, width: int = 40) -> str:
    """``value`` as JSON writes it, shortened to ``width`` characters (as a message shows what was written)."""
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], list[str], FieldInfo | None]:
    """The path of ``loc`` as the user wrote it (union tags dropped), the keys the object at its
    end may have (empty when that is not a model), and the field it ends at (None: it ends at an
    item of a list or a dict, or at a key no model has)."""
    where: list[str] = []
    current: Any = model
    described: FieldInfo | None = None
    for part in loc:
        current = _unwrap(current)
        if _is_model(current):
            field = _field(current, part)
            where.append(str(part))
            current = field.annotation if field is not None else None
            described = field
            continue
        described = None
        members = _union_members(current)
        if members:
            chosen = next((m for m in members if _tag(m) == part), None)
            if chosen is not None:  # a union's tag in pydantic's loc: not a key the user wrote
                current = chosen
                continue
            where.append(str(part))
            current = None
            continue
        origin = typing.get_origin(current)
        where.append(str(part))
        args = typing.get_args(current)
        if origin in (tuple, list, set, frozenset) and args:
            current = args[0]
        elif origin is dict and len(args) == 2:
            current = args[1]
        else:
            current = None
    current = _unwrap(current)
    if not _is_model(current):
        models = [m for m in _union_members(current) if _is_model(_unwrap(m))]
        current = _unwrap(models[0]) if len(models) == 1 else None
    fields = [f.alias or name for name, f in current.model_fields.items()] if _is_model(current) else []
    return where, fields, described


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    members = _union_members(tp)
    real = [m for m in members if m is not type(None)]
    if members and len(real) == 1:
        return _unwrap(real[0])
    return tp


def _union_members(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return ()


def _tag(tp: Any) -> str | None:
    """The name pydantic gives a union member in an error's loc: its Tag, or a model's class name."""
    if typing.get_origin(tp) is typing.Annotated:
        for meta in typing.get_args(tp)[1:]:
            tag = getattr(meta, "tag", None)
            if isinstance(tag, str):
                return tag
        tp = typing.get_args(tp)[0]
    return tp.__name__ if _is_model(tp) else None


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field(model: type[BaseModel], key: Any) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None
