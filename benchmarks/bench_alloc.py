"""Benchmark of the elastic allocator against the raw driver, measured side by side in one run.

1. First growth: raw cuda-python cuMemCreate + cuMemMap + cuMemSetAccess per chunk (the
   physical limit) vs the arena's grow, one chunk per call and all chunks in one call,
   for 2, 8 and 32 MiB chunks. Goal: arena ≥ 0.9× raw.
2. Growth after a shrink: from the arena's handle pool (skips cuMemCreate) vs without
   it. Goal: pooled ≥ 1.25× the raw first-growth rate (the bound is ~1.39×).
3. ``alloc(k)`` + ``free(ids)`` on a block pool with no growth, µs per pair, for
   k = 1, 16, 256, the median of ``--runs`` runs (each a fresh pool; a host CPU drifts
   between runs). Goal: alloc(16) + free ≤ 5 µs median.
4. Driver work per token served: the co-location trace (``colocate/default.toml``, durations
   × ``--trace-scale``) replayed on the simulated clock (``colocate/simulate.py``: the real
   scheduler and pools, no GPU work) gives chunks mapped and unmapped per 1,000 output
   tokens, with the allocator's old give-back and with the parameters' settings, per
   chunk size; times this driver's µs per chunk mapped (arena batch growth) and unmapped
   (arena shrink), it is the driver time per 1,000 tokens. Goal (issue 17): the
   parameters' chunks per 1,000 tokens ≥ 3× fewer than the old give-back's at 2 MiB.

Rounds alternate raw and arena so drift hits both; each figure is the median over
rounds. Runs on the GPU (``--driver cuda``, the default when one is usable); on the host
driver it is a smoke test whose ratios say nothing about a GPU.

    python benchmarks/bench_alloc.py [--driver auto|cuda|host] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpolicy.alloc import Arena, BlockPool, Driver, KVCacheLayout, StaticLimit, open_driver
from kvpolicy.units import GiB, MiB

GOAL_FIRST_GROWTH = 0.9
GOAL_POOLED_GROWTH = 1.25
GOAL_ALLOC16_US = 5.0
GOAL_DRIVER_WORK_CUT = 3.0
COLOCATE = Path(__file__).resolve().parent / "colocate"


def raw_grow(driver: Driver, va: int, chunk: int, n: int) -> tuple[float, list[Any]]:
    """Time create + map + set access for ``n`` chunks straight through the driver API (no arena)."""
    if driver.kind == "cuda":
        cu = driver.bindings  # type: ignore[attr-defined]
        create, map_, access = cu.cuMemCreate, cu.cuMemMap, cu.cuMemSetAccess
        prop, desc = driver.allocation_prop, driver.access_descriptors  # type: ignore[attr-defined]
        handles = []
        t0 = time.perf_counter()
        for i in range(n):
            err, h = create(chunk, prop, 0)
            if err:
                raise RuntimeError(f"cuMemCreate: {err}")
            (err,) = map_(va + i * chunk, chunk, 0, h, 0)
            if err:
                raise RuntimeError(f"cuMemMap: {err}")
            (err,) = access(va + i * chunk, chunk, desc, 1)
            if err:
                raise RuntimeError(f"cuMemSetAccess: {err}")
            handles.append(h)
        return time.perf_counter() - t0, handles
    handles = []
    t0 = time.perf_counter()
    for i in range(n):
        h = driver.create(chunk)
        driver.map(va + i * chunk, chunk, h)
        driver.set_access(va + i * chunk, chunk)
        handles.append(h)
    return time.perf_counter() - t0, handles


def raw_round(driver: Driver, chunk: int, n: int) -> float:
    va = driver.reserve(n * chunk)
    try:
        seconds, handles = raw_grow(driver, va, chunk, n)
        for i, h in enumerate(handles):
            if driver.kind == "cuda":  # mapped around the Driver: undone around it too
                cu = driver.bindings  # type: ignore[attr-defined]
                (err,) = cu.cuMemUnmap(va + i * chunk, chunk)
                (err2,) = cu.cuMemRelease(h)
                if err or err2:
                    raise RuntimeError(f"cuMemUnmap/cuMemRelease: {err} {err2}")
            else:
                driver.unmap(va + i * chunk, chunk)
                driver.release(h)
    finally:
        driver.free_address(va, n * chunk)
    return seconds


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def arena_rounds(driver: Driver, chunk: int, n: int) -> dict[str, float]:
    """One round of each arena measurement, in seconds for ``n`` chunks."""
    out: dict[str, float] = {}
    with Arena(driver, n * chunk, chunk) as arena:
        out["arena_first"] = timed(lambda: [arena.map_chunks((i,)) for i in range(n)])
        arena.shrink(n, keep_handles=False)
        out["arena_batch"] = timed(lambda: arena.map_chunks(range(n)))
        out["arena_unmap"] = timed(lambda: arena.shrink(n, keep_handles=False))
        out["regrow_without_pool"] = timed(lambda: [arena.map_chunks((i,)) for i in range(n)])
    with Arena(driver, n * chunk, chunk, keep_handles=n) as arena:
        arena.grow(n)
        arena.shrink(n)  # every handle goes to the pool
        before = arena.calls.create
        out["regrow_from_pool"] = timed(lambda: [arena.map_chunks((i,)) for i in range(n)])
        arena.shrink(n)
        out["regrow_pool_batch"] = timed(lambda: arena.map_chunks(range(n)))
        assert arena.calls.create == before, "the pooled regrow called cuMemCreate"
    return out


def growth(driver: Driver, chunk: int, total: int, rounds: int) -> dict[str, Any]:
    n = max(8, total // chunk)
    raw_round(driver, chunk, n)  # warm-up: first-touch costs in the driver
    arena_rounds(driver, chunk, n)
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        samples.setdefault("raw", []).append(raw_round(driver, chunk, n))
        for key, seconds in arena_rounds(driver, chunk, n).items():
            samples.setdefault(key, []).append(seconds)
    row: dict[str, Any] = {"chunk": chunk, "chunks_per_round": n, "rounds": rounds}
    for key, values in samples.items():
        median = statistics.median(values)
        row[f"{key}_gibps"] = n * chunk / median / GiB
        row[f"{key}_us_per_chunk"] = median / n * 1e6
    raw = row["raw_gibps"]
    for key in ("arena_first", "arena_batch", "regrow_without_pool", "regrow_from_pool", "regrow_pool_batch"):
        row[f"{key}_vs_raw"] = row[f"{key}_gibps"] / raw
    return row


def alloc_free(driver: Driver, ks: list[int], iterations: int) -> list[dict[str, Any]]:
    layout = KVCacheLayout(num_layers=32, block_size=16, num_heads=8, head_dim=128, dtype="bfloat16")
    per_chunk = 2 * MiB // layout.block_stride
    need_blocks = 2 * max(ks)
    rows = []
    with BlockPool(driver, layout, 4 * need_blocks, chunk=2 * MiB, limit=StaticLimit(64 * GiB)) as pool:
        pool.free(pool.alloc(need_blocks))  # map enough chunks up front: the loop never grows
        calls = pool.arenas[0].calls.copy()
        for k in ks:
            alloc, free = pool.alloc, pool.free
            clock = time.perf_counter_ns
            for _ in range(200):  # warm-up
                free(alloc(k))
            n = iterations if k <= 16 else max(1000, iterations // 8)
            samples = []
            for _ in range(n):
                t0 = clock()
                ids = alloc(k)
                free(ids)
                samples.append(clock() - t0)
            samples.sort()
            rows.append(
                {
                    "k": k,
                    "iterations": n,
                    "median_us": samples[n // 2] / 1e3,
                    "p90_us": samples[n * 9 // 10] / 1e3,
                    "per_block_us": samples[n // 2] / 1e3 / k,
                }
            )
        assert pool.arenas[0].calls == calls, "the alloc/free loop touched the driver"
        rows.append({"blocks_per_chunk": per_chunk, "arenas": len(pool.arenas)})
    return rows


def alloc_free_runs(driver: Driver, ks: list[int], iterations: int, runs: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``alloc_free`` ``runs`` times, each on a fresh pool: per k the median of the runs' medians and p90s (a
    host CPU's speed drifts between runs more than within one; the goal is on the median run)."""
    per_run = [alloc_free(driver, ks, iterations) for _ in range(runs)]
    shape = per_run[0][-1]
    rows = []
    for i, k in enumerate(ks):
        medians = [run[i]["median_us"] for run in per_run]
        median = statistics.median(medians)
        rows.append({
            "k": k,
            "iterations": per_run[0][i]["iterations"],
            "runs": runs,
            "median_us": median,
            "p90_us": statistics.median(run[i]["p90_us"] for run in per_run),
            "per_block_us": median / k,
            "run_medians_us": medians,
        })
    return rows, shape


