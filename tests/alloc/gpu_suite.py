"""Everything the allocator needs run on a GPU, in one command, with JSON results.

    python3 tests/alloc/gpu_suite.py --out "$OUT"

1. ``pytest -m gpu tests/alloc`` (the suite on the cuda-python driver, the host-vs-CUDA
   comparison, the 10,000-cycle leak test, real out-of-memory) → ``alloc_gpu_tests.json``
2. ``benchmarks/bench_alloc.py`` → ``bench_alloc.json``
3. ``compute-sanitizer --tool memcheck`` on ``tests/alloc/sanitize_alloc.py`` → ``alloc_sanitize.json``

Each step runs in its own process with a time limit (240 + 150 + 180 s at most, so the
whole stays under the device's 10-minute command limit; expected about 3 minutes); a
step that fails or times out is recorded and the next one still runs. Exits 0 only
when every step passed.
Run from the repository root: kvpolicy is the one PYTHONPATH names (scripts/gpu-check installs it), else the
checkout's; the root comes after it, for the tests package.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class _Collector:
    """A pytest plugin that keeps each test's outcome for the JSON report."""

    def __init__(self) -> None:
        self.tests: list[dict[str, object]] = []

    def pytest_runtest_logreport(self, report) -> None:  # type: ignore[no-untyped-def]
        if report.when == "call" or report.outcome != "passed":
            entry: dict[str, object] = {
                "test": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "seconds": round(report.duration, 3),
            }
            if report.outcome != "passed":
                entry["detail"] = str(report.longrepr)[-3000:]
            self.tests.append(entry)


def run_pytest(out: Path) -> int:
    """In this process: pytest -m gpu over tests/alloc, results to alloc_gpu_tests.json."""
    import pytest

    collector = _Collector()
    t0 = time.time()
    # The import mode and markers come from pyproject.toml; conftests from tests/ down (ledger_dir is the root one's).
    args = ["-m", "gpu", "-q", "-p", "no:cacheprovider", f"--confcutdir={HERE.parent}", str(HERE)]
    rc = int(pytest.main(args, plugins=[collector]))
    counts: dict[str, int] = {}
    for t in collector.tests:
        key = "error" if t["when"] != "call" and t["outcome"] == "failed" else str(t["outcome"])
        counts[key] = counts.get(key, 0) + 1
    if rc == 0 and (not counts.get("passed") or counts.get("skipped")):
        rc = 1  # on the GPU machine every GPU test must run: a skip means no usable GPU or torch
    result = {"exit_code": rc, "seconds": round(time.time() - t0, 1), "counts": counts, "tests": collector.tests}
    (out / "alloc_gpu_tests.json").write_text(json.dumps(result, indent=2))
    print(f"pytest -m gpu: {counts} in {result['seconds']} s (exit {rc})")
    return rc


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/compute-sanitizer", "/opt/nvidia/*/compute-sanitizer*"):
        for path in sorted(glob.glob(pattern)):
            if os.access(path, os.X_OK):
                return path
    return None


def step_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The steps' environment: the repository root after whatever PYTHONPATH already names, so that an
    installed kvpolicy (scripts/gpu-check's, with ``kvpolicy.grammar`` and ``kvpolicy.adapters`` in it)
    wins over the checkout's ``kvpolicy/``, which has neither, and the root still serves ``tests``."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(ROOT)]))
    return env


def step(name: str, cmd: list[str], timeout: int, env: dict[str, str]) -> dict[str, object]:
    t0 = time.time()
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    # A session of its own, so a timeout ends the whole step (compute-sanitizer's target too).
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        rc = 124
        output += f"\n[timed out after {timeout} s]"
    tail = output[-6000:]
    print(tail, flush=True)
    return {"step": name, "command": cmd, "exit_code": rc, "seconds": round(time.time() - t0, 1), "output_tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--pytest-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sanitizer-timeout", type=int, default=180)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.pytest_only:
        return run_pytest(args.out)

    env = step_environment(os.environ)
    py = sys.executable
    steps = [step("pytest -m gpu", [py, str(HERE / "gpu_suite.py"), "--pytest-only", "--out", str(args.out)], 240, env)]
    bench_json = args.out / "bench_alloc.json"
    bench = [py, str(ROOT / "benchmarks" / "bench_alloc.py"), "--driver", "cuda", "--json", str(bench_json)]
    steps.append(step("benchmark", bench, 150, env))
    sanitizer = find_sanitizer()
    if sanitizer is None:
        steps.append({"step": "compute-sanitizer", "exit_code": None, "output_tail": "compute-sanitizer not found"})
    else:
        cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "1", py, str(HERE / "sanitize_alloc.py")]
        result = step("compute-sanitizer", cmd, args.sanitizer_timeout, env)
        summary = [line for line in str(result["output_tail"]).splitlines() if "ERROR SUMMARY" in line]
        result["error_summary"] = summary[-1] if summary else None
        steps.append(result)
        (args.out / "alloc_sanitize.json").write_text(json.dumps(result, indent=2))
    ok = all(s["exit_code"] == 0 for s in steps)
    summary = {"ok": ok, "steps": [{k: v for k, v in s.items() if k != "output_tail"} for s in steps]}
    (args.out / "alloc_gpu_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
