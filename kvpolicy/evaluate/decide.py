"""``evaluate(policy, facts, state) -> (decision, state)``: the decision, exactly as
docs/semantics.md states it.

Pure and deterministic: no I/O, no clock (time is ``facts.now``), GPUs and
instances processed in id order so equal inputs give byte-identical JSON
whatever order the facts list them in. All outputs are rounded down to the
GPU's chunk; inputs are used as given, and every intermediate is exact (a
proportional share is a Fraction): rounding happens once, on the way out, so
it never compounds. Where the semantics leave a choice open, the choice is
documented in docs/semantics.md and marked "choice" here.

``prepare(policy)`` makes a policy ready to evaluate; whoever evaluates one policy
many times (the controller, on every change of the facts) prepares it once and
passes the ``PreparedPolicy``. ``evaluate`` also takes a plain Policy, and prepares
it for that one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kvpolicy.evaluate.conditions import Condition, compile_condition
from kvpolicy.evaluate.decision import Decision, RuleMemory, State
from kvpolicy.facts import Facts, GpuFacts, InstanceFacts
from kvpolicy.policy.model import Amount, Expr, Policy
from kvpolicy.policy.resolve import GpuSettings, ModelSettings, gpu_settings, model_settings

RESERVE_POOL = "reserve"
"""``reserved.by_pool`` key for model reserves standing in for unreported pools."""


# ---- preparation: what the facts do not change -------------------------------------------


@dataclass(frozen=True)
class PreparedRule:
    """A complete rule (``when`` and ``shrink`` set) as the evaluator reads it."""

    name: str
    line: int
    when: Expr
    shrink: str
    """``min``, ``target`` or ``amount``."""
    amount: Amount | None
    grace: float
    cooldown: float
    order: tuple[tuple[str, bool], ...]
    """(attribute, descending) for each ``order`` key: rules with equal orders share one sort."""


@dataclass
class PreparedPolicy:
    """A policy ready to evaluate.

    Holds the policy's complete rules as plain values, and keeps what the evaluator
    derives from the policy for a model name (its settings) or a GPU (its settings;
    for a capacity: bounds, pool limits, headroom, compiled conditions) the first
    time it needs it: the facts name the same few models and capacities evaluation
    after evaluation. Nothing here depends on the facts' figures, so keeping it
    never changes a result.
    """

    policy: Policy
    rules: tuple[PreparedRule, ...]
    _models: dict[str, ModelSettings] = field(default_factory=dict)
    _gpus: dict[tuple[str, str | None], GpuSettings] = field(default_factory=dict)
    _bounds: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    _pool_limits: dict[tuple[str, int], tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    _headroom: dict[tuple[str, str | None, int], int] = field(default_factory=dict)
    _conditions: dict[tuple[int, int], Condition] = field(default_factory=dict)

    def model(self, name: str) -> ModelSettings:
        settings = self._models.get(name)
        if settings is None:
            settings = self._models[name] = model_settings(self.policy, name)
        return settings

    def gpu(self, gpu_id: str, name: str | None = None) -> GpuSettings:
        settings = self._gpus.get((gpu_id, name))
        if settings is None:
            settings = self._gpus[(gpu_id, name)] = gpu_settings(self.policy, gpu_id, name)
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

    def pool_limits(self, model: ModelSettings, capacity: int) -> tuple[tuple[str, int, int], ...]:
        """(pool name, its policy max in bytes, the pool block's line) for the pools with a
        max, by name."""
        key = (model.name, capacity)
        limits = self._pool_limits.get(key)
        if limits is None:
            limits = self._pool_limits[key] = tuple(
                (name, block.max.resolve(capacity), block.span.line)
                for name, block in sorted(model.pools.items())
                if block.max is not None
            )
        return limits

    def headroom(self, gpu_id: str, capacity: int, name: str | None = None) -> int:
        key = (gpu_id, name, capacity)
        headroom = self._headroom.get(key)
        if headroom is None:
            headroom = self._headroom[key] = self.gpu(gpu_id, name).headroom_bytes(capacity)
        return headroom

    def condition(self, index: int, capacity: int) -> Condition:
        """Rule ``index``'s ``when``, compiled for a GPU of ``capacity`` (percentages resolved)."""
        key = (index, capacity)
        condition = self._conditions.get(key)
        if condition is None:
            condition = self._conditions[key] = compile_condition(self.rules[index].when, capacity)
        return condition


def prepare(policy: Policy) -> PreparedPolicy:
    """``policy`` ready to evaluate. Incomplete rules (no ``when`` or no ``shrink``) never
    load, as lint refuses them; a partial policy's are left out."""
    rules = tuple(
        PreparedRule(
            name=rule.name.value,
            line=rule.span.line,
            when=rule.when,
            shrink=rule.shrink_to.kind,
            amount=rule.shrink_to.amount,
            grace=rule.grace.seconds if rule.grace else 0.0,
            cooldown=rule.cooldown.seconds if rule.cooldown else 0.0,
            order=tuple((key.attribute.value, key.descending) for key in rule.order),
        )
        for rule in policy.rules
        if rule.when is not None and rule.shrink_to is not None
    )
    return PreparedPolicy(policy, rules)


# ---- working state of one evaluation ----------------------------------------------------


Exact = int | Fraction


@dataclass(eq=False, slots=True)
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
    actions: list[dict[str, object]] = field(default_factory=list)
    """Each an ``Action`` as plain data: the decision validates them with the rest."""


@dataclass(eq=False, slots=True)
class _Gpu:
    facts: GpuFacts
    capacity: int
    headroom: int
    chunk: int
    reserved_by_pool: dict[str, int]
    reserved: int
    budget: int
    """A, exact; the decision shows it rounded down to the chunk."""
    instances: list[_Inst]
    elastic: list[_Inst]
    """The instances with an elastic pool, in id order."""


def evaluate(
    policy: PreparedPolicy | Policy, facts: Facts, state: State | None = None
) -> tuple[Decision, State]:
    """The decision for ``facts`` under ``policy``, and the state to pass next time."""
    prepared = policy if isinstance(policy, PreparedPolicy) else prepare(policy)
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
    new_state = State(rules=dict(sorted(new_memory.items())))
    decision = _decision(prepared, facts, gpus, _rule_reports(prepared, new_state, facts.now))
    return decision, new_state


# ---- steps 1-2: budgets -----------------------------------------------------------------


def _gpus(prepared: PreparedPolicy, facts: Facts) -> list[_Gpu]:
    by_gpu: dict[str, list[InstanceFacts]] = {}
    for inst in facts.instances:
        by_gpu.setdefault(inst.gpu, []).append(inst)
    gpus: list[_Gpu] = []
    for gpu_facts in sorted(facts.gpus, key=lambda g: g.id):
        settings = prepared.gpu(gpu_facts.id, gpu_facts.name)
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
                    used=inst_facts.elastic.used if inst_facts.elastic is not None else 0,
                    min=minimum,
                    max=maximum,
                )
            )
        reserved = sum(reserved_by_pool.values())
        headroom = prepared.headroom(gpu_facts.id, capacity, gpu_facts.name)
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
                elastic=[i for i in members if i.elastic],
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
    "waiting": lambda i: _waiting(i.facts),
    "weight": lambda i: i.settings.weight,
    "target": lambda i: i.target,
    "min": lambda i: i.min,
    "max": lambda i: i.max,
    "engine": lambda i: i.facts.engine,
    "name": lambda i: i.facts.model,
}


