from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.model import SizeLit
from kvpolicy.units import DECIMAL_TO_BINARY


@register
class DecimalUnit(Rule):
    """A size in decimal units (`GB`) where binary units (`GiB`) are almost always meant.

    ## What it does
    Flags `KB MB GB TB` (powers of 1000). GPU memory, chunks and every figure
    kvpolicy prints are in binary units (powers of 1024).

    ## Why is this bad?
    `40 GB` is 37.25 GiB: 7% less than a reader who thinks in GiB expects.

    ## Example
    ```
    model "qwen3-8b" { reserve 40 GB }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { reserve 40 GiB }
    ```
    """

    code = "KV019"
    name = "decimal-unit"
    severity = Severity.WARNING

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for node in ctx.nodes_of(SizeLit):
            if node.unit in DECIMAL_TO_BINARY:
                binary = DECIMAL_TO_BINARY[node.unit]
                yield self.at(
                    ctx.file, node.span,
                    f"'{node.unit}' is a decimal unit ({node.text} = {node.bytes:,} bytes)",
                    f"did you mean '{binary}'? (or suppress: # kvpolicy: ignore[{self.code}] decimal on purpose)",
                )
