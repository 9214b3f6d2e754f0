"""KV028 sglang-without-reserve: an SGLang model without `reserve`, which the DeepSeek-V4
adapter refuses to start.

The check; the rule and its documentation are in ``kvpolicy.catalogue``. The message gives
the adapter's reason, so that lint says what the engine would say at start.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register


@register
class SglangWithoutReserve(Check):
    rule = catalogue.SGLANG_WITHOUT_RESERVE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            if model.engine is None or model.engine.value != "sglang" or model.reserve is not None:
                continue
            if ctx.reported_within(model):
                continue  # e.g. `reserve 40 GiBB`: the reserve is written, its error already said
            yield self.at(
                ctx.file, model.name.span,
                f"SGLang's adapter refuses to start model '{model.name.value}': it has no `reserve`, "
                "and DeepSeek-V4's pools are sized from it",
                "add e.g. `reserve 40 GiB` (kvpolicy plan --policy shows what a reserve buys)",
            )
