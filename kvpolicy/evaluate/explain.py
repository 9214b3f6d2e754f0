"""The decision as people read it: per GPU a stacked view of its capacity, per
instance each number with the reason it is what it is."""

from __future__ import annotations

from kvpolicy import gpu_bar
from kvpolicy.evaluate.decision import Decision, GpuDecision, InstanceDecision, RuleOnInstance, RuleReport
from kvpolicy.policy.model import Policy
from kvpolicy.policy.resolve import ModelSettings, gpu_settings, model_settings
from kvpolicy.terminal import PLAIN, Style
from kvpolicy.units import format_bytes

BAR_WIDTH = 64
LABEL = 28
"""Width of the figure names (``reserved compressor_state`` fits)."""
LEGEND_WIDTH = 80


def render_explain(policy: Policy, decision: Decision, facts_source: str, style: Style = PLAIN) -> str:
    """The decision for people; ``style`` colours the bars (kvpolicy.terminal)."""
    out = [
        f"policy {decision.policy.file} (sha256 {decision.policy.sha256[:12]}), "
        f"facts {facts_source} (now {decision.now:.1f})",
    ]
    instances_by_gpu: dict[str, list[InstanceDecision]] = {}
    for inst in decision.instances:
        instances_by_gpu.setdefault(inst.gpu, []).append(inst)
    for gpu in decision.gpus:
        out.append("")
        out.extend(_gpu_section(policy, gpu, style))
        for inst in instances_by_gpu.get(gpu.id, ()):
            out.append("")
            out.extend(_instance_section(policy, gpu, inst))
    if not decision.gpus:
        out.append("")
        out.append("no GPUs in the facts: nothing to decide")
    out.append("")
    out.extend(render_rules(decision.rules, decision.now))
    return "\n".join(out) + "\n"


RULE_STATES = {
    "waiting": "waiting out grace",
    "acting": "acting",
    "cooling_down": "cooling down",
    "not_needed": "holds, not needed",
}
"""How each rule state reads, in ``explain``, ``status`` and ``top``."""


def render_rules(rules: tuple[RuleReport, ...], now: float) -> list[str]:
    """Every rule with where it stands on each instance; times relative to ``now``."""
    if not rules:
        return ["rules: none"]
    lines = ["rules"]
    for rule in rules:
        head = f'  rule "{rule.rule}" ({rule.file}:{rule.line}): grace {rule.grace:g}s, cooldown {rule.cooldown:g}s'
        if not rule.instances:
            lines.append(head + "; idle (its condition holds on no instance)")
            continue
        lines.append(head)
        lines.extend(f"    {on.instance:<22}{rule_state_text(on, now)}" for on in rule.instances)
    return lines


def rule_state_text(on: RuleOnInstance, now: float) -> str:
    """One rule's state on one instance, short enough for ``top``: ``acting for 12.0s, shrink to 4 GiB``."""
    name = RULE_STATES[on.state]
    if on.state == "acting":
        since = f" for {_seconds(now - on.since)}" if on.since is not None else ""
        return f"{name}{since}, shrink to {format_bytes(on.shrink_to or 0)}"
    if on.state == "waiting":
        return f"{name}: acts in {_seconds((on.until or now) - now)}"
    if on.state == "cooling_down":
        return f"{name}: may act in {_seconds((on.until or now) - now)}"
    return f"{name} (earlier shrinks suffice)"


def _seconds(value: float) -> str:
    return f"{max(0.0, value):.1f}s"


