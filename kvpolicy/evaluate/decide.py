"""``evaluate(policy, facts, state) -> (decision, state)``: DESIGN §4, exactly.

Pure and deterministic: no I/O, no clock (time is ``facts.now``), GPUs and
instances processed in id order so equal inputs give byte-identical JSON
whatever order the facts list them in. All outputs are rounded down to the
GPU's chunk; inputs are used as given, and every intermediate is exact (a
proportional share is a Fraction): rounding happens once, on the way out, so
it never compounds. Where DESIGN §4 leaves a choice open,
the choice is documented in docs/semantics.md and marked "choice" here.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

from kvpolicy.evaluate.conditions import Condition, compile_condition
from kvpolicy.evaluate.decision import (
    Action,
    Decision,
    GpuDecision,
    InstanceDecision,
    PolicyRef,
    Reasons,
    Reserved,
    RuleMemory,
    State,
    Violation,
)
from kvpolicy.facts import Facts, GpuFacts, InstanceFacts
from kvpolicy.policy.model import Policy, Rule
from kvpolicy.policy.resolve import (
    GpuSettings,
    ModelSettings,
    gpu_settings,
    model_settings,
)

RESERVE_POOL = "reserve"
"""``reserved.by_pool`` key for model reserves standing in for unreported pools."""


# ---- per-policy preparation (cached: the controller evaluates one policy many times) ----


R = TypeVar("R")

class _Prepared:
    """What does not depend on the facts: bindings, GPU settings, compiled conditions."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.rules: tuple[Rule, ...] = policy.rules
        self._models: dict[str, ModelSettings] = {}
        self._gpus: dict[str, GpuSettings] = {}
        self._conditions: dict[tuple[int, int], Condition | None] = {}
        self._pool_limits: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
        self._bounds: dict[tuple[str, int], tuple[int, int]] = {}
        self._order_keys: dict[int, tuple[tuple[str, bool], ...]] = {}
        self._outputs: dict[tuple, object] = {}
        """Output records by their field values: equal figures reuse the (frozen) record, so an
        evaluation whose results did not change builds no new pydantic objects."""
        self._headroom: dict[tuple[str, int], int] = {}

    def model(self, name: str) -> ModelSettings:
        settings = self._models.get(name)
        if settings is None:
            settings = self._models[name] = model_settings(self.policy, name)
        return settings

    def gpu(self, gpu_id: str) -> GpuSettings:
        settings = self._gpus.get(gpu_id)
        if settings is None:
            settings = self._gpus[gpu_id] = gpu_settings(self.policy, gpu_id)
        return settings

    def bounds(self, model: ModelSettings, capacity: int) -> tuple[int, int]:
        """(min, max) in bytes on a GPU of ``capacity``; a min above max is treated as max."""
        key = (model.name, capacity)
        bounds = self._bounds.get(key)
        if bounds is None:
            maximum = max(0, model.max_bytes(capacity))
            # choice: a min above max is treated as max (lint reports it where it can)
            bounds = self._bounds[key] = (max(0, min(model.min_bytes(capacity), maximum)), maximum)
        return bounds

    def output(self, key: tuple) -> Any:
        """The frozen record made before for ``key``, or None (the key's first item names the
        record's kind, the rest are every value it is built from)."""
        return self._outputs.get(key)

    def keep(self, key: tuple, record: R) -> R:
        """Remember ``record`` as the output for ``key``; returns it."""
        if len(self._outputs) > 8192:
            self._outputs.clear()
        self._outputs[key] = record
        return record

    def headroom(self, gpu_id: str, capacity: int) -> int:
        key = (gpu_id, capacity)
        if key not in self._headroom:
            self._headroom[key] = self.gpu(gpu_id).headroom_bytes(capacity)
        return self._headroom[key]

    def pool_limits(self, model: ModelSettings, capacity: int) -> dict[str, tuple[int, int]]:
        """Pool name → (its policy max in bytes, the pool block's line), for pools with a max."""
        key = (model.name, capacity)
        limits = self._pool_limits.get(key)
        if limits is None:
            limits = self._pool_limits[key] = {
                name: (block.max.resolve(capacity), block.span.line)
                for name, block in model.pools.items()
                if block.max is not None
            }
        return limits

    def order_key(self, index: int) -> tuple[tuple[str, bool], ...]:
        """The rule's ``order`` as plain values (rules with equal orders share one sort)."""
        if index not in self._order_keys:
            self._order_keys[index] = tuple((k.attribute.value, k.descending) for k in self.rules[index].order)
        return self._order_keys[index]

    def condition(self, index: int, capacity: int) -> Condition | None:
        key = (index, capacity)
        if key not in self._conditions:
            when = self.rules[index].when
            self._conditions[key] = None if when is None else compile_condition(when, capacity)
        return self._conditions[key]


