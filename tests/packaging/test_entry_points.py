"""A disabled plugin costs an engine process almost nothing: the entry points import a short list of modules.

vLLM and SGLang load their general plugins in every process they start, whether
kvpolicy is enabled there or not. Each test loads kvpolicy's entry point as the
engine does (through the installed package metadata), calls it with no
``KVPOLICY_*`` variable set, and lists what got imported. The cost in time is
measured by benchmarks/bench_entry_points.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ALWAYS = {"kvpolicy", "kvpolicy.adapters", "kvpolicy.adapters.errors", "kvpolicy.adapters.settings",
          "kvpolicy.adapters.common"}
HEAVY = ("pydantic", "lark", "torch", "vllm", "sglang", "cuda", "watchdog", "prometheus_client", "pynvml")

PROBE = """
import json, sys
from importlib.metadata import entry_points
(point,) = [p for p in entry_points(group=sys.argv[1]) if p.name == "kvpolicy"]
point.load()()
print(json.dumps({
    "value": point.value,
    "kvpolicy": sorted(m for m in sys.modules if m == "kvpolicy" or m.startswith("kvpolicy.")),
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2:])),
}))
"""


def load_disabled(group: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_")}
    done = subprocess.run([sys.executable, "-c", PROBE, group, *HEAVY], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("group", "value", "own"), [
    ("vllm.general_plugins", "kvpolicy.adapters.vllm_adapter.plugin:register",
     {"kvpolicy.adapters.vllm_adapter", "kvpolicy.adapters.vllm_adapter.plugin"}),
    ("sglang.srt.plugins", "kvpolicy.adapters.sglang_dsv4:plugin", {"kvpolicy.adapters.sglang_dsv4"}),
], ids=["vllm", "sglang"])
def test_a_disabled_entry_point_imports_only_the_settings(group: str, value: str, own: set[str]) -> None:
    seen = load_disabled(group)
    assert seen["value"] == value
    assert set(seen["kvpolicy"]) == ALWAYS | own  # nothing of the ledger, the allocator, the policy or the facts
    assert seen["heavy"] == []
