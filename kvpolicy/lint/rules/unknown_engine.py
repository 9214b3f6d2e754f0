from collections.abc import Iterator

from kvpolicy.engines import ANY_ENGINE, ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.policy.suggest import did_you_mean


@register
class UnknownEngine(Rule):
    """An `engine` that kvpolicy has no adapter for.

    ## What it does
    `engine` is `sglang`, `vllm`, or `any` (the default: instances of any engine,
    including programs that attach to the ledger themselves).

    ## Why is this bad?
    The engine decides which pool names are valid and which pools can be elastic;
    a misspelt engine would bind no instance the way the policy intends.

    ## Example
    ```
    model "qwen3-8b" { engine vlm }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { engine vllm }
    ```
    """

    code = "KV009"
    name = "unknown-engine"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        known = (*sorted(ENGINES), ANY_ENGINE)
        for model in ctx.policy.models:
            engine = model.engine
            if engine is not None and engine.value not in known:
                yield self.at(
                    ctx.file, engine.span, f"unknown engine '{engine.value}'",
                    did_you_mean(engine.value, known) or "expected " + ", ".join(known),
                )