_PREPARED: OrderedDict[int, _Prepared] = OrderedDict()
_PREPARED_SIZE = 8


def _prepared(policy: Policy) -> _Prepared:
    entry = _PREPARED.get(id(policy))
    if entry is None or entry.policy is not policy:
        entry = _Prepared(policy)
        _PREPARED[id(policy)] = entry
        while len(_PREPARED) > _PREPARED_SIZE:
            _PREPARED.popitem(last=False)
    return entry


# ---- working state of one evaluation ----------------------------------------------------


Exact = int | Fraction


@dataclass(eq=False)
class _Inst:
    id: str
    facts: InstanceFacts
    settings: ModelSettings
    elastic: bool
    used: int
    min: int
    max: int
    guarantee: Exact = 0
    guarantee_reason: str = "not_elastic"
    limit: Exact = 0
    limit_bound: str = "not_elastic"
    target: int = 0
    """Rounded: rules compare against it, as the engine sees it."""
    level: int = 0
    tp_size: int = 1
    actions: list[Action] = field(default_factory=list)


@dataclass(eq=False)
class _Gpu:
    facts: GpuFacts
    capacity: int
    headroom: int
    chunk: int
    reserved_by_pool: dict[str, int]
    reserved: int
    budget: int
    """A, exact; the decision shows it rounded down to the chunk."""
    instances: list[_Inst] = field(default_factory=list)

    @property
    def elastic(self) -> list[_Inst]:
        return [i for i in self.instances if i.elastic]


def evaluate(policy: Policy, facts: Facts, state: State | None = None) -> tuple[Decision, State]:
    """The decision for ``facts`` under ``policy``, and the state to pass next time."""
    prepared = _prepared(policy)
    state = state or State()
    gpus = _gpus(prepared, facts)
    for gpu in gpus:
        _guarantees(gpu)
        _limits(gpu)
    _tensor_parallel(gpus)
    for gpu in gpus:
        _targets(gpu)
    new_memory: dict[str, dict[str, RuleMemory]] = {}
    for gpu in gpus:
        _rules(prepared, gpu, facts.now, state, new_memory)
    decision = _decision(prepared, facts, gpus)
    return decision, State(rules=dict(sorted(new_memory.items())))


# ---- steps 1-2: budgets -----------------------------------------------------------------


