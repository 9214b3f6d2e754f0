from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Severity


@register
class UnknownAttribute(Rule):
    """An attribute in `when` or `order` that instances and GPUs do not have.

    ## What it does
    `when` compares `gpu.capacity gpu.free gpu.used gpu.reserved` and
    `model.used model.idle model.priority model.weight model.min model.max
    model.target model.engine model.name`; `order` takes the short names of the
    `model.*` attributes. Anything else is reported with the closest attribute.

    ## Why is this bad?
    A rule over an attribute that does not exist can never be evaluated.

    ## Example
    ```
    rule "reclaim" {
      when gpu.fre < 8 GiB
      order idle desc
      shrink to min
      grace 30s
    }
    ```

    ## Use instead
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      order idle desc
      shrink to min
      grace 30s
    }
    ```
    """

    code = "KV010"
    name = "unknown-attribute"
    severity = Severity.ERROR
    phase = "parse"
    suppressible = False
