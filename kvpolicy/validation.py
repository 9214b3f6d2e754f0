"""Pydantic validation errors in the user's words: where (``gpus.0.capacity``), what, and for
an unknown key the field it was probably meant to be.

The JSON documents people write (facts, ``.kvtest.json`` files) forbid unknown keys, so
that a typo cannot silently fall back to a default; this module makes that refusal
say what to write instead.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from kvpolicy.suggest import closest

_PREFIXES = ("Value error, ", "Assertion failed, ")


def describe(exc: ValidationError, model: type[BaseModel], limit: int = 5) -> str:
    """The first ``limit`` problems of ``exc`` (raised validating ``model``), ``; ``-separated."""
    problems = [problem(error, model) for error in exc.errors()]
    unique = list(dict.fromkeys(problems))
    shown = "; ".join(unique[:limit])
    return shown + (f"; and {len(unique) - limit} more" if len(unique) > limit else "")


def problem(error: Any, model: type[BaseModel]) -> str:
    """``loc: message`` for one error of ``ValidationError.errors()``."""
    loc = tuple(error["loc"])
    where, fields = _walk(model, loc[:-1] if error["type"] == "extra_forbidden" else loc)
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        path = ".".join([*where, key])
        guess = closest(key, fields) if fields else None
        if guess:
            return f"{path}: unknown field {key!r}; did you mean {guess!r}?"
        known = f" (fields: {', '.join(fields)})" if fields else ""
        return f"{path}: unknown field {key!r}{known}"
    if error["type"] == "missing":
        return f"{'.'.join(where)}: required, not given"
    message = error["msg"]
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return f"{'.'.join(where) or '(top level)'}: {message}"


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], list[str]]:
    """The path of ``loc`` as the user wrote it (union tags dropped), and the keys the object
    at its end may have (empty when that is not a model)."""
    where: list[str] = []
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if _is_model(current):
            field = _field(current, part)
            where.append(str(part))
            current = field.annotation if field is not None else None
            continue
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
    return where, fields


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


def _field(model: type[BaseModel], key: Any) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None
