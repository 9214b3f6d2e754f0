"""A prediction of both modes on a simulated clock: the real scheduler, pools and evaluator, no processes.

    python3 benchmarks/colocate/simulate.py [--params cpu.toml] [--patience S]

Each tenant is the benchmark's ``Engine`` over a real ``BlockPool`` (host driver) with
no GPU work; steps take exactly ``step_ms`` of simulated time. In kvpolicy mode the
controller is modelled by calling the real ``evaluate`` after every step with the
pools' usage as facts and publishing a new revision when a limit or target changes,
and the ledger's elastic admission by a shared budget (Σ mapped ≤ A). What it leaves
out: GPU time, the controller's and the ledger's latencies, idle time (no rule here
uses it). It takes seconds per mode, so it is how parameters (e.g. the clients'
patience) were explored; the device run is the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Literal

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from engine import Engine
from params import Params, load_params
from policyedit import swap_settings
from report import ratio_table, ratios, serving_table
from traces import requests_for

from kvpolicy.alloc import BlockPool, StaticLimit, open_driver
from kvpolicy.alloc.limits import LimitReading


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
        self.reading = LimitReading(guarantee, guarantee, 0)
        self.used = self.mapped = 0
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

    def report(self, used: int, mapped: int) -> None:
        self.used, self.mapped = used, mapped

    def acknowledge(self, revision: int, status: str) -> None: ...

    def pressure(self) -> int:
        return self.gpu.pressure if self.gpu.scope == "gpu" else self.signal


def simulate(params: Params, mode: str, runtime_reserved: int, scope: PressureScope = "gpu") -> dict[str, dict]:
    """Per tenant, the engine's summary after the whole trace on a simulated clock."""
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
    text = params.policy.read_text()
    policy = policy_from_text(text)
    headroom = policy.gpu_settings(params.device.gpu).headroom_bytes(0)
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
            guarantee = policy.model_settings(name).min_bytes(capacity)
            source = shared.source(name, guarantee)
            pool = BlockPool(driver, kv.layout, params.elastic_blocks, chunk=kv.elastic_chunk_bytes, limit=source, name=name,
                             give_back_under_pressure=params.engine.give_back_under_pressure,
                             give_back_delay_s=params.engine.give_back_delay_s,
                             give_back_hold_s=params.engine.give_back_hold_s, reserve_blocks=params.engine.reserve_blocks,
                             pressure_keeps_reserve=params.engine.pressure_keeps_reserve, yield_above_target_s=params.engine.yield_above_target_s,
                             clock=lambda: now[0])
            pool.ensure_mapped(range(guarantee // pool.block_bytes))
        engine = Engine(pool, NoWork(), requests_for(params.trace, i), block_tokens=kv.block_tokens,
                        max_request_blocks=params.max_request_blocks, prefill_tokens_per_step=params.engine.prefill_tokens_per_step,
                        max_running=params.engine.max_running, patience_s=params.engine.patience_s,
                        slo_ttft_s=params.engine.slo_ttft_s, slo_gap_s=params.engine.slo_gap_ms / 1000,
                        token_clock=lambda: now[0] + step_s, map_between_steps=params.engine.map_between_steps,
                        kv_bytes_bound=params.budget.static_share)
        engine.last_stats = pool.sync()
        at_start.append(pool.mapping.groups_mapped)
        engines.append(engine)
        sources.append(source)
    state, revision, edited, step, t = None, 0, False, params.engine.step_ms / 1000, 0.0
    gpu = params.device.gpu
    v4 = InstanceFacts(id=f"{params.dsv4.model}/0", model=params.dsv4.model, engine="sglang", gpu=gpu,
                       pools={"all": PoolFacts(owner="runtime", bytes=runtime_reserved)})
    while t < params.trace.duration_s:
        now[0] = t
        for engine in engines:
            engine.step(t)
        if mode == "kvpolicy":
            if not edited and t >= params.reload.at_s:
                policy = policy_from_text(swap_settings(text, *params.reload.swap, params.reload.fields))
                edited = True
            facts = Facts(now=t, gpus=(GpuFacts(id=gpu, capacity=capacity, other_used=0),), instances=(v4, *(
                InstanceFacts(id=f"{n}/0", model=n, gpu=gpu, elastic=ElasticFacts(used=s.used, mapped=s.mapped))
                for n, s in zip(params.tenants, sources)
            )))
            decision, state = evaluate(policy, facts, state)
            for name, source in zip(params.tenants, sources):
                d = decision.instance(f"{name}/0")
                if (d.limit, d.target) != (source.reading.limit, source.reading.target):
                    revision += 1
                    source.reading = LimitReading(d.limit, d.target, revision)
        t += step
    out = {}
    for name, engine, start in zip(params.tenants, engines, at_start):
        out[name] = engine.summary()
        m = engine.pool.mapping
        out[name].update(groups_mapped=m.groups_mapped, groups_unmapped=m.groups_unmapped, regrowths=m.regrowths,
                         groups_mapped_at_start=start, arenas=len(m.arenas))
        engine.pool.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(HERE / "cpu.toml"), help="parameter file (default: cpu.toml, the scaled geometry)")
    ap.add_argument("--duration-scale", type=float, default=1.0, metavar="F", help="multiply every duration of the trace by F")
    ap.add_argument("--give-back-delay", type=float, metavar="S", help="override engine.give_back_delay_s")
    ap.add_argument("--patience", type=float, help="override engine.patience_s (0: clients wait forever)")
    ap.add_argument("--no-old", action="store_true", help="skip the run with the old allocator behaviour (no hold, no reserve)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override an [engine] setting for the kvpolicy run (TOML value), e.g. give_back_hold_s=4")
    ap.add_argument("--pressure-scope", default="gpu", choices=("gpu", "entitled", "furthest", "furthest-entitled"),
                    help="who sees a refusal for the budget (the ledger today: gpu)")
    ap.add_argument("--chunk", metavar="SIZE", help="override kv.elastic_chunk for the kvpolicy run (e.g. '8 MiB')")
    ap.add_argument("--runs", default="static,kvpolicy-old,kvpolicy", help="which runs, comma-separated")
    ap.add_argument("--json", metavar="PATH", help="also write every run's per-tenant figures here")
    ap.add_argument("--runtime-reserved", type=int, help="the V4 pools' bytes (default: the plan's footprint for the reserve)")
    args = ap.parse_args()
    params = load_params(args.params).scaled(args.duration_scale)
    overrides: dict[str, object] = {}
    if args.patience is not None:
        overrides["patience_s"] = args.patience or None
    if args.give_back_delay is not None:
        overrides["give_back_delay_s"] = args.give_back_delay
    params = params.model_copy(update={"engine": params.engine.model_copy(update=overrides)})
    import tomllib

    sets = {k: v for k, v in (tomllib.loads(item).popitem() for item in args.set)}
    tuned = params.model_copy(update={"engine": type(params.engine).model_validate({**params.engine.model_dump(), **sets})})
    if args.chunk:
        tuned = tuned.model_copy(update={"kv": type(params.kv).model_validate({**params.kv.model_dump(), "elastic_chunk": args.chunk})})
    reserved = args.runtime_reserved
    if reserved is None:
        from dsv4 import planned, policy_reserve

        reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint
    # The old allocator behaviour (no hold, no reserve) beside the parameters', both against static.
    old = params.old_allocator()
    runs = {"static": (params, "static", "gpu"), "kvpolicy-old": (old, "kvpolicy", "gpu"),
            "kvpolicy": (tuned, "kvpolicy", args.pressure_scope)}
    wanted = args.runs.split(",")
    if args.no_old or old == tuned:
        wanted = [w for w in wanted if w != "kvpolicy-old"]
    runs = {k: v for k, v in runs.items() if k in wanted}
    results = {}
    for label, (p, mode, scope) in runs.items():
        results[label] = result = simulate(p, mode, reserved, scope)
        print(f"{label}: {sum(s['tokens'] for s in result.values()):,} tokens; " + "; ".join(
            f"{n} {s['tokens']:,} (completed {s['completed']}, abandoned {s['abandoned']}, preempted {s['preempted']})"
            for n, s in result.items()) + f"; {sum(s['groups_mapped'] for s in result.values()):,} chunk groups mapped")
    e = tuned.engine
    print(f"\n{params.name}: simulated clock, patience {e.patience_s} s; kvpolicy: give-back delay {e.give_back_delay_s} s, "
          f"hold {e.give_back_hold_s} s, reserve {e.reserve_blocks} blocks; kvpolicy-old: no hold, no reserve. "
          "Step times are the allocator's and scheduler's CPU time (no GPU work).\n")
    for label in runs:
        if label != "static" and "static" in results:
            print(ratio_table(ratios(results["static"], results[label]), label))
    print(serving_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"params": params.name, "engine": e.model_dump(), "scope": args.pressure_scope, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