def _gpus(prepared: _Prepared, facts: Facts) -> list[_Gpu]:
    by_gpu: dict[str, list[InstanceFacts]] = {}
    for inst in facts.instances:
        by_gpu.setdefault(inst.gpu, []).append(inst)
    gpus: list[_Gpu] = []
    for gpu_facts in sorted(facts.gpus, key=lambda g: g.id):
        settings = prepared.gpu(gpu_facts.id)
        capacity = settings.capacity if settings.capacity is not None else gpu_facts.capacity
        chunk = settings.chunk
        reserved_by_pool: dict[str, int] = {}
        members: list[_Inst] = []
        for inst_facts in sorted(by_gpu.get(gpu_facts.id, ()), key=lambda i: i.id):
            model = prepared.model(inst_facts.model)
            reported = False
            for name, pool in inst_facts.pools.items():
                if pool.owner == "runtime":
                    reserved_by_pool[name] = reserved_by_pool.get(name, 0) + pool.bytes
                    reported = True
            if not reported and model.reserve:
                reserved_by_pool[RESERVE_POOL] = reserved_by_pool.get(RESERVE_POOL, 0) + model.reserve
            elastic = inst_facts.elastic is not None
            minimum, maximum = prepared.bounds(model, capacity) if elastic else (0, 0)
            members.append(
                _Inst(
                    id=inst_facts.id,
                    facts=inst_facts,
                    settings=model,
                    elastic=elastic,
                    used=inst_facts.elastic.used if elastic else 0,
                    min=minimum,
                    max=maximum,
                )
            )
        reserved = sum(reserved_by_pool.values())
        headroom = prepared.headroom(gpu_facts.id, capacity)
        budget = max(0, capacity - headroom - gpu_facts.other_used - reserved)
        gpus.append(
            _Gpu(
                facts=gpu_facts,
                capacity=capacity,
                headroom=headroom,
                chunk=chunk,
                reserved_by_pool=dict(sorted(reserved_by_pool.items())),
                reserved=reserved,
                budget=budget,
                instances=members,
            )
        )
    return gpus


# ---- step 3: guarantees ------------------------------------------------------------------


def _guarantees(gpu: _Gpu) -> None:
    """Priority levels from highest: a level whose mins fit gets them; the first that
    does not shares what remains in proportion to its mins; lower levels get 0."""
    elastic = gpu.elastic
    remaining = gpu.budget
    starved = False
    for level, priority in enumerate(sorted({i.settings.priority for i in elastic}, reverse=True)):
        members = [i for i in elastic if i.settings.priority == priority]
        need = sum(i.min for i in members)
        for inst in members:
            inst.level = level
        if starved:
            for inst in members:
                inst.guarantee, inst.guarantee_reason = 0, "lower_priority" if inst.min else "min"
        elif need <= remaining:
            for inst in members:
                inst.guarantee, inst.guarantee_reason = inst.min, "min"
            remaining -= need
        else:
            for inst in members:
                inst.guarantee = Fraction(remaining * inst.min, need)
                inst.guarantee_reason = "shared"
            starved = True


# ---- step 4: limits, and tensor-parallel groups ---------------------------------------------


def _limits(gpu: _Gpu) -> None:
    """l_i = min(max_i, A − Σ_{j≠i} g_j): anything except what is guaranteed to others."""
    guaranteed = sum(i.guarantee for i in gpu.elastic)
    for inst in gpu.elastic:
        budget_room = gpu.budget - (guaranteed - inst.guarantee)
        if inst.max <= budget_room:
            inst.limit, inst.limit_bound = inst.max, "max"
        else:
            inst.limit, inst.limit_bound = max(0, budget_room), "budget"


def _tensor_parallel(gpus: list[_Gpu]) -> None:
    """Instances sharing an engine id get the group's smallest limit everywhere.

    choice: a member's guarantee is capped at that limit too (it could not use
    more). What it cannot use is not handed to its neighbours' limits, which
    were computed before: so a change on one GPU never raises a limit on another.
    """
    groups: dict[str, list[_Inst]] = {}
    for gpu in gpus:
        for inst in gpu.elastic:
            groups.setdefault(inst.facts.engine_group, []).append(inst)
    for members in groups.values():
        if len(members) < 2:
            continue
        cap = min(i.limit for i in members)
        for inst in members:
            inst.tp_size = len(members)
            if inst.limit > cap:
                inst.limit, inst.limit_bound = cap, "tensor_parallel"
            if inst.guarantee > cap:
                inst.guarantee, inst.guarantee_reason = cap, "tensor_parallel"


# ---- step 5: fair targets -------------------------------------------------------------------


