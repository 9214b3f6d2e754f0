"""KV006 negative-size: a size or percentage below zero.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import PercentLit, SizeLit


@register
class NegativeSize(Check):
    rule = catalogue.NEGATIVE_SIZE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(SizeLit, PercentLit):
            if isinstance(node, SizeLit) and node.bytes < 0:
                yield self.at(ctx.file, node.span, f"a size cannot be negative ({node.text})", f"did you mean `{node.text.lstrip('-')}`?")
            elif isinstance(node, PercentLit) and node.percent < 0:
                yield self.at(ctx.file, node.span, f"a percentage cannot be negative ({node.text})",
                              f"did you mean `{node.text.lstrip('-')}`?")
