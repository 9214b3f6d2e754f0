"""What ``kvpolicy status`` and ``kvpolicy top`` show: the controller's status file
refreshed with the live ledger, and its rendering as tables and bars."""

from __future__ import annotations

import time

from kvpolicy.evaluate.explain import rule_state_text
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.status import STALE_AFTER, InstanceStatus, Status, live_status, read_status
from kvpolicy import gpu_bar
from kvpolicy.facts import runtime_pool_bytes
from kvpolicy.terminal import PLAIN, Style
from kvpolicy.units import format_bytes

BAR_WIDTH = 64
SCREEN_WIDTH = 80
"""``top`` fits a terminal of 80 columns."""


def current_status(ledger: LedgerDir, stale_after: float = STALE_AFTER, stuck_after: float = 60.0) -> Status:
    """The controller's last status with GPUs and instances read live from the ledger.

    While the controller only observes, the limits it decided (not published) are kept.
    """
    base = read_status(ledger.path)
    status = live_status(ledger.read(), base, stuck_after=stuck_after, stale_after=stale_after)
    if status.controller is not None:
        status.controller.running = ledger.controller_running()
    if base is not None and base.controller is not None and base.controller.observe:
        decided = {i.id: i for i in base.instances}
        for inst in status.instances:
            mine = decided.get(inst.id)
            if mine is not None:
                inst.limit, inst.target, inst.guarantee = mine.limit, mine.target, mine.guarantee
        status.gpus = base.gpus or status.gpus
    return status


def problems(status: Status) -> list[str]:
    """What an operator must look at: a stale controller, a rejected policy, stuck deferrals, a GPU
    whose segment cannot be used."""
    found = []
    if status.controller is None:
        found.append("no controller has written a status here")
    elif status.controller.stopped_at is not None:
        found.append(f"controller pid {status.controller.pid} stopped {_ago(status.controller.stopped_at)}: "
                     "nothing enforces the policy (engines keep their last limits)")
    elif status.controller.running is False:
        found.append(f"controller pid {status.controller.pid} is not running: it ended without a clean stop "
                     f"(last heartbeat {_ago(status.controller.heartbeat_at)}); engines keep their last limits")
    elif status.controller.stale:
        found.append(f"controller pid {status.controller.pid} is stale (last heartbeat {_ago(status.controller.heartbeat_at)})")
    if status.last_reload is not None and not status.last_reload.ok:
        found.append("the last policy reload failed: the previous policy stays in force")
    found += [f"{i.id}: deferral stuck since {_ago(i.deferred_since)}" for i in status.instances if i.stuck]
    found += [f"{gpu}: its ledger segment cannot be used, so engines on it get no new limits: {why}"
              for gpu, why in status.refused_segments.items()]
    return found


FULL_TABLE_WIDTH = 116
"""The instance table with every column; ``top`` on a narrower screen drops the engine,
mapped bytes and revisions (``status`` always shows them)."""


def render_status(status: Status, width: int | None = None) -> str:
    """The status as text; with ``width`` below the full table's, the instance table in
    fewer columns, each line at most ``width`` (80 or more) characters but for long names."""
    lines = []
    if status.policy is not None:
        p = status.policy
        lines.append(f"policy {p.file}  revision {p.revision}  sha256 {p.sha256[:12]}  loaded {_ago(p.loaded_at)}")
    else:
        lines.append("policy: none loaded")
    if status.last_reload is not None:
        r = status.last_reload
        if r.ok:
            lines.append(f"last reload: ok {_ago(r.at)}")
        else:
            e = r.error
            where = "" if e is None else f"{e.file}:{e.line}:{e.col}: {e.code} " if e.line else f"{e.file}: " if e.file else ""
            lines.append(f"last reload: FAILED {_ago(r.at)}: {where}{e.message if e else ''}")
            if e is not None and e.hint:
                lines.append(f"  hint: {e.hint}")
    if status.controller is not None:
        c = status.controller
        mode = ", observing (not publishing)" if c.observe else ""
        if c.stopped_at is not None:
            lines.append(f"controller: pid {c.pid}, stopped {_ago(c.stopped_at)} (a clean stop){mode}")
        else:
            state = "NOT RUNNING" if c.running is False else "STALE" if c.stale else "ok"
            lines.append(f"controller: pid {c.pid}, heartbeat {_ago(c.heartbeat_at)} ({state}){mode}")
    lines.append("")
    labels = gpu_labels(status)
    lines.append(f"{'GPU':<10}{'capacity':>12}{'reserved':>12}{'budget':>12}{'free':>12}  figures")
    for g in status.gpus:
        uuid = g.id if width is None and labels[g.id] != g.id else ""  # status names the UUID; top has no room
        lines.append(
            f"{labels[g.id]:<10}{_b(g.capacity):>12}{_b(g.reserved.total):>12}{_b(g.elastic_budget):>12}{_b(g.free):>12}"
            f"  {g.figures:<13}{uuid}".rstrip()
        )
    lines.append("")
    if width is not None and width < FULL_TABLE_WIDTH:
        lines += _compact_instances(status, labels)
    else:
        lines += _instances(status, labels)
    if status.rules:
        lines.append("")
        lines += _rules(status)
    for problem in status.problems:
        lines.append(f"note: {problem}")
    return "\n".join(lines) + "\n"