def params_chunk() -> int:
    """The chunk size the co-location parameters (``colocate/default.toml``) use."""
    if str(COLOCATE) not in sys.path:
        sys.path.append(str(COLOCATE))
    from params import load_params  # type: ignore[import-not-found]

    return int(load_params(COLOCATE / "default.toml").kv.elastic_chunk_bytes)


def driver_work_per_token(grow_rows: list[dict[str, Any]], scale: float) -> list[dict[str, Any]]:
    """Per chunk size of ``grow_rows`` and allocator setting (old give-back, the parameters'):
    chunks mapped and unmapped per 1,000 tokens on the simulated co-location trace, and the
    driver time they cost at the µs per chunk measured in ``grow_rows``."""
    if str(COLOCATE) not in sys.path:
        sys.path.append(str(COLOCATE))
    from dsv4 import planned, policy_reserve  # type: ignore[import-not-found]
    from params import load_params  # type: ignore[import-not-found]
    from report import driver_work_per_1k, pooled  # type: ignore[import-not-found]
    from simulate import simulate  # type: ignore[import-not-found]

    params = load_params(COLOCATE / "default.toml").scaled(scale)
    reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint
    rows = []
    for g in grow_rows:
        kv = params.kv.model_copy(update={"elastic_chunk": g["chunk"]})
        for label, p in (("old", params.old_allocator()), ("params", params)):
            tenants = simulate(p.model_copy(update={"kv": kv}), "kvpolicy", reserved)  # both settings at this chunk
            works = [driver_work_per_1k(t) for t in tenants.values()]
            tokens = sum(t["tokens"] for t in tenants.values())
            mapped = sum(w[0] * t["tokens"] for w, t in zip(works, tenants.values()) if w) / tokens
            unmapped = sum(w[1] * t["tokens"] for w, t in zip(works, tenants.values()) if w) / tokens
            rows.append({
                "chunk": g["chunk"], "allocator": label, "tokens": tokens, "preempted": pooled(tenants)["preempted"],
                "mapped_per_1k_tokens": mapped, "unmapped_per_1k_tokens": unmapped,
                "driver_ms_per_1k_tokens": (mapped * g["arena_batch_us_per_chunk"] + unmapped * g["arena_unmap_us_per_chunk"]) / 1000,
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=["auto", "cuda", "host"], default="auto")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and bytes (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per growth figure (default 7, quick 3)")
    parser.add_argument("--total-mib", type=int, default=None, help="bytes per round (default 2048 MiB, quick 256)")
    parser.add_argument("--runs", type=int, default=5, help="alloc/free runs, the figure is their median (default 5)")
    parser.add_argument("--trace-scale", type=float, default=None,
                        help="durations of the co-location trace replayed for the per-token figure (default 0.125, quick 0.05; 0: skip it)")
    args = parser.parse_args(argv)

    rounds = args.rounds or (3 if args.quick else 7)
    total = (args.total_mib or (256 if args.quick else 2048)) * MiB
    driver = open_driver(args.driver, host_capacity=4 * total + 8 * GiB)
    print(f"driver: {driver!r}  python {platform.python_version()}  rounds {rounds}  bytes/round {total // MiB} MiB")

    grow_rows = [growth(driver, chunk * MiB, total, rounds) for chunk in (2, 8, 32)]
    print()
    print("first growth and regrowth, GiB/s (× raw driver rate in the same run)")
    header = ["chunk", "raw c+m+a", "arena batch", "arena/chunk", "regrow pool", "pool/chunk", "regrow nopool", "raw µs/chunk"]
    print("  ".join(f"{h:>15}" for h in header))
    for r in grow_rows:
        cells = [f"{r['chunk'] // MiB} MiB", f"{r['raw_gibps']:.1f}"]
        for key in ("arena_batch", "arena_first", "regrow_pool_batch", "regrow_from_pool", "regrow_without_pool"):
            cells.append(f"{r[key + '_gibps']:.1f} ({r[key + '_vs_raw']:.2f}×)")
        cells.append(f"{r['raw_us_per_chunk']:.1f}")
        print("  ".join(f"{c:>15}" for c in cells))

    af, shape = alloc_free_runs(driver, [1, 16, 256], 2_000 if args.quick else 20_000, args.runs)
    print()
    print(f"alloc(k) + free(ids), no growth ({shape['arenas']} arenas, {shape['blocks_per_chunk']} blocks per chunk; "
          f"median of {args.runs} runs, each run's median in brackets)")
    print(f"{'k':>6}  {'median µs':>10}  {'p90 µs':>10}  {'µs/block':>10}  runs")
    for r in af:
        runs = " ".join(f"{m:.2f}" for m in r["run_medians_us"])
        print(f"{r['k']:>6}  {r['median_us']:>10.2f}  {r['p90_us']:>10.2f}  {r['per_block_us']:>10.3f}  [{runs}]")

    scale = 0.05 if args.quick and args.trace_scale is None else (0.125 if args.trace_scale is None else args.trace_scale)
    work = driver_work_per_token(grow_rows, scale) if scale > 0 else []
    if work:
        print()
        print(f"driver work per 1,000 tokens served (co-location trace × {scale:g} on the simulated clock; µs per chunk from above)")
        print(f"{'chunk':>8}  {'allocator':>9}  {'tokens':>9}  {'preempted':>9}  {'mapped':>8}  {'unmapped':>8}  {'driver ms':>9}")
        for w in work:
            print(f"{w['chunk'] // MiB:>4} MiB  {w['allocator']:>9}  {w['tokens']:>9,}  {w['preempted']:>9}  "
                  f"{w['mapped_per_1k_tokens']:>8.1f}  {w['unmapped_per_1k_tokens']:>8.1f}  {w['driver_ms_per_1k_tokens']:>9.2f}")

    goals = {
        # A block pool grows by mapping all the chunks it needs in one map_chunks call per
        # arena: the batch columns are its growth; the per-chunk columns are the worst case.
        "first_growth_ge_0.9x_raw": all(r["arena_batch_vs_raw"] >= GOAL_FIRST_GROWTH for r in grow_rows),
        "pooled_growth_ge_1.25x_raw": all(r["regrow_pool_batch_vs_raw"] >= GOAL_POOLED_GROWTH for r in grow_rows),
        "alloc16_free_le_5us_median": next(r for r in af if r["k"] == 16)["median_us"] <= GOAL_ALLOC16_US,
    }
    if work:
        def chunks(w: dict[str, Any]) -> float:
            return w["mapped_per_1k_tokens"] + w["unmapped_per_1k_tokens"]

        old = next(w for w in work if w["allocator"] == "old" and w["chunk"] == 2 * MiB)
        new = next(w for w in work if w["allocator"] == "params" and w["chunk"] == params_chunk())
        goals["driver_work_per_token_cut_ge_3x"] = chunks(new) * GOAL_DRIVER_WORK_CUT <= chunks(old)
    print()
    for name, ok in goals.items():
        print(f"goal {name}: {'met' if ok else 'NOT met'}")
    if driver.kind != "cuda":
        print("(host driver: growth ratios are a smoke test, not GPU figures)")

    if args.json:
        result = {
            "driver": driver.kind,
            "device": driver.name,
            "python": platform.python_version(),
            "growth": grow_rows,
            "alloc_free": af,
            "alloc_free_shape": shape,
            "driver_work_per_token": work,
            "goals": goals,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
