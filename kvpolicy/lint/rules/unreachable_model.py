"""KV021 unreachable-model: a model glob that can never bind an instance, because another pattern wins for all its names.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy import globs
from kvpolicy.policy.model import ModelBlock


@register
class UnreachableModel(Check):
    rule = catalogue.UNREACHABLE_MODEL

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        models = ctx.policy.models
        ranked = [(globs.specificity(m.name.value, i), i, m) for i, m in enumerate(models)]
        # Only a glob can include a glob, and only one whose literal prefix the other
        # spells out: indexing globs by that prefix spares the automaton check for
        # almost every pair in a policy of many models.
        by_prefix: dict[str, list[tuple[tuple[int, int, int], int, ModelBlock]]] = {}
        for entry in ranked:
            if globs.is_glob(entry[2].name.value):
                by_prefix.setdefault(globs.literal_prefix(entry[2].name.value), []).append(entry)
        for rank, _, model in ranked:
            pattern = model.name.value
            if not globs.is_glob(pattern):
                continue
            prefix = globs.literal_prefix(pattern)
            candidates = sorted(
                (entry for k in range(len(prefix) + 1) for entry in by_prefix.get(prefix[:k], ())),
                key=lambda entry: entry[1],  # file order: report the first that wins
            )
            for other_rank, _, other in candidates:
                other_pattern = other.name.value
                if other_rank > rank and other_pattern != pattern and globs.includes(other_pattern, pattern):
                    yield self.at(
                        ctx.file, model.name.span,
                        f"model {pattern!r} never binds: {other_pattern!r} (line {other.span.line}) "
                        "matches all its names and wins",
                        "make it more specific, move it above an equally long pattern, or remove it",
                    )
                    break
