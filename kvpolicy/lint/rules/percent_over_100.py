"""KV008 percent-over-100: a percentage of the GPU's capacity above 100%.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import PercentLit


@register
class PercentOver100(Check):
    rule = catalogue.PERCENT_OVER_100

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(PercentLit):
            if node.percent > 100:
                yield self.at(ctx.file, node.span, f"{node.text} is more than the GPU's whole capacity", "a percentage is at most 100%")
