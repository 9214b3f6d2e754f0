from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.policy import globs
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import ModelBlock


@register
class UnreachableModel(Rule):
    """A model glob that can never bind an instance, because another pattern wins for all its names.

    ## What it does
    An instance binds the most specific matching `model` block: an exact name,
    then the longest pattern, then the first in the file. A glob is unreachable
    when another pattern that outranks it matches every name it matches (e.g.
    `"qwen3-*"` after an equally long `"qwen*-*"` that is earlier in the file).

    ## Why is this bad?
    The block's settings never apply, though a reader would expect them to.

    ## Example
    ```
    model "qwen?-*" { priority 10 }
    model "qwen3-*" { priority 20 }
    ```

    ## Use instead
    ```
    model "qwen3-*" { priority 20 }
    model "qwen?-*" { priority 10 }
    ```
    """

    code = "KV021"
    name = "unreachable-model"
    severity = Severity.WARNING

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
