"""KV009 unknown-engine: an `engine` that kvpolicy has no adapter for.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.engines import ANY_ENGINE, ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.suggest import did_you_mean


@register
class UnknownEngine(Check):
    rule = catalogue.UNKNOWN_ENGINE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        known = (*sorted(ENGINES), ANY_ENGINE)
        for model in ctx.policy.models:
            engine = model.engine
            if engine is not None and engine.value not in known:
                yield self.at(
                    ctx.file, engine.span, f"unknown engine '{engine.value}'",
                    did_you_mean(engine.value, known) or "expected " + ", ".join(known),
                )
