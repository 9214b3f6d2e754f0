"""KV029 vllm-without-reserve-or-elastic-pool: a vLLM model with neither `reserve` nor an
`owner elastic` pool, which the vLLM adapter refuses to start.

The check; the rule and its documentation are in ``kvpolicy.catalogue``. The message gives
the adapter's reason, so that lint says what the engine would say at start.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.engines import ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register


@register
class VllmWithoutReserveOrElasticPool(Check):
    rule = catalogue.VLLM_WITHOUT_RESERVE_OR_ELASTIC_POOL

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        elastic_on_vllm = ", ".join(sorted(ENGINES["vllm"].elastic_pools))
        for model in ctx.policy.models:
            if model.engine is None or model.engine.value != "vllm" or model.reserve is not None:
                continue
            if ctx.reported_within(model):
                continue  # e.g. `reserve 40 GiBB`: the reserve is written, its error already said
            if any(p.owner is not None and p.owner.value == "elastic" for p in model.pools):
                continue
            yield self.at(
                ctx.file, model.name.span,
                f"the vLLM adapter refuses to start model '{model.name.value}': it has neither `reserve` "
                "(a static KV cache of that size) nor an `owner elastic` pool, so its KV cache cannot be sized",
                f"add `reserve SIZE`, or mark its KV pool elastic, e.g. `pool full {{ owner elastic }}` "
                f"(elastic on vllm: {elastic_on_vllm})",
            )
