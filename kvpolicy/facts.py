"""Facts: what is true now, per GPU and per engine instance (schema 1).

Adapters produce them, the ledger carries them between processes, and tests and
``kvpolicy explain`` read them from JSON. Sizes are bytes (people may write them with
a unit: ``"40 GiB"``; they are stored and written as integers), times are seconds.
Field docstrings are the descriptions of the published JSON Schema
(``docs/facts.schema.json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Final, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, NonNegativeInt, PositiveInt, WithJsonSchema, model_validator

from kvpolicy.units import MAX_SIZE, SIZE_UNITS, parse_size
from kvpolicy.validation import Conflict, Conflicts

FACTS_SCHEMA: Final = 1

Owner = Literal["runtime", "elastic"]


class OwnedPool(Protocol):
    """A pool as the facts, the ledger and the status file each describe it."""

    @property
    def owner(self) -> str: ...
    @property
    def bytes(self) -> int: ...


def runtime_pool_bytes(pools: Iterable[OwnedPool]) -> int:
    """The bytes of the runtime-owned pools among ``pools``: what the engine reserved itself."""
    return sum(p.bytes for p in pools if p.owner == "runtime")

SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*(" + "|".join(SIZE_UNITS) + r")\s*$"


def _size(value: Any) -> Any:
    """A string with a unit → bytes; anything else is left to the integer check, but for
    ``true``/``false``, which are not sizes however Python counts them."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a size: write bytes as an integer or a string such as \"40 GiB\"")
    return parse_size(value) if isinstance(value, str) else value


Size = Annotated[
    int,
    BeforeValidator(_size),
    Field(ge=0, le=MAX_SIZE),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_SIZE},
                {"type": "string", "pattern": SIZE_PATTERN, "examples": ["40 GiB", "512 MiB"]},
            ]
        },
        mode="validation",
    ),
]
"""Bytes: an integer, or a string with a unit (``"40 GiB"``, ``"1.5 TiB"``); a string without a unit is refused."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class PoolFacts(_Frozen):
    """One KV pool of an instance.

    ``bytes`` is what the GPU loses to the pool (for PyTorch tensors: after the
    caching allocator rounds each one up to its segment); budgets use it.
    ``tensor_bytes`` is the sum of the pool's tensor sizes, and ``parts`` breaks
    the pool down further (e.g. compressor state per ratio); both are informational.
    """

    owner: Owner = "runtime"
    """runtime: the engine allocated the pool itself, once (its bytes count as reserved on the GPU);
    elastic: kvpolicy's allocator backs it and the instance's elastic figures count it."""
    bytes: Size
    """Bytes the GPU loses to the pool (after allocator rounding); what budgets use."""
    tensor_bytes: Size | None = None
    """Sum of the pool's tensor sizes, before rounding (informational)."""
    parts: dict[str, Size] = Field(default_factory=dict)
    """The pool broken down further, in bytes (e.g. compressor state per ratio; informational)."""


class ElasticFacts(_Frozen):
    """An instance's elastic pool: bytes in live blocks, and bytes mapped on the GPU."""

    used: Size = 0
    """Bytes in live KV blocks: what the instance's requests hold now (rules' model.used). At most mapped."""
    mapped: Size = 0
    """Bytes of GPU memory mapped for the pool, live blocks or free: what it takes from the GPU now."""
    waiting: Size = 0
    """Bytes of the largest growth the pool was refused (at its limit or by the GPU's budget) in its last
    period, between two of its engine's ticks: what work waiting for memory needs (rules' model.waiting).
    0: nothing waits."""


class GpuFacts(_Frozen):
    """One GPU."""

    id: str
    """The GPU's id, as instances name it: its UUID (GPU-... or MIG-...), or cuda:N where NVML is missing."""
    name: str | None = None
    """Its display name, e.g. cuda:0 (NVML's numbering on the controller's machine); a policy's gpu blocks match the id or this."""
    capacity: Size
    """Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity)."""
    other_used: Size = 0
    """Memory in use on the GPU that no instance in these facts accounts for."""


class InstanceFacts(_Frozen):
    """One engine process on one GPU."""

    id: str
    """Unique among the instances, e.g. chat/0."""
    model: str
    """The model's name, which the policy's model blocks match."""
    engine: str = "any"
    """sglang, vllm or any."""
    engine_id: str | None = None
    """Instances sharing an engine id are one tensor-parallel engine (default: own id)."""
    gpu: str
    """The id of the GPU it runs on (one of gpus)."""
    rank: NonNegativeInt = 0
    """Its tensor-parallel rank."""
    pid: PositiveInt | None = None
    """Its process id, if known (informational)."""
    pools: dict[str, PoolFacts] = Field(default_factory=dict)
    """Its KV pools by name (swa, c4, full, ...)."""
    elastic: ElasticFacts | None = None
    """Its elastic pool, if it has one; absent: it holds no elastic memory."""
    idle_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Seconds since it last served a request (rules' model.idle)."""

    @property
    def engine_group(self) -> str:
        return self.engine_id if self.engine_id is not None else self.id

    @property
    def runtime_bytes(self) -> int:
        return runtime_pool_bytes(self.pools.values())

    @property
    def reports_runtime_pools(self) -> bool:
        return any(p.owner == "runtime" for p in self.pools.values())


def _repeated_ids(field: str, ids: list[str], hint: str) -> Iterable[Conflict]:
    """A conflict at each id of ``field``'s entries that an earlier entry has already."""
    first: dict[str, int] = {}
    for index, id_ in enumerate(ids):
        if id_ in first:
            yield Conflict((field, index, "id"), f"{json.dumps(id_)} is {field}.{first[id_]}'s id too", hint)
        else:
            first[id_] = index


class Facts(_Frozen):
    """What is true now, per GPU and per engine instance: the evaluator's input."""

    schema_: Literal[1] = Field(default=FACTS_SCHEMA, alias="schema")
    """The version of this format: 1."""
    now: float = Field(default=0.0, allow_inf_nan=False)
    """The time of the facts, in seconds (any epoch; rules' grace and cooldown count from it)."""
    gpus: tuple[GpuFacts, ...] = ()
    """Every GPU the instances run on."""
    instances: tuple[InstanceFacts, ...] = ()
    """Every engine process, one per GPU it uses."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, use_attribute_docstrings=True)

    @model_validator(mode="after")
    def _consistent(self) -> Facts:
        """Ids that name one GPU or instance each, and instances on GPUs the facts list: every value that
        disagrees is named at its own place (``Conflicts``)."""
        conflicts = [*_repeated_ids("gpus", [g.id for g in self.gpus], "each GPU is listed once"),
                     *_repeated_ids("instances", [i.id for i in self.instances],
                                    "each engine process is listed once per GPU it uses, under an id of its own")]
        known = [g.id for g in self.gpus]
        for index, inst in enumerate(self.instances):
            if inst.gpu not in known:
                hint = f"the GPUs listed: {', '.join(map(json.dumps, dict.fromkeys(known)))}" if known else "list it under gpus"
                conflicts.append(Conflict(("instances", index, "gpu"), f"{json.dumps(inst.gpu)} is not a GPU of these facts", hint))
        if conflicts:
            raise Conflicts(conflicts)
        return self

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
