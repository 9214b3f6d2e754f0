"""Figures derived from one mode's records: reload latency, reclaim times, the budget check.

Pure functions over the JSON the tenants and the driver wrote (no processes, no GPU),
so ``--combine`` can recompute them from fetched files.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def reload_metrics(reload: dict[str, Any], decisions: list[dict[str, Any]], tenants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """From the save to the controller's publish of the edited policy, and to every tenant acting on it.

    ``acked``: the tenant's pool read the new revision and acknowledged it (applied or
    deferred) — the new limits are in force. ``applied``: its pool holds no more than the
    new limit (a deferral completed): the memory has moved.
    """
    saved = reload["saved_at"]
    sha = reload["sha256"][:12]
    published = next((d for d in decisions if d.get("published") and d.get("policy_sha256") == sha), None)
    out: dict[str, Any] = {"saved_at": saved, "policy_sha256": sha}
    if published is None:
        out["error"] = "the controller never published the edited policy"
        return out
    revision = published["revision"]
    out["revision"] = revision
    out["publish_ms"] = round((published["at"] - saved) * 1000, 1)  # the log's clock has ms resolution
    acked: dict[str, float | None] = {}
    applied: dict[str, float | None] = {}
    for name, t in tenants.items():
        seen = [r for r in t.get("revisions", []) if r["revision"] >= revision]
        acked[name] = round((seen[0]["at"] - saved) * 1000, 1) if seen else None
        done = [r for r in seen if not r["deferred"]]
        applied[name] = round((done[0]["at"] - saved) * 1000, 1) if done else None
    out["acked_ms"] = acked
    out["applied_ms"] = applied
    out["reload_to_acked_ms"] = None if None in acked.values() else max(acked.values())
    out["reload_to_applied_ms"] = None if None in applied.values() else max(applied.values())
    return out


def _columns(tenant: dict[str, Any]) -> dict[str, int]:
    return {name: i for i, name in enumerate(tenant["samples"]["columns"])}


def reclaim_transitions(tenant: dict[str, Any], below: int, guarantee: int, grace: float) -> dict[str, Any]:
    """Each time the tenant's use fell below the idle rule's threshold: how long until its memory was back to its guarantee.

    Start: the first sample with ``used < below`` after one with ``used ≥ below`` (the rule's
    condition starts to hold). End: the first later sample with ``held ≤ guarantee + one
    growth step`` (the memory above its guarantee is unmapped and back in the GPU's
    elastic budget, where another tenant's admission can take it). An episode whose use
    rose above the threshold again first is ``interrupted``. Goal: grace + 1 s.
    """
    col = _columns(tenant)
    rows = tenant["samples"]["rows"]
    group = tenant["pool"]["group_bytes"]
    episodes: list[dict[str, Any]] = []
    interrupted = 0
    start: float | None = None
    above = False
    for row in rows:
        t, held, used = row[col["t"]], row[col["held"]], row[col["used"]]
        if used >= below:
            if start is not None:
                interrupted += 1
            start, above = None, True
            continue
        if above:  # fell below the threshold
            above, start = False, t
        if start is not None and held <= guarantee + group:
            episodes.append({"tenant": tenant["name"], "idle_at": start, "reclaimed_at": t, "seconds": round(t - start, 3)})
            start = None
    limit = grace + 1.0
    return {
        "episodes": episodes,
        "interrupted": interrupted,
        "unfinished_at_end": start is not None,
        "goal_seconds": limit,
        "max_seconds": max((e["seconds"] for e in episodes), default=None),
        "within_goal": sum(e["seconds"] <= limit for e in episodes),
    }


def budget_check(samples: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Over the driver's ledger samples: Σ elastic mapped (and pending) never above the budget."""
    worst = max((s["elastic_committed"] for s in samples), default=0)
    over = [s for s in samples if s["elastic_committed"] > budget]
    return {"samples": len(samples), "budget": budget, "max_committed": worst, "over_budget": len(over)}


def drain_after_edit(tenant: dict[str, Any], at_s: float, tolerance: int) -> dict[str, Any] | None:
    """After the policy edit at trace time ``at_s``: how long a tenant left above its new target took to drain to it.

    A tenant is *above* when, within 1 s of the edit (the pool reads the new revision in
    milliseconds), a sample holds more than its target plus ``tolerance`` (the reserve a
    pool keeps beyond its use, and one growth step). It has *drained* at the first later
    sample within its target plus ``tolerance``. None: the edit left it within its target.
    ``seconds`` None: it held more than its target until the run ended — the edit's
    targets were not honoured, whatever the tokens say.
    """
    col = _columns(tenant)
    t_, held_, target_ = col["t"], col["held"], col["target"]
    rows = [r for r in tenant["samples"]["rows"] if r[t_] >= at_s]
    start = next((r for r in rows if r[t_] <= at_s + 1.0 and r[held_] > r[target_] + tolerance), None)
    if start is None:
        return None
    done = next((r for r in rows if r[t_] > start[t_] and r[held_] <= r[target_] + tolerance), None)
    return {
        "held": start[held_],
        "target": start[target_],
        "seconds": None if done is None else round(done[t_] - at_s, 3),
    }


def drain_tolerance(pool: dict[str, Any], reserve_blocks: int) -> int:
    """What a kvpolicy pool at its target may hold beyond it: the reserve it keeps past its use
    (in whole growth steps, as ``BlockPool`` rounds it) and one growth step."""
    group = pool["group_bytes"]
    return -(-reserve_blocks * pool["block_bytes"] // group) * group + group


def drains_after_edit(tenants: dict[str, dict[str, Any]], at_s: float, reserve_blocks: int) -> dict[str, dict[str, Any]]:
    """``drain_after_edit`` for every tenant the edit left above its target (each with its pool's tolerance)."""
    out = {n: drain_after_edit(t, at_s, drain_tolerance(t["pool"], reserve_blocks)) for n, t in tenants.items()}
    return {n: d for n, d in out.items() if d is not None}


def mean_and_spread(values: list[float | None]) -> dict[str, Any]:
    """Over the values given (None: not measured, left out): their mean, its standard error, one value's standard
    deviation, and how many there were; None where too few to say."""
    xs = [v for v in values if v is not None]
    sd = statistics.stdev(xs) if len(xs) > 1 else None
    return {"mean": statistics.fmean(xs) if xs else None, "se": None if sd is None else sd / math.sqrt(len(xs)),
            "sd": sd, "n": len(xs)}
