"""``--combine``: both modes' records → ``results.json``, ``memory.png`` and the README's results section.

Runs anywhere (no GPU): it reads ``static.json`` and ``kvpolicy.json`` as the device
run wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from analysis import drains_after_edit
from latency import attainment, percentile
from params import Trace
from traces import busy_windows

GiB = 1 << 30
README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
TENANT_FIELDS = ("tokens", "arrived", "completed", "abandoned", "queued", "preempted", "running_at_end",
                 "waiting_at_end", "step_ms_p50", "step_ms_p99", "oom", "corrupted", "checked", "refusals")


DRIVER_WORK = ("groups_mapped", "groups_unmapped", "regrowths", "groups_mapped_at_start", "arenas")
LATENCY_FIELDS = ("ttft_ms_p50", "ttft_ms_p99", "ttft_s", "slo")
STEP_FIELDS = ("interval_ms_p50", "interval_ms_p99", "step_ms_p99_within_bound", "steps_within_bound", "kv_bytes_bound",
               "groups_grown_between", "phase_seconds", "check_between_steps", "step_ms_p99_with_check", "tail")
"""Where the step time goes: step start to step start (what a running request waits per token, the
work between steps included), the step p99 over the steps that attended no more KV than a static
share, the growth mapped between steps, the phases' seconds, the step p99 with the finished requests'
KV check counted in (where it runs after the step), and what the slowest 1% of steps spent their time
on (``engine.Engine._tail``). None: a run from before they were measured."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def driver_work_per_1k(t: dict[str, Any]) -> tuple[float, float] | None:
    """Chunks mapped and unmapped per 1,000 tokens served, after start-up (the static share or the
    guarantee mapped before the trace is not per-token work). None: not counted, or no tokens."""
    if t.get("groups_mapped") is None or t.get("groups_mapped_at_start") is None or not t["tokens"]:
        return None
    per = 1000 * (t.get("arenas") or 1) / t["tokens"]
    return (t["groups_mapped"] - t["groups_mapped_at_start"]) * per, t["groups_unmapped"] * per


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _churn(t: dict[str, Any]) -> float | None:
    w = driver_work_per_1k(t)
    return None if w is None else w[0] + w[1]


