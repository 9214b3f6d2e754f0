"""A prediction of both modes on a simulated clock: the real scheduler, pools and evaluator, no processes.

    python3 benchmarks/colocate/simulate.py [--params default.toml] [--patience S] [--seeds A-B]

Each tenant is the benchmark's ``Engine`` over a real ``BlockPool`` (host driver) with
no GPU work; steps take exactly ``step_ms`` of simulated time. In kvpolicy mode the
controller is modelled by calling the real ``evaluate`` after every step with the
pools' usage as facts and publishing a new revision when a limit, target or guarantee
changes, and the ledger's elastic admission by a shared budget (Σ mapped ≤ A). What it
leaves out: GPU time, the controller's and the ledger's latencies, idle time (no rule
here uses it), how the tenants' processes interleave (each step takes them in one
order, or with ``--order-seed`` in a random one), and what the driver's calls cost in
time (with ``--driver-us`` a tenant pays for each chunk it maps or unmaps, and loses the
steps the wall clock's pacing would: ``DriverCost``). It takes seconds per mode, so it is
how parameters (e.g. the clients' patience) were explored; the GPU run is the
measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from analysis import drain_after_edit, drain_tolerance, mean_and_spread
from engine import Engine
from params import Params, load_params
from policyedit import swap_settings
from report import drained_text, pooled, ratio_table, ratios, serving_table
from traces import requests_for

from kvpolicy.alloc import BlockPool, StaticLimit, open_driver
from kvpolicy.alloc.limits import LimitReading
from kvpolicy.policy.resolve import gpu_settings, model_settings

if TYPE_CHECKING:
    from kvpolicy.evaluate.decision import InstanceDecision


class NoWork:
    """Stands in for the GPU work (``kvwork.KVWork``): the simulation is about memory, not data."""

    def write(self, blocks, keys) -> None: ...
    def check(self, blocks, keys) -> list[int]: return [0] * len(blocks)
    def attend(self, tables, contexts) -> None: ...
    def synchronize(self) -> None: ...


PressureScope = Literal["gpu", "entitled", "furthest", "furthest-entitled"]
"""Who sees a refusal for the budget: ``gpu`` every other pool (the ledger's one counter per GPU);
``entitled`` every other pool, but only refusals of a requester asking within its target;
``furthest`` only the pool furthest above its target; ``furthest-entitled`` both restrictions."""


@dataclass(frozen=True)
class DriverCost:
    """The time a tenant's mapping costs it, which the simulated clock otherwise leaves out.

    On the GPU a tenant's steps are paced at most one every ``step_ms`` and a late step
    is not made up for (``tenant.py``): a step whose own work and driver calls take longer
    than the interval makes the next one start late, and the steps that time would have
    held are lost. Each chunk group mapped or unmapped costs ``us_per_chunk`` (nearly the
    same at 2, 8 or 32 MiB: docs/allocator.md, "Costs that shape the design"), on top of
    ``step_busy_ms``, a step's own time without the driver."""

    us_per_chunk: float
    step_busy_ms: float = 0.0

    def overrun_s(self, chunks: int, step_s: float) -> float:
        """How far past its interval a step runs that mapped or unmapped ``chunks`` chunk groups."""
        return max(0.0, self.step_busy_ms / 1e3 + chunks * self.us_per_chunk / 1e6 - step_s)


@dataclass
class Pacing:
    """One tenant's lateness under a ``DriverCost`` (None: the driver is free and no step is lost)."""

    cost: DriverCost | None
    late_s: float = 0.0
    lost: int = 0
    """Steps lost: intervals the tenant spent finishing earlier steps."""

    def skips(self, step_s: float) -> bool:
        """Whether this step is lost: the tenant is still a whole interval behind."""
        if self.late_s < step_s:
            return False
        self.late_s -= step_s
        self.lost += 1
        return True

    def ran(self, chunks: int, step_s: float) -> None:
        """A step ran and mapped or unmapped ``chunks`` chunk groups (its between-step work included)."""
        if self.cost is not None:
            self.late_s += self.cost.overrun_s(chunks, step_s)


class SharedBudget:
    """The ledger's elastic admission in one process: per instance its limit, for the GPU Σ committed ≤ budget."""

    def __init__(self, budget: int, scope: PressureScope = "gpu") -> None:
        self.budget = budget
        self.scope = scope
        self.committed: dict[str, int] = {}
        self.sources: dict[str, SimLimit] = {}
        self.pressure = 0
        """Admissions refused for the budget, as the ledger counts them."""

    def source(self, name: str, guarantee: int) -> SimLimit:
        self.committed[name] = 0
        self.sources[name] = src = SimLimit(self, name, guarantee)
        return src

    def refused(self, name: str, n: int) -> None:
        """``name``'s admission of ``n`` bytes was refused for the budget: signal as the scope says."""
        self.pressure += 1
        if self.scope == "gpu":
            return
        if self.scope.endswith("entitled") and self.committed[name] + n > self.sources[name].reading.target:
            return  # a requester above its target takes what is free, nobody gives for it
        others = [s for k, s in self.sources.items() if k != name]
        if self.scope.startswith("furthest"):
            above = [(self.committed[s.name] - s.reading.target, s.name) for s in others]
            best = max(above, default=None)
            others = [self.sources[best[1]]] if best and best[0] > 0 else []
        for s in others:
            s.signal += 1


class SimLimit:
    def __init__(self, gpu: SharedBudget, name: str, guarantee: int) -> None:
        self.gpu, self.name = gpu, name
        self.reading = LimitReading(guarantee, guarantee, 0, guarantee)
        self.used = self.mapped = self.waiting = 0
        self.signal = 0
        """Refusals addressed to this pool (scopes other than ``gpu``)."""

    def read(self) -> LimitReading:
        return self.reading

    def certain_refusal(self, n: int) -> bool:
        return False  # every refusal is asked of the simulated GPU (and moves its pressure counter)

    def admit(self, n: int) -> bool:
        c = self.gpu.committed
        if c[self.name] + n > self.reading.limit:
            return False
        if sum(c.values()) + n > self.gpu.budget:
            self.gpu.refused(self.name, n)
            return False
        c[self.name] += n
        return True

    def commit(self, n: int) -> None: ...

    def rollback(self, n: int) -> None:
        self.gpu.committed[self.name] -= n

    def release(self, n: int) -> None:
        self.gpu.committed[self.name] -= n

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        self.used, self.mapped, self.waiting = used, mapped, waiting

    def acknowledge(self, revision: int, status: str) -> None: ...

    def pressure(self) -> int:
        return self.gpu.pressure if self.gpu.scope == "gpu" else self.signal


def publish(source: SimLimit, decision: InstanceDecision, revision: int) -> int:
    """The controller's publish for one pool: a new revision when its limit, target or guarantee
    changed; returns the revision in force. The guarantee goes with the limit and target, as the
    ledger publishes it (``kvpolicy.runtime.client``): under pressure a pool gives back only what
    lies above it (``GiveBack``), so an idle tenant keeps its guarantee mapped, as the device
    run's tenants do. Without it the simulated idle tenants gave theirs to the busy ones and the
    bursty traces' predictions ran 3–6% above the real processes'."""
    r, d = source.reading, decision
    if (d.limit, d.target, d.guarantee) != (r.limit, r.target, r.guarantee):
        revision += 1
        source.reading = LimitReading(d.limit, d.target, revision, d.guarantee)
    return revision


def pooled_reference(params: Params) -> Params:
    """The ``pooled`` run's parameters: memory goes back the step it is freed, mapped a block at a time,
    nothing mapped ahead, no yield (what a single shared pool does; ``simulate`` drops the policy)."""
    engine = params.engine.model_copy(update={
        "give_back_delay_s": 0.0, "give_back_hold_s": 0.0, "reserve_blocks": 0, "pressure_keeps_reserve": False,
        "yield_above_target_s": 0.0, "map_between_steps": False, "driver_chunks_between_steps": None})
    return params.model_copy(update={"engine": engine, "kv": params.kv.model_copy(update={"elastic_chunk": None})})


def simulate(params: Params, mode: str, runtime_reserved: int, scope: PressureScope = "gpu",
             order_seed: int | None = None, driver_cost: DriverCost | None = None) -> dict[str, dict]:
    """Per tenant, the engine's summary after the whole trace on a simulated clock.

    ``mode``: ``static`` (fixed shares), ``kvpolicy`` (the policy's limits and targets, re-evaluated
    every step) or ``pooled`` — a reference, not kvpolicy: the whole elastic budget is one pool that
    any tenant takes from, first come first served, with no guarantee, limit, target or rule, and a
    block goes back to it the step it is freed (with ``pooled_reference``'s parameters). It is what
    sharing the memory buys on the trace without any policy: a yardstick for the policy's figures.

    ``order_seed``: each step takes the tenants in a random order drawn from it, as concurrent
    processes interleave (who takes memory another just gave back can then differ from run to
    run); None takes them in the trace's order every step.

    ``driver_cost``: what each chunk mapped or unmapped costs a tenant in time, hence the steps it
    loses (each tenant's ``steps_lost``); None: the driver takes no time."""
    from kvpolicy.evaluate.decide import evaluate
    from kvpolicy.facts import (
        ElasticFacts,
        Facts,
        GpuFacts,
        InstanceFacts,
        PoolFacts,
    )
    from kvpolicy.lint.load import policy_from_text

    kv = params.kv
    order = None if order_seed is None else random.Random(order_seed)
    text = params.policy.read_text()
    policy = policy_from_text(text)
    headroom = gpu_settings(policy, params.device.gpu).headroom_bytes(0)
    capacity = params.budget.elastic + headroom + runtime_reserved
    driver = open_driver("host", host_capacity=params.budget.elastic * 2)
    shared = SharedBudget(params.budget.elastic, scope)
    now = [0.0]  # the simulated clock, which the pools' give-back delay reads
    step_s = params.engine.step_ms / 1000  # a step's tokens are out at its end
    engines, sources, at_start = [], [], []
    for i, name in enumerate(params.tenants):
        if mode == "static":
            source = StaticLimit(params.budget.static_share)
            pool = BlockPool(driver, kv.layout, params.static_blocks, chunk=kv.chunk, limit=source, name=name)
            pool.ensure_mapped(range(pool.num_blocks))
        else:
            guarantee = 0 if mode == "pooled" else model_settings(policy, name).min_bytes(capacity)
            source = shared.source(name, guarantee)
            if mode == "pooled":  # the whole budget its limit, a target of 0: every free block goes back at a sync
                source.reading = LimitReading(params.budget.elastic, 0, 1)
            pool = BlockPool(driver, kv.layout, params.elastic_blocks, chunk=kv.elastic_chunk_bytes, limit=source, name=name,
                             give_back_under_pressure=params.engine.give_back_under_pressure,
                             give_back_delay_s=params.engine.give_back_delay_s,
                             give_back_hold_s=params.engine.give_back_hold_s, reserve_blocks=params.engine.reserve_blocks,
                             pressure_keeps_reserve=params.engine.pressure_keeps_reserve, yield_above_target_s=params.engine.yield_above_target_s,
                             give_back_chunks_per_sync=params.engine.driver_chunks_between_steps, clock=lambda: now[0])
            pool.ensure_mapped(range(guarantee // pool.block_bytes))
        engine = Engine(pool, NoWork(), requests_for(params.trace, i), block_tokens=kv.block_tokens,
                        max_request_blocks=params.max_request_blocks, prefill_tokens_per_step=params.engine.prefill_tokens_per_step,
                        max_running=params.engine.max_running, patience_s=params.engine.patience_s,
                        slo_ttft_s=params.engine.slo_ttft_s, slo_gap_s=params.engine.slo_gap_ms / 1000,
                        token_clock=lambda: now[0] + step_s, map_between_steps=params.engine.map_between_steps,
                        check_between_steps=params.engine.check_between_steps, kv_bytes_bound=params.budget.static_share,
                        driver_chunks_between_steps=params.engine.driver_chunks_between_steps)
        engine.last_stats = pool.sync()
        at_start.append(pool.mapping.groups_mapped)
        engines.append(engine)
        sources.append(source)
    state, revision, edited, step, t = None, 0, False, params.engine.step_ms / 1000, 0.0
    edited_at: float | None = None
    samples: dict[str, list[list[float]]] = {name: [] for name in params.tenants}  # t, held, target (drain_after_edit's)
    every, next_sample = params.engine.sample_every_s, 0.0
    gpu = params.device.gpu
    v4 = InstanceFacts(id=f"{params.dsv4.model}/0", model=params.dsv4.model, engine="sglang", gpu=gpu,
                       pools={"all": PoolFacts(owner="runtime", bytes=runtime_reserved)})
    pacing = [Pacing(driver_cost) for _ in engines]
    while t < params.trace.duration_s:
        now[0] = t
        for i in range(len(engines)) if order is None else order.sample(range(len(engines)), len(engines)):
            if pacing[i].skips(step):
                continue
            before = engines[i].driver_ops()
            engines[i].step(t)
            pacing[i].ran(engines[i].driver_ops() - before, step)
        if mode == "kvpolicy":
            if not edited and t >= params.reload.at_s:
                policy = policy_from_text(swap_settings(text, *params.reload.swap, params.reload.fields))
                edited, edited_at = True, t
            facts = Facts(now=t, gpus=(GpuFacts(id=gpu, capacity=capacity, other_used=0),), instances=(v4, *(
                InstanceFacts(id=f"{n}/0", model=n, gpu=gpu,
                              elastic=ElasticFacts(used=s.used, mapped=s.mapped, waiting=s.waiting))
                for n, s in zip(params.tenants, sources)
            )))
            decision, state = evaluate(policy, facts, state)
            for name, source in zip(params.tenants, sources):
                revision = publish(source, decision.instance(f"{name}/0"), revision)
            if t >= next_sample:
                next_sample = t + every
                for name, engine in zip(params.tenants, engines):
                    samples[name].append([t, engine.pool.held_bytes, engine.pool.mapping.reading.target])
        t += step
    out = {}
    for name, engine, start, paced in zip(params.tenants, engines, at_start, pacing):
        out[name] = engine.summary()
        m = engine.pool.mapping
        out[name].update(groups_mapped=m.groups_mapped, groups_unmapped=m.groups_unmapped, regrowths=m.regrowths,
                         groups_mapped_at_start=start, arenas=len(m.arenas), steps_lost=paced.lost)
        if edited_at is not None:
            tenant = {"samples": {"columns": ["t", "held", "target"], "rows": samples[name]},
                      "pool": {"block_bytes": engine.pool.block_bytes, "group_bytes": m.group_bytes}}
            out[name]["drained"] = drain_after_edit(tenant, edited_at, drain_tolerance(tenant["pool"], params.engine.reserve_blocks))
        engine.pool.close()
    return out


def seed_range(text: str) -> list[int]:
    """``A-B`` (or one seed ``A``): the seeds from A to B."""
    first, dash, last = text.partition("-")
    try:
        seeds = list(range(int(first), int(last if dash else first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B, e.g. 1-16, not {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} names no seed")
    return seeds


def longest_drain(result: dict[str, dict]) -> float | None:
    """The longest drain after the policy edit over the tenants it left above their targets
    (inf: one never drained; None: there was no edit, or it left every pool within its target)."""
    drains = [d["seconds"] for t in result.values() if (d := t.get("drained"))]
    if not drains:
        return None
    return math.inf if None in drains else max(drains)


def seed_summary(per_seed: dict[int, dict[str, dict[str, dict]]]) -> dict[str, dict]:
    """Over seeds (seed → label → tenant → figures, static among the labels): each other label's
    ratios to static — tokens, preemptions, SLO attainment, TTFT p99 — per seed, their mean and standard
    error, and the longest drain after the policy edit; ``paired``: kvpolicy − kvpolicy-old per
    seed, when both ran (the same trace on both sides, so the difference is the settings')."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    def stats(values: list[float | None]) -> dict[str, Any]:
        return {**mean_and_spread(values), "values": values}

    labels = [label for label in next(iter(per_seed.values())) if label != "static"]
    out: dict[str, dict] = {}
    for label in labels:
        rows = {key: [] for key in ("tokens", "preempted", "slo", "ttft_p99")}
        drains = []
        for runs in per_seed.values():
            s, k = pooled(runs["static"]), pooled(runs[label])
            rows["tokens"].append(ratio(k["tokens"], s["tokens"]))
            rows["preempted"].append(ratio(k["preempted"], s["preempted"]))
            rows["slo"].append(ratio(k["slo_attainment"], s["slo_attainment"]))
            rows["ttft_p99"].append(ratio(k["ttft_ms_p99"], s["ttft_ms_p99"]))
            drains.append(longest_drain(runs[label]))
        out[label] = {key: stats(v) for key, v in rows.items()}
        out[label]["drain_s"] = {"max": max((d for d in drains if d is not None), default=None), "values": drains}
    if {"kvpolicy", "kvpolicy-old"} <= set(labels):
        new, old = out["kvpolicy"]["tokens"]["values"], out["kvpolicy-old"]["tokens"]["values"]
        out["paired"] = {"tokens": stats([None if a is None or b is None else a - b for a, b in zip(new, old)])}
    return out


def _drain_words(drain: float | None, sep: str = ",", label: str = "drained in") -> str:
    """``longest_drain``'s figure in words after ``sep`` ('' for None)."""
    if drain is None:
        return ""
    return f"{sep} a pool never drained to its new target" if drain == math.inf else f"{sep} {label} {drain:.1f} s"


def _many_seeds(runs: dict[str, tuple[Params, str, PressureScope]], seeds: list[int], reserved: int, json_path: str | None,
                order_seed: int | None = None, driver_cost: DriverCost | None = None) -> int:
    """``--seeds``: every run on the trace with each seed; the ratios to static per seed, then their mean ± standard error."""
    per_seed: dict[int, dict[str, dict[str, dict]]] = {}
    for seed in seeds:
        per_seed[seed] = {}
        for label, (p, mode, scope) in runs.items():
            seeded = p.model_copy(update={"trace": p.trace.model_copy(update={"seed": seed})})
            per_seed[seed][label] = simulate(seeded, mode, reserved, scope, order_seed, driver_cost)
        line = f"seed {seed}:"
        if "static" in per_seed[seed]:
            s = pooled(per_seed[seed]["static"])
            for label, result in per_seed[seed].items():
                if label != "static":
                    k = pooled(result)
                    drain = longest_drain(result)
                    lost = sum(t["steps_lost"] for t in result.values())
                    line += (f" {label} tokens {k['tokens'] / s['tokens']:.4f}, preempted {k['preempted']} vs {s['preempted']}"
                             + (f", {lost} steps lost to the driver" if driver_cost else "") + _drain_words(drain) + ";")
        print(line.rstrip(";"), flush=True)
    if "static" not in runs:
        return 0
    summary = seed_summary(per_seed)

    def ms(st: dict) -> str:
        se = "" if st["se"] is None else f" ± {st['se']:.4f}"
        return "–" if st["mean"] is None else f"{st['mean']:.4f}{se}"

    print(f"\nover {len(seeds)} seeds ({seeds[0]}–{seeds[-1]}), kvpolicy/static, mean ± standard error:")
    for label, st in summary.items():
        if label == "paired":
            continue
        d = st["drain_s"]["max"]
        print(f"  {label}: tokens {ms(st['tokens'])}, preempted {ms(st['preempted'])}, SLO attainment {ms(st['slo'])}, "
              f"TTFT p99 {ms(st['ttft_p99'])}"
              + _drain_words(d, ";", "longest drain"))
        if d == math.inf:
            never = sum(v == math.inf for v in st["drain_s"]["values"])
            p = runs[label][0]
            print(f"    (on {never} of {len(seeds)} seeds a pool was still above its new target when the run ended, "
                  f"{p.trace.duration_s - p.reload.at_s:g} s after the edit)")
    if "paired" in summary:
        t = summary["paired"]["tokens"]
        better = sum(v > 0 for v in t["values"] if v is not None)
        print(f"  kvpolicy − kvpolicy-old, paired by seed: tokens {ms(t)} (better on {better} of {len(seeds)})")
    if json_path:
        Path(json_path).write_text(json.dumps({"seeds": seeds, "summary": summary, "runs": per_seed}, indent=1, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(HERE / "default.toml"),
                    help="parameter file (default: default.toml, the H200 run's trace and geometry on the host driver's "
                         "sparse pages; the scaled cpu*.toml files put 32 blocks in a chunk, not the H200's 4)")
    ap.add_argument("--duration-scale", type=float, default=1.0, metavar="F", help="multiply every duration of the trace by F")
    ap.add_argument("--give-back-delay", type=float, metavar="S", help="override engine.give_back_delay_s")
    ap.add_argument("--patience", type=float, help="override engine.patience_s (0: clients wait forever)")
    ap.add_argument("--no-old", action="store_true", help="skip the run with the old allocator behaviour (no hold, no reserve)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override an [engine] setting for the kvpolicy run (TOML value), e.g. give_back_hold_s=4; "
                         "TABLE.KEY=VALUE one of [kv], [reload] or [trace] (times after --duration-scale), e.g. reload.at_s=119")
    ap.add_argument("--pressure-scope", default="gpu", choices=("gpu", "entitled", "furthest", "furthest-entitled"),
                    help="who sees a refusal for the budget (the ledger today: gpu)")
    ap.add_argument("--chunk", metavar="SIZE", help="override kv.elastic_chunk for the kvpolicy run (e.g. '8 MiB')")
    ap.add_argument("--runs", default="static,kvpolicy-old,kvpolicy",
                    help="which runs, comma-separated, of static, kvpolicy-old, kvpolicy and pooled (the whole budget "
                         "as one pool, no policy: a yardstick, see simulate())")
    ap.add_argument("--json", metavar="PATH", help="also write every run's per-tenant figures here")
    ap.add_argument("--runtime-reserved", type=int, help="the V4 pools' bytes (default: the plan's footprint for the reserve)")
    ap.add_argument("--order-seed", type=int, metavar="N",
                    help="take the tenants' steps in a random order each step, drawn from N, as concurrent processes "
                         "interleave (default: the same order every step)")
    ap.add_argument("--driver-us", type=float, metavar="US",
                    help="each chunk a tenant maps or unmaps costs it US microseconds, and the steps that makes late are "
                         "lost as on the GPU (35-50 there, at any chunk size; default: the driver takes no time)")
    ap.add_argument("--step-busy-ms", type=float, default=0.0, metavar="MS",
                    help="with --driver-us: a step's own time without the driver (default 0: only driver time past a "
                         "whole interval makes a step late)")
    ap.add_argument("--seeds", metavar="A-B", type=seed_range,
                    help="run the trace with each of these seeds (e.g. 1-16) and print the ratios' mean and standard error")
    args = ap.parse_args()
    params = load_params(args.params).scaled(args.duration_scale)
    overrides: dict[str, object] = {}
    if args.patience is not None:
        overrides["patience_s"] = args.patience or None
    if args.give_back_delay is not None:
        overrides["give_back_delay_s"] = args.give_back_delay
    params = params.model_copy(update={"engine": params.engine.model_copy(update=overrides)})
    import tomllib

    sets: dict[str, dict[str, object]] = {}
    for item in args.set:  # KEY=VALUE sets an [engine] key; TABLE.KEY=VALUE (a TOML dotted key) one of that table
        key, value = tomllib.loads(item).popitem()
        table, values = (key, value) if isinstance(value, dict) else ("engine", {key: value})
        if table not in ("engine", "kv", "reload", "trace"):
            ap.error(f"--set {item}: no table {table!r} to set (engine, kv, reload, trace)")
        sets.setdefault(table, {}).update(values)
    tuned = params.model_copy(update={
        table: type(getattr(params, table)).model_validate({**getattr(params, table).model_dump(), **values})
        for table, values in sets.items()})
    if args.chunk:
        tuned = tuned.model_copy(update={"kv": type(tuned.kv).model_validate({**tuned.kv.model_dump(), "elastic_chunk": args.chunk})})
    if args.step_busy_ms and args.driver_us is None:
        ap.error("--step-busy-ms is a step's time beside the driver's: give --driver-us too")
    driver_cost = None if args.driver_us is None else DriverCost(args.driver_us, args.step_busy_ms)
    reserved = args.runtime_reserved
    if reserved is None:
        from dsv4 import planned, policy_reserve

        reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint
    # The old allocator behaviour (no hold, no reserve) beside the parameters', both against static.
    old = params.old_allocator()
    runs = {"static": (params, "static", "gpu"), "kvpolicy-old": (old, "kvpolicy", "gpu"),
            "kvpolicy": (tuned, "kvpolicy", args.pressure_scope), "pooled": (pooled_reference(params), "pooled", "gpu")}
    wanted = args.runs.split(",")
    if args.no_old or old == tuned:
        wanted = [w for w in wanted if w != "kvpolicy-old"]
    runs = {k: v for k, v in runs.items() if k in wanted}
    if args.seeds:
        return _many_seeds(runs, args.seeds, reserved, args.json, args.order_seed, driver_cost)
    results = {}
    for label, (p, mode, scope) in runs.items():
        results[label] = result = simulate(p, mode, reserved, scope, args.order_seed, driver_cost)
        print(f"{label}: {sum(s['tokens'] for s in result.values()):,} tokens; " + "; ".join(
            f"{n} {s['tokens']:,} (completed {s['completed']}, abandoned {s['abandoned']}, preempted {s['preempted']})"
            for n, s in result.items()) + f"; {sum(s['groups_mapped'] for s in result.values()):,} chunk groups mapped")
    e = tuned.engine
    print(f"\n{params.name}: simulated clock, patience {e.patience_s} s; kvpolicy: give-back delay {e.give_back_delay_s} s, "
          f"hold {e.give_back_hold_s} s, reserve {e.reserve_blocks} blocks; kvpolicy-old: no hold, no reserve. "
          "Step times are the allocator's and scheduler's CPU time (no GPU work"
          + (f"; each chunk mapped or unmapped costs {driver_cost.us_per_chunk:g} µs of the tenant's time" if driver_cost else "")
          + ").\n")
    for label in runs:
        if label != "static" and "static" in results:
            print(ratio_table(ratios(results["static"], results[label]), label))
    print(serving_table(results))
    for label, result in results.items():
        if runs[label][1] == "kvpolicy":
            print(f"{label}: policy edit at {runs[label][0].reload.at_s:g} s; "
                  f"{drained_text({n: d for n, t in result.items() if (d := t.get('drained'))})}.")
    if args.json:
        Path(args.json).write_text(json.dumps({"params": params.name, "engine": e.model_dump(), "scope": args.pressure_scope, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
