"""KV019 decimal-unit: a size in decimal units (`GB`) where binary units (`GiB`) are almost always meant.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import SizeLit
from kvpolicy.units import DECIMAL_TO_BINARY


@register
class DecimalUnit(Check):
    rule = catalogue.DECIMAL_UNIT

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(SizeLit):
            if node.unit in DECIMAL_TO_BINARY:
                binary = DECIMAL_TO_BINARY[node.unit]
                yield self.at(
                    ctx.file, node.span,
                    f"'{node.unit}' is a decimal unit ({node.text} = {node.bytes:,} bytes)",
                    f"did you mean '{binary}'? (or suppress: # kvpolicy: ignore[{self.rule.code}] decimal on purpose)",
                )