def pooled(tenants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One mode's figures over all its tenants: tokens, preemptions, TTFT percentiles over every
    tenant's requests, SLO attainment over every counted request, driver work per 1,000 tokens."""
    ttft = [v for t in tenants.values() for v in t.get("ttft_s") or ()]
    slo = [t.get("slo") for t in tenants.values()]
    met = sum(x["met"] for x in slo if x)
    missed = sum(x["missed"] for x in slo if x)
    tokens = sum(t["tokens"] for t in tenants.values())
    work = [driver_work_per_1k(t) for t in tenants.values()]
    out: dict[str, Any] = {
        "tokens": tokens,
        "preempted": sum(t["preempted"] for t in tenants.values()),
        "ttft_ms_p50": _ms(percentile(ttft, 0.50)),
        "ttft_ms_p99": _ms(percentile(ttft, 0.99)),
        "slo_attainment": attainment(met, missed) if any(slo) else None,
        "map_unmap_per_1k_tokens": None,
    }
    if tokens and all(w is not None for w in work):  # each tenant's per-1k figure weighted by its tokens
        out["map_unmap_per_1k_tokens"] = sum((w[0] + w[1]) * t["tokens"] for w, t in zip(work, tenants.values()) if w) / tokens
    return out


def ratios(static: dict[str, dict[str, Any]], kv: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """kvpolicy against static, measured in the same run: per tenant and in all. Each tenant's
    figures are its engine summary's (tokens, step_ms_p50/p99, preempted, TTFT, SLO) plus its pool's
    driver work (chunks mapped and unmapped after start-up per 1,000 tokens; regrowths:
    give-back/regrow cycles)."""
    rows = {}
    for name, k in kv.items():
        s = static[name]
        ks, ss = k.get("slo") or {}, s.get("slo") or {}
        rows[name] = {
            "tokens": _ratio(k["tokens"], s["tokens"]),
            "step_p50": _ratio(k["step_ms_p50"], s["step_ms_p50"]),
            "step_p99": _ratio(k["step_ms_p99"], s["step_ms_p99"]),
            "interval_p99": _ratio(k.get("interval_ms_p99"), s.get("interval_ms_p99")),
            "step_p99_within_bound": _ratio(k.get("step_ms_p99_within_bound"), s.get("step_ms_p99_within_bound")),
            "step_p99_with_check": _ratio(k.get("step_ms_p99_with_check"), s.get("step_ms_p99_with_check")),
            "preempted": (s["preempted"], k["preempted"]),
            "preempted_ratio": _ratio(k["preempted"], s["preempted"]),
            "ttft_p50": _ratio(k.get("ttft_ms_p50"), s.get("ttft_ms_p50")),
            "ttft_p99": _ratio(k.get("ttft_ms_p99"), s.get("ttft_ms_p99")),
            "slo": _ratio(ks.get("attainment"), ss.get("attainment")),
            "regrowths": k.get("regrowths"),
            "map_unmap_per_1k_tokens": _churn(k),
        }
    ps, pk = pooled(static), pooled(kv)
    return {
        "tenants": rows,
        "tokens": _ratio(pk["tokens"], ps["tokens"]),
        "preempted": (ps["preempted"], pk["preempted"]),
        "preempted_ratio": _ratio(pk["preempted"], ps["preempted"]),
        "step_p50_max": max((r["step_p50"] or 0 for r in rows.values()), default=None),
        "step_p99_max": max((r["step_p99"] or 0 for r in rows.values()), default=None),
        "interval_p99_max": _most(r["interval_p99"] for r in rows.values()),
        "step_p99_within_bound_max": _most(r["step_p99_within_bound"] for r in rows.values()),
        "step_p99_with_check_max": _most(r["step_p99_with_check"] for r in rows.values()),
        "ttft_p50": _ratio(pk["ttft_ms_p50"], ps["ttft_ms_p50"]),
        "ttft_p99": _ratio(pk["ttft_ms_p99"], ps["ttft_ms_p99"]),
        "slo": _ratio(pk["slo_attainment"], ps["slo_attainment"]),
        "map_unmap_per_1k_tokens": pk["map_unmap_per_1k_tokens"],
    }


def _most(values: Iterable[float | None]) -> float | None:
    """The largest of the tenants' ratios; None if any is missing (a run from before it was measured)."""
    vs = list(values)
    return None if not vs or any(v is None for v in vs) else max(vs)


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def ratio_table(r: dict[str, Any], label: str = "kvpolicy") -> str:
    """``ratios`` as a markdown table."""
    lines = [
        f"| tenant | tokens {label}/static | step p50 × | step p99 × | step p99 at static's KV × | interval p99 × "
        f"| preempted static → {label} | TTFT p50 × | TTFT p99 × | SLO attainment × | give-back/regrow cycles "
        "| chunks mapped+unmapped per 1k tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in r["tenants"].items():
        cycles = "–" if t["regrowths"] is None else str(t["regrowths"])
        lines.append(f"| {name} | {_x(t['tokens'])} | {_x(t['step_p50'])} | {_x(t['step_p99'])} | "
                     f"{_x(t.get('step_p99_within_bound'))} | {_x(t.get('interval_p99'))} | "
                     f"{t['preempted'][0]} → {t['preempted'][1]} | {_x(t.get('ttft_p50'))} | {_x(t.get('ttft_p99'))} | "
                     f"{_x(t.get('slo'))} | {cycles} | {_f(t['map_unmap_per_1k_tokens'])} |")
    lines.append(f"| all | {_x(r['tokens'])} | ≤ {_x(r['step_p50_max'])} | ≤ {_x(r['step_p99_max'])} | "
                 f"≤ {_x(r.get('step_p99_within_bound_max'))} | ≤ {_x(r.get('interval_p99_max'))} | "
                 f"{r['preempted'][0]} → {r['preempted'][1]} ({_x(r['preempted_ratio'])}) | {_x(r.get('ttft_p50'))} | "
                 f"{_x(r.get('ttft_p99'))} | {_x(r.get('slo'))} | | {_f(r.get('map_unmap_per_1k_tokens'))} |")
    return "\n".join(lines) + "\n"


TAIL_PHASES = ("alloc", "write", "attend", "check", "free", "gpu_wait")
"""The phases ``tail_table`` shows (``sync`` runs inside a step only with the old allocator)."""


def tail_table(modes: dict[str, dict[str, dict[str, Any]]]) -> str | None:
    """Per tenant and mode, the step p99 (and with the finished requests' KV check counted in), and
    what the slowest 1% of steps spent their time on: mean ms per phase, the KV they attended, the
    share that finished a request. None: no run measured it."""
    rows = [(label, name, t) for label, tenants in modes.items() for name, t in tenants.items() if t.get("tail")]
    if not rows:
        return None
    lines = [
        "| tenant | mode | step p99 ms | with the check | slowest 1%: mean ms | "
        + " | ".join(TAIL_PHASES) + " | KV GiB | finishing a request |",
        "|---|---|---:|---:|---:|" + "---:|" * len(TAIL_PHASES) + "---:|---:|",
    ]
    for label, name, t in rows:
        tail, block = t["tail"], t.get("block_bytes")
        kv = "–" if block is None else f"{tail['kv_blocks'] * block / GiB:.1f}"
        lines.append(
            f"| {name} | {label} | {t['step_ms_p99']:.2f} | {_f(t.get('step_ms_p99_with_check'), '.2f')} | "
            f"{tail['step_ms']:.2f} | " + " | ".join(f"{tail['phase_ms'].get(p, 0.0):.2f}" for p in TAIL_PHASES)
            + f" | {kv} | {100 * tail['with_finished']:.0f}% |")
    return "\n".join(lines) + "\n"


def serving_table(modes: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Per tenant and mode (and every mode's tenants together): what serving systems headline.

    ``modes``: label → tenant → figures (an engine summary plus the pool's driver work)."""
    lines = [
        "| tenant | mode | tokens | preempted | step p50 / p99 ms | TTFT p50 / p99 s | SLO attainment "
        "| chunks mapped / unmapped per 1k tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, tenants in modes.items():
        for name, t in tenants.items():
            slo = (t.get("slo") or {}).get("attainment")
            w = driver_work_per_1k(t)
            lines.append(
                f"| {name} | {label} | {t['tokens']:,} | {t['preempted']} | {t['step_ms_p50']:.2f} / {t['step_ms_p99']:.2f} | "
                f"{_s(t.get('ttft_ms_p50'))} / {_s(t.get('ttft_ms_p99'))} | {_pct(slo)} | "
                f"{'–' if w is None else f'{w[0]:.1f} / {w[1]:.1f}'} |")
    for label, tenants in modes.items():
        p = pooled(tenants)
        lines.append(f"| all | {label} | {p['tokens']:,} | {p['preempted']} | | {_s(p['ttft_ms_p50'])} / {_s(p['ttft_ms_p99'])} | "
                     f"{_pct(p['slo_attainment'])} | {_f(p['map_unmap_per_1k_tokens'])} (both) |")
    return "\n".join(lines) + "\n"


def _s(ms: float | None) -> str:
    return "–" if ms is None else f"{ms / 1000:.2f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _tenant(mode: dict[str, Any], name: str) -> dict[str, Any]:
    t = mode["tenants"][name]
    s = t["summary"]
    out = {k: s[k] for k in TENANT_FIELDS}
    out.update({k: s.get(k) for k in (*LATENCY_FIELDS, *STEP_FIELDS)})  # None: a run from before they were measured
    out["peak_mapped"] = t["peak_held"]
    out["block_bytes"] = (t.get("pool") or {}).get("block_bytes")
    out.update(t.get("driver_work") or dict.fromkeys(DRIVER_WORK))  # None: a run from before it was counted
    out["released_under_pressure"] = t.get("released_under_pressure")  # None: a run from before it existed
    if mode["mode"] == "kvpolicy":
        rec = mode["reclaim"][name]
        out["reclaim_seconds"] = [e["seconds"] for e in rec["episodes"]]
        out["reclaim_interrupted"] = rec["interrupted"]
        r = mode.get("reload", {})
        out["reload_acked_ms"] = r.get("acked_ms", {}).get(name)
        out["reload_applied_ms"] = r.get("applied_ms", {}).get(name)
        out["ledger_check"] = t.get("ledger_check")
    else:
        out["reclaim_seconds"] = None
        out["reload_acked_ms"] = out["reload_applied_ms"] = None
    return out


def drained_text(drained: dict[str, dict[str, Any]] | None) -> str:
    """The pools the edit left above their new targets, and how long each took to drain to it."""
    if drained is None:
        return "drain not measured"
    if not drained:
        return "no pool was left above its new target"
    return "drained to the new targets: " + ", ".join(
        f"{n} {_gib(d['held'])} → {_gib(d['target'])} GiB "
        + ("not within the run" if d["seconds"] is None else f"after {d['seconds']:.1f} s")
        for n, d in drained.items())


def _mode(mode: dict[str, Any]) -> dict[str, Any]:
    names = list(mode["tenants"])
    tenants = {n: _tenant(mode, n) for n in names}
    d = mode["dsv4"]
    out: dict[str, Any] = {
        "tokens": sum(t["tokens"] for t in tenants.values()),
        "oom": sum(t["oom"] for t in tenants.values()),
        "corrupted": sum(t["corrupted"] for t in tenants.values()),
        "budget": mode["budget"],
        "budget_check": mode["budget_check"],
        "tenants": tenants,
        "dsv4": {k: d.get(k) for k in ("build", "note", "sglang", "reserve", "admitted", "pools", "footprint",
                                       "tensor_bytes", "ledger_runtime_reserved", "build_seconds", "plan")},
        "timeline": mode.get("timeline"),
    }
    if mode["mode"] == "kvpolicy":
        r = mode.get("reload", {})
        out["reload"] = {k: r.get(k) for k in ("at_s", "swap", "fields", "revision", "publish_ms", "acked_ms", "applied_ms",
                                                "reload_to_acked_ms", "reload_to_applied_ms", "error")}
        if r.get("at_s") is not None:  # how long the edit's new targets took to hold (the tenants' samples say)
            out["reload"]["drained"] = drains_after_edit(mode["tenants"], r["at_s"], mode["params"]["engine"]["reserve_blocks"])
        episodes = [e for n in names for e in mode["reclaim"][n]["episodes"]]
        out["reclaim"] = {
            "rule": mode["idle_rule"],
            "goal_seconds": mode["idle_rule"]["grace"] + 1.0,
            "episodes": episodes,
            "max_seconds": max((e["seconds"] for e in episodes), default=None),
            "within_goal": sum(e["seconds"] <= mode["idle_rule"]["grace"] + 1.0 for e in episodes),
        }
        out["publishes"] = sum(1 for x in mode.get("decisions", []) if x.get("published"))
    return out


def issue17_goals(r: dict[str, Any], static: dict[str, Any], kv: dict[str, Any]) -> dict[str, bool]:
    """Issue 17's goals on one trace, from ``ratios`` and the modes' totals (the bursty-trace goals —
    tokens, TTFT p99, SLO — are listed for every trace; they are goals on the bursty ones)."""
    def at_most(v: float | None, bound: float) -> bool:
        return v is not None and v <= bound

    def at_least(v: float | None, bound: float) -> bool:
        return v is not None and v >= bound

    return {
        "i17_step_p99_at_most_1.5x": at_most(r.get("step_p99_max"), 1.5),
        "i17_step_p50_at_most_1.2x": at_most(r.get("step_p50_max"), 1.2),
        "i17_tokens_at_least_1.0x": at_least(r.get("tokens"), 1.0),
        "i17_preempted_at_most_1.25x": at_most(r.get("preempted_ratio"), 1.25),
        "i17_bursty_tokens_at_least_1.5x": at_least(r.get("tokens"), 1.5),
        "i17_bursty_ttft_p99_2x_lower": at_most(r.get("ttft_p99"), 0.5),
        "i17_bursty_slo_at_least_1.5x": at_least(r.get("slo"), 1.5),
        "i17_zero_oom_corrupted": static["oom"] == kv["oom"] == static["corrupted"] == kv["corrupted"] == 0,
    }


def machine_id(machine: dict[str, Any] | None) -> str | None:
    """Which machine a mode ran on: its GPU's UUID, or without a GPU its host's name (None: not recorded)."""
    m = machine or {}
    if m.get("gpu"):
        return m.get("gpu_uuid")
    return f"host {m['host']}" if m.get("host") else None


def one_machine(modes: dict[str, dict[str, Any]]) -> str | None:
    """The machine every mode ran on (None where a record predates the machine's id).

    A ratio is of two runs on one machine: GPU hosts of one kind differ by more than the
    effects measured (two H100s' static step p50: 1.51-1.64 ms and 1.69-1.87 ms), so modes from two
    machines are refused.
    """
    ids = {name: machine_id(mode.get("machine")) for name, mode in modes.items()}
    if None in ids.values():
        return None
    if len(set(ids.values())) > 1:
        where = ", ".join(f"{name} on {ran_on}" for name, ran_on in ids.items())
        raise SystemExit(f"colocate --combine: the modes ran on different machines ({where}); a ratio across "
                         "machines measures the machines: run every mode on one (in one GPU command, or in "
                         "calls back to back while the machine is held)")
    return next(iter(ids.values()))


def combine(src: Path, dest: Path, *, update_readme: bool = False) -> int:
    """Write ``results.json`` and ``memory.png`` into ``dest`` from ``src/{static,kvpolicy}.json``."""
    modes = {}
    for name in ("static", "kvpolicy"):
        path = src / f"{name}.json"
        if not path.exists():
            raise SystemExit(f"colocate --combine: {path} is missing; run --mode {name} --out {src} first")
        modes[name] = json.loads(path.read_text())
    old_path = src / "kvpolicy-old.json"  # optional: the same trace with the allocator's old give-back
    if old_path.exists():
        modes["kvpolicy-old"] = json.loads(old_path.read_text())
    ran_on = one_machine(modes)
    static, kv = _mode(modes["static"]), _mode(modes["kvpolicy"])
    ratio = kv["tokens"] / static["tokens"] if static["tokens"] else None
    reload = kv.get("reload", {})
    rec = kv["reclaim"]
    results = {
        "issue": 8,
        "params": modes["kvpolicy"]["params"]["name"],
        "machine": modes["kvpolicy"].get("machine") or modes["static"].get("machine"),
        "one_machine": ran_on,
        "trace": modes["kvpolicy"]["params"]["trace"],
        "engine": modes["kvpolicy"]["params"]["engine"],
        "kv": modes["kvpolicy"]["params"]["kv"],
        "tokens_ratio": ratio,
        "ratios": ratios(static["tenants"], kv["tenants"]),
        "goals": {
            "zero_oom": static["oom"] == 0 and kv["oom"] == 0,
            "zero_corrupted": static["corrupted"] == 0 and kv["corrupted"] == 0,
            "tokens_ratio_at_least_1_5": ratio is not None and ratio >= 1.5,
            "reclaim_within_grace_plus_1s": f"{rec['within_goal']} of {len(rec['episodes'])} episodes",
            "reload_applied_within_100ms": (reload.get("reload_to_acked_ms") or 1e9) <= 100,
            "never_over_budget": static["budget_check"]["over_budget"] == 0 and kv["budget_check"]["over_budget"] == 0,
        },
        "modes": {"static": static, "kvpolicy": kv},
    }
    results["goals"].update(issue17_goals(results["ratios"], static, kv))
    if "kvpolicy-old" in modes:
        results["modes"]["kvpolicy-old"] = old_mode = _mode(modes["kvpolicy-old"])
        results["ratios_old"] = ratios(static["tenants"], old_mode["tenants"])
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    try:
        plot(modes, dest / "memory.png")
        plotted = True
    except ImportError as exc:  # the plot needs matplotlib (pip install 'kvpolicy[bench]'); the figures do not
        print(f"colocate --combine: memory.png not written ({exc}); pip install matplotlib")
        plotted = False
    table = markdown(results, plot="memory.png" if plotted else None)
    (dest / "results.md").write_text(table)
    print(table)
    if update_readme:
        text = README.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{README}: no {BEGIN} … {END} section to replace")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        README.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return 0


def _gib(n: int | None) -> str:
    return "–" if n is None else f"{n / GiB:.2f}"


def _slo_words(results: dict[str, Any]) -> str:
    e = results.get("engine") or {}
    return f"{e.get('slo_ttft_s', 2.0):g} s and every inter-token gap ≤ {e.get('slo_gap_ms', 50.0):g} ms"


def _one_machine_words(results: dict[str, Any]) -> str:
    ran_on = results.get("one_machine")
    return f" Every mode ran on {ran_on}." if ran_on else ""


def markdown(results: dict[str, Any], plot: str | None = "memory.png") -> str:
    """The results as the README shows them; ``plot``: the memory plot beside them (None: none was drawn)."""
    m = results["machine"] or {}
    if m.get("gpu"):
        where = f"{m['gpu']}, {m['gpu_memory'] / GiB:.0f} GiB, driver {m.get('driver')}, CUDA {m.get('cuda')}"
    else:
        where = f"CPU ({m.get('cpu')}, {m.get('cpus')} cores), host driver"
    kv, st = results["modes"]["kvpolicy"], results["modes"]["static"]
    lines = [
        f"Machine: {where}; torch {m.get('torch')}, Python {m.get('python')}.{_one_machine_words(results)} "
        f"Parameters: `{results['params']}`.",
        "",
        (f"**Tokens served: kvpolicy / static = {results['tokens_ratio']:.2f}×** "
         f"({kv['tokens']:,} vs {st['tokens']:,} output tokens)."),
        "",
        "kvpolicy against static in the same run:",
        "",
        ratio_table(results["ratios"]) if "ratios" in results else "(no ratios: results from before they were computed)",
        *([ratio_table(results["ratios_old"], "kvpolicy-old")] if "ratios_old" in results else []),
        "Per tenant and mode (TTFT: arrival to first token, over the requests that got one; SLO: TTFT ≤ "
        f"{_slo_words(results)}; an abandoned request misses; chunks: after start-up):",
        "",
        serving_table({m: v["tenants"] for m, v in results["modes"].items()}),
        *_tail_section(results),
        ("| tenant | mode | tokens | completed / arrived | abandoned | queued | preempted | step p50 / p99 ms "
         "| peak mapped GiB | OOM | corrupted | reclaim s (max, n) | reload acked / applied ms |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in results["modes"]:
        for name, t in results["modes"][mode]["tenants"].items():
            reclaim = t["reclaim_seconds"]
            rec = "–" if reclaim is None else (f"{max(reclaim):.1f} ({len(reclaim)})" if reclaim else "none")
            rl = "–" if mode == "static" else f"{t.get('reload_acked_ms')} / {t.get('reload_applied_ms')}"
            lines.append(
                f"| {name} | {mode} | {t['tokens']:,} | {t['completed']} / {t['arrived']} | {t['abandoned']} | {t['queued']} | "
                f"{t['preempted']} | {t['step_ms_p50']:.2f} / {t['step_ms_p99']:.2f} | {_gib(t['peak_mapped'])} | {t['oom']} | "
                f"{t['corrupted']} | {rec} | {rl} |"
            )
    r, rc, d, g, b = kv.get("reload", {}), kv["reclaim"], kv["dsv4"], results["goals"], kv["budget"]
    built = f" (SGLang {d['sglang']}, built in {d['build_seconds']} s)" if d.get("sglang") else f" — {d.get('note')}"

    def ok(flag: bool) -> str:
        return "✓" if flag else "✗"

    lines += [
        "",
        (f"- DeepSeek-V4 tenant: {d['build']}{built}; runtime-owned pools {_gib(d['ledger_runtime_reserved'])} GiB "
         f"in the ledger for a reserve of {_gib(d['reserve'])} GiB."),
        (f"- Budget: elastic budget published {_gib(b.get('elastic_budget'))} GiB (capacity {_gib(b.get('capacity'))} GiB "
         f"= budget + headroom {_gib(b.get('headroom'))} GiB + V4 pools, other use 0); most committed at once "
         f"{_gib(kv['budget_check']['max_committed'])} GiB over {kv['budget_check']['samples']} ledger samples, "
         f"over budget {kv['budget_check']['over_budget']} times."),
        (f"- Policy edit at {r.get('at_s')} s (swap {r.get('fields')} of {r.get('swap')}): published after "
         f"{r.get('publish_ms')} ms, acknowledged by every tenant after {r.get('reload_to_acked_ms')} ms, applied "
         f"(every pool within its new limit) after {r.get('reload_to_applied_ms')} ms; {drained_text(r.get('drained'))}."),
        (f"- Idle reclaim (`{rc['rule']['name']}`: use below {_gib(rc['rule']['below'])} GiB, grace {rc['rule']['grace']:g} s): "
         f"{len(rc['episodes'])} episodes, {rc['within_goal']} within grace + 1 s, longest {rc['max_seconds']} s."),
        (f"- Goals: zero OOM {ok(g['zero_oom'])}; zero corrupted {ok(g['zero_corrupted'])}; "
         f"tokens ≥ 1.5× {ok(g['tokens_ratio_at_least_1_5'])}; reclaim within grace + 1 s: "
         f"{g['reclaim_within_grace_plus_1s']}; reload within 100 ms {ok(g['reload_applied_within_100ms'])}; "
         f"never over budget {ok(g['never_over_budget'])}."),
        ("- Issue 17's goals: " + "; ".join(f"{k} {ok(v)}" for k, v in g.items() if k.startswith("i17_")) + "."),
    ]
    if plot is not None:
        lines += ["", f"![memory per tenant over time, both modes]({plot})"]
    return "\n".join(lines) + "\n"


def _tail_section(results: dict[str, Any]) -> list[str]:
    table = tail_table({m: v["tenants"] for m, v in results["modes"].items()})
    if table is None:
        return []
    where = ("after the step, apart from its time" if results.get("engine", {}).get("check_between_steps")
             else "inside the step")
    return [f"The step's time (the finished requests' KV check, the benchmark's instrument, ran {where}), "
            "and where the slowest 1% of steps went:", "", table]


def plot(modes: dict[str, dict[str, Any]], path: Path) -> None:
    """Mapped memory per tenant over time (stacked), both modes, with busy phases and the policy edit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, 1, figsize=(14, 8), sharex=True, sharey=True)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    for ax, name in zip(axes, ("static", "kvpolicy")):
        mode = modes[name]
        trace = Trace.model_validate(mode["params"]["trace"])
        grid = np.arange(0.0, trace.duration_s, 0.1)
        runtime = mode["dsv4"]["ledger_runtime_reserved"] / GiB
        layers, labels = [np.full_like(grid, runtime)], [f"DeepSeek-V4 pools ({mode['dsv4']['build']})"]
        used_total = np.zeros_like(grid)
        for tname, t in mode["tenants"].items():
            col = {c: i for i, c in enumerate(t["samples"]["columns"])}
            rows = np.array(t["samples"]["rows"], dtype=float)
            idx = np.clip(np.searchsorted(rows[:, col["t"]], grid, side="right") - 1, 0, len(rows) - 1)
            layers.append(rows[idx, col["held"]] / GiB)
            used_total += rows[idx, col["used"]] / GiB
            labels.append(f"{tname} mapped")
        ax.stackplot(grid, *layers, labels=labels, colors=["#bbbbbb", *colors], alpha=0.85)
        ax.plot(grid, used_total + runtime, color="black", lw=0.8, label="in live blocks (all tenants) + V4 pools")
        budget = mode["params"]["budget"]["elastic"] / GiB + runtime
        ax.axhline(budget, color="red", ls="--", lw=1, label="elastic budget + V4 pools")
        for i in range(len(mode["tenants"])):
            for lo, hi in busy_windows(trace, i):
                ax.axvspan(lo, hi, ymin=0.975 - 0.025 * i, ymax=1.0 - 0.025 * i, color=colors[i], alpha=0.9, lw=0)
        if name == "kvpolicy" and "reload" in mode:
            ax.axvline(mode["reload"]["at_s"], color="purple", lw=1.2, label="policy edited (priorities swapped)")
        tokens = sum(t["summary"]["tokens"] for t in mode["tenants"].values())
        ax.set_title(f"{name}: {tokens:,} output tokens")
        ax.set_ylabel("GiB")
        ax.set_ylim(0, budget * 1.12)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1].set_xlabel("seconds (bars at the top: each tenant's busy phase)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["combine", "driver_work_per_1k", "issue17_goals", "markdown", "plot", "pooled", "ratio_table", "ratios", "serving_table"]
