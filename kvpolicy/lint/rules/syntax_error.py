from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class SyntaxErrorRule(Rule):
    """The text does not follow the grammar of the kvpolicy language.

    ## What it does
    Reports text the parser cannot read: a missing value, brace or parenthesis, a
    stray character, two statements on one line without `;`. The diagnostic sits
    where the text goes wrong (for a missing value: right after the keyword that
    needs it) and names what was expected in the language's own words.

    ## Why is this bad?
    A policy that cannot be parsed cannot be used: `kvpolicy run` keeps the last
    good policy and reports this error until the file is fixed.

    ## Example
    ```
    model "qwen3-8b" {
      priority
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 10
    }
    ```
    """

    code = "KV002"
    name = "syntax-error"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
