from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import PercentLit, SizeLit
from kvpolicy.units import format_bytes


@register
class MinAboveMax(Rule):
    """A model whose `min` is above its `max`.

    ## What it does
    Compares `min` and `max` of each model block: directly when both are sizes or
    both percentages, and on every known GPU capacity (from `gpu ... capacity`,
    `--gpu-capacity` or `--facts`) when one is a size and the other a percentage.

    ## Why is this bad?
    The guarantee could never be honoured within the cap.

    ## Example
    ```
    model "qwen3-8b" {
      min 8 GiB
      max 4 GiB
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      min 4 GiB
      max 8 GiB
    }
    ```
    """

    code = "KV016"
    name = "min-above-max"
    severity = Severity.ERROR
    suppressible = False

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
