"""KV021 unreachable-model: a model glob that can never bind an instance, because another pattern wins for all its names.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.

Comparing every glob with every other would be quadratic, and one comparison can
be expensive (``globs.includes``). So the pairs are indexed by what an including
pattern must share with the included one: its literal prefix must begin the
other's, its literal suffix must end the other's, and its longest literal run must
lie inside one of the other's runs (fill the included pattern's wildcards with a
character the other never spells: that name must still match). A pair that
``includes`` cannot decide within its cap is skipped, as are the pairs left when
the rule's own cap is spent: the rule then reports less, never wrongly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy import globs
from kvpolicy.policy.model import ModelBlock

RULE_WORK_LIMIT = 2_000_000
"""Automaton steps the whole rule may take (a pair has ``globs.PAIR_WORK_LIMIT``)."""


@dataclass(frozen=True)
class _Glob:
    index: int
    rank: tuple[int, int, int]
    block: ModelBlock
    pattern: str
    prefix: str
    suffix: str
    key: str
    """The longest literal run between the literal ends ('' if none)."""


def _glob(index: int, block: ModelBlock) -> _Glob:
    pattern = block.name.value
    prefix, suffix = globs.literal_prefix(pattern), globs.literal_suffix(pattern)
    middle = pattern[len(prefix) : len(pattern) - len(suffix)]
    key = max(globs.literal_runs(middle), key=len, default="")
    return _Glob(index, globs.specificity(pattern, index), block, pattern, prefix, suffix, key)


def _ancestors(words: set[str]) -> dict[str, str | None]:
    """For each word, the longest other word of the set that is a prefix of it (a trie's
    parent links, built from the sorted words in time linear in their total length)."""
    parent: dict[str, str | None] = {}
    stack: list[str] = []
    for word in sorted(words):
        while stack and not word.startswith(stack[-1]):
            stack.pop()
        parent[word] = stack[-1] if stack else None
        stack.append(word)
    return parent


def _chain(word: str, parent: dict[str, str | None]) -> list[str]:
    found: list[str] = []
    at: str | None = word
    while at is not None:
        found.append(at)
        at = parent[at]
    return found


@dataclass
class _Group:
    """The globs of one (literal prefix, literal suffix), by their key."""

    by_key: dict[str, list[_Glob]] = field(default_factory=dict)
    key_lengths: set[int] = field(default_factory=set)

    def add(self, g: _Glob) -> None:
        self.by_key.setdefault(g.key, []).append(g)
        self.key_lengths.add(len(g.key))

    def candidates(self, runs: list[str]) -> Iterator[_Glob]:
        """The globs whose key lies inside one of ``runs`` (the other pattern's literal runs)."""
        enumerate_cost = sum(len(run) for run in runs) * len(self.key_lengths)
        if enumerate_cost < len(self.by_key):
            keys = {run[j : j + n] for n in self.key_lengths for run in runs for j in range(len(run) - n + 1)}
            keys.add("")
            keys &= self.by_key.keys()
        else:
            keys = {k for k in self.by_key if not k or any(k in run for run in runs)}
        for k in keys:
            yield from self.by_key[k]


@register
class UnreachableModel(Check):
    rule = catalogue.UNREACHABLE_MODEL

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        all_globs = [_glob(i, m) for i, m in enumerate(ctx.policy.models) if globs.is_glob(m.name.value)]
        groups: dict[tuple[str, str], _Group] = {}
        for g in all_globs:
            groups.setdefault((g.prefix, g.suffix), _Group()).add(g)
        prefixes = _ancestors({g.prefix for g in all_globs})
        suffixes = _ancestors({g.suffix[::-1] for g in all_globs})  # a suffix, read backwards, is a prefix
        work = 0
        for g in all_globs:
            runs = globs.literal_runs(g.pattern)
            candidates: list[_Glob] = []
            for prefix in _chain(g.prefix, prefixes):
                for suffix in _chain(g.suffix[::-1], suffixes):
                    group = groups.get((prefix, suffix[::-1]))
                    if group is not None:
                        candidates.extend(c for c in group.candidates(runs) if c.rank > g.rank and c.pattern != g.pattern)
            for other in sorted(candidates, key=lambda c: c.index):  # file order: report the first that wins
                if work > RULE_WORK_LIMIT:
                    return  # the rule's cap: the remaining pairs are not compared (documented)
                verdict = globs.inclusion(other.pattern, g.pattern)
                work += verdict.work
                ctx.charge(verdict.work)
                if verdict.included:
                    yield self.at(
                        ctx.file, g.block.name.span,
                        f"model {g.pattern!r} never binds: {other.pattern!r} (line {other.block.span.line}) "
                        "matches all its names and wins",
                        "make it more specific, move it above an equally long pattern, or remove it",
                    )
                    break
