"""Ledger hot paths: the engine's limit read (ns) and elastic admission reserve+commit (µs).

Baselines measured in the same run: ``StaticLimit`` (kvpolicy.alloc.limits), the same
interface inside one process with a thread lock and no shared memory, and a bare
8-byte read of the mapping. Ratios are against those, so the figures mean something
on any machine.

    python benchmarks/bench_ledger.py [--ledger-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import tempfile
import time
import timeit
from pathlib import Path

from kvpolicy.alloc.limits import StaticLimit
from kvpolicy.runtime.client import attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.ledger import GpuLimits, InstanceLimits
from kvpolicy.units import GiB, MiB

CHUNK = 2 * MiB


def per_call(fn, number: int, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    """Best-of-``repeat`` seconds per call of ``fn``."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def _contended(ledger_dir: Path, n: int, ops: int, start, out) -> None:  # type: ignore[no-untyped-def]
    inst = attach(model="bench", id=f"c{n}", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                  handle_signals=False)
    start.wait()
    t = time.perf_counter()
    for _ in range(ops):
        if inst.admit(CHUNK):
            inst.commit(CHUNK)
            inst.release(CHUNK)
    out.put(time.perf_counter() - t)
    inst.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger-dir", type=Path, default=None, help="default: a fresh directory on /dev/shm")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--processes", type=int, default=4, help="processes in the contended admission run")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kvpolicy-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    ledger_dir = args.ledger_dir or base / "ledger"
    try:
        inst = attach(model="bench", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                      capacity=1 << 40, handle_signals=False)
        static = StaticLimit(1 << 40)
        words = inst._words
        idx = inst._pub_seq_index
        r: dict[str, float] = {}
        r["word_read_ns"] = per_call(lambda: words[idx], 200_000) * 1e9
        r["static_read_ns"] = per_call(static.read, 200_000) * 1e9
        r["ledger_read_ns"] = per_call(inst.read, 200_000) * 1e9

        ld = LedgerDir(ledger_dir)
        view = ld.read()
        rev = iter(range(1, 10**9))

        def publish_then_read() -> None:
            ld.publish(view, next(rev), {}, {"bench/0": InstanceLimits(GiB, GiB, 0)})
            inst.read()

        publish_only = per_call(lambda: ld.publish(view, next(rev), {}, {"bench/0": InstanceLimits(GiB, GiB, 0)}), 300)
        r["read_after_publish_ns"] = (per_call(publish_then_read, 300) - publish_only) * 1e9
        r["publish_us"] = publish_only * 1e6
        ld.publish(view, next(rev), {"cuda:0": GpuLimits(1 << 40, 0, 0, 1 << 40)}, {"bench/0": InstanceLimits(1 << 40, 1 << 40, 0)})

        def ledger_cycle() -> None:
            inst.admit(CHUNK)
            inst.commit(CHUNK)

        def static_cycle() -> None:
            static.admit(CHUNK)
            static.commit(CHUNK)

        r["static_admit_commit_us"] = per_call(static_cycle, 2000) * 1e6
        r["ledger_admit_commit_us"] = per_call(ledger_cycle, 2000) * 1e6
        r["ledger_release_us"] = per_call(lambda: inst.release(CHUNK), 2000) * 1e6
        inst.detach()

        ctx = mp.get_context("fork")
        start, out = ctx.Event(), ctx.Queue()
        ops = 2000
        procs = [ctx.Process(target=_contended, args=(ledger_dir, n, ops, start, out)) for n in range(args.processes)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        start.set()
        times = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join()
        r["contended_cycle_us"] = max(times) / ops * 1e6  # admit + commit + release, each process
        r["contended_processes"] = args.processes
        ld.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    if args.json:
        print(json.dumps(r, indent=2))
        return
    print("kvpolicy ledger hot paths (best of 7)")
    print(f"  8-byte read of the mapping (baseline)    {r['word_read_ns']:8.0f} ns")
    print(f"  StaticLimit.read() (in-process baseline)  {r['static_read_ns']:8.0f} ns")
    print(f"  Instance.read(), nothing published        {r['ledger_read_ns']:8.0f} ns  "
          f"({r['ledger_read_ns'] / r['static_read_ns']:.2f}× StaticLimit)")
    print(f"  Instance.read() after a publish           {r['read_after_publish_ns']:8.0f} ns")
    print(f"  controller publish, one instance          {r['publish_us']:8.1f} µs")
    print(f"  StaticLimit admit+commit (baseline)       {r['static_admit_commit_us']:8.2f} µs")
    print(f"  ledger admit+commit (reserve+commit)      {r['ledger_admit_commit_us']:8.2f} µs  "
          f"({r['ledger_admit_commit_us'] / r['static_admit_commit_us']:.1f}× StaticLimit)")
    print(f"  ledger release                            {r['ledger_release_us']:8.2f} µs")
    print(f"  admit+commit+release, {args.processes} processes at once  {r['contended_cycle_us']:8.2f} µs per cycle")


if __name__ == "__main__":
    main()
