from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import SizeLit

PRIORITY_RANGE = (0, 1000)
WEIGHT_RANGE = (1, 10000)
MAX_SIZE = 2**63 - 1
"""Sizes travel through the ledger as signed 64-bit integers."""


@register
class OutOfRange(Rule):
    """A priority, weight or size outside its range.

    ## What it does
    `priority` is 0..1000 (higher is more important), `weight` is 1..10000 (a
    share of spare memory), and sizes stay below 8 EiB.

    ## Why is this bad?
    Out-of-range numbers are typos (`priority 10000`), and a weight of 0 would
    starve the model of spare memory in a way nobody reading the file expects.

    ## Example
    ```
    model "qwen3-8b" {
      priority 5000
      weight 0
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 500
      weight 1
    }
    ```
    """

    code = "KV014"
    name = "out-of-range"
    severity = Severity.ERROR
    suppressible = False

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
