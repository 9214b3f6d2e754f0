"""Decision (what the evaluator concludes, schema 1) and State (what it remembers).

The decision's JSON is ``kvpolicy explain --format json``'s (docs/json.md, docs/decision.schema.json);
fields beyond it are additions. ``reasons`` say why each number is what it is.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

DECISION_SCHEMA: Final = 1
STATE_SCHEMA: Final = 1


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class PolicyRef(_Out):
    file: str
    sha256: str


class Reserved(_Out):
    total: int
    by_pool: dict[str, int]
    """Runtime-owned bytes per pool; ``reserve`` holds model reserves standing in
    for instances that have not reported their pools yet."""


class GpuDecision(_Out):
    id: str
    name: str | None = None
    """The GPU's display name (cuda:N) when the facts give one; ``id`` is then its UUID."""
    capacity: int
    headroom: int
    other_used: int
    reserved: Reserved
    elastic_budget: int
    free: int
    used: int
    """Σ elastic bytes in use on this GPU."""
    chunk: int
    guaranteed: int
    """Σ guarantees on this GPU."""


class Action(_Out):
    rule: str
    file: str
    line: int
    shrink_to: int


class Violation(_Out):
    kind: Literal["pool_over_max", "reserve_exceeded"]
    pool: str | None
    bytes: int
    max: int
    file: str
    line: int


LimitBound = Literal["max", "budget", "tensor_parallel", "rule", "not_elastic"]
GuaranteeReason = Literal["min", "shared", "lower_priority", "not_elastic", "tensor_parallel"]


class Reasons(_Out):
    guarantee: GuaranteeReason
    limit: LimitBound
    priority_level: int
    min: int
    """The instance's minimum as used here: min(min, max), in bytes."""
    max: int
    weight: int
    engine_group: str
    tensor_parallel_size: int


class InstanceDecision(_Out):
    id: str
    model: str
    policy_model: str | None
    engine: str
    gpu: str
    guarantee: int
    limit: int
    target: int
    shortfall: bool
    elastic: bool
    actions: tuple[Action, ...] = ()
    violations: tuple[Violation, ...] = ()
    reasons: Reasons


RuleStateName = Literal["waiting", "acting", "cooling_down", "not_needed"]


class RuleOnInstance(_Out):
    """Where one rule stands on one instance."""

    instance: str
    state: RuleStateName
    """waiting: its condition holds, the grace is not over; acting: its shrink is in force;
    cooling_down: its shrink ended, it may not act again before ``until``; not_needed: its
    condition holds and the grace is over, but the shrinks decided before it made the
    condition false."""
    since: float | None
    """acting: when the shrink started; waiting, not_needed: when the condition started
    holding; cooling_down: null."""
    until: float | None
    """waiting: when the grace ends; cooling_down: when the cooldown ends; else null."""
    shrink_to: int | None
    """acting: the limit it holds the instance to, in bytes; else null."""


class RuleReport(_Out):
    """One complete rule of the policy and where it stands on each instance it touches."""

    rule: str
    file: str
    line: int
    grace: float
    cooldown: float
    instances: tuple[RuleOnInstance, ...] = ()
    """By instance id; an instance the rule does not touch (its condition does not hold,
    no cooldown runs) is not listed."""


class Decision(_Out):
    schema_: Literal[1] = Field(default=DECISION_SCHEMA, alias="schema")
    policy: PolicyRef
    now: float
    gpus: tuple[GpuDecision, ...]
    instances: tuple[InstanceDecision, ...]
    rules: tuple[RuleReport, ...] = ()
    """Every complete rule of the policy, in policy order, with its state per instance."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    def to_json(self) -> str:
        """Deterministic JSON: equal decisions give byte-identical text."""
        return self.model_dump_json(by_alias=True, indent=2)

    def instance(self, instance_id: str) -> InstanceDecision:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        raise KeyError(instance_id)

    def gpu(self, gpu_id: str) -> GpuDecision:
        for gpu in self.gpus:
            if gpu.id == gpu_id:
                return gpu
        raise KeyError(gpu_id)


class RuleMemory(BaseModel):
    """One rule's memory of one instance. Times are the facts' ``now`` (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    holding_since: float | None = None
    """When the rule's condition started holding on the reported facts (null: it does not)."""
    shrink_to: int | None = None
    """The shrink in force, in bytes (null: none)."""
    cooldown_until: float | None = None
    """Until when the rule may not act on the instance again (null: no cooldown runs)."""
    acting_since: float | None = None
    """When the shrink in force started (null: none is in force, or an older state did not record it)."""


class State(BaseModel):
    """What the evaluator carries from one evaluation to the next: ``explain --state``'s input,
    and the controller's rule state file beside the ledger (``state.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, use_attribute_docstrings=True)

    schema_: Literal[1] = Field(default=STATE_SCHEMA, alias="schema")
    """The version of this format: 1."""
    rules: dict[str, dict[str, RuleMemory]] = Field(default_factory=dict)
    """Rule name → instance id → memory; a rule or instance with nothing to remember is absent."""

    def memory(self, rule: str, instance: str) -> RuleMemory | None:
        return self.rules.get(rule, {}).get(instance)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
