"""Per-rank figures at tensor parallel 2: the plan against two real vLLM ranks on a CPU.

Standard attention splits its KV heads across ranks; MLA and DeepSeek-V4 keep a full
replica on every rank (``max_tp_shards = 1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvpolicy.adapters.vllm_adapter.planning.hf_config import (
    SpecSettings,
    load_config,
    model_specs,
)
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.support.network import free_loopback_port
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.units import GiB

pytestmark = pytest.mark.vllm

HERE = Path(__file__).parent
BUDGET = 20 * GiB


def run_ranks(name: str, block_size: int, world: int = 2) -> list[dict]:
    port = free_loopback_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "tp_rank.py"), str(rank), str(world), str(port), str(CONFIGS / name),
             str(block_size), str(BUDGET)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(world)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert proc.returncode == 0 and lines, f"rank failed:\n{err[-3000:]}"
        results.append(json.loads(lines[-1]))
    return results


@pytest.mark.parametrize(
    ("name", "block_size", "split"),
    [("qwen3-8b", 16, True), ("deepseek-v2-lite", 16, False), ("deepseek-v4-flash", 256, False)],
)
def test_tensor_parallel_ranks(name: str, block_size: int, split: bool) -> None:
    ranks = run_ranks(name, block_size)
    config = load_config(CONFIGS / name / "config.json")
    mine = model_specs(config, SpecSettings(block_size=block_size, tensor_parallel_size=2)).layers
    single = model_specs(config, SpecSettings(block_size=block_size)).layers
    for rank in ranks:
        pages = {".".join(n.split(".")[:3]) if n not in mine else n: p for n, p in rank["pages"].items()}
        assert pages == {n: [s.page_size_bytes, s.block_size] for n, s in mine.items()}
    # Split heads halve a standard layer's page; replicas keep it whole.
    first = next(iter(mine))
    assert (mine[first].page_size_bytes * 2 == single[first].page_size_bytes) is split
    plan = make_plan(
        config,
        PlanSettings(
            max_model_len=4096, block_size=block_size, tensor_parallel_size=2,
            max_num_batched_tokens=ranks[0]["max_num_batched_tokens"],
            max_concurrent_batches=ranks[0]["max_concurrent_batches"],
        ),
        budget=BUDGET,
    )
    assert {(r["num_blocks"], r["bytes_per_block"]) for r in ranks} == {(plan.num_blocks, plan.bytes_per_block)}
