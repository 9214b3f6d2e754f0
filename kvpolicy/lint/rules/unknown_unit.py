from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class UnknownUnit(Rule):
    """A size or duration has a unit kvpolicy does not know.

    ## What it does
    Checks the unit after every number: sizes take `B KiB MiB GiB TiB` (binary)
    or `KB MB GB TB` (decimal), durations take `ms s m h`, and `%` is a share of
    the GPU's capacity. Suggests the closest known unit.

    ## Why is this bad?
    A size whose unit is unknown has no value; guessing one could hand out a
    thousand times more memory than meant.

    ## Example
    ```
    model "qwen3-8b" { reserve 40 GiBB }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { reserve 40 GiB }
    ```
    """

    code = "KV001"
    name = "unknown-unit"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
