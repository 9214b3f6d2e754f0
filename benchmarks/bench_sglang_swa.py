"""Benchmark of SGLang DeepSeek-V4's SWA pool on the elastic allocator against SGLang's stock pool, in one run.

The real SGLang 0.5.23 ``DeepSeekV4TokenToKVPool`` (a 7-layer V4-shaped model, SWA at
half the full tokens) is built twice by SGLang's own pool code: stock, and with its SWA
tensors over an ``ElasticSWA`` bound to SGLang's ``SWATokenToKVPoolAllocator``. The same
workloads drive SGLang's allocator over each, rounds alternating, medians reported:

1. ``prefill``: a request of one page admitted (``alloc_extend``) and finished (``free``),
   then the scheduler's capacity check (``available_size``), per step;
2. ``decode``: 16 running requests, one decode token each (``alloc_decode``, a new page
   every 256 tokens), the capacity check, per step; requests restart when long;
3. ``window``: one request decoding past the sliding window, its pages freed as they
   leave it (``free_swa``) — the SWA pool's own turnover.

The elastic pool is warm (its chunks mapped, the limit above its use), as in a running
engine; a step includes its ``tick`` (limit check, give-back and report when due).
Goal: elastic ≤ 1.2× stock per step. Then the memory an idle engine's SWA pool holds:
the elastic pool after its requests finished and the target fell to its guarantee,
against the stock SWA tensors (goal: ≤ guarantee + one chunk group, the pinned chunks).
On the host driver both sides are SGLang's Python and torch-on-CPU bookkeeping, so the
ratios are meaningful; the idle figure is the simulated device memory.

    python benchmarks/bench_sglang_swa.py [--driver auto|cuda|host] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The tests' SGLang pool set-up (import stand-ins): tests.sglang. Appended, so that an installed kvpolicy
# (the GPU machine's, adapters inside) wins over the source tree's kvpolicy/.
sys.path.append(str(HERE.parent))

from kvpolicy.alloc import StaticLimit, open_driver  # noqa: E402 - after the path to the tests' SGLang helpers
from kvpolicy.units import GiB, MiB  # noqa: E402 - after the path to the tests' SGLang helpers

GOAL_RATIO = 1.2
P = 256
CHUNK = 2 * MiB
BUDGET = 400 * MiB


def build(device: str, driver: Any | None, limit: StaticLimit | None) -> tuple[Any, Any, Any]:
    """(SGLang's SWA allocator, its V4 pool, the ElasticSWA or None) for a fixed budget."""
    from tests.sglang import sglang_standins

    sglang_standins.install()
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    from tests.sglang.sglang_support import (
        build_pools_through_sglang,
        kv_cache_configurator,
        published_server_args,
        single_process_parallel,
    )
    from tests.sglang.test_sglang_swa_elastic import TINY

    from kvpolicy.adapters.sglang_dsv4 import elastic as E

    with ExitStack() as stack:
        stack.enter_context(single_process_parallel())
        args = stack.enter_context(published_server_args(
            max_running_requests=32, swa_full_tokens_ratio=0.5, _swa_full_tokens_ratio_explicitly_set=True,
            device=device))
        kvc = kv_cache_configurator(TINY, args)
        kvc.device = device
        cls = type(kvc)
        original = cls._profile_available_bytes
        cls._profile_available_bytes = lambda self, pre: BUDGET
        try:
            if driver is None:
                built, swa = build_pools_through_sglang(kvc), None
            else:
                make = lambda layers, pages, page_bytes: E.ElasticSWA(  # noqa: E731 - the pool factory swa_backed_by calls
                    driver, layers=layers, pages=pages, page_bytes=page_bytes, chunk=CHUNK, limit=limit)
                with E.swa_backed_by(make) as made:
                    built = build_pools_through_sglang(kvc)
                (swa,) = made
        finally:
            cls._profile_available_bytes = original
    s = built.sizes
    outer = SWATokenToKVPoolAllocator(s.full_max_total_num_tokens, s.swa_max_total_num_tokens, P, torch.int64,
                                      device, built.pool, need_sort=False)
    if swa is not None:
        swa.bind(outer)
    return outer, built.pool, swa


class Workload:
    """A scheduler's allocator calls, on CPU index tensors as SGLang passes them."""

    def __init__(self, outer: Any, device: str) -> None:
        import torch

        self.torch, self.outer, self.device = torch, outer, device

    def t(self, values: list[int]) -> Any:
        return self.torch.tensor(values, dtype=self.torch.int64)

    def d(self, values: list[int]) -> Any:
        return self.torch.tensor(values, dtype=self.torch.int64, device=self.device)

    def extend(self, prefix: list[int], length: int) -> list[int]:
        n = len(prefix)
        last = prefix[-1] if prefix else -1
        out = self.outer.alloc_extend(self.d([n]), self.t([n]), self.d([n + length]), self.t([n + length]),
                                      self.d([last]), length)
        assert out is not None, "the benchmark's pool ran short"
        return prefix + out.cpu().tolist()

    def prefill(self, steps: int) -> None:
        o = self.outer
        for _ in range(steps):
            full = self.extend([], P)
            o.free(self.d(full))
            o.available_size()

    def decode(self, steps: int, batch: int = 16) -> None:
        o = self.outer
        reqs = [self.extend([], 1) for _ in range(batch)]
        for _ in range(steps):
            seq = [len(r) + 1 for r in reqs]
            out = o.alloc_decode(self.d(seq), self.t(seq), self.d([r[-1] for r in reqs]))
            assert out is not None, "the benchmark's pool ran short"
            for r, loc in zip(reqs, out.cpu().tolist(), strict=True):
                r.append(loc)
            o.available_size()
            if len(reqs[0]) >= 8 * P:
                o.free(self.d([x for r in reqs for x in r]))
                reqs = [self.extend([], 1) for _ in range(batch)]
        o.free(self.d([x for r in reqs for x in r]))

    def window(self, steps: int, window: int) -> None:
        o = self.outer
        req = self.extend([], 1)
        freed = 0
        for _ in range(steps):
            out = o.alloc_decode(self.d([len(req) + 1]), self.t([len(req) + 1]), self.d([req[-1]]))
            assert out is not None, "the benchmark's pool ran short"
            req.append(int(out[0]))
            upto = max(0, len(req) - window - P) // P * P
            if upto > freed:
                o.free_swa(self.d(req[freed:upto]))
                freed = upto
            o.available_size()
            if len(req) >= 16 * P:
                o.free_swa(self.d(req[freed:]))
                o.free_full(self.d(req))
                req, freed = self.extend([], 1), 0
        if len(req) > freed:
            o.free_swa(self.d(req[freed:]))
        o.free_full(self.d(req))


def timed(fn: Any, steps: int) -> float:
    start = time.perf_counter()
    fn(steps)
    return (time.perf_counter() - start) / steps * 1e6


def throughput(device: str, driver: Any, rounds: int, steps: int) -> dict[str, Any]:
    from tests.sglang.test_sglang_swa_elastic import WINDOW

    stock, _, _ = build(device, None, None)
    elastic, _, swa = build(device, driver, StaticLimit(1 * GiB))
    runs = {"stock": Workload(stock, device), "elastic": Workload(elastic, device)}
    loads = {
        "prefill": lambda w: w.prefill,
        "decode": lambda w: w.decode,
        "window": lambda w: (lambda n: w.window(n, WINDOW)),
    }
    out: dict[str, Any] = {}
    for name, load in loads.items():
        for w in runs.values():
            load(w)(max(10, steps // 10))  # warm-up: the elastic pool maps what the workload uses
        times: dict[str, list[float]] = {"stock": [], "elastic": []}
        for _ in range(rounds):
            for side, w in runs.items():
                times[side].append(timed(load(w), steps))
        s, e = statistics.median(times["stock"]), statistics.median(times["elastic"])
        out[name] = {"stock_us_per_step": s, "elastic_us_per_step": e, "ratio": e / s, "goal_met": e / s <= GOAL_RATIO}
    swa.close()
    return out


def idle_memory(device: str, driver: Any, guarantee_groups: int) -> dict[str, Any]:
    """The elastic pool after a load under a high limit, once the target fell to the guarantee."""
    limit = StaticLimit(1 * GiB)
    outer, pool, swa = build(device, driver, limit)
    group = swa.mapping.group_bytes
    w = Workload(outer, device)
    held = [w.extend([], 4 * P) for _ in range(12)]
    busy = swa.held_bytes
    for full in held:
        outer.free(w.d(full))
    guarantee = guarantee_groups * group
    limit.set(1 * GiB, target=guarantee + swa.pinned, guarantee=guarantee)
    swa.give_back_interval = 0.0
    outer.available_size()  # the scheduler's next round: the tick gives back above the target
    stock = sum(t.nbytes for t in pool.swa_kv_pool.kv_buffer)
    fig = {
        "stock_swa_bytes": stock, "elastic_busy_bytes": busy, "elastic_idle_bytes": swa.held_bytes,
        "guarantee_bytes": guarantee, "pinned_bytes": swa.pinned, "chunk_group_bytes": group,
        "goal_met": swa.held_bytes <= guarantee + group,
    }
    swa.close()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", choices=("auto", "cuda", "host"), default="auto")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    args = ap.parse_args(argv)
    driver = open_driver(args.driver, host_capacity=4 * GiB)
    device = "cuda" if driver.kind == "cuda" else "cpu"
    rounds, steps = (3, 30) if args.quick else (5, 300)
    results: dict[str, Any] = {"driver": driver.kind, "device": driver.name, "python": platform.python_version()}
    try:
        results["throughput"] = tp = throughput(device, driver, rounds, steps)
        print(f"{'driver':<24}{driver.kind} ({driver.name})")
        print("SWA page allocation, µs per scheduler step (SGLang's SWATokenToKVPoolAllocator):")
        for name, fig in tp.items():
            print(f"  {name:<10} stock {fig['stock_us_per_step']:9.1f}  elastic {fig['elastic_us_per_step']:9.1f}  "
                  f"ratio {fig['ratio']:5.2f}  (goal ≤ {GOAL_RATIO}: {'met' if fig['goal_met'] else 'NOT met'})")
        results["idle"] = idle = idle_memory(device, driver, guarantee_groups=2)
        print(f"idle engine's SWA pool: elastic {idle['elastic_idle_bytes'] / MiB:.0f} MiB (busy "
              f"{idle['elastic_busy_bytes'] / MiB:.0f} MiB; guarantee {idle['guarantee_bytes'] / MiB:.0f} MiB + "
              f"{idle['pinned_bytes'] / MiB:.0f} MiB pinned) vs stock {idle['stock_swa_bytes'] / MiB:.0f} MiB; "
              f"goal {'met' if idle['goal_met'] else 'NOT met'}")
    finally:
        driver.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
