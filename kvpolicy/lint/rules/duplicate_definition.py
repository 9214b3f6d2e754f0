"""KV011 duplicate-definition: the same model, pool, rule, GPU id or setting defined twice.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import Node


@register
class DuplicateDefinition(Check):
    rule = catalogue.DUPLICATE_DEFINITION

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        policy = ctx.policy
        seen: dict[str, int] = {}

        def once(key: str, what: str, node: Node, span: Span | None = None) -> Iterator[Diagnostic]:
            if key in seen:
                yield self.at(ctx.file, span or node.span, f"{what} is defined twice", f"the first is on line {seen[key]}")
            else:
                seen[key] = node.span.line

        for block in policy.defaults:
            yield from once("defaults", "'defaults'", block, _keyword(block, "defaults"))
        for gpu in policy.gpus:
            if gpu.is_wildcard:
                yield from once("gpu *", "'gpu *'", gpu, _keyword(gpu, "gpu"))
            for gpu_id in gpu.ids:
                yield from once(f"gpu {gpu_id.value}", f"GPU {gpu_id.value!r}", gpu_id)
        for model in policy.models:
            yield from once(f"model {model.name.value}", f"model {model.name.value!r}", model.name)
            for pool in model.pools:
                yield from once(f"pool {model.name.value} {pool.name.value}", f"pool '{pool.name.value}' of model {model.name.value!r}", pool.name)
        for rule in policy.rules:
            yield from once(f"rule {rule.name.value}", f"rule {rule.name.value!r}", rule.name)


def _keyword(block: Node, word: str) -> Span:
    """The block's keyword (a block's span starts with it): where a duplicate is reported."""
    start = block.span
    return Span(line=start.line, col=start.col, end_line=start.line, end_col=start.col + len(word))
