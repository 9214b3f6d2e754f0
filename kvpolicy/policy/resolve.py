"""What a policy says for one GPU or one model name, defaults applied.

The language's defaults (docs/language.md): headroom 0, chunk 2 MiB, priority 0,
reserve 0, min 0, max 100%, weight 100, engine any. A GPU takes each setting from
the most specific ``gpu`` block that sets it (an explicit id beats ``*``), then
from ``defaults``. An instance binds the most specific ``model`` block whose
pattern matches its model name (exact, then longest pattern, then first in file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kvpolicy.policy import globs
from kvpolicy.diagnostics import Span
from kvpolicy.policy.model import (
    Amount,
    ModelBlock,
    PercentLit,
    Policy,
    PoolBlock,
    SizeLit,
)
from kvpolicy.units import MiB

DEFAULT_CHUNK = 2 * MiB
DEFAULT_PRIORITY = 0
DEFAULT_WEIGHT = 100
_ZERO_SPAN = Span(line=0, col=0, end_line=0, end_col=0)
DEFAULT_MIN: Amount = SizeLit(span=_ZERO_SPAN, bytes=0, number="0", unit="B")
DEFAULT_MAX: Amount = PercentLit(span=_ZERO_SPAN, percent=Decimal(100))


@dataclass(frozen=True)
class GpuSettings:
    """A GPU's settings before its capacity is known; ``*_line`` say where each came from (0: default)."""

    headroom: Amount | None
    capacity: int | None
    chunk: int
    headroom_line: int = 0
    capacity_line: int = 0
    chunk_line: int = 0

    def headroom_bytes(self, capacity: int) -> int:
        return 0 if self.headroom is None else self.headroom.resolve(capacity)


@dataclass(frozen=True)
class ModelSettings:
    """The settings that bind an instance whose model is ``name``."""

    name: str
    block: ModelBlock | None
    engine: str | None
    priority: int
    reserve: int | None
    min: Amount
    max: Amount
    weight: int
    pools: dict[str, PoolBlock] = field(default_factory=dict)

    @property
    def pattern(self) -> str | None:
        return self.block.name.value if self.block else None

    @property
    def line(self) -> int:
        return self.block.span.line if self.block else 0

    def min_bytes(self, capacity: int) -> int:
        return self.min.resolve(capacity)

    def max_bytes(self, capacity: int) -> int:
        return self.max.resolve(capacity)

    def pool_max_bytes(self, pool: str, capacity: int) -> int | None:
        block = self.pools.get(pool)
        return None if block is None or block.max is None else block.max.resolve(capacity)


def gpu_settings(policy: Policy, gpu_id: str, name: str | None = None) -> GpuSettings:
    """A ``gpu "X"`` block applies when X is the GPU's id (its UUID) or its display name (``cuda:N``);
    a block naming the id comes before one naming the display name, then ``gpu *``, then defaults."""
    by_id = [g for g in policy.gpus if any(s.value == gpu_id for s in g.ids)]
    by_name = [g for g in policy.gpus if name and name != gpu_id and g not in by_id and any(s.value == name for s in g.ids)]
    specific = [*by_id, *by_name]
    wildcard = [g for g in policy.gpus if g.is_wildcard]
    layers = [*specific, *wildcard, *policy.defaults]  # most specific first

    def first(attr: str) -> tuple[Any, int]:
        for block in layers:
            value = getattr(block, attr, None)
            if value is not None:
                return value, block.span.line
        return None, 0

    headroom, headroom_line = first("headroom")
    capacity, capacity_line = first("capacity")
    chunk, chunk_line = first("chunk")
    return GpuSettings(
        headroom=headroom,
        capacity=capacity.bytes if capacity is not None else None,
        chunk=chunk.bytes if chunk is not None else DEFAULT_CHUNK,
        headroom_line=headroom_line,
        capacity_line=capacity_line,
        chunk_line=chunk_line,
    )


def bind(policy: Policy, name: str) -> ModelBlock | None:
    """The model block that binds ``name``, or None (the instance gets the defaults)."""
    best: tuple[tuple[int, int, int], ModelBlock] | None = None
    for index, block in enumerate(policy.models):
        pattern = block.name.value
        if globs.matches(pattern, name):
            key = globs.specificity(pattern, index)
            if best is None or key > best[0]:
                best = (key, block)
    return best[1] if best else None


def model_settings(policy: Policy, name: str) -> ModelSettings:
    block = bind(policy, name)
    if block is None:
        return ModelSettings(
            name=name, block=None, engine=None, priority=DEFAULT_PRIORITY, reserve=None,
            min=DEFAULT_MIN, max=DEFAULT_MAX, weight=DEFAULT_WEIGHT,
        )
    return ModelSettings(
        name=name,
        block=block,
        engine=block.engine.value if block.engine else None,
        priority=block.priority.value if block.priority else DEFAULT_PRIORITY,
        reserve=block.reserve.bytes if block.reserve else None,
        min=block.min or DEFAULT_MIN,
        max=block.max or DEFAULT_MAX,
        weight=block.weight.value if block.weight else DEFAULT_WEIGHT,
        pools={p.name.value: p for p in block.pools},
    )
