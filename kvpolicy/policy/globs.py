"""Model-name patterns: an exact name, or a glob with ``*`` (any run) and ``?`` (one character).

Binding picks the most specific pattern that matches an instance's model name:
an exact name first, then the longest pattern, then the first in the file.
"""

from __future__ import annotations

import re
from functools import lru_cache

WILDCARDS = "*?"


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in WILDCARDS)


@lru_cache(maxsize=4096)
def _regex(pattern: str) -> re.Pattern[str]:
    parts = [".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.S)


def matches(pattern: str, name: str) -> bool:
    return _regex(pattern).fullmatch(name) is not None


def literal_prefix(pattern: str) -> str:
    """The characters before the first wildcard: every name the pattern matches starts with them."""
    cut = min((i for i, c in enumerate(pattern) if c in WILDCARDS), default=len(pattern))
    return pattern[:cut]


def literal_suffix(pattern: str) -> str:
    """The characters after the last wildcard: every name the pattern matches ends with them."""
    cut = max((i for i, c in enumerate(pattern) if c in WILDCARDS), default=-1)
    return pattern[cut + 1 :]


def specificity(pattern: str, index: int) -> tuple[int, int, int]:
    """Sort key, larger wins: exact before glob, longer before shorter, earlier before later."""
    return (0 if is_glob(pattern) else 1, len(pattern), -index)


_OTHER = "\0"  # stands for every character that no pattern mentions


def _step(pattern: str, states: frozenset[int], symbol: str) -> frozenset[int]:
    nxt: set[int] = set()
    for i in states:
        if i < len(pattern):
            c = pattern[i]
            if c == "*":
                nxt.add(i)
            elif c == "?" or c == symbol:
                nxt.add(i + 1)
    return _closure(pattern, nxt)


def _closure(pattern: str, states: set[int] | frozenset[int]) -> frozenset[int]:
    todo, seen = list(states), set(states)
    while todo:
        i = todo.pop()
        if i < len(pattern) and pattern[i] == "*" and i + 1 not in seen:
            seen.add(i + 1)
            todo.append(i + 1)
    return frozenset(seen)


def includes(outer: str, inner: str) -> bool:
    """Whether every name that ``inner`` matches is also matched by ``outer``.

    Explores the product of both patterns' automata over the characters they
    mention plus one stand-in for all others; a state where ``inner`` accepts and
    ``outer`` does not is a name that only ``inner`` matches.
    """
    # Cheap necessary conditions first: ``outer``'s literal ends must be spelt out
    # by ``inner``'s (a wildcard in ``inner`` there could produce another character).
    if not literal_prefix(inner).startswith(literal_prefix(outer)):
        return False
    if not literal_suffix(inner).endswith(literal_suffix(outer)):
        return False
    alphabet = (set(inner) | set(outer) | {_OTHER}) - set(WILDCARDS)
    start = (_closure(inner, {0}), _closure(outer, {0}))
    todo, seen = [start], {start}
    while todo:
        a, b = todo.pop()
        if len(inner) in a and len(outer) not in b:
            return False
        for symbol in alphabet:
            pair = (_step(inner, a, symbol), _step(outer, b, symbol))
            if pair[0] and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True
