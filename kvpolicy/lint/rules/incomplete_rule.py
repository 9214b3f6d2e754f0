from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity


@register
class IncompleteRule(Rule):
    """A `rule` without `when` or without `shrink to`.

    ## What it does
    A rule says when to act (`when`) and what to do (`shrink to`); both are
    required.

    ## Why is this bad?
    A rule without a condition would act on every instance all the time; one
    without an action does nothing.

    ## Example
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      grace 30s
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

    code = "KV018"
    name = "incomplete-rule"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for rule in ctx.policy.rules:
            missing = [
                example
                for present, example in ((rule.when, "when model.idle > 60s"), (rule.shrink_to, "shrink to min"))
                if present is None
            ]
            if missing and not ctx.reported_within(rule):
                what = " and ".join(f"'{m.split()[0]}'" for m in missing)
                yield self.at(
                    ctx.file, rule.name.span, f"rule {rule.name.value!r} has no {what}",
                    "add " + " and ".join(f"`{m}`" for m in missing),
                )

