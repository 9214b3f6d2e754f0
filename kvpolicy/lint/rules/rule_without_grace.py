"""KV020 rule-without-grace: a `rule` without `grace`: it acts the moment its condition holds.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register


@register
class RuleWithoutGrace(Check):
    rule = catalogue.RULE_WITHOUT_GRACE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for rule in ctx.policy.rules:
            if rule.grace is None and not ctx.reported_within(rule):
                yield self.at(
                    ctx.file, rule.name.span, f"rule {rule.name.value!r} has no 'grace': it acts at once",
                    "add e.g. `grace 30s`, or `grace 0s` to act at once on purpose",
                )
