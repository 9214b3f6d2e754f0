"""KV016 min-above-max: a model whose `min` is above its `max`.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import PercentLit, SizeLit
from kvpolicy.units import format_bytes


@register
class MinAboveMax(Check):
    rule = catalogue.MIN_ABOVE_MAX

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        capacities = _known_capacities(ctx)
        for model in ctx.policy.models:
            low, high = model.min, model.max
            if low is None or high is None:
                continue
            if isinstance(low, SizeLit) and isinstance(high, SizeLit):
                if low.bytes > high.bytes:
                    yield self.at(ctx.file, low.span, f"min {low.text} is above max {high.text}", "lower min or raise max")
            elif isinstance(low, PercentLit) and isinstance(high, PercentLit):
                if low.percent > high.percent:
                    yield self.at(ctx.file, low.span, f"min {low.text} is above max {high.text}", "lower min or raise max")
            else:
                for capacity in capacities:
                    lo, hi = low.resolve(capacity), high.resolve(capacity)
                    if lo > hi:
                        yield self.at(
                            ctx.file, low.span,
                            f"min {low.text} is above max {high.text} (= {format_bytes(hi)}) "
                            f"on a GPU of {format_bytes(capacity)}",
                            "lower min or raise max",
                        )
                        break


def _known_capacities(ctx: LintContext) -> list[int]:
    capacities = {g.capacity.bytes for g in ctx.policy.gpus if g.capacity is not None}
    if ctx.gpu_capacity is not None:
        capacities.add(ctx.gpu_capacity)
    if ctx.facts is not None:
        capacities.update(g.capacity for g in ctx.facts.gpus)
    return sorted(capacities)
