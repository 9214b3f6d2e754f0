from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class SuppressionWithoutReason(Rule):
    """A `# kvpolicy: ignore[...]` comment that does not say why.

    ## What it does
    A suppression silences the named codes on its line (or, alone on a line, on
    the next line). It must give a reason after the closing bracket.

    ## Why is this bad?
    The next person to edit the policy cannot tell a deliberate exception from a
    silenced mistake.

    ## Example
    ```
    model "a" { reserve 40 GB }  # kvpolicy: ignore[KV019]
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GB }  # kvpolicy: ignore[KV019] vendor sizes are decimal
    ```
    """

    code = "KV023"
    name = "suppression-without-reason"
    severity = Severity.WARNING
    phase = "suppression"
    suppressible = False
