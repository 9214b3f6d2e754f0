from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class UnusedSuppression(Rule):
    """A suppression whose code is not reported on the line it covers.

    ## What it does
    Reports codes in `# kvpolicy: ignore[...]` that silenced nothing.

    ## Why is this bad?
    Stale suppressions hide the next real finding on that line.

    ## Example
    ```
    model "a" { reserve 40 GiB }  # kvpolicy: ignore[KV019] decimal on purpose
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GiB }
    ```
    """

    code = "KV025"
    name = "unused-suppression"
    severity = Severity.WARNING
    phase = "suppression"
    suppressible = False
