from collections.abc import Iterator

from kvpolicy.engines import ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity

ELASTIC_SETTINGS = ("min", "max", "weight")


@register
class IneffectiveSetting(Rule):
    """A setting that has no effect for this model yet.

    ## What it does
    `min`, `max` and `weight` govern elastic KV memory. An engine whose adapter
    runs no elastic pool (SGLang today: all DeepSeek-V4 pools are runtime-owned)
    never has elastic memory, so these settings do nothing there. On vLLM they
    take effect once the model marks a pool `owner elastic` (e.g.
    `pool full { owner elastic }`); without one, vLLM's KV cache is sized from
    `reserve` and the settings do nothing.

    ## Why is this bad?
    The file reads as if the model had a guarantee it will never get.

    ## Example
    ```
    model "qwen3-8b" {
      engine vllm
      reserve 40 GiB
      min 8 GiB
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      engine vllm
      min 8 GiB
      pool full { owner elastic }
    }
    ```
    """

    code = "KV022"
    name = "ineffective-setting"
    severity = Severity.WARNING

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            engine = model.engine.value if model.engine else None
            if engine not in ENGINES:
                continue
            vocabulary = ENGINES[engine]
            if vocabulary.supports_elastic:
                elastic = [p for p in model.pools if p.owner is not None and p.owner.value == "elastic"]
                if elastic:
                    continue
                message = f"'{{setting}}' has no effect: no pool of this {engine} model is `owner elastic`"
                hint = (
                    f"mark its KV pool elastic (e.g. `pool full {{ owner elastic }}`; elastic on {engine}: "
                    f"{', '.join(sorted(vocabulary.elastic_pools))}), or budget it with `reserve`"
                )
            else:
                message = f"'{{setting}}' has no effect: the {engine} adapter runs no elastic pool yet"
                hint = "budget runtime-owned pools with `reserve` and `pool ... { max ... }`"
            for setting in ELASTIC_SETTINGS:
                value = getattr(model, setting)
                if value is not None:
                    yield self.at(ctx.file, value.span, message.format(setting=setting), hint)
