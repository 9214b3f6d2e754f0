"""KV017 over-commitment: guarantees and reservations that do not fit on a GPU.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.engines import ENGINES
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import ModelBlock
from kvpolicy.policy.resolve import gpu_settings, model_settings
from kvpolicy.units import format_bytes


@dataclass(frozen=True)
class _Demand:
    block: ModelBlock | None
    min: int
    reserve: int


@register
class OverCommitment(Check):
    rule = catalogue.OVER_COMMITMENT

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        policy = ctx.policy
        for gpu_id, capacity, other, demands in _gpus(ctx):
            settings = gpu_settings(policy, gpu_id)
            if settings.capacity is not None:
                capacity = settings.capacity
            headroom = settings.headroom_bytes(capacity)
            total = headroom
            for demand in demands:
                total += demand.min + demand.reserve
                if total > capacity - other:
                    mins = sum(d.min for d in demands)
                    reserves = sum(d.reserve for d in demands)
                    span = demand.block.name.span if demand.block else Span.point(1, 1)
                    yield self.at(
                        ctx.file, span,
                        f"over-committed on {'each GPU' if gpu_id == '*' else gpu_id}: min {format_bytes(mins)} + reserve "
                        f"{format_bytes(reserves)} + headroom {format_bytes(headroom)} = "
                        f"{format_bytes(mins + reserves + headroom)} > capacity {format_bytes(capacity)}"
                        + (f" - other use {format_bytes(other)}" if other else ""),
                        "lower reserve or min, lower the headroom, or place fewer models on this GPU",
                    )
                    break


def _may_be_elastic(model: ModelBlock) -> bool:
    """Whether instances of this model can hold elastic memory (so their min counts)."""
    engine = model.engine.value if model.engine else None
    return engine not in ENGINES or ENGINES[engine].supports_elastic


def _gpus(ctx: LintContext) -> Iterator[tuple[str, int, int, list[_Demand]]]:
    """(gpu id, capacity, other use, demands) for each GPU the context knows of."""
    policy = ctx.policy
    if ctx.facts is not None:
        for gpu in ctx.facts.gpus:
            demands = []
            for inst in (i for i in ctx.facts.instances if i.gpu == gpu.id):
                settings = model_settings(policy, inst.model)
                capacity = gpu_settings(policy, gpu.id, gpu.name).capacity or gpu.capacity
                reserve = inst.runtime_bytes if inst.reports_runtime_pools else (settings.reserve or 0)
                minimum = settings.min_bytes(capacity) if inst.elastic is not None else 0
                demands.append(_Demand(settings.block, minimum, reserve))
            yield gpu.id, gpu.capacity, gpu.other_used, demands
    elif ctx.gpu_capacity is not None:
        ids = sorted({i.value for g in policy.gpus for i in g.ids}) or ["*"]
        for gpu_id in ids:
            capacity = gpu_settings(policy, gpu_id).capacity or ctx.gpu_capacity
            demands = [
                _Demand(
                    m,
                    m.min.resolve(capacity) if m.min is not None and _may_be_elastic(m) else 0,
                    m.reserve.bytes if m.reserve is not None else 0,
                )
                for m in policy.models
            ]
            yield gpu_id, ctx.gpu_capacity, 0, demands
