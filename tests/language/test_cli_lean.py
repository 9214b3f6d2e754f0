"""A lean CLI: lint, fmt and explain import neither torch nor cuda-python (nor
anything else heavy), so they start fast and run where no GPU stack is installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "two-models.kvp"
FACTS = ROOT / "policies" / "two-models.facts.json"

HEAVY = ("torch", "cuda", "numpy", "triton", "pynvml", "prometheus_client", "watchdog", "vllm", "sglang")

PROBE = """
import contextlib, io, json, sys, time
start = time.perf_counter()
import kvpolicy.cli
with contextlib.redirect_stdout(io.StringIO()):
    code = kvpolicy.cli.main(sys.argv[1:])
elapsed = time.perf_counter() - start
print(json.dumps({"code": code, "seconds": elapsed, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["lint", str(POLICY)],
        ["lint", "--format", "sarif", "--facts", str(FACTS), str(POLICY)],
        ["fmt", "--check", str(POLICY)],
        ["explain", str(POLICY), "--facts", str(FACTS)],
    ],
    ids=["lint", "lint-sarif-facts", "fmt", "explain"],
)
def test_command_imports_nothing_heavy(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert [m for m in report["modules"] if m in HEAVY] == []
    # start-up time is measured, not asserted (benchmarks/bench_lint.py reports it)
    print(f"kvpolicy {args[0]}: import + run in {report['seconds'] * 1000:.0f} ms")


def test_heavy_modules_are_installed_here() -> None:
    """The check above means something only if each heavy module could have been imported
    (the test environment, scripts/test, installs them all)."""
    missing = [m for m in HEAVY if importlib.util.find_spec(m) is None]
    assert not missing, f"not installed, so the lean check cannot catch their import: {missing}"