def _targets(gpu: _Gpu) -> None:
    """The spare A − Σ g water-filled by weight, each instance capped at its limit."""
    elastic = gpu.elastic
    # Whole bytes are exact enough here: targets are rounded down to the chunk.
    spare = math.floor(gpu.budget - sum(i.guarantee for i in elastic))
    shares = waterfill(spare, [(i.settings.weight, math.floor(i.limit - i.guarantee)) for i in elastic])
    for inst, share in zip(elastic, shares):
        inst.target = _out(min(inst.limit, inst.guarantee + share), gpu.chunk)


def waterfill(amount: int, claims: list[tuple[int, int]]) -> list[int]:
    """Split ``amount`` by weight among ``(weight, room)`` claims, none above its room.

    Whoever's fair share exceeds its room gets its room, and the rest is split
    again among the others, until everyone left can take a full share.
    """
    shares = [0] * len(claims)
    active = [k for k, (weight, room) in enumerate(claims) if weight > 0 and room > 0]
    remaining = max(0, amount)
    while active and remaining > 0:
        total = sum(claims[k][0] for k in active)
        full = [k for k in active if claims[k][1] * total <= remaining * claims[k][0]]
        if not full:
            for k in active:
                shares[k] = remaining * claims[k][0] // total
            break
        for k in full:
            shares[k] = claims[k][1]
            remaining -= claims[k][1]
        active = [k for k in active if k not in full]
    return shares


# ---- step 6: rules ----------------------------------------------------------------------------

_ORDER_VALUES = {
    "priority": lambda i: i.settings.priority,
    "idle": lambda i: i.facts.idle_seconds,
    "used": lambda i: i.used,
    "weight": lambda i: i.settings.weight,
    "target": lambda i: i.target,
    "min": lambda i: i.min,
    "max": lambda i: i.max,
    "engine": lambda i: i.facts.engine,
    "name": lambda i: i.facts.model,
}


def _ordered(instances: list[_Inst], rule: Rule) -> list[_Inst]:
    ordered = sorted(instances, key=lambda i: i.id)
    for key in reversed(rule.order):  # stable sorts, last key first
        ordered.sort(key=_ORDER_VALUES[key.attribute.value], reverse=key.descending)
    return ordered


def _rules(prepared: _Prepared, gpu: _Gpu, now: float, state: State, memory: dict[str, dict[str, RuleMemory]]) -> None:
    elastic = gpu.elastic
    if not elastic or not prepared.rules:
        return
    used_total = sum(i.used for i in elastic)
    reported_gpu = {
        "gpu.capacity": gpu.capacity,
        "gpu.reserved": gpu.reserved,
        "gpu.used": used_total,
        "gpu.free": gpu.budget - used_total,
    }
    # Figures as reported, one dict per instance, built once for all rules.
    reported = {inst.id: {**reported_gpu, **_instance_figures(inst)} for inst in elastic}
    used_now = {inst.id: inst.used for inst in elastic}  # lowered by the shrinks decided so far
    shrunk = False
    orders: dict[tuple, list[_Inst]] = {}
    for index, rule in enumerate(prepared.rules):
        condition = prepared.condition(index, gpu.capacity)
        if condition is None or rule.shrink_to is None:
            continue  # incomplete rules never load; kept safe for partial policies
        name = rule.name.value
        grace = rule.grace.seconds if rule.grace else 0.0
        cooldown = rule.cooldown.seconds if rule.cooldown else 0.0
        remembered = state.rules.get(name, {})
        rule_memory = memory.setdefault(name, {})
        in_force: list[tuple[_Inst, float]] = []
        candidates: list[tuple[_Inst, float]] = []
        order_key = prepared.order_key(index)
        ordered = orders.get(order_key) if not shrunk else None  # a shrink can move targets
        if ordered is None:
            ordered = orders[order_key] = _ordered(elastic, rule)
        for inst in ordered:
            holds = condition(reported[inst.id])
            old = remembered.get(inst.id)
            since = None
            if holds:
                since = old.holding_since if old is not None and old.holding_since is not None else now
            cooldown_until = old.cooldown_until if old is not None else None
            if old is not None and old.shrink_to is not None and not holds:
                cooldown_until = now + cooldown  # the shrink ends: its cooldown starts
            if cooldown_until is not None and cooldown_until <= now:
                cooldown_until = None
            if holds and old is not None and old.shrink_to is not None:
                in_force.append((inst, since))
            elif holds and cooldown_until is None and now - since >= grace:
                candidates.append((inst, since))
            if since is not None or cooldown_until is not None:
                if old is not None and old.shrink_to is None and (old.holding_since, old.cooldown_until) == (since, cooldown_until):
                    rule_memory[inst.id] = old  # unchanged: frozen, so it can be shared
                else:
                    rule_memory[inst.id] = RuleMemory(holding_since=since, cooldown_until=cooldown_until)
        for inst, since in in_force:  # shrinks in force count before anyone new is chosen
            value = _apply_shrink(prepared, rule, inst, gpu, used_now)
            rule_memory[inst.id] = RuleMemory(holding_since=since, shrink_to=value)
            shrunk = True
        for inst, since in candidates:
            if shrunk and not condition(_adjusted(reported[inst.id], inst, gpu, used_now)):
                continue  # the shrinks decided so far already made the condition false
            value = _apply_shrink(prepared, rule, inst, gpu, used_now)
            rule_memory[inst.id] = RuleMemory(holding_since=since, shrink_to=value)
            shrunk = True
        if not rule_memory:
            del memory[name]