def _ordered(instances: list[_Inst], order: tuple[tuple[str, bool], ...]) -> list[_Inst]:
    ordered = sorted(instances, key=lambda i: i.id)
    for attribute, descending in reversed(order):  # stable sorts, last key first
        ordered.sort(key=_ORDER_VALUES[attribute], reverse=descending)
    return ordered


def _rules(prepared: PreparedPolicy, gpu: _Gpu, now: float, state: State, memory: dict[str, dict[str, RuleMemory]]) -> None:
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
        name, grace, cooldown = rule.name, rule.grace, rule.cooldown
        remembered = state.rules.get(name, {})
        rule_memory = memory.setdefault(name, {})
        in_force: list[tuple[_Inst, float, float]] = []
        candidates: list[tuple[_Inst, float]] = []
        ordered = orders.get(rule.order) if not shrunk else None  # a shrink can move targets
        if ordered is None:
            ordered = orders[rule.order] = _ordered(elastic, rule.order)
        for inst in ordered:
            old = remembered.get(inst.id)
            since, cooldown_until = _holding_and_cooling(old, condition(reported[inst.id]), now, cooldown)
            if since is not None and old is not None and old.shrink_to is not None:
                in_force.append((inst, since, old.acting_since if old.acting_since is not None else now))
            elif since is not None and cooldown_until is None and now - since >= grace:
                candidates.append((inst, since))
            if since is not None or cooldown_until is not None:
                if old is not None and old.shrink_to is None and (old.holding_since, old.cooldown_until) == (since, cooldown_until):
                    rule_memory[inst.id] = old  # unchanged: frozen, so it can be shared
                else:
                    rule_memory[inst.id] = RuleMemory(holding_since=since, cooldown_until=cooldown_until)
        for inst, since, acting in in_force:  # shrinks in force count before anyone new is chosen
            value = _apply_shrink(prepared, rule, inst, gpu, used_now)
            rule_memory[inst.id] = RuleMemory(holding_since=since, shrink_to=value, acting_since=acting)
            shrunk = True
        for inst, since in candidates:
            if shrunk and not condition(_adjusted(reported[inst.id], inst, gpu, used_now)):
                continue  # the shrinks decided so far already made the condition false
            value = _apply_shrink(prepared, rule, inst, gpu, used_now)
            rule_memory[inst.id] = RuleMemory(holding_since=since, shrink_to=value, acting_since=now)
            shrunk = True
        if not rule_memory:
            del memory[name]


