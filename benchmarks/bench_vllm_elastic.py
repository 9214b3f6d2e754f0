"""Benchmark of vLLM's block pool on the elastic allocator against vLLM's stock pool, measured in one run.

1. Steady-state block allocation: one "step" = 32 decode allocations of one block
   (``get_new_blocks(1)``, each preceded by the elastic allocation check ``make_room``),
   then the step's blocks freed in reverse (``free_blocks``) and, for the elastic pool,
   ``on_step`` (mirror, limit check, activity). Nothing grows: the elastic pool's memory
   is already mapped, as in a warmed-up engine. Stock = vLLM 0.33's own ``BlockPool``
   doing the same calls. Goal: elastic ≤ 1.2× stock per step.
2. Memory an idle engine holds: the elastic pool after its requests finished and the
   target fell to its guarantee, against the stock buffer vLLM allocates for the same
   capacity (measured with cuMemGetInfo on a GPU; on the host driver, the simulated
   device memory, and the stock figure is the buffer size). Goal: ≤ guarantee + the
   chunks pinned for the null block ("one chunk per layer group").
3. Giving memory back after a lowered limit: the pool holds G of free (prefix-cached)
   blocks; the limit drops to 0 and the time until ``on_step`` has unmapped it all
   (evictions, device synchronisation, cuMemUnmap/cuMemRelease) is measured; also the
   growth of the same G from nothing (admission, cuMemCreate/Map/SetAccess, zero fill).
4. A bounded give-back: the pool holds G of free (prefix-cached) blocks and its target
   falls to 0, its limit unchanged (an engine gone quiet); ``on_step`` runs until all of
   G is back. Unbounded, one step does it all; with ``give_back_chunks`` N
   (``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS``) at most N chunks a step. Reported per bound:
   the longest step, the steps it took and their total time — what one step waits for
   against how long the memory takes to go back.

Geometry: Qwen3-8B in the BLHNC layout (2.25 MiB blocks of 16 tokens). Rounds alternate
stock and elastic; figures are medians. On the host driver the ratios of (1) are
meaningful (both are Python bookkeeping); (2) and (3) describe the simulation only.

    python benchmarks/bench_vllm_elastic.py [--driver auto|cuda|host] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

from kvpolicy.alloc import Driver, StaticLimit, open_driver
from kvpolicy.units import GiB, MiB

BLOCK_TOKENS = 16
BPB = 36 * 8 * 128 * 2 * 2 * BLOCK_TOKENS  # Qwen3-8B, bf16, BLHNC: 2.25 MiB
GOAL_STEADY_RATIO = 1.2
DECODES_PER_STEP = 32


def _pools(
    driver: Driver, num_blocks: int, chunk: int, limit: StaticLimit, give_back_chunks: int | None = None
) -> tuple[Any, Any, Any]:
    """(vLLM's BlockPool, the ElasticPool beside it, the ElasticKVBuffer)."""
    from kvpolicy.adapters.vllm_adapter.elastic.buffer import ElasticKVBuffer, pinned_chunks
    from kvpolicy.adapters.vllm_adapter.elastic.pool import ElasticPool
    from vllm.v1.core.block_pool import BlockPool

    buffer = ElasticKVBuffer(
        driver, num_blocks=num_blocks, bytes_per_block=BPB, chunk=chunk, limit=limit,
        pinned=pinned_chunks(BPB, chunk) * chunk, grow_chunks=max(1, 16 * MiB // chunk),
        give_back_chunks=give_back_chunks,
    )
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=BLOCK_TOKENS)
    elastic = ElasticPool.adopt(pool, buffer, give_back_interval=1.0, report_interval=1.0)
    return pool, elastic, buffer


def _step(pool: Any, elastic: Any | None) -> None:
    """One step on vLLM's ``pool``; with ``elastic`` (the ElasticPool beside it), its hook and ``on_step`` too."""
    got = []
    get = pool.get_new_blocks
    for _ in range(DECODES_PER_STEP):
        if elastic is not None and pool.free_block_queue.num_free_blocks < 1:  # the allocation check's hook
            elastic.make_room(1)
        got += get(1)
    pool.free_blocks(reversed(got))
    if elastic is not None:
        elastic.on_step(active=True)


def steady_state(driver: Driver, rounds: int, steps: int) -> dict[str, float]:
    from vllm.v1.core.block_pool import BlockPool

    limit = StaticLimit(4 * GiB)
    pool, elastic, buffer = _pools(driver, 4096, 2 * MiB, limit)
    stock = BlockPool(4096, enable_caching=True, hash_block_size=BLOCK_TOKENS)
    try:
        assert elastic.make_room(512)  # warm: 512 blocks mapped, so the loop never grows
        held = buffer.mapping.held_bytes
        times: dict[str, list[float]] = {"stock": [], "elastic": []}
        for _ in range(rounds):
            for name, vllm_pool, ours in (("stock", stock, None), ("elastic", pool, elastic)):
                t0 = time.perf_counter()
                for _ in range(steps):
                    _step(vllm_pool, ours)
                times[name].append((time.perf_counter() - t0) / steps)
        assert buffer.mapping.held_bytes == held, "the steady-state loop grew or shrank the pool"
        s, e = statistics.median(times["stock"]), statistics.median(times["elastic"])
        return {
            "stock_us_per_step": s * 1e6,
            "elastic_us_per_step": e * 1e6,
            "stock_us_per_block": s * 1e6 / DECODES_PER_STEP,
            "elastic_us_per_block": e * 1e6 / DECODES_PER_STEP,
            "ratio": e / s,
        }
    finally:
        buffer.close()


def manager_steady_state(driver: Driver, rounds: int, steps: int) -> dict[str, Any]:
    """vLLM's KVCacheManager.allocate_slots (what the scheduler calls), stock vs elastic, decode with turnover.

    Needs vLLM's whole package (Request, KVCacheManager); skipped with the minimal one.
    """
    try:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
        from vllm.v1.request import Request
    except Exception as exc:  # noqa: BLE001 - the minimal vLLM package (GPU machine): not carried
        return {"skipped": f"needs vLLM's full package ({type(exc).__name__}: {exc})"}
    from kvpolicy.adapters.vllm_adapter.elastic.buffer import ElasticKVBuffer, pinned_chunks
    from kvpolicy.adapters.vllm_adapter.elastic.pool import bind_scheduler

    init_none_hash(sha256)
    num_blocks = 4096
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(36)]
    spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    assert spec.page_size_bytes * 36 == BPB

    def config() -> Any:
        tensor = KVCacheTensor(size=num_blocks * BPB, layers=layers, layer_stride=spec.page_size_bytes, block_stride=BPB)
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                             kv_cache_groups=[KVCacheGroupSpec(layers, spec)], kv_cache_layout="BLHNC")

    def manager() -> Any:
        return KVCacheManager(config(), max_model_len=2048, scheduler_block_size=BLOCK_TOKENS,
                              hash_block_size=BLOCK_TOKENS, enable_caching=True)

    stock = manager()
    elastic = manager()
    limit = StaticLimit(4 * GiB)
    buffer = ElasticKVBuffer(driver, num_blocks=num_blocks, bytes_per_block=BPB, chunk=2 * MiB, limit=limit,
                             pinned=pinned_chunks(BPB, 2 * MiB) * 2 * MiB, grow_chunks=8)
    pool = bind_scheduler(elastic, buffer, give_back_interval=1.0, report_interval=1.0)
    hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
    try:
        assert pool.make_room(1024)

        def run(m: Any, seed: int) -> float:
            import random

            rng = random.Random(seed)
            running: list[Any] = []
            n = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                while len(running) < DECODES_PER_STEP:
                    req = Request(f"r{n}", [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 200))],
                                  SamplingParams(max_tokens=64), None, block_hasher=hasher)
                    n += 1
                    assert m.allocate_slots(req, req.num_tokens) is not None
                    req.num_computed_tokens = req.num_tokens
                    running.append(req)
                for req in list(running):
                    req.append_output_token_ids(rng.randrange(1, 30000))
                    assert m.allocate_slots(req, 1) is not None
                    req.num_computed_tokens += 1
                    if req.num_output_tokens >= 64:
                        m.free(req)
                        running.remove(req)
                if m is elastic:
                    pool.on_step(active=True)
            elapsed = time.perf_counter() - t0
            for req in running:
                m.free(req)
            return elapsed / steps

        times: dict[str, list[float]] = {"stock": [], "elastic": []}
        for r in range(rounds):
            times["stock"].append(run(stock, r))
            times["elastic"].append(run(elastic, r))
        s, e = statistics.median(times["stock"]), statistics.median(times["elastic"])
        return {"stock_us_per_step": s * 1e6, "elastic_us_per_step": e * 1e6, "ratio": e / s,
                "grown_blocks": pool.grown_blocks}
    finally:
        buffer.close()


