from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class InvalidValue(Rule):
    """A value of the wrong kind for its setting or comparison.

    ## What it does
    Reports a size where a whole number belongs (`priority 10 GiB`), a number
    without a unit where a size belongs (`reserve 40`), an `owner` other than
    `runtime` or `elastic`, an `order` direction other than `asc` or `desc`, a
    `shrink to` other than `min`, `target`, a size or a percentage, and a
    comparison whose sides cannot be compared (`gpu.free < 60s`).

    ## Why is this bad?
    The policy would not mean what it says; kvpolicy refuses to guess.

    ## Example
    ```
    model "qwen3-8b" {
      reserve 40
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      reserve 40 GiB
    }
    ```
    """

    code = "KV007"
    name = "invalid-value"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
