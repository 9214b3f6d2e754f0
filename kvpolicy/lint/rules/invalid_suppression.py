from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class InvalidSuppression(Rule):
    """A suppression that names an unknown code, or a code that cannot be suppressed.

    ## What it does
    Checks the codes in `# kvpolicy: ignore[...]`. Errors that leave the policy
    without a meaning (syntax errors, unknown units, ...) cannot be suppressed;
    warnings and `over-commitment` can.

    ## Why is this bad?
    The comment suppresses nothing, though it reads as if it did.

    ## Example
    ```
    model "a" { reserve 40 GiBB }  # kvpolicy: ignore[KV001] typo
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GiB }
    ```
    """

    code = "KV024"
    name = "invalid-suppression"
    severity = Severity.WARNING
    phase = "suppression"
    suppressible = False