def _free_now(driver: Driver) -> int:
    if driver.kind == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return driver.mem_info()[0]
    return driver.capacity - driver.in_use  # type: ignore[attr-defined]


def idle_memory(driver: Driver, capacity: int, guarantee: int, chunk: int) -> dict[str, float]:
    """Memory held by an idle engine: elastic (target = guarantee) vs the stock buffer for the same capacity."""
    num_blocks = capacity // BPB
    base = _free_now(driver)
    limit = StaticLimit(capacity, capacity)
    pool, elastic, buffer = _pools(driver, num_blocks, chunk, limit)
    try:
        assert elastic.make_room(num_blocks // 4)  # it served requests: a quarter of its capacity mapped
        blocks = pool.get_new_blocks(num_blocks // 4)
        pool.free_blocks(reversed(blocks))
        elastic.on_step(active=True)
        busy = base - _free_now(driver)
        limit.set(capacity, guarantee)  # idle: the controller's target falls to the guarantee
        elastic.on_step(active=False)
        idle = base - _free_now(driver)
        pinned = buffer.pinned
    finally:
        buffer.close()
    stock = num_blocks * BPB
    if driver.kind == "cuda":
        import torch

        before = _free_now(driver)
        t = torch.zeros(stock, dtype=torch.int8, device=f"cuda:{driver.device}")  # what vLLM allocates
        stock = before - driver.mem_info()[0]
        del t
    return {
        "capacity_bytes": capacity,
        "guarantee_bytes": guarantee,
        "chunk_bytes": chunk,
        "pinned_chunks": pinned // chunk,
        "elastic_busy_bytes": busy,
        "elastic_idle_bytes": idle,
        "stock_bytes": stock,
        "idle_over_goal_bytes": idle - (guarantee + pinned),
        "goal_met": idle <= guarantee + pinned,
    }


def _cached_and_free(pool: Any, elastic: Any, size: int) -> float:
    """Grow ``size`` of blocks into the pool and leave them free and prefix-cached; the growth's seconds."""
    n = size // BPB
    t0 = time.perf_counter()
    assert elastic.make_room(n), "could not grow"
    grown = time.perf_counter() - t0
    blocks = pool.get_new_blocks(n)
    hashes = [bytes([i % 256, i // 256]) * 16 for i in range(n)]
    pool.cache_full_blocks(_Hashed(hashes), blocks, 0, n, BLOCK_TOKENS, 0)
    pool.free_blocks(reversed(blocks))  # free, still in the prefix cache
    elastic.on_step(active=False)
    return grown


def give_back(driver: Driver, size: int, chunk: int, rounds: int) -> dict[str, float]:
    """Grow ``size`` of blocks, make them free prefix-cached blocks, lower the limit to 0, time the give-back."""
    grow_t, back_t = [], []
    num_blocks = 2 * size // BPB
    for _ in range(rounds):
        limit = StaticLimit(size + 2 * chunk, size + 2 * chunk)
        pool, elastic, buffer = _pools(driver, num_blocks, chunk, limit)
        try:
            grow_t.append(_cached_and_free(pool, elastic, size))
            held = buffer.mapping.held_bytes
            limit.set(0, 0)
            t0 = time.perf_counter()
            elastic.on_step(active=False)
            back_t.append(time.perf_counter() - t0)
            assert buffer.mapping.held_bytes == buffer.pinned, "not everything went back"
            assert len(pool.cached_block_hash_to_block) == 0, "cached blocks of unmapped chunks must be evicted"
            released = held - buffer.pinned
        finally:
            buffer.close()
    g, b = statistics.median(grow_t), statistics.median(back_t)
    return {
        "bytes": released,
        "chunk_bytes": chunk,
        "grow_seconds": g,
        "grow_gib_per_s": released / g / GiB,
        "give_back_seconds": b,
        "give_back_gib_per_s": released / b / GiB,
    }


def bounded_give_back(driver: Driver, size: int, chunk: int, bound: int | None, rounds: int) -> dict[str, Any]:
    """``size`` of free cached blocks above a target that falls to 0 (the limit stays): every step's
    ``on_step`` timed until all of it is back, with at most ``bound`` chunks a give-back."""
    longest, steps, total = [], [], []
    num_blocks = 2 * size // BPB
    for _ in range(rounds):
        limit = StaticLimit(size + 2 * chunk, size + 2 * chunk)
        pool, elastic, buffer = _pools(driver, num_blocks, chunk, limit, give_back_chunks=bound)
        try:
            _cached_and_free(pool, elastic, size)
            limit.set(size + 2 * chunk, 0)  # a new revision: the first give-back is due at once
            times = []
            while buffer.mapping.held_bytes > buffer.pinned:
                t0 = time.perf_counter()
                elastic.on_step(active=False)
                times.append(time.perf_counter() - t0)
                assert len(times) <= size // chunk + 1, "the give-back stopped above the target"
        finally:
            buffer.close()
        longest.append(max(times))
        steps.append(len(times))
        total.append(sum(times))
    return {
        "bytes": size,
        "chunk_bytes": chunk,
        "bound_chunks": bound,
        "longest_step_seconds": statistics.median(longest),
        "steps": statistics.median(steps),
        "total_seconds": statistics.median(total),
    }


class _Hashed:
    """What ``BlockPool.cache_full_blocks`` reads of a request without events: its block hashes."""

    def __init__(self, hashes: list[bytes]) -> None:
        self.block_hashes = hashes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", choices=("auto", "cuda", "host"), default="auto")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    args = ap.parse_args(argv)
    driver = open_driver(args.driver, host_capacity=24 * GiB)
    if driver.kind == "cuda":
        import torch

        torch.cuda.init()
    rounds, steps = (3, 200) if args.quick else (7, 2000)
    results: dict[str, Any] = {
        "driver": driver.kind,
        "device": driver.name,
        "python": platform.python_version(),
        "block_bytes": BPB,
    }
    try:
        results["steady_state"] = steady = steady_state(driver, rounds, steps)
        print(f"{'driver':<28}{driver.kind} ({driver.name})")
        print(f"steady state, µs per step of {DECODES_PER_STEP} decode blocks (alloc + free + on_step):")
        print(f"  stock vLLM BlockPool       {steady['stock_us_per_step']:9.1f}  ({steady['stock_us_per_block']:.2f}/block)")
        print(f"  elastic                    {steady['elastic_us_per_step']:9.1f}  ({steady['elastic_us_per_block']:.2f}/block)")
        print(f"  ratio elastic/stock        {steady['ratio']:9.2f}  (goal ≤ {GOAL_STEADY_RATIO})")
        results["manager_steady_state"] = mgr = manager_steady_state(driver, rounds, max(50, steps // 10))
        if "skipped" in mgr:
            print(f"KVCacheManager.allocate_slots: skipped ({mgr['skipped'][:60]}...)")
        else:
            print(
                f"KVCacheManager.allocate_slots, µs per step of {DECODES_PER_STEP} decodes with turnover: stock "
                f"{mgr['stock_us_per_step']:.0f}, elastic {mgr['elastic_us_per_step']:.0f}, ratio {mgr['ratio']:.2f}"
            )
        cap = 2 * GiB if args.quick else 8 * GiB
        idle = []
        for chunk in (2 * MiB, 4 * MiB):
            fig = idle_memory(driver, cap, 256 * MiB, chunk)
            idle.append(fig)
            print(
                f"idle engine, {cap // GiB} GiB capacity, guarantee 256 MiB, chunk {chunk // MiB} MiB: "
                f"elastic {fig['elastic_idle_bytes'] / MiB:.0f} MiB (busy {fig['elastic_busy_bytes'] / MiB:.0f} MiB, "
                f"{fig['pinned_chunks']} pinned chunk(s)) vs stock {fig['stock_bytes'] / MiB:.0f} MiB; "
                f"goal {'met' if fig['goal_met'] else 'NOT met'}"
            )
        results["idle"] = idle
        back = []
        for chunk in (2 * MiB, 32 * MiB):
            fig = give_back(driver, (512 * MiB if args.quick else 2 * GiB), chunk, 1 if args.quick else 3)
            back.append(fig)
            print(
                f"give back {fig['bytes'] / MiB:.0f} MiB of free cached blocks, chunk {chunk // MiB} MiB: "
                f"{fig['give_back_seconds'] * 1e3:.1f} ms ({fig['give_back_gib_per_s']:.1f} GiB/s); "
                f"growing it: {fig['grow_seconds'] * 1e3:.1f} ms ({fig['grow_gib_per_s']:.1f} GiB/s)"
            )
        results["give_back"] = back
        size = 512 * MiB if args.quick else 4 * GiB
        bounded = []
        for bound in (None, 512, 128, 32):
            fig = bounded_give_back(driver, size, 2 * MiB, bound, 1 if args.quick else 3)
            bounded.append(fig)
            print(
                f"give back {size // MiB} MiB above the target, 2 MiB chunks, at most {bound or 'all'} a step: "
                f"longest step {fig['longest_step_seconds'] * 1e3:.1f} ms, {fig['steps']:.0f} step(s), "
                f"{fig['total_seconds'] * 1e3:.1f} ms in all"
            )
        results["bounded_give_back"] = bounded
    finally:
        driver.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
