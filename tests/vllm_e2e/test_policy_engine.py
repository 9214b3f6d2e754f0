"""vLLM 0.32.0's OpenAI server with kvpolicy enabled: the policy's reserve sizes the CPU engine's KV cache.

One server (API server, engine core, worker) on a CPU "device" (the ledger's ``cpu:0``,
the host's memory) whose capacity in the policy fits one reserve and not two. Then:
its KV cache is the plan's, byte for byte; the ledger holds its worker with pools adding
up to the buffer; it serves completions; a second engine on the same device is refused
with a clear start-up message. Then the server is killed with SIGKILL and two engines
start at the same moment on its ledger: their own start reclaims the dead rank, exactly
one is admitted and the other exits with the reason alone (no traceback); the one that
ran generates the same greedy tokens as an engine given the same KV size by hand. Five
engine starts in all (the server, the refused engine, the two together, the one by hand).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.waiting import wait_for
from tests.vllm_e2e.engines import (
    GREEDY_PROMPTS,
    GREEDY_TOKENS,
    SERVED_MODEL,
    OfflineEngine,
    Server,
    callers_by_role,
    plugin_calls,
    run_offline,
)

from kvpolicy.runtime.client import resolve_access
from kvpolicy.runtime.liveness import is_alive
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.values import SlotView

pytestmark = pytest.mark.vllm_engine

DEVICE = "cpu:0"  # kvpolicy.adapters.ledger_port.HOST_DEVICE, spelled out: the key is a contract
RESERVE = 96 * 2**20
CAPACITY = 160 * 2**20  # one reserve fits, two do not
POLICY = f"""version 1

gpu "{DEVICE}" {{
  capacity 160 MiB
}}

model "{SERVED_MODEL}" {{
  engine vllm
  reserve 96 MiB
}}
"""
PROMPTS = ["Hello, my name is", "The capital of France is"]  # five tokens or more: see test_offline_engine
MAX_TOKENS = 8


def kvpolicy_env(work: Path) -> dict[str, str]:
    policy = work / "policy.kvp"
    policy.write_text(POLICY)
    return {
        "KVPOLICY_ENABLE": "1",
        "KVPOLICY_POLICY": str(policy),
        "KVPOLICY_LEDGER_DIR": str(work / "ledger"),
        "KVPOLICY_FIGURES_WAIT": "0",  # the policy gives the capacity: nothing to wait for
    }


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("policy-engine")


@pytest.fixture(scope="module")
def policy_server(e2e_venv: Any, tiny_model: Path, work: Path) -> Iterator[Server]:
    running = Server.start(e2e_venv.python, tiny_model, work / "server", kv_cache_bytes=None, env=kvpolicy_env(work))
    yield running
    running.stop()


def ledger(work: Path) -> GpuLedger:
    return GpuLedger.open(work / "ledger", DEVICE, resolve_access())


def instances(work: Path) -> list[SlotView]:
    views, problems = ledger(work).slots()
    assert not problems, problems
    return views


def cache_info(server: Server) -> dict[str, str]:
    (labels,) = re.findall(r"^vllm:cache_config_info\{(.*)\} 1\.0$", server.get("/metrics").decode(), re.MULTILINE)
    return dict(re.findall(r'(\w+)="([^"]*)"', labels))


def kvpolicy_plan(work: Path, tiny_model: Path, block_size: int) -> dict[str, Any]:
    """``kvpolicy plan --policy`` for the server's model, as an operator runs it before launching."""
    out = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "plan", "--policy", str(work / "policy.kvp"), "--model", SERVED_MODEL,
         "--gpu", DEVICE, "--model-config", str(tiny_model / "config.json"), "--max-model-len", "512",
         "--block-size", str(block_size), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_policys_reserve_sizes_vllms_kv_cache(policy_server: Server, work: Path, tiny_model: Path) -> None:
    info = cache_info(policy_server)
    plan = kvpolicy_plan(work, tiny_model, int(info["block_size"]))
    assert plan["budget"] == RESERVE  # 96 MiB is whole 2 MiB granules
    assert int(info["num_gpu_blocks"]) == plan["num_blocks"]
    # vLLM's own log line of the KV cache it built, and of how it was sized.
    log = policy_server.log_text()
    assert f"CPU KV cache size: {plan['num_blocks'] * int(info['block_size']):,} tokens" in log
    assert "Explicitly set (0.09/" in log  # 96 MiB: the policy's reserve, as kv_cache_memory_bytes


def test_the_ledger_holds_the_worker_with_its_pools(policy_server: Server, work: Path, tiny_model: Path) -> None:
    (rank,) = instances(work)
    assert (rank.engine, rank.model, rank.gpu) == ("vllm", SERVED_MODEL, DEVICE)
    roles = callers_by_role(plugin_calls(policy_server.work), policy_server.process.pid)
    assert [rank.pid] == roles["worker"]  # the worker process sized and allocated the cache
    plan = kvpolicy_plan(work, tiny_model, int(cache_info(policy_server)["block_size"]))
    # The pools split the one KV buffer vLLM allocated: a Llama's full-attention pool (idle: the
    # null block is padding), and its free blocks.
    assert sum(p.bytes for p in rank.pools.values()) == plan["total_bytes"] <= RESERVE
    assert set(rank.pools) == {"full", "padding", "free_blocks"}
    assert rank.pools["free_blocks"].bytes == (plan["num_blocks"] - 1) * plan["bytes_per_block"]