def _instance_figures(inst: _Inst) -> dict[str, object]:
    return {
        "model.used": inst.used,
        "model.idle": inst.facts.idle_seconds,
        "model.priority": inst.settings.priority,
        "model.weight": inst.settings.weight,
        "model.min": inst.min,
        "model.max": inst.max,
        "model.target": inst.target,
        "model.engine": inst.facts.engine,
        "model.name": inst.facts.model,
    }


def _adjusted(figures: dict, inst: _Inst, gpu: _Gpu, used_now: dict[str, int]) -> dict:
    """The figures with the shrinks decided so far counted as lowering usage."""
    used = sum(used_now.values())
    return {**figures, "model.used": used_now[inst.id], "gpu.used": used, "gpu.free": gpu.budget - used}


def _apply_shrink(prepared: _Prepared, rule: Rule, inst: _Inst, gpu: _Gpu, used_now: dict[str, int]) -> int:
    """Lower the instance's limit to the rule's value (never below its guarantee)."""
    file = prepared.policy.file
    shrink = rule.shrink_to
    if shrink.kind == "min":
        value = inst.min
    elif shrink.kind == "target":
        value = inst.target
    else:
        value = shrink.amount.resolve(gpu.capacity)
    value = max(inst.guarantee, max(0, value))
    if value < inst.limit:
        inst.limit, inst.limit_bound = value, "rule"
    # choice: targets are not redistributed by rules, but never exceed the limit
    inst.target = min(inst.target, _out(inst.limit, gpu.chunk))
    shown = _out(value, gpu.chunk)
    key = ("action", rule.name.value, file, rule.span.line, shown)
    action = prepared.output(key)
    if action is None:
        action = prepared.keep(key, Action(rule=rule.name.value, file=file, line=rule.span.line, shrink_to=shown))
    inst.actions.append(action)
    used_now[inst.id] = min(used_now[inst.id], math.floor(value))
    return shown


# ---- step 7 and the decision ------------------------------------------------------------------


def _out(value: Exact, chunk: int) -> int:
    """An output figure: rounded down to the chunk, never negative."""
    whole = value if type(value) is int else math.floor(value)
    return whole - whole % chunk if whole > 0 else 0


