from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import PercentLit, SizeLit


@register
class NegativeSize(Rule):
    """A size or percentage below zero.

    ## What it does
    Reports `reserve`, `min`, `max`, `headroom`, `capacity`, `chunk`, `shrink to`
    and compared sizes that are negative.

    ## Why is this bad?
    Memory cannot be negative; a negative headroom would hand out memory the GPU
    does not have.

    ## Example
    ```
    gpu * { headroom -2 GiB }
    ```

    ## Use instead
    ```
    gpu * { headroom 2 GiB }
    ```
    """

    code = "KV006"
    name = "negative-size"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(SizeLit, PercentLit):
            if isinstance(node, SizeLit) and node.bytes < 0:
                yield self.at(ctx.file, node.span, f"a size cannot be negative ({node.text})", f"did you mean `{node.text.lstrip('-')}`?")
            elif isinstance(node, PercentLit) and node.percent < 0:
                yield self.at(ctx.file, node.span, f"a percentage cannot be negative ({node.text})")
