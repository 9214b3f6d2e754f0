"""vLLM 0.32.0's OpenAI server (API server, engine core, worker) with kvpolicy installed but not enabled."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_e2e.engines import (
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    SERVED_MODEL,
    Server,
    callers_by_role,
    kvpolicy_entry_point,
    plugin_calls,
)
from tests.vllm_e2e.tiny_model import TinyLlama

pytestmark = pytest.mark.vllm_engine

PROMPTS = ["Hello, my name is", "The capital of France is"]  # five tokens or more: see test_offline_engine
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(e2e_venv: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server.start(e2e_venv.python, tiny_model, tmp_path_factory.mktemp("server"))
    yield running
    running.stop()


def complete(server: Server, prompt: Any) -> dict[str, Any]:
    return server.post(
        "/v1/completions",
        {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
         "ignore_eos": True, "return_token_ids": True},
    )


def test_completions_answer_greedily_and_repeat(server: Server) -> None:
    first, second = complete(server, PROMPTS), complete(server, PROMPTS)
    assert [len(c["token_ids"]) for c in first["choices"]] == [MAX_TOKENS] * len(PROMPTS)
    assert first["usage"]["completion_tokens"] == MAX_TOKENS * len(PROMPTS)
    assert [c["token_ids"] for c in first["choices"]] == [c["token_ids"] for c in second["choices"]]
    assert all(isinstance(c["text"], str) for c in first["choices"])


def test_a_token_id_prompt_continues_as_its_text(server: Server) -> None:
    (by_text,) = complete(server, PROMPTS[0])["choices"]
    (by_ids,) = complete(server, by_text["prompt_token_ids"])["choices"]
    assert by_ids["token_ids"] == by_text["token_ids"]


def test_the_served_model(server: Server) -> None:
    (model,) = json.loads(server.get("/v1/models"))["data"]
    assert (model["id"], model["max_model_len"]) == (SERVED_MODEL, MAX_MODEL_LEN)


def test_kv_cache_figures_in_vllms_metrics(server: Server) -> None:
    # vllm:cache_config_info carries the cache config as labels; the next tests size it from a policy.
    metrics = server.get("/metrics").decode()
    (labels,) = re.findall(r"^vllm:cache_config_info\{(.*)\} 1\.0$", metrics, re.MULTILINE)
    info = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    page = int(info["block_size"]) * TinyLlama().kv_bytes_per_token(dtype_bytes=2)
    assert int(info["num_gpu_blocks"]) == KV_CACHE_BYTES // page


def test_vllm_calls_the_kvpolicy_plugin_in_each_of_its_processes(server: Server) -> None:
    calls = plugin_calls(server.work)
    assert {(c["value"], c["outcome"]) for c in calls} == {(kvpolicy_entry_point(), "returned")}
    roles = callers_by_role(calls, server.process.pid)
    assert {role: len(roles.get(role, [])) for role in ("main", "engine_core", "worker")} == {
        "main": 1, "engine_core": 1, "worker": 1
    }
    assert set(roles) <= {"main", "engine_core", "worker", "model_inspection"}
    # The three serving processes were alive when the server was ready.
    assert {roles["main"][0], roles["engine_core"][0], roles["worker"][0]} <= set(server.memory)
