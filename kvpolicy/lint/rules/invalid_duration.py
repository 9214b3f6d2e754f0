from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class InvalidDuration(Rule):
    """A duration without a time unit, with a size unit, or below zero.

    ## What it does
    Checks `grace`, `cooldown` and durations compared with `model.idle`: each
    needs a unit among `ms s m h` and must not be negative.

    ## Why is this bad?
    `grace 30` could mean 30 seconds or 30 minutes; kvpolicy does not guess.

    ## Example
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      shrink to min
      grace 30
    }
    ```

    ## Use instead
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      shrink to min
      grace 30s
    }
    ```
    """

    code = "KV005"
    name = "invalid-duration"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
