"""Benchmark: what a disabled kvpolicy plugin costs every engine process at start.

vLLM loads its general plugins in every process (API server, engine core, workers)
and SGLang in every process too, so the entry point runs even where kvpolicy is
off. Each run starts a fresh interpreter that imports the entry point and calls it
with ``KVPOLICY_ENABLE`` unset; the baseline is a fresh interpreter that does
nothing (``python -c pass``), measured in the same run, so the figure printed is
what the plugin adds, whatever the machine. Also counted: the kvpolicy modules
the call imported (``sys.modules``) and whether pydantic or the allocator came in.

    python benchmarks/bench_entry_points.py [--runs 21] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ENGINE_PRELUDE = "import dataclasses, importlib.metadata, logging, pathlib, socket, threading, typing"
ENTRY_POINTS = {
    "vllm": ("kvpolicy.adapters.vllm_adapter.plugin", "register"),
    "sglang": ("kvpolicy.adapters.sglang_dsv4", "plugin"),
}
REPORT = (
    "import json, sys; "
    "print(json.dumps({'modules': sorted(m for m in sys.modules if m == 'kvpolicy' or m.startswith('kvpolicy.')), "
    "'pydantic': 'pydantic' in sys.modules, 'allocator': 'kvpolicy.alloc' in sys.modules}))"
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_")}


def _times(code: str, runs: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of a fresh interpreter running ``code``; CPU (user + system, from the
    child's own rusage) is what other load on a shared machine disturbs least."""
    walls, cpus = [], []
    env = _env()
    for _ in range(runs):
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        _, status, usage = os.wait4(child.pid, 0)
        walls.append(time.perf_counter() - start)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"{code!r} exited {child.returncode}")
        cpus.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, {args.runs} runs each")
    results: dict[str, object] = {"runs": args.runs}
    for setting, prelude in (("bare interpreter", "pass"), ("engine's standard library loaded", ENGINE_PRELUDE)):
        base, base_cpu = _times(prelude, args.runs)
        print(f"{setting}: baseline wall {base * 1e3:.1f} ms, CPU {base_cpu * 1e3:.1f} ms")
        rows: dict[str, object] = {"baseline_wall_ms": base * 1e3, "baseline_cpu_ms": base_cpu * 1e3}
        for engine, (module, function) in ENTRY_POINTS.items():
            call = f"{prelude}; from {module} import {function}; {function}()"
            median, cpu = _times(call, args.runs)
            out = subprocess.run([sys.executable, "-c", f"{call}; {REPORT}"], env=_env(), check=True,
                                 capture_output=True, text=True).stdout
            seen = json.loads(out.splitlines()[-1])
            print(
                f"  {engine:>6} {module}:{function}, disabled: wall {median * 1e3:.1f} ms "
                f"(+{(median - base) * 1e3:.1f} ms, {median / base:.2f}x), CPU {cpu * 1e3:.1f} ms "
                f"(+{(cpu - base_cpu) * 1e3:.1f} ms, {cpu / base_cpu:.2f}x); {len(seen['modules'])} kvpolicy modules, "
                f"pydantic {'yes' if seen['pydantic'] else 'no'}, allocator {'yes' if seen['allocator'] else 'no'}"
            )
            rows[engine] = {"wall_ms": median * 1e3, "cpu_ms": cpu * 1e3, "added_cpu_ms": (cpu - base_cpu) * 1e3,
                            "wall_ratio": median / base, "cpu_ratio": cpu / base_cpu, **seen}
        results[setting] = rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
