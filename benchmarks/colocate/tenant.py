"""One tenant process: a serving engine with an elastic (or static) KV block pool, following its trace.

Started by the driver (``colocate.py``); talks to it over stdin/stdout, one line each:
``loaded`` once its imports and trace are ready; then it waits for ``build`` (the driver
sends it once the DeepSeek-V4 pools exist and, in kvpolicy mode, the controller runs),
builds its pool, views and warmed-up kernels and says ``ready {json}``; then it
waits for ``go T0`` (wall-clock seconds) and serves its requests from T0 until its
clock (``clock.py``: real time, or a step count) reaches the trace's end, one engine
step at most every ``step_ms``; it says ``reload-time`` when its clock passes the
policy edit's time. At the end it checks the KV of the requests still running, writes
its result JSON, closes its pool, detaches from the ledger and prints ``done``.

- static mode: the pool maps its fixed share up front under a ``StaticLimit`` (as
  engines size their KV cache at start-up today); no ledger.
- kvpolicy mode: the tenant attaches to the ledger (engine ``any``, its guarantee from
  the policy) and the pool's limit source is the ledger instance, so the controller's
  limits and targets govern it; it maps its guarantee at start and keeps it; it reports
  activity (``touch``) in every step that serves something.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from clock import TraceClock
from params import Params, load_params
from traces import requests_for


def is_oom(exc: BaseException) -> bool:
    from kvpolicy.alloc.errors import DeviceOutOfMemory

    if isinstance(exc, DeviceOutOfMemory):
        return True
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def build_pool(params: Params, mode: str, name: str, guarantee: int, ledger_dir: str | None, clock: TraceClock):
    """The driver, the limit source and the block pool of this tenant (static: fully mapped).

    The pool's give-back delay is measured on the tenant's trace clock."""
    import torch

    from kvpolicy.alloc import BlockPool, StaticLimit, open_driver

    kv = params.kv
    if params.device.driver == "cuda":
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")  # the primary context exists before the driver uses it
        driver = open_driver("cuda", device=0)
    else:
        torch.set_num_threads(1)  # several tenants share the CPU: one thread each, no oversubscription
        driver = open_driver("host", host_capacity=params.device.host_capacity)
    inst = None
    if mode == "static":
        limit = StaticLimit(params.budget.static_share)
        pool = BlockPool(driver, kv.layout, params.static_blocks, chunk=kv.chunk, limit=limit, name=name)
        pool.ensure_mapped(range(pool.num_blocks))
    else:
        import kvpolicy

        inst = kvpolicy.attach(
            model=name, gpu=params.device.ledger_id, engine="any", id=f"{name}/0", guarantee=guarantee,
            elastic=True, ledger_dir=ledger_dir,
        )
        source = inst.limit_source()
        deadline = time.monotonic() + 60
        # Elastic admission needs the controller's figures, and a limit computed for an elastic instance.
        while (reading := source.read()).revision == 0 or reading.limit == 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"tenant {name}: no limit published within 60 s; is the controller running?")
            time.sleep(0.01)
        pool = BlockPool(
            driver, kv.layout, params.elastic_blocks, chunk=kv.elastic_chunk_bytes, limit=source, name=name,
            give_back_under_pressure=params.engine.give_back_under_pressure,
            give_back_delay_s=params.engine.give_back_delay_s, give_back_hold_s=params.engine.give_back_hold_s,
            reserve_blocks=params.engine.reserve_blocks,
            pressure_keeps_reserve=params.engine.pressure_keeps_reserve, yield_above_target_s=params.engine.yield_above_target_s,
            give_back_chunks_per_sync=params.engine.driver_chunks_between_steps, clock=clock.now,
        )
        # The guarantee is this tenant's: it maps it now and keeps it (the pool never gives back memory
        # below its target or a rule's `shrink to min`, both ≥ the guarantee). The ledger's admission
        # checks each instance's limit and the GPU's budget, not the unused guarantees of the others,
        # so a guarantee left unmapped could be taken by two neighbours growing at once.
        pool.ensure_mapped(range(guarantee // pool.block_bytes))
    return driver, inst, pool


def driver_work(mapping, at_start: int) -> dict[str, int]:
    """Chunk groups mapped and unmapped, and give-back/regrow cycles, over the pool's life; the groups
    mapped at start-up (the static share, or the guarantee), and the chunks a group is (one per arena)."""
    return {"groups_mapped": mapping.groups_mapped, "groups_unmapped": mapping.groups_unmapped,
            "regrowths": mapping.regrowths, "groups_mapped_at_start": at_start, "arenas": len(mapping.arenas)}


def warm_up(work, pool) -> None:
    """Run each kind of GPU work once so that no kernel is compiled or loaded inside the timed window."""
    from kvwork import block_key

    ids = pool.alloc(2)
    keys = [block_key(0, i) for i in range(2)]
    work.write(ids, keys)
    work.attend([__import__("numpy").array(ids)], [2 * work.block_tokens - 1])
    bad = work.check(ids, keys)
    assert not any(bad), f"warm-up blocks {ids} did not read back as written: {bad}"
    pool.free(ids)
    work.synchronize()


class Recorder:
    """Samples of the pool over time, every revision the pool saw, and the peak it held."""

    def __init__(self, pool, every: float) -> None:
        self.pool = pool
        self.every = every
        self.samples: list[list[float]] = []
        self.revisions: list[dict[str, Any]] = []
        self.peak = 0
        self._next = 0.0
        self._rev = -1
        self._deferred = False

    COLUMNS = ("t", "held", "used", "limit", "target", "revision", "running", "waiting")

    def after_step(self, t: float, stats, engine) -> None:
        self.peak = max(self.peak, stats.held_bytes)
        if stats.revision != self._rev or stats.deferred != self._deferred:
            self._rev, self._deferred = stats.revision, stats.deferred
            self.revisions.append({
                "at": time.time(), "revision": stats.revision, "deferred": stats.deferred,
                "held": stats.held_bytes, "limit": stats.limit, "target": stats.target,
            })
        if t >= self._next:
            self._next = t + self.every
            self.samples.append([
                round(t, 4), stats.held_bytes, stats.used_bytes, stats.limit, stats.target, stats.revision,
                len(engine.running), len(engine.waiting),
            ])


def serve(params: Params, engine, recorder: Recorder, inst, clock: TraceClock, t0: float) -> None:
    """Follow the trace from wall-clock time ``t0`` until the tenant's clock reaches its end.

    One step at most every ``step_ms`` of wall time (``clock`` says how trace time
    advances); the last step is at or after the trace's end, so every request of the
    trace has arrived. When the clock passes the policy edit's time the tenant says
    ``reload-time`` (the driver edits once every tenant has); on the ``steps`` clock a
    kvpolicy tenant then waits for ``resume``, sent once the controller has published
    the edit, so the edit lands at the same trace time on any machine.
    """
    step = params.engine.step_ms / 1000
    duration, reload_at = params.trace.duration_s, params.reload.at_s
    clock.start(t0)
    delay = t0 - time.time()
    if delay > 0:
        time.sleep(delay)
    next_step = time.monotonic()
    announced = False
    while True:
        now = clock.now()
        engine.step(now)
        clock.tick()
        if inst is not None and (engine.running or engine.waiting):
            inst.touch()
        recorder.after_step(now, engine.last_stats, engine)
        if not announced and now >= reload_at:
            print("reload-time", flush=True)
            announced = True
            if clock.kind == "steps" and inst is not None:  # kvpolicy mode: the edit is published at this trace time
                if sys.stdin.readline().strip() != "resume":
                    raise SystemExit("tenant: expected 'resume' on stdin after 'reload-time'")
                next_step = time.monotonic()
        if now >= duration:
            break
        next_step = max(next_step + step, time.monotonic())  # a late step is not made up for by a burst
        delay = next_step - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("--mode", choices=("static", "kvpolicy"), required=True)
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--guarantee", type=int, default=0)
    ap.add_argument("--ledger-dir")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true", help="time each phase's GPU work (engine.Engine's profile)")
    ap.add_argument("--old-allocator", action="store_true", help="kvpolicy mode with the allocator's old give-back (Params.old_allocator)")
    args = ap.parse_args()
    params = load_params(args.params).scaled(args.scale)
    if args.old_allocator:
        params = params.old_allocator()
    name = params.tenants[args.index]

    import numpy  # noqa: F401  (fail here, before anything is built, if it is missing)
    import torch  # noqa: F401 - the same, for torch
    from engine import Engine
    from kvwork import KVWork, describe_device

    requests = requests_for(params.trace, args.index)
    print("loaded", flush=True)
    if sys.stdin.readline().strip() != "build":
        print(f"tenant {name}: expected 'build' on stdin", file=sys.stderr)
        return 2
    started = time.time()
    clock = TraceClock(params.engine.clock, params.engine.step_ms / 1000)
    driver, inst, pool = build_pool(params, args.mode, name, args.guarantee, args.ledger_dir, clock)
    kv = params.kv
    work = KVWork(pool, attn_layers=kv.attn_layers, max_batch=params.engine.max_running, window=kv.attn_max_blocks,
                  max_tokens=kv.attn_max_tokens, seed=args.index, attention=kv.attention)
    warm_up(work, pool)
    mapped_at_start = pool.mapping.groups_mapped
    engine = Engine(
        pool, work, requests,
        block_tokens=kv.block_tokens, max_request_blocks=params.max_request_blocks,
        prefill_tokens_per_step=params.engine.prefill_tokens_per_step, max_running=params.engine.max_running,
        patience_s=params.engine.patience_s, is_oom=is_oom, profile=args.profile, token_clock=clock.now,
        slo_ttft_s=params.engine.slo_ttft_s, slo_gap_s=params.engine.slo_gap_ms / 1000,
        map_between_steps=params.engine.map_between_steps, check_between_steps=params.engine.check_between_steps,
        kv_bytes_bound=params.budget.static_share, driver_chunks_between_steps=params.engine.driver_chunks_between_steps,
    )
    engine.last_stats = pool.sync()
    recorder = Recorder(pool, params.engine.sample_every_s)
    setup_s = time.time() - started
    print("ready " + json.dumps({"name": name, "setup_s": round(setup_s, 3), "held": pool.held_bytes}), flush=True)

    line = sys.stdin.readline().split()
    if not line or line[0] != "go":
        print(f"tenant {name}: expected 'go T0' on stdin, got {line!r}", file=sys.stderr)
        return 2
    t0 = float(line[1])
    serve(params, engine, recorder, inst, clock, t0)
    served_wall_s = time.time() - t0
    engine.finish()
    work.synchronize()

    result: dict[str, Any] = {
        "name": name,
        "index": args.index,
        "mode": args.mode,
        "t0": t0,
        "setup_s": setup_s,
        "summary": engine.summary(),
        "clock": {"kind": clock.kind, "steps": clock.steps, "trace_s": round(clock.now(), 6), "wall_s": round(served_wall_s, 3)},
        "peak_held": recorder.peak,
        "released_under_pressure": pool.released_under_pressure,
        "driver_work": driver_work(pool.mapping, mapped_at_start),
        "samples": {"columns": Recorder.COLUMNS, "rows": recorder.samples},
        "revisions": recorder.revisions,
        "pool": {
            "num_blocks": pool.num_blocks, "block_bytes": pool.block_bytes, "group_bytes": pool.group_bytes,
            "arenas": len(pool.arenas), "driver": driver.kind, "calls": pool.calls.as_dict(),
        },
        "device": describe_device(work.device) if args.index == 0 else None,
    }
    if inst is not None:
        slot = inst.snapshot()
        # The ledger counts what admission let through; the pool counts what it holds: they must agree.
        result["ledger_check"] = {"ledger_mapped": slot.mapped, "ledger_pending": slot.pending, "pool_held": pool.held_bytes}
    del work  # views over the arenas go before the arenas
    pool.close()
    if inst is not None:
        result["ledger_check"]["ledger_mapped_after_close"] = inst.snapshot().mapped
        inst.detach()
    Path(args.out).write_text(json.dumps(result))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
