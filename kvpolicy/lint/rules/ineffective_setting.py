from collections.abc import Iterator

from kvpolicy.engines import ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.policy.errors import Diagnostic, Severity

ELASTIC_SETTINGS = ("min", "max", "weight")


@register
class IneffectiveSetting(Rule):
    """A setting that has no effect for this model yet.

    ## What it does
    `min`, `max` and `weight` govern elastic KV memory. An engine whose adapter
    runs no elastic pool (SGLang today: all DeepSeek-V4 pools are runtime-owned)
    never has elastic memory, so these settings do nothing there.

    ## Why is this bad?
    The file reads as if the model had a guarantee it will never get.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine sglang
      reserve 40 GiB
      min 8 GiB
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine sglang
      reserve 40 GiB
    }
    ```
    """

    code = "KV022"
    name = "ineffective-setting"
    severity = Severity.WARNING

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            engine = model.engine.value if model.engine else None
            if engine not in ENGINES or ENGINES[engine].supports_elastic:
                continue
            for setting in ELASTIC_SETTINGS:
                value = getattr(model, setting)
                if value is not None:
                    yield self.at(
                        ctx.file, value.span,
                        f"'{setting}' has no effect: the {engine} adapter runs no elastic pool yet",
                        "budget runtime-owned pools with `reserve` and `pool ... { max ... }`",
                    )