def _violations(prepared: _Prepared, inst: _Inst, capacity: int, file: str) -> tuple[Violation, ...]:
    found: list[Violation] = []

    def violation(kind: str, pool: str | None, nbytes: int, maximum: int, line: int) -> None:
        key = (kind, pool, nbytes, maximum, file, line)
        record = prepared.output(key)
        if record is None:
            record = prepared.keep(key, Violation(kind=kind, pool=pool, bytes=nbytes, max=maximum, file=file, line=line))
        found.append(record)

    settings = inst.settings
    limits = prepared.pool_limits(settings, capacity)
    for name in sorted(inst.facts.pools) if limits else ():
        pool = inst.facts.pools[name]
        if pool.owner != "runtime" or name not in limits:
            continue
        limit, line = limits[name]
        if pool.bytes > limit:
            violation("pool_over_max", name, pool.bytes, limit, line)
    block = settings.block
    if settings.reserve is not None and block is not None and block.reserve is not None:
        total = inst.facts.runtime_bytes
        if total > settings.reserve:
            violation("reserve_exceeded", None, total, settings.reserve, block.reserve.span.line)
    return tuple(found)


def _decision(prepared: _Prepared, facts: Facts, gpus: list[_Gpu]) -> Decision:
    policy = prepared.policy
    file = policy.file
    gpu_out: list[GpuDecision] = []
    inst_out: list[InstanceDecision] = []
    for gpu in gpus:
        used = sum(i.used for i in gpu.elastic)
        budget, free = _out(gpu.budget, gpu.chunk), _out(gpu.budget - used, gpu.chunk)
        guaranteed = sum(_out(i.guarantee, gpu.chunk) for i in gpu.elastic)
        by_pool = tuple(gpu.reserved_by_pool.items())
        gpu_key = (
            "gpu", gpu.facts.id, gpu.capacity, gpu.headroom, gpu.facts.other_used, gpu.reserved,
            by_pool, budget, free, used, gpu.chunk, guaranteed,
        )
        gpu_record = prepared.output(gpu_key)
        if gpu_record is None:
            gpu_record = prepared.keep(gpu_key, GpuDecision(
                id=gpu.facts.id, capacity=gpu.capacity, headroom=gpu.headroom, other_used=gpu.facts.other_used,
                reserved=Reserved(total=gpu.reserved, by_pool=dict(by_pool)),
                elastic_budget=budget, free=free, used=used, chunk=gpu.chunk, guaranteed=guaranteed,
            ))
        gpu_out.append(gpu_record)
        for inst in gpu.instances:
            settings = inst.settings
            guarantee, limit = _out(inst.guarantee, gpu.chunk), _out(inst.limit, gpu.chunk)
            actions = tuple(inst.actions)
            violations = _violations(prepared, inst, gpu.capacity, file)
            key = (
                "instance", inst.id, inst.facts.model, settings.pattern, inst.facts.engine, gpu.facts.id,
                guarantee, limit, inst.target, inst.guarantee < inst.min, inst.elastic, actions, violations,
                inst.guarantee_reason, inst.limit_bound, inst.level, inst.min, inst.max, settings.weight,
                inst.facts.engine_group, inst.tp_size,
            )
            record = prepared.output(key)
            if record is None:
                record = prepared.keep(key, InstanceDecision(
                    id=inst.id, model=inst.facts.model, policy_model=settings.pattern, engine=inst.facts.engine,
                    gpu=gpu.facts.id, guarantee=guarantee, limit=limit, target=inst.target,
                    shortfall=inst.guarantee < inst.min, elastic=inst.elastic, actions=actions, violations=violations,
                    reasons=Reasons(
                        guarantee=inst.guarantee_reason, limit=inst.limit_bound, priority_level=inst.level,
                        min=inst.min, max=inst.max, weight=settings.weight, engine_group=inst.facts.engine_group,
                        tensor_parallel_size=inst.tp_size,
                    ),
                ))
            inst_out.append(record)
    inst_out.sort(key=lambda d: d.id)
    return Decision(
        policy=PolicyRef(file=policy.file, sha256=policy.sha256),
        now=facts.now,
        gpus=tuple(gpu_out),
        instances=tuple(inst_out),
    )