def engine_groups(instances: list[InstanceStatus]) -> list[tuple[str, list[InstanceStatus]]]:
    """Instances by engine (ranks sharing an engine id, in rank order), engines in the order first seen."""
    groups: dict[str, list[InstanceStatus]] = {}
    for i in instances:
        groups.setdefault(i.engine_id or i.id, []).append(i)
    return [(key, sorted(ranks, key=lambda i: i.rank)) for key, ranks in groups.items()]


def _rows(status: Status) -> list[tuple[str | None, str, InstanceStatus | None]]:
    """(engine header or None, the id as shown, the instance): an engine of several ranks gets a
    header line and its ranks indented under it; a one-rank engine is one line, as it always was."""
    rows: list[tuple[str | None, str, InstanceStatus | None]] = []
    for key, ranks in engine_groups(status.instances):
        if len(ranks) == 1:
            rows.append((None, ranks[0].id, ranks[0]))
            continue
        gpus = ", ".join(dict.fromkeys(i.gpu for i in ranks))
        total = sum(runtime_pool_bytes(i.pools.values()) for i in ranks)
        rows.append((f"engine {key}: {len(ranks)} ranks on {gpus}, runtime pools {_b(total)}", "", None))
        rows += [(None, f"  {i.id}", i) for i in ranks]
    return rows


def gpu_labels(status: Status) -> dict[str, str]:
    """How the tables name each GPU: its display name (``cuda:N``) where the controller gave one, else its id."""
    labels = {g.id: g.name or g.id for g in status.gpus}
    for i in status.instances:
        labels.setdefault(i.gpu, i.gpu)
    return labels


def _compact_instances(status: Status, labels: dict[str, str]) -> list[str]:
    lines = [f"{'INSTANCE':<20}{'GPU':<8}{'POOLS':>10}{'USED':>11}{'LIMIT':>11}{'TARGET':>11}  STATE"]
    for header, shown, i in _rows(status):
        if i is None:
            lines.append(header or "")
            continue
        used = _b(i.elastic.used) if i.elastic else "-"
        state = (i.ack or "-") + (" STUCK" if i.stuck else "")
        lines.append(f"{shown:<20}{labels[i.gpu]:<8}{_b(runtime_pool_bytes(i.pools.values())):>10}{used:>11}{_b(i.limit):>11}{_b(i.target):>11}  {state}")
    return lines


def _instances(status: Status, labels: dict[str, str]) -> list[str]:
    lines = [f"{'INSTANCE':<22}{'ENGINE':<8}{'GPU':<8}{'RUNTIME POOLS':>15}{'USED':>11}{'MAPPED':>11}"
             f"{'LIMIT':>11}{'TARGET':>11}{'REV':>5}{'ACK':>5}  STATE"]
    for header, shown, i in _rows(status):
        if i is None:
            lines.append(header or "")
            continue
        used = _b(i.elastic.used) if i.elastic else "-"
        mapped = _b(i.elastic.mapped) if i.elastic else "-"
        state = (i.ack or "-") + (" STUCK" if i.stuck else "")
        lines.append(
            f"{shown:<22}{i.engine:<8}{labels[i.gpu]:<8}{_b(runtime_pool_bytes(i.pools.values())):>15}{used:>11}{mapped:>11}{_b(i.limit):>11}"
            f"{_b(i.target):>11}{i.revision:>5}{i.acked_revision:>5}  {state}"
        )
    return lines


def _rules(status: Status) -> list[str]:
    """Each rule on each instance it touches: what it does and since when (as of the
    controller's last evaluation)."""
    now = time.time()
    lines = [f"{'RULE':<20}{'INSTANCE':<20}STATE"]
    for rule in status.rules:
        if not rule.instances:
            lines.append(f"{rule.rule:<20}{'-':<20}idle")
        for on in rule.instances:
            lines.append(f"{rule.rule:<20}{on.instance:<20}{rule_state_text(on, now)}")
    return lines


def render_bars(status: Status, style: Style = PLAIN, width: int = SCREEN_WIDTH) -> str:
    """Per GPU: a bar (headroom, other use, each reserved pool, elastic in use, free) and its
    legend, in the marks ``explain`` uses. Every line fits ``width`` columns; all bars have
    one width, which depends on the screen, never on the figures."""
    lines = []
    known = [g for g in status.gpus if g.capacity]
    capacity_width = max((len(_b(g.capacity)) for g in known), default=0)
    bar_width = max(10, min(BAR_WIDTH, width - len(f"{'':<8} [] ") - capacity_width))
    labels = gpu_labels(status)
    for g in status.gpus:
        if not g.capacity:
            lines.append(f"{labels[g.id]}: capacity unknown")
            continue
        used = sum(i.elastic.used for i in status.instances if i.gpu == g.id and i.elastic)
        parts = gpu_bar.segments(
            headroom=g.headroom or 0, other_used=g.other_used or 0, pools=g.reserved.by_pool, used=used, free=g.free
        )
        lines.append(f"{labels[g.id]:<8} [{gpu_bar.render_bar(parts, g.capacity, bar_width, style)}] {_b(g.capacity)}")
        lines += gpu_bar.wrap(gpu_bar.legend(parts, sizes=True, style=style), width, indent=" " * 9)
    return "\n".join(lines) + "\n"


def _b(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _ago(t: float | None) -> str:
    if not t:
        return "never"
    seconds = time.time() - t
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"
