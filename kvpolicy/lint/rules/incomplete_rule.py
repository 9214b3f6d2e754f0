"""KV018 incomplete-rule: a `rule` without `when` or without `shrink to`.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register


@register
class IncompleteRule(Check):
    rule = catalogue.INCOMPLETE_RULE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for rule in ctx.policy.rules:
            missing = [
                example
                for present, example in ((rule.when, "when model.idle > 60s"), (rule.shrink_to, "shrink to min"))
                if present is None
            ]
            if missing and not ctx.reported_within(rule):
                what = " and ".join(f"'{m.split()[0]}'" for m in missing)
                yield self.at(
                    ctx.file, rule.name.span, f"rule {rule.name.value!r} has no {what}",
                    "add " + " and ".join(f"`{m}`" for m in missing),
                )

