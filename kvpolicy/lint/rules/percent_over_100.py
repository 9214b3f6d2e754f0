from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import PercentLit


@register
class PercentOver100(Rule):
    """A percentage of the GPU's capacity above 100%.

    ## What it does
    Percentages (`max 40%`, `headroom 5%`, `shrink to 10%`) are shares of the
    GPU's capacity; more than all of it is reported.

    ## Why is this bad?
    No GPU has more than its capacity; a limit above it is a typo (`400%` for `40%`).

    ## Example
    ```
    model "qwen3-*" { max 400% }
    ```

    ## Use instead
    ```
    model "qwen3-*" { max 40% }
    ```
    """

    code = "KV008"
    name = "percent-over-100"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(PercentLit):
            if node.percent > 100:
                yield self.at(ctx.file, node.span, f"{node.text} is more than the GPU's whole capacity", "a percentage is at most 100%")
