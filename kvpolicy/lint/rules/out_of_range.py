"""KV014 out-of-range: a priority, weight or size outside its range.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import SizeLit

PRIORITY_RANGE = (0, 1000)
WEIGHT_RANGE = (1, 10000)
MAX_SIZE = 2**63 - 1
"""Sizes travel through the ledger as signed 64-bit integers."""


@register
class OutOfRange(Check):
    rule = catalogue.OUT_OF_RANGE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            for setting, (low, high) in (("priority", PRIORITY_RANGE), ("weight", WEIGHT_RANGE)):
                value = getattr(model, setting)
                if value is not None and not low <= value.value <= high:
                    yield self.at(
                        ctx.file, value.span, f"{setting} {value.value} is outside {low}..{high}",
                        f"use a {setting} from {low} to {high}",
                    )
        for node in ctx.nodes_of(SizeLit):
            if node.bytes > MAX_SIZE:
                yield self.at(ctx.file, node.span, f"{node.text} is too large", "sizes stay below 8 EiB")