def _gpu_section(policy: Policy, gpu: GpuDecision, style: Style) -> list[str]:
    settings = gpu_settings(policy, gpu.id, gpu.name)
    capacity_from = f"policy line {settings.capacity_line}" if settings.capacity is not None else "facts"
    headroom_from = f"policy line {settings.headroom_line}" if settings.headroom_line else "default (none)"
    parts = gpu_bar.segments(
        headroom=gpu.headroom, other_used=gpu.other_used, pools=gpu.reserved.by_pool, used=gpu.used, free=gpu.free
    )
    lines = [
        f"GPU {gpu.id}: capacity {format_bytes(gpu.capacity)} ({capacity_from}), chunk {format_bytes(gpu.chunk)}",
        "  [" + gpu_bar.render_bar(parts, gpu.capacity, BAR_WIDTH, style) + "]",
        f"  {'headroom':<{LABEL}}{format_bytes(gpu.headroom):>12}   {headroom_from}",
        f"  {'other use':<{LABEL}}{format_bytes(gpu.other_used):>12}   memory no instance accounts for",
    ]
    for name, size in gpu.reserved.by_pool.items():
        why = "model reserves of instances that have not reported their pools" if name == "reserve" else "runtime-owned, as reported"
        lines.append(f"  {'reserved ' + name:<{LABEL}}{format_bytes(size):>12}   {why}")
    lines += [
        f"  {'elastic budget':<{LABEL}}{format_bytes(gpu.elastic_budget):>12}   "
        f"capacity - headroom - other use - reserved, rounded down to {format_bytes(gpu.chunk)}",
        f"  {'  guaranteed':<{LABEL}}{format_bytes(gpu.guaranteed):>12}",
        f"  {'  in use':<{LABEL}}{format_bytes(gpu.used):>12}",
        f"  {'  free':<{LABEL}}{format_bytes(gpu.free):>12}   budget - in use",
    ]
    entries = gpu_bar.legend(parts, sizes=False, style=style, all_kinds=True)
    lines += gpu_bar.wrap(entries, LEGEND_WIDTH, indent=" " * len("  legend: "), first="  legend: ")
    return lines


def _instance_section(policy: Policy, gpu: GpuDecision, inst: InstanceDecision) -> list[str]:
    settings = model_settings(policy, inst.model)
    binding = (
        f'policy model "{inst.policy_model}" (line {settings.line})'
        if inst.policy_model is not None
        else "no model block matches: defaults"
    )
    kind = "elastic" if inst.elastic else "runtime-owned pools only"
    lines = [f"  {inst.id}: model {inst.model} -> {binding}; engine {inst.engine}; {kind}"]
    r = inst.reasons
    if inst.elastic:
        lines.append(f"    {'guarantee':<10}{format_bytes(inst.guarantee):>12}   {_guarantee_reason(inst, settings)}")
        lines.append(f"    {'limit':<10}{format_bytes(inst.limit):>12}   {_limit_reason(inst, settings, gpu)}")
        lines.append(
            f"    {'target':<10}{format_bytes(inst.target):>12}   guarantee + fair share of the spare "
            f"by weight {r.weight}, at most the limit"
        )
    else:
        lines.append("    guarantee, limit, target 0: it holds no elastic memory; its pools count as reserved")
    for action in inst.actions:
        lines.append(
            f"    {'action':<10}{format_bytes(action.shrink_to):>12}   shrunk by rule \"{action.rule}\" "
            f"({action.file}:{action.line})"
        )
    for v in inst.violations:
        what = f"pool {v.pool} holds" if v.kind == "pool_over_max" else "runtime-owned pools hold"
        limit_name = "its max" if v.kind == "pool_over_max" else "the model's reserve"
        lines.append(
            f"    {'VIOLATION':<10}{format_bytes(v.bytes):>12}   {v.kind}: {what} {format_bytes(v.bytes)} > "
            f"{limit_name} {format_bytes(v.max)} ({v.file}:{v.line})"
        )
    if inst.shortfall:
        lines.append(f"    {'SHORTFALL':<10}{format_bytes(r.min - inst.guarantee):>12}   its min {format_bytes(r.min)} is not guaranteed")
    return lines


def _guarantee_reason(inst: InstanceDecision, settings: ModelSettings) -> str:
    r = inst.reasons
    level = f"priority {settings.priority}, level {r.priority_level + 1}"
    return {
        "min": f"its min ({level})" if r.min else "no min",
        "shared": f"its share of what remained, in proportion to min ({level}: the mins did not all fit)",
        "lower_priority": f"0: higher priorities took the budget ({level})",
        "tensor_parallel": f"capped at its tensor-parallel group's limit ({r.tensor_parallel_size} ranks)",
        "not_elastic": "no elastic pool",
    }[r.guarantee]


def _limit_reason(inst: InstanceDecision, settings: ModelSettings, gpu: GpuDecision) -> str:
    r = inst.reasons
    if r.limit == "max":
        where = f" (line {settings.block.max.span.line})" if settings.block and settings.block.max else " (default 100%)"
        return f"its max {settings.max.text}{where}"
    if r.limit == "budget":
        return "the elastic budget minus the others' guarantees"
    if r.limit == "tensor_parallel":
        return f"the smallest limit of its tensor-parallel group ({r.engine_group}, {r.tensor_parallel_size} ranks)"
    if r.limit == "rule":
        return "lowered by a rule (below)"
    return "no elastic pool"
