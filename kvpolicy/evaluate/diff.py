"""Two decisions on the same facts side by side: what a policy change would do
(``kvpolicy diff OLD NEW``, schema 1, docs/json.md).

Both policies are evaluated on the same facts and rule state, so every difference is the
policy's. Per instance: its guarantee, limit and target, old and new, and the rules acting
on it; per GPU its elastic budget. ``changed`` marks what moved.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvpolicy.evaluate.decision import Decision, PolicyRef
from kvpolicy.units import format_bytes

DIFF_SCHEMA: Final = 1


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)


class Bytes(_Out):
    """One figure under the old and the new policy, in bytes."""

    old: int
    new: int

    @property
    def changed(self) -> bool:
        return self.old != self.new


class Rules(_Out):
    """The rules acting on an instance under each policy."""

    old: tuple[str, ...]
    new: tuple[str, ...]


class InstanceDiff(_Out):
    id: str
    model: str
    gpu: str
    guarantee: Bytes
    limit: Bytes
    target: Bytes
    rules: Rules
    changed: bool
    """True when the guarantee, limit or target differ."""


class GpuDiff(_Out):
    id: str
    elastic_budget: Bytes
    changed: bool


class PolicyDiff(_Out):
    """``kvpolicy diff --format json``."""

    schema_: Literal[1] = Field(default=DIFF_SCHEMA, alias="schema")
    old: PolicyRef
    new: PolicyRef
    facts: str
    """Where the facts came from: a file, or the live ledger."""
    now: float
    gpus: tuple[GpuDiff, ...]
    instances: tuple[InstanceDiff, ...]
    changed: int
    """How many instances and GPUs have a figure that differs: 0 when the change moves nothing."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, use_attribute_docstrings=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def diff_decisions(old: Decision, new: Decision, facts: str) -> PolicyDiff:
    """``old`` and ``new``, decided on the same facts (so for the same instances and GPUs)."""
    new_instances = {i.id: i for i in new.instances}
    instances = []
    for a in old.instances:
        b = new_instances[a.id]
        figures = {name: Bytes(old=getattr(a, name), new=getattr(b, name)) for name in ("guarantee", "limit", "target")}
        instances.append(InstanceDiff(
            id=a.id, model=a.model, gpu=a.gpu, **figures,
            rules=Rules(old=tuple(x.rule for x in a.actions), new=tuple(x.rule for x in b.actions)),
            changed=any(f.changed for f in figures.values()),
        ))
    new_gpus = {g.id: g for g in new.gpus}
    gpus = []
    for gpu in old.gpus:
        budget = Bytes(old=gpu.elastic_budget, new=new_gpus[gpu.id].elastic_budget)
        gpus.append(GpuDiff(id=gpu.id, elastic_budget=budget, changed=budget.changed))
    changed = sum(i.changed for i in instances) + sum(g.changed for g in gpus)
    return PolicyDiff(old=old.policy, new=new.policy, facts=facts, now=old.now, gpus=tuple(gpus),
                      instances=tuple(instances), changed=changed)


def render_diff(diff: PolicyDiff) -> str:
    """The diff for people: ``*`` marks a line whose figures differ, ``old -> new`` each figure that moved."""
    out = [
        f"old {diff.old.file} (sha256 {diff.old.sha256[:12]}) -> new {diff.new.file} (sha256 {diff.new.sha256[:12]})",
        f"facts {diff.facts} (now {diff.now:.1f})",
        "",
        f"  {'GPU':<20}ELASTIC BUDGET",
    ]
    for g in diff.gpus:
        out.append(f"{'*' if g.changed else ' '} {g.id:<20}{_pair(g.elastic_budget)}")
    out += ["", f"  {'INSTANCE':<20}{'GUARANTEE':<22}{'LIMIT':<22}{'TARGET':<22}RULES"]
    for i in diff.instances:
        rules = _rules(i.rules)
        out.append(f"{'*' if i.changed else ' '} {i.id:<20}{_pair(i.guarantee):<22}{_pair(i.limit):<22}"
                   f"{_pair(i.target):<22}{rules}".rstrip())
    out.append("")
    out.append(f"{diff.changed} change(s)" if diff.changed else "no changes: the new policy decides the same")
    return "\n".join(out) + "\n"


def _pair(figure: Bytes) -> str:
    if not figure.changed:
        return format_bytes(figure.old)
    return f"{format_bytes(figure.old)} -> {format_bytes(figure.new)}"


def _rules(rules: Rules) -> str:
    old, new = ", ".join(rules.old), ", ".join(rules.new)
    if old == new:
        return old
    return f"{old or '(none)'} -> {new or '(none)'}"