def _holding_and_cooling(old: RuleMemory | None, holds: bool, now: float, cooldown: float) -> tuple[float | None, float | None]:
    """A rule's clocks for one instance at ``now``: since when its condition has held (None: it
    does not hold now) and until when the rule cools down on it (None: it does not)."""
    since = None
    if holds:
        since = old.holding_since if old is not None and old.holding_since is not None else now
    cooldown_until = old.cooldown_until if old is not None else None
    if old is not None and old.shrink_to is not None and not holds:
        cooldown_until = now + cooldown  # the shrink ends: its cooldown starts
    if cooldown_until is not None and cooldown_until <= now:
        cooldown_until = None
    return since, cooldown_until


def _instance_figures(inst: _Inst) -> dict[str, object]:
    return {
        "model.used": inst.used,
        "model.idle": inst.facts.idle_seconds,
        "model.waiting": _waiting(inst.facts),
        "model.priority": inst.settings.priority,
        "model.weight": inst.settings.weight,
        "model.min": inst.min,
        "model.max": inst.max,
        "model.target": inst.target,
        "model.engine": inst.facts.engine,
        "model.name": inst.facts.model,
    }


def _waiting(facts: InstanceFacts) -> int:
    """Bytes its work waits for (``elastic.waiting``); 0 for an instance without an elastic pool."""
    return facts.elastic.waiting if facts.elastic is not None else 0


def _adjusted(figures: dict, inst: _Inst, gpu: _Gpu, used_now: dict[str, int]) -> dict:
    """The figures with the shrinks decided so far counted as lowering usage."""
    used = sum(used_now.values())
    return {**figures, "model.used": used_now[inst.id], "gpu.used": used, "gpu.free": gpu.budget - used}


def _apply_shrink(prepared: PreparedPolicy, rule: PreparedRule, inst: _Inst, gpu: _Gpu, used_now: dict[str, int]) -> int:
    """Lower the instance's limit to the rule's value (never below its guarantee)."""
    value: Exact
    if rule.shrink == "min":
        value = inst.min
    elif rule.shrink == "target":
        value = inst.target
    else:
        assert rule.amount is not None  # a shrink to an amount has one
        value = rule.amount.resolve(gpu.capacity)
    value = max(inst.guarantee, max(0, value))
    if value < inst.limit:
        inst.limit, inst.limit_bound = value, "rule"
    # choice: targets are not redistributed by rules, but never exceed the limit
    inst.target = min(inst.target, _out(inst.limit, gpu.chunk))
    shown = _out(value, gpu.chunk)
    inst.actions.append({"rule": rule.name, "file": prepared.policy.file, "line": rule.line, "shrink_to": shown})
    used_now[inst.id] = min(used_now[inst.id], math.floor(value))
    return shown


