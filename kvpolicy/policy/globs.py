"""Model-name patterns: an exact name, or a glob with ``*`` (any run) and ``?`` (one character).

Binding picks the most specific pattern that matches an instance's model name:
an exact name first, then the longest pattern, then the first in the file.

Whether one glob matches every name another matches (``includes``) is decided on
the patterns' automata, simulated bit-parallel (one Python int per set of
positions). In general that question is hard (the outer pattern's set of states
can blow up), so the search is exact but capped: past ``PAIR_WORK_LIMIT`` steps
it answers None, undecided, and the caller skips the finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

WILDCARDS = "*?"
PAIR_WORK_LIMIT = 20_000
"""Automaton steps ``includes`` may take for one pair of patterns before it gives up (None)."""


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in WILDCARDS)


@lru_cache(maxsize=4096)
def _regex(pattern: str) -> re.Pattern[str]:
    parts = [".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.S)


def matches(pattern: str, name: str) -> bool:
    # A backtracking regex is fastest for the usual pattern, but its time grows as
    # len(name) ** stars: beyond two stars, the automaton (linear in the name).
    if pattern.count("*") <= 2:
        return _regex(pattern).fullmatch(name) is not None
    return _automaton(_collapse(pattern)).matches(name)


def literal_prefix(pattern: str) -> str:
    """The characters before the first wildcard: every name the pattern matches starts with them."""
    cut = min((i for i in (pattern.find("*"), pattern.find("?")) if i >= 0), default=len(pattern))
    return pattern[:cut]


def literal_suffix(pattern: str) -> str:
    """The characters after the last wildcard: every name the pattern matches ends with them."""
    cut = max(pattern.rfind("*"), pattern.rfind("?"))
    return pattern[cut + 1 :]


def literal_runs(pattern: str) -> list[str]:
    """The runs of literal characters between wildcards (empty runs left out)."""
    return [run for run in re.split(r"[*?]+", pattern) if run]


def min_length(pattern: str) -> int:
    """The length of the shortest name the pattern matches."""
    return len(pattern) - pattern.count("*")


def specificity(pattern: str, index: int) -> tuple[int, int, int]:
    """Sort key, larger wins: exact before glob, longer before shorter, earlier before later."""
    return (0 if is_glob(pattern) else 1, len(pattern), -index)


def _collapse(pattern: str) -> str:
    """The same language with runs of ``*`` as one (then a star's closure is one step)."""
    return re.sub(r"\*{2,}", "*", pattern) if "**" in pattern else pattern


@dataclass(frozen=True)
class _Automaton:
    """A glob's position automaton: bit i of a state set is "i characters of the pattern
    matched"; bit ``len(pattern)`` is acceptance. Stars are never adjacent."""

    length: int
    stars: int
    """The positions holding ``*``."""
    any_char: int
    """The positions holding ``?``: where a character the pattern does not spell can go."""
    by_char: dict[str, int]
    """For each literal character, the positions it (or a ``?``) can advance."""
    universal: int
    """Positions from which only stars remain: every continuation is accepted."""

    @property
    def accept(self) -> int:
        return 1 << self.length

    def close(self, states: int) -> int:
        return states | ((states & self.stars) << 1)

    def step(self, states: int, advancing: int) -> int:
        """The states after one character that advances the positions in ``advancing``."""
        return self.close(((states & advancing) << 1) | (states & self.stars))

    def mask(self, char: str) -> int:
        return self.by_char.get(char, self.any_char)

    @property
    def start(self) -> int:
        return self.close(1)

    def matches(self, name: str) -> bool:
        states = self.start
        for char in name:
            states = self.step(states, self.mask(char))
            if not states:
                return False
        return bool(states & self.accept)


@lru_cache(maxsize=4096)
def _automaton(pattern: str) -> _Automaton:
    stars = any_char = 0
    literal: dict[str, int] = {}
    for i, c in enumerate(pattern):
        if c == "*":
            stars |= 1 << i
        elif c == "?":
            any_char |= 1 << i
        else:
            literal[c] = literal.get(c, 0) | 1 << i
    universal = 1 << len(pattern)
    for i in range(len(pattern) - 1, -1, -1):
        if pattern[i] != "*":
            break
        universal |= 1 << i
    by_char = {c: positions | any_char for c, positions in literal.items()}
    return _Automaton(len(pattern), stars, any_char, by_char, universal)


@dataclass(frozen=True)
class Inclusion:
    included: bool | None
    """Whether every name ``inner`` matches is matched by ``outer``; None: undecided within the limit."""
    work: int
    """Automaton steps taken."""


def includes(outer: str, inner: str, limit: int = PAIR_WORK_LIMIT) -> bool | None:
    """Whether every name that ``inner`` matches is also matched by ``outer``;
    None when that could not be decided within ``limit`` automaton steps."""
    return inclusion(outer, inner, limit).included


@lru_cache(maxsize=65536)
def inclusion(outer: str, inner: str, limit: int = PAIR_WORK_LIMIT) -> Inclusion:
    """``includes`` with the work it took (cached: an editor re-lints the same globs on every change).

    Cheap necessary conditions first, then two witnesses, then an exhaustive search.
    The literal ends of ``outer`` must be spelt out by ``inner`` (a wildcard of
    ``inner`` there could produce another character); they are then cut from both,
    which keeps the answer and makes a long literal prefix cost nothing more.
    """
    prefix = literal_prefix(outer)
    if not literal_prefix(inner).startswith(prefix):
        return Inclusion(False, 0)
    outer, inner = outer[len(prefix) :], inner[len(prefix) :]
    suffix = literal_suffix(outer)
    if not literal_suffix(inner).endswith(suffix):
        return Inclusion(False, 0)
    if suffix:
        outer, inner = outer[: -len(suffix)], inner[: -len(suffix)]
    outer, inner = _collapse(outer), _collapse(inner)
    if min_length(inner) < min_length(outer):
        return Inclusion(False, 0)
    if "*" not in outer and ("*" in inner or len(inner) != len(outer)):
        return Inclusion(False, 0)
    return _search(_automaton(outer), inner, limit)


def _search(outer: _Automaton, inner: str, limit: int) -> Inclusion:
    """Look for a name ``inner`` matches and ``outer`` does not: two cheap witnesses first,
    then every pair (position in ``inner``, state set of ``outer``)."""
    work = 0
    # Witnesses first: inner's wildcards filled with a character outer does not spell
    # (a star with none, then with one) settle most pairs that are not included.
    for star_spells_one in (False, True):
        accepted, steps = _witness_accepted(outer, inner, star_spells_one)
        work += steps
        if not accepted:
            return Inclusion(False, work)
    return _exhaustive(outer, inner, limit, work)


def _witness_accepted(outer: _Automaton, inner: str, star_spells_one: bool) -> tuple[bool, int]:
    """Whether ``outer`` accepts ``inner`` with each ``?`` (and each ``*``, if it spells one)
    read as a character ``outer`` does not spell; with the automaton steps taken."""
    states, steps = outer.start, 0
    for c in inner:
        if c == "*" and not star_spells_one:
            continue
        states = outer.step(states, outer.any_char if c in "*?" else outer.mask(c))
        steps += 1
        if not states:
            break
    return bool(states & outer.accept), steps


def _exhaustive(outer: _Automaton, inner: str, limit: int, work: int) -> Inclusion:
    """Depth-first over the pairs (position in ``inner``, state set of ``outer``); characters
    ``outer`` does not spell count as one."""
    classes = sorted({*outer.by_char.values(), outer.any_char})  # characters that act alike
    n, accept, universal = len(inner), outer.accept, outer.universal
    start = (0, outer.start)
    seen, todo = {start}, [start]
    while todo:
        i, states = todo.pop()
        if states & universal:
            continue  # every completion is accepted from here
        if i == n:
            if not states & accept:
                return Inclusion(False, work)
            continue
        successors = _successors(outer, inner[i], i, states, classes)
        work += len(successors)
        for successor in successors:
            if not successor[1]:
                return Inclusion(False, work)  # outer is dead; inner can still finish
            if successor not in seen:
                seen.add(successor)
                todo.append(successor)
        if work > limit:
            return Inclusion(None, work)
    return Inclusion(True, work)


def _successors(outer: _Automaton, c: str, i: int, states: int, classes: list[int]) -> list[tuple[int, int]]:
    """The pairs reached from (``i``, ``states``) by reading ``inner[i] == c``."""
    if c == "*":  # spell nothing more (move on), or one more character of any class (stay)
        return [(i + 1, states), *((i, outer.step(states, m)) for m in classes)]
    if c == "?":
        return [(i + 1, outer.step(states, m)) for m in classes]
    return [(i + 1, outer.step(states, outer.mask(c)))]
