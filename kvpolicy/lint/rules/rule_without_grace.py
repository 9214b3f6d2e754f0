from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity


@register
class RuleWithoutGrace(Rule):
    """A `rule` without `grace`: it acts the moment its condition holds.

    ## What it does
    Flags rules that have no `grace` (the time a condition must hold before the
    rule acts).

    ## Why is this bad?
    Without hysteresis a rule flaps: a burst that briefly drops `gpu.free` shrinks
    an instance that needs its memory back a second later.

    ## Example
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      shrink to min
    }
    ```

    ## Use instead
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      shrink to min
      grace 30s
    }
    ```
    """

    code = "KV020"
    name = "rule-without-grace"
    severity = Severity.WARNING

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for rule in ctx.policy.rules:
            if rule.grace is None and not ctx.reported_within(rule):
                yield self.at(
                    ctx.file, rule.name.span, f"rule {rule.name.value!r} has no 'grace': it acts at once",
                    "add e.g. `grace 30s`, or `grace 0s` to act at once on purpose",
                )
