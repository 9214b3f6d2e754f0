from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class UnknownField(Rule):
    """A statement or setting that the language does not have, in this place.

    ## What it does
    Reports a keyword the block does not accept (`priorty` in a `model` block,
    `owner` in a `rule`), with the closest keyword that fits. A top-level keyword
    such as `model` inside a block usually means a `}` is missing above it.

    ## Why is this bad?
    An unknown setting does nothing; a typo would silently leave the default in
    force (priority 0 instead of 100).

    ## Example
    ```
    model "qwen3-8b" {
      priorty 10
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 10
    }
    ```
    """

    code = "KV004"
    name = "unknown-field"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