def _rule_reports(prepared: PreparedPolicy, state: State, now: float) -> list[dict[str, object]]:
    """Every complete rule, in policy order, with where it stands on each instance it remembers."""
    reports: list[dict[str, object]] = []
    for rule in prepared.rules:
        on: list[dict[str, object]] = []
        for instance, memory in sorted(state.rules.get(rule.name, {}).items()):
            on.append(_rule_on(instance, memory, rule, now))
        reports.append({
            "rule": rule.name, "file": prepared.policy.file, "line": rule.line,
            "grace": rule.grace, "cooldown": rule.cooldown, "instances": on,
        })
    return reports


def _rule_on(instance: str, memory: RuleMemory, rule: PreparedRule, now: float) -> dict[str, object]:
    if memory.shrink_to is not None:
        return {"instance": instance, "state": "acting", "since": memory.acting_since, "until": None,
                "shrink_to": memory.shrink_to}
    if memory.cooldown_until is not None:
        return {"instance": instance, "state": "cooling_down", "since": None, "until": memory.cooldown_until,
                "shrink_to": None}
    since = memory.holding_since
    until = since + rule.grace if since is not None and now - since < rule.grace else None
    return {"instance": instance, "state": "waiting" if until is not None else "not_needed", "since": since,
            "until": until, "shrink_to": None}


# ---- step 7 and the decision ------------------------------------------------------------------


def _out(value: Exact, chunk: int) -> int:
    """An output figure: rounded down to the chunk, never negative."""
    whole = value if type(value) is int else math.floor(value)
    return whole - whole % chunk if whole > 0 else 0


def _violations(prepared: PreparedPolicy, inst: _Inst, capacity: int, file: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    settings = inst.settings
    pools = inst.facts.pools
    for name, limit, line in prepared.pool_limits(settings, capacity):
        pool = pools.get(name)
        if pool is not None and pool.owner == "runtime" and pool.bytes > limit:
            found.append({"kind": "pool_over_max", "pool": name, "bytes": pool.bytes, "max": limit, "file": file, "line": line})
    block = settings.block
    if settings.reserve is not None and block is not None and block.reserve is not None:
        total = inst.facts.runtime_bytes
        if total > settings.reserve:
            found.append({
                "kind": "reserve_exceeded", "pool": None, "bytes": total, "max": settings.reserve,
                "file": file, "line": block.reserve.span.line,
            })
    return found


def _decision(prepared: PreparedPolicy, facts: Facts, gpus: list[_Gpu], rules: list[dict[str, object]]) -> Decision:
    """The decision as plain data, validated into the pydantic boundary type at once
    (one validation of the whole, not one per record)."""
    policy = prepared.policy
    file = policy.file
    gpu_out: list[dict[str, object]] = []
    inst_out: list[dict[str, Any]] = []  # Decision validates them
    for gpu in gpus:
        chunk = gpu.chunk
        used = sum(i.used for i in gpu.elastic)
        gpu_out.append({
            "id": gpu.facts.id, "name": gpu.facts.name, "capacity": gpu.capacity, "headroom": gpu.headroom, "other_used": gpu.facts.other_used,
            "reserved": {"total": gpu.reserved, "by_pool": gpu.reserved_by_pool},
            "elastic_budget": _out(gpu.budget, chunk), "free": _out(gpu.budget - used, chunk), "used": used,
            "chunk": chunk, "guaranteed": sum(_out(i.guarantee, chunk) for i in gpu.elastic),
        })
        for inst in gpu.instances:
            settings = inst.settings
            inst_out.append({
                "id": inst.id, "model": inst.facts.model, "policy_model": settings.pattern, "engine": inst.facts.engine,
                "gpu": gpu.facts.id, "guarantee": _out(inst.guarantee, chunk), "limit": _out(inst.limit, chunk),
                "target": inst.target, "shortfall": inst.guarantee < inst.min, "elastic": inst.elastic,
                "actions": inst.actions, "violations": _violations(prepared, inst, gpu.capacity, file),
                "reasons": {
                    "guarantee": inst.guarantee_reason, "limit": inst.limit_bound, "priority_level": inst.level,
                    "min": inst.min, "max": inst.max, "weight": settings.weight,
                    "engine_group": inst.facts.engine_group, "tensor_parallel_size": inst.tp_size,
                },
            })
    inst_out.sort(key=lambda d: d["id"])
    return Decision.model_validate({
        "policy": {"file": policy.file, "sha256": policy.sha256},
        "now": facts.now,
        "gpus": gpu_out,
        "instances": inst_out,
        "rules": rules,
    })
