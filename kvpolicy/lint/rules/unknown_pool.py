from collections.abc import Iterator

from kvpolicy.engines import ENGINES, pool_vocabulary
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.suggest import did_you_mean


@register
class UnknownPool(Rule):
    """A `pool` name the model's engine does not have.

    ## What it does
    Checks pool names against the pools the engine's adapter reports. SGLang
    (DeepSeek-V4): `swa c4 c128 indexer compressor_state` (and `other`). vLLM: the
    same five for DeepSeek-V4, and `full mla sliding_window mamba` for other
    models. A model without `engine` may name any of them.

    ## Why is this bad?
    A budget on a pool that never reports bytes limits nothing.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine sglang
      pool c5 { owner runtime }
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine sglang
      pool c4 { owner runtime }
    }
    ```
    """

    code = "KV012"
    name = "unknown-pool"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            engine = model.engine.value if model.engine else None
            vocabulary = pool_vocabulary(engine)
            for pool in model.pools:
                if pool.name.value not in vocabulary:
                    known = engine in ENGINES
                    message = f"engine {engine} has no pool" if known else "no engine has a pool named"
                    yield self.at(
                        ctx.file, pool.name.span, f"{message} '{pool.name.value}'",
                        did_you_mean(pool.name.value, sorted(vocabulary)) or "expected one of " + ", ".join(sorted(vocabulary)),
                    )
