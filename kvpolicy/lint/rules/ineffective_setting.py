"""KV022 ineffective-setting: a setting that has no effect for this model yet.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.engines import ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register

ELASTIC_SETTINGS = ("min", "max", "weight")


@register
class IneffectiveSetting(Check):
    rule = catalogue.INEFFECTIVE_SETTING

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
                example = "full" if "full" in vocabulary.elastic_pools else min(vocabulary.elastic_pools)
                hint = (
                    f"mark its KV pool elastic (e.g. `pool {example} {{ owner elastic }}`; elastic on {engine}: "
                    f"{', '.join(sorted(vocabulary.elastic_pools))}), or budget it with `reserve`"
                )
            else:
                message = f"'{{setting}}' has no effect: the {engine} adapter runs no elastic pool yet"
                hint = "budget runtime-owned pools with `reserve` and `pool ... { max ... }`"
            for setting in ELASTIC_SETTINGS:
                value = getattr(model, setting)
                if value is not None:
                    yield self.at(ctx.file, value.span, message.format(setting=setting), hint)
