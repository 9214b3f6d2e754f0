"""Policy saved → new limit visible in an attached engine process.

Runs a real controller (``kvpolicy run --gpu-capacity``) and a real engine process
that reads its limit in a loop (the hot path: one 8-byte read) and reports, over
a pipe, the monotonic time it saw each new limit. Each save changes the other
model's `min`, so every save changes the engine's limit (A minus that guarantee). 200 saves by in-place write and
200 by atomic rename (write a temporary file, rename it over the policy).

Baseline measured in the same run: how long the kernel takes to tell a watchdog
observer about the same kind of save (the floor any file-watching reloader has).

    python benchmarks/bench_reload.py [--saves 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

POLICY = """version 1
model "engine" {{ priority 100; min 1 GiB; max 100% }}
model "other" {{ priority 10; min {min_gib} GiB }}
"""

ENGINE = textwrap.dedent("""
    import sys, time, kvpolicy
    inst = kvpolicy.attach(model="engine", gpu="cuda:0", ledger_dir=sys.argv[1], elastic=True, id="engine/0")
    other = kvpolicy.attach(model="other", gpu="cuda:0", ledger_dir=sys.argv[1], elastic=True, id="other/0")
    print("ready", flush=True)
    last = inst.read().limit
    while True:
        limit = inst.read().limit
        if limit != last:
            print(f"{time.monotonic()} {limit}", flush=True)
            last = limit
""")


def save(path: Path, text: str, how: str) -> None:
    if how == "in-place":
        with open(path, "w") as f:
            f.write(text)
    else:
        tmp = path.with_name(".policy.kvp.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def measure_reload(root: Path, saves: int) -> dict[str, list[float]]:
    policy = root / "policy.kvp"
    ledger = root / "ledger"
    policy.write_text(POLICY.format(min_gib=1))
    controller = subprocess.Popen(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(policy), "--ledger-dir", str(ledger),
         "--gpu-capacity", "141GiB", "--metrics-address", "off", "--log-level", "WARNING"],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(ledger)], stdout=subprocess.PIPE, text=True)
    seen: queue.Queue[float] = queue.Queue()

    def read_engine() -> None:
        for line in engine.stdout:
            seen.put(float(line.split()[0]))

    try:
        assert engine.stdout.readline().strip() == "ready"
        threading.Thread(target=read_engine, daemon=True).start()
        time.sleep(1.0)  # the first publish after the engine attached
        results: dict[str, list[float]] = {}
        value = 1
        for how in ("in-place", "atomic-rename"):
            latencies = []
            for _ in range(saves):
                value = value % 60 + 1
                time.sleep(0.03)  # leave each save on its own
                start = time.monotonic()
                save(policy, POLICY.format(min_gib=value), how)
                while (at := seen.get(timeout=10)) < start:
                    pass  # a change from before this save
                latencies.append((at - start) * 1000)
            results[how] = latencies
        return results
    finally:
        engine.kill()
        controller.terminate()
        controller.wait(10)
        engine.wait()


def measure_watchdog_floor(root: Path, saves: int) -> dict[str, list[float]]:
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    path = root / "floor.kvp"
    path.write_text("x")
    seen = threading.Event()

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            seen.set()

    observer = Observer()
    observer.schedule(Handler(), str(root), recursive=False)
    observer.start()
    results: dict[str, list[float]] = {}
    try:
        for how in ("in-place", "atomic-rename"):
            latencies = []
            for n in range(saves):
                time.sleep(0.01)
                seen.clear()
                start = time.monotonic()
                save(path, f"save {n}", how)
                seen.wait(5)
                latencies.append((time.monotonic() - start) * 1000)
            results[how] = latencies
    finally:
        observer.stop()
        observer.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpolicy-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        root = Path(tmp)
        reload = measure_reload(root, args.saves)
        floor = measure_watchdog_floor(root, args.saves)
    print(f"machine: {platform.machine()} python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"{'save':<15}{'median ms':>11}{'p99 ms':>9}{'floor median':>14}{'floor p99':>11}{'x floor':>9}")
    summary = {}
    for how in reload:
        med, p99 = statistics.median(reload[how]), percentile(reload[how], 0.99)
        fmed, fp99 = statistics.median(floor[how]), percentile(floor[how], 0.99)
        summary[how] = {"median_ms": med, "p99_ms": p99, "floor_median_ms": fmed, "floor_p99_ms": fp99}
        print(f"{how:<15}{med:>11.2f}{p99:>9.2f}{fmed:>14.2f}{fp99:>11.2f}{med / fmed:>9.1f}")
    print("goal: p99 <= 50 ms (engines that poll their limit every 100 ms see a change 50 ms late on average)")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
