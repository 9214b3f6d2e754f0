"""KV013 unmanageable-elastic-pool: `owner elastic` on a pool that the engine's adapter cannot run elastically.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.engines import DEEPSEEK_V4_POOLS, RUNTIME_OWNED_WHY, elastic_pools, pool_vocabulary
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register


@register
class UnmanageableElasticPool(Check):
    rule = catalogue.UNMANAGEABLE_ELASTIC_POOL

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            engine = model.engine.value if model.engine else None
            elastic = elastic_pools(engine)
            for pool in model.pools:
                name = pool.name.value
                if pool.owner is None or pool.owner.value != "elastic" or name in elastic:
                    continue
                if name not in pool_vocabulary(engine):
                    continue  # unknown-pool says it
                who = f"the {engine} adapter" if engine else "no adapter"
                hint = (
                    "elastic pools: " + ", ".join(sorted(elastic))
                    if elastic
                    else "use `owner runtime`: no pool of this engine can be elastic yet"
                )
                message = f"{who} cannot run pool '{name}' elastically"
                if name in RUNTIME_OWNED_WHY and "swa" in elastic:
                    message += f": {RUNTIME_OWNED_WHY[name]}"
                    hint = "use `owner runtime`: of DeepSeek-V4's pools only `swa` can be elastic"
                elif elastic and name in DEEPSEEK_V4_POOLS:
                    hint = f"use `owner runtime`: DeepSeek-V4's pools stay runtime-owned ({hint})"
                yield self.at(ctx.file, pool.owner.span, message, hint)
