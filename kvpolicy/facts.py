"""Facts: what is true now, per GPU and per engine instance (schema 1).

Adapters produce them, the ledger carries them between processes, and tests and
``kvpolicy explain`` read them from JSON. All sizes are bytes, times are seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

FACTS_SCHEMA = 1

Owner = Literal["runtime", "elastic"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolFacts(_Frozen):
    """One KV pool of an instance.

    ``bytes`` is what the GPU loses to the pool (for PyTorch tensors: after the
    caching allocator rounds each one up to its segment); budgets use it.
    ``tensor_bytes`` is the sum of the pool's tensor sizes, and ``parts`` breaks
    the pool down further (e.g. compressor state per ratio); both are informational.
    """

    owner: Owner = "runtime"
    bytes: NonNegativeInt
    tensor_bytes: NonNegativeInt | None = None
    parts: dict[str, NonNegativeInt] = Field(default_factory=dict)


class ElasticFacts(_Frozen):
    """An instance's elastic pool: bytes in live blocks, and bytes mapped on the GPU."""

    used: NonNegativeInt = 0
    mapped: NonNegativeInt = 0


class GpuFacts(_Frozen):
    id: str
    capacity: NonNegativeInt
    other_used: NonNegativeInt = 0
    """Memory in use on the GPU that no instance in these facts accounts for."""


class InstanceFacts(_Frozen):
    """One engine process on one GPU."""

    id: str
    model: str
    engine: str = "any"
    engine_id: str | None = None
    """Instances sharing an engine id are one tensor-parallel engine (default: own id)."""
    gpu: str
    rank: NonNegativeInt = 0
    pid: int | None = None
    pools: dict[str, PoolFacts] = Field(default_factory=dict)
    elastic: ElasticFacts | None = None
    idle_seconds: float = Field(default=0.0, ge=0)

    @property
    def engine_group(self) -> str:
        return self.engine_id if self.engine_id is not None else self.id

    @property
    def runtime_bytes(self) -> int:
        return sum(p.bytes for p in self.pools.values() if p.owner == "runtime")

    @property
    def reports_runtime_pools(self) -> bool:
        return any(p.owner == "runtime" for p in self.pools.values())


class Facts(_Frozen):
    schema_: Literal[1] = Field(default=FACTS_SCHEMA, alias="schema")
    now: float = 0.0
    gpus: tuple[GpuFacts, ...] = ()
    instances: tuple[InstanceFacts, ...] = ()

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> Facts:
        gpu_ids = [g.id for g in self.gpus]
        if len(set(gpu_ids)) != len(gpu_ids):
            raise ValueError(f"GPU ids are not unique: {sorted(gpu_ids)}")
        ids = [i.id for i in self.instances]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"instance ids are not unique: {dup}")
        known = set(gpu_ids)
        for inst in self.instances:
            if inst.gpu not in known:
                raise ValueError(
                    f"instance {inst.id!r} is on GPU {inst.gpu!r}, which the facts do not list "
                    f"(known: {sorted(known) or 'none'})"
                )
        return self

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
