"""vLLM 0.32.0's CPU engine with an elastic KV cache: kvpolicy's allocator on the host driver, mapped on demand.

One engine in one process (``elastic_run.py``: the ``LLM`` class, executor ``uni``), its
model's ``full`` pool ``owner elastic``. The CPU attention backend takes only the
layer-outermost ``LBHNC`` layout, so the buffer is one reservation of one chunk-aligned
region per layer (2 here), a block one page in each. The script plays the controller
between engine steps (published limits) and checks after every step that every block vLLM
holds is mapped; this module asserts on what it recorded. One engine start (and the
session's stock engine, shared with test_offline_engine).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_e2e.engines import (
    FIGURES,
    GREEDY_PROMPTS,
    GREEDY_TOKENS,
    HERE,
    KV_CACHE_BYTES,
    SERVED_MODEL,
    START_TIMEOUT_S,
    engine_env,
)

pytestmark = pytest.mark.vllm_engine

DEVICE = "cpu:0"
CHUNK = 2 * 2**20
MAX = KV_CACHE_BYTES  # the stock engine's KV size, by hand: both plan the same blocks
POLICY = f"""version 1

gpu "{DEVICE}" {{
  capacity 256 MiB
}}

model "{SERVED_MODEL}" {{
  engine vllm
  min 0 MiB
  max 64 MiB
  pool full {{ owner elastic }}
}}
"""


@pytest.fixture(scope="module")
def run(e2e_venv: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("elastic-engine")
    (work / "policy.kvp").write_text(POLICY)
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "KVPOLICY_ENABLE": "1",
        "KVPOLICY_POLICY": str(work / "policy.kvp"),
        "KVPOLICY_LEDGER_DIR": str(work / "ledger"),
        "KVPOLICY_FIGURES_WAIT": "0",  # the policy gives the capacity
        "KVPOLICY_MODEL": SERVED_MODEL,  # the LLM class serves the model under its path
        "KVPOLICY_ELASTIC_GIVE_BACK_INTERVAL": "0",  # memory above the target goes back at the next step
        "KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET": "2",  # the new-work hook on (no one else here: it never caps)
        "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": "5",  # a give-back unmaps at most 5 chunks a step
    }
    args = [str(e2e_venv.python), str(HERE / "elastic_run.py"), str(tiny_model), str(work / "result.json"),
            "--max-tokens", str(GREEDY_TOKENS)]
    for prompt in GREEDY_PROMPTS:
        args += ["--prompt", prompt]
    log = work / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.run(args, env=engine_env(work, env), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=2 * START_TIMEOUT_S, cwd=work)  # start + ~120 steps
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"the elastic engine exited with {proc.returncode}; its log ends:\n{text[-6000:]}"
    result = json.loads((work / "result.json").read_text())
    FIGURES.append(f"elastic LLM in one process: {result['checked_steps']} engine steps checked")
    return result | {"log": text}


def test_the_yield_above_the_target_hooks_the_schedulers_allocation(run: dict[str, Any]) -> None:
    """With ``KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET`` the manager's ``allocate_slots`` is the adapter's
    (the greedy outputs below, equal to the stock engine's, ran through it)."""
    assert run["yields_new_work"] is True


def test_the_give_back_bound_reaches_the_schedulers_pool(run: dict[str, Any]) -> None:
    """``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS`` is the bound of the give-back the scheduler's pool runs, in
    whole chunk groups of one chunk per region: 5 chunks over the layout's 2 regions are 2 groups (its
    effect on vLLM's queue and prefix cache: tests/vllm_elastic, over vLLM's own classes)."""
    assert run["reservation"]["regions"] == 2 and run["give_back_groups"] == 2


def test_the_cpu_backend_runs_the_elastic_cache_layer_outermost(run: dict[str, Any]) -> None:
    assert run["layout"] == "LBHNC"  # the only layout vLLM's CPU attention backend takes
    assert "Using LBHNC KV cache layout." in run["log"]
    r = run["reservation"]
    page = r["block_stride"]
    assert r["regions"] == 2 and r["bytes_per_block"] == 2 * page  # one page per layer and block
    assert run["num_gpu_blocks"] == MAX // r["bytes_per_block"]  # vLLM planned the policy's max
    assert r["region_bytes"] % CHUNK == 0 and r["region_bytes"] >= run["num_gpu_blocks"] * page
    assert r["size"] == 2 * r["region_bytes"]


def test_greedy_tokens_equal_the_stock_engines(run: dict[str, Any], stock_run: dict[str, Any]) -> None:
    assert stock_run["num_gpu_blocks"] == run["num_gpu_blocks"]  # the same KV size, by hand
    assert [p["token_ids"] for p in run["prompts"]] == [p["token_ids"] for p in stock_run["prompts"]]
    assert [len(p["token_ids"]) for p in run["prompts"]] == [GREEDY_TOKENS] * len(GREEDY_PROMPTS)


def test_the_kv_views_lie_inside_the_allocators_reservation(run: dict[str, Any]) -> None:
    r = run["reservation"]
    views = run["views"]
    assert len(views) == 2
    # Layer l's view starts at region l: the widened layer stride vLLM was given.
    assert sorted(views.values()) == [r["va"], r["va"] + r["region_bytes"]]
    assert all(r["va"] <= ptr < r["va"] + r["size"] for ptr in views.values())


def test_an_engine_starts_with_the_null_blocks_chunks_only(run: dict[str, Any]) -> None:
    # Block 0 is in chunk 0 of each layer's region: two 2 MiB chunks, pinned, nothing elastic yet.
    assert run["start"]["pinned_bytes"] == run["start"]["held_bytes"] == 2 * CHUNK
    assert run["start"]["elastic_bytes"] == 0 and run["start"]["mapped_host_bytes"] == 2 * CHUNK
    assert run["greedy"]["held_bytes"] == 2 * CHUNK  # three short prompts fit in the pinned chunks


def test_a_raised_limit_lets_it_grow(run: dict[str, Any]) -> None:
    grow = run["grow"]
    assert grow["peak_handed_out_blocks"] * run["reservation"]["bytes_per_block"] > run["start"]["pinned_bytes"]
    assert grow["elastic_bytes"] > 0 and grow["mapped_host_bytes"] == grow["held_bytes"]
    assert grow["held_bytes"] % (2 * CHUNK) == 0  # whole chunk groups: one chunk in each region
    assert grow["preemptions"] == 0 and grow["refusals"].get("limit", 0) == 0
    assert grow["finished_tokens"] == [16] * 24
    regrow = run["regrow"]  # after the lowering, raised again
    assert regrow["elastic_bytes"] > 0 and regrow["finished_tokens"] == [16] * 24


def test_a_limit_lowered_below_use_makes_vllm_preempt_and_queue_never_crash(run: dict[str, Any]) -> None:
    lowered = run["lowered"]
    at = lowered["at"]
    assert at["used_bytes"] > run["guarantee"] + run["start"]["pinned_bytes"]  # lowered below what it used
    assert lowered["preemptions"] > at["preemptions_before"]  # vLLM's own counter (vllm:num_preemptions)
    assert lowered["waiting_seen"] > 0  # vLLM's waiting queue, after the lowering
    assert lowered["refusals"].get("limit", 0) > 0  # growth refused: allocation misses, no error
    assert lowered["finished_tokens"] == [16] * 24  # every request finished, in full
    assert lowered["elastic_bytes"] == 0 and lowered["held_bytes"] == run["start"]["pinned_bytes"]  # drained
    # Memory only went down after the lowering: draining, never growth.
    trace = [t for t in run["trace"] if t[0] == "lowered" and t[1] > at["step"]]
    held = [t[4] for t in trace]
    assert held == sorted(held, reverse=True)


def test_an_idle_engine_gives_its_memory_back_to_its_guarantee(run: dict[str, Any]) -> None:
    assert run["regrow"]["held_bytes"] > run["start"]["pinned_bytes"]
    idle = run["idle"]
    assert idle["elastic_bytes"] == run["guarantee"] == 0
    assert idle["held_bytes"] == idle["mapped_host_bytes"] == run["start"]["pinned_bytes"]


def test_every_handed_out_block_was_in_mapped_memory_after_every_step(run: dict[str, Any]) -> None:
    # elastic_run.py checked it after each step (the host driver's mapped, accessible pages, and
    # ElasticPool.check_consistent); a failed check would have failed the run.
    steps = run["grow"]["steps"] + run["lowered"]["steps"] + run["regrow"]["steps"]
    assert run["checked_steps"] == steps + 2  # and the two idle steps
