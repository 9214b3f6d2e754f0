"""KV012 unknown-pool: a `pool` name the model's engine does not have.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.engines import ENGINES, pool_vocabulary
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.suggest import did_you_mean


@register
class UnknownPool(Check):
    rule = catalogue.UNKNOWN_POOL

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