def test_the_engine_serves_completions(policy_server: Server) -> None:
    answer = policy_server.post(
        "/v1/completions",
        {"model": SERVED_MODEL, "prompt": PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
    )
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS * len(PROMPTS)


def test_kvpolicy_status_shows_the_engine(policy_server: Server, work: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "status", "--ledger-dir", str(work / "ledger"), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert SERVED_MODEL in out.stdout and DEVICE in out.stdout, out.stdout + out.stderr


def test_a_second_engine_is_refused_with_a_clear_message(e2e_venv: Any, tiny_model: Path, policy_server: Server,
                                                         work: Path) -> None:
    # The LLM class serves the model under its path: KVPOLICY_MODEL names it as the policy does.
    second = run_offline(e2e_venv.python, tiny_model, work / "second", PROMPTS, kv_cache_bytes=None,
                         env=kvpolicy_env(work) | {"KVPOLICY_MODEL": SERVED_MODEL}, check=False)
    assert second["returncode"] != 0
    log = second["log"]
    assert f"AdapterError: kvpolicy ledger: cannot admit 96 MiB (100663296 B) of runtime-owned KV memory on {DEVICE}" \
        in log, log[-4000:]
    assert [v.model for v in instances(work)] == [SERVED_MODEL]  # the refused engine left nothing behind


@pytest.fixture(scope="module")
def after_kill(e2e_venv: Any, tiny_model: Path, policy_server: Server, work: Path) -> dict[str, Any]:
    """The server killed with SIGKILL, then two engines started at the same moment on its ledger.

    Nobody reclaims by hand: the engines' own start must find the dead rank's slot (a claim
    reclaims dead slots first), and then only one reserve fits. Their KV cache is the policy's.
    """
    (rank,) = instances(work)
    os.killpg(policy_server.process.pid, signal.SIGKILL)  # no clean exit: the worker's slot is left behind
    policy_server.process.wait(60)
    # The worker holding the slot is another process of the group: SIGKILL is sent, but tearing down its
    # memory takes a while on a loaded machine; until it has exited it is (rightly) alive.
    assert wait_for(lambda: not is_alive(rank.pid, rank.start_time), timeout=120), f"pid {rank.pid} outlived SIGKILL"
    assert [v.id for v in instances(work)] == [rank.id]  # still there: only a writer's claim or reclaim frees it
    env = kvpolicy_env(work) | {"KVPOLICY_MODEL": SERVED_MODEL}
    # The engine that is admitted holds its reserve until both have run or exited: on a loaded machine one
    # may finish its prompts before the other has imported vLLM, and must not free the room for it.
    release = work / "release-together"
    engines = [
        OfflineEngine.start(e2e_venv.python, tiny_model, work / f"together-{i}", GREEDY_PROMPTS, kv_cache_bytes=None,
                            max_tokens=GREEDY_TOKENS, env=env, hold_until=release)
        for i in range(2)
    ]
    held = [e.wait_held() for e in engines]
    release.touch()
    runs = [e.finish(check=False) | {"held": h} for e, h in zip(engines, held)]
    return {"killed": rank, "runs": runs, "left": instances(work)}


def test_a_killed_engine_is_reclaimed_when_the_next_engines_start(after_kill: dict[str, Any]) -> None:
    runs = after_kill["runs"]
    assert [r["returncode"] for r in runs].count(0) == 1, [r["log"][-3000:] for r in runs]
    assert [r["held"] for r in runs] == [r["returncode"] == 0 for r in runs]  # the admitted one held; the refused one never ran
    assert after_kill["left"] == []  # the killed rank is gone, and the engine that ran detached when it exited


def test_of_two_engines_started_at_once_one_runs_and_the_other_exits_with_the_reason(
    after_kill: dict[str, Any],
) -> None:
    (refused,) = [r for r in after_kill["runs"] if r["returncode"] != 0]
    log = refused["log"]
    message = (f"AdapterError: kvpolicy ledger: cannot admit 96 MiB (100663296 B) of runtime-owned KV memory on "
               f"{DEVICE}: unreserved = C − H − U − R − G = 160 MiB − 0 B − 0 B − 96 MiB − 0 B = 64 MiB")
    assert message in log, log[-4000:]
    assert "Traceback" not in log, log[-4000:]  # the reason alone, not vLLM's call stack in front of it
    assert "out of memory" not in log.lower()


def test_greedy_tokens_with_the_policys_reserve_equal_an_engine_given_the_same_kv_size_by_hand(
    e2e_venv: Any, tiny_model: Path, work: Path, after_kill: dict[str, Any],
) -> None:
    (sized,) = [r for r in after_kill["runs"] if r["returncode"] == 0]
    by_hand = run_offline(e2e_venv.python, tiny_model, work / "by-hand", GREEDY_PROMPTS, kv_cache_bytes=RESERVE,
                          max_tokens=GREEDY_TOKENS)
    assert sized["kv_cache_memory_bytes"] == by_hand["kv_cache_memory_bytes"] == RESERVE
    assert sized["num_gpu_blocks"] == by_hand["num_gpu_blocks"]
    assert [p["token_ids"] for p in sized["prompts"]] == [p["token_ids"] for p in by_hand["prompts"]]
    assert all(len(p["token_ids"]) == GREEDY_TOKENS for p in sized["prompts"])
