"""JSON with positions: where each value, key and string sits in the document.

The standard ``json`` module gives values without positions. An editor's navigation needs
the path to the string under the cursor (``cases/0/expect/instances/chat/0``, as a key or
a value) and the region of every string; a message about a document people wrote needs the
line and column of the value it is about (``facts.json:7:21: ... gpus.0.capacity ...``). A
small recursive-descent reader of strict JSON (and of ``NaN`` and ``Infinity``, which Python's reader
takes); on malformed text it returns None (a test file being typed has no definitions until it
parses; ``json`` itself reports syntax errors).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None,
             # not JSON, but Python's reader takes them, so a document can hold them (and be refused for them)
             "NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

PathPart = str | int


@dataclass(frozen=True)
class JsonString:
    value: str
    start: int
    end: int
    """Offsets of the quotes (end exclusive)."""
    path: tuple[PathPart, ...]
    """Where it is: the keys and indices down to it; a key's path ends with itself."""
    is_key: bool


@dataclass(frozen=True)
class JsonDocument:
    value: Any
    strings: tuple[JsonString, ...]
    starts: dict[tuple[PathPart, ...], int]
    """Where each value starts, by its path (the document itself: ``()``)."""
    ends: dict[tuple[PathPart, ...], int]
    """Where each value ends (exclusive), by its path."""

    def string_at(self, offset: int) -> JsonString | None:
        return next((s for s in self.strings if s.start <= offset <= s.end), None)

    def offset_of(self, path: tuple[object, ...], *, key: bool = False) -> int:
        """Where the value at ``path`` starts (with ``key``: its key, as an unknown key is reported),
        or its nearest ancestor that is in the document; path parts compare as text."""
        return self.span_of(path, key=key)[0]

    def span_of(self, path: tuple[object, ...], *, key: bool = False) -> tuple[int, int]:
        """Where the value at ``path`` starts and ends (with ``key``: its key's quotes), or its nearest
        ancestor's that is in the document, as ``offset_of`` finds it."""
        wanted = tuple(str(p) for p in path)
        if key and wanted in self._keys:
            return self._keys[wanted]
        while wanted not in self._values:
            wanted = wanted[:-1]
        return self._values[wanted]

    @cached_property
    def _values(self) -> dict[tuple[str, ...], tuple[int, int]]:
        """Every value's span by its path as text (read once: a document's problems look up many)."""
        return {tuple(map(str, p)): (start, self.ends[p]) for p, start in self.starts.items()}

    @cached_property
    def _keys(self) -> dict[tuple[str, ...], tuple[int, int]]:
        return {tuple(map(str, s.path)): (s.start, s.end) for s in self.strings if s.is_key}


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text`` (a column counts characters)."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _Malformed(Exception):
    pass


def parse(text: str) -> JsonDocument | None:
    found = _Found([], {}, {})
    try:
        value, end = _value(text, _skip(text, 0), (), found)
        if _skip(text, end) != len(text):
            raise _Malformed
    except (_Malformed, IndexError, RecursionError):
        return None
    return JsonDocument(value, tuple(found.strings), found.starts, found.ends)


@dataclass
class _Found:
    """What the reader records on its way: every string, and where every value starts and ends."""

    strings: list[JsonString]
    starts: dict[tuple[PathPart, ...], int]
    ends: dict[tuple[PathPart, ...], int]


def _skip(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # a run of zero or more always matches


def _value(text: str, pos: int, path: tuple[PathPart, ...], found: _Found) -> tuple[Any, int]:
    found.starts[path] = pos
    value, end = _value_at(text, pos, path, found)
    found.ends[path] = end
    return value, end


def _value_at(text: str, pos: int, path: tuple[PathPart, ...], found: _Found) -> tuple[Any, int]:
    char = text[pos]
    if char == "{":
        return _object(text, _skip(text, pos + 1), path, found)
    if char == "[":
        return _array(text, _skip(text, pos + 1), path, found)
    if char == '"':
        return _string(text, pos, path, found, is_key=False)
    number = _NUMBER.match(text, pos)
    if number:
        return json.loads(number.group()), number.end()
    for word, literal in _LITERALS.items():
        if text.startswith(word, pos):
            return literal, pos + len(word)
    raise _Malformed


def _object(text: str, pos: int, path: tuple[PathPart, ...], found: _Found) -> tuple[dict[str, Any], int]:
    """The object whose first member (or closing brace) is at ``pos``."""
    result: dict[str, Any] = {}
    more = text[pos] != "}"
    while more:
        key, pos = _string(text, pos, path, found, is_key=True)
        pos = _skip(text, pos)
        if text[pos] != ":":
            raise _Malformed
        result[key], pos = _value(text, _skip(text, pos + 1), (*path, key), found)
        more, pos = _next(text, pos, "}")
    return result, pos + 1  # past the "}"


def _array(text: str, pos: int, path: tuple[PathPart, ...], found: _Found) -> tuple[list[Any], int]:
    """The array whose first item (or closing bracket) is at ``pos``."""
    items: list[Any] = []
    more = text[pos] != "]"
    while more:
        item, pos = _value(text, pos, (*path, len(items)), found)
        items.append(item)
        more, pos = _next(text, pos, "]")
    return items, pos + 1  # past the "]"


def _next(text: str, pos: int, close: str) -> tuple[bool, int]:
    """After an item: (another follows, where it starts) past a ',', or (False, the ``close``'s place)."""
    pos = _skip(text, pos)
    if text[pos] == close:
        return False, pos
    if text[pos] != ",":
        raise _Malformed
    return True, _skip(text, pos + 1)


def _string(text: str, pos: int, path: tuple[PathPart, ...], found: _Found, *, is_key: bool) -> tuple[str, int]:
    match = _STRING.match(text, pos)
    if match is None:
        raise _Malformed
    value = json.loads(match.group())
    found.strings.append(JsonString(value, pos, match.end(), (*path, value) if is_key else path, is_key))
    return value, match.end()
