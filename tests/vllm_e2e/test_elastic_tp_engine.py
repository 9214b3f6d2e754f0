"""vLLM 0.32.0's CPU engine with tensor parallel 2 (executor ``mp``) and an elastic KV cache.

Two engine starts of ``elastic_tp_run.py`` (the ``LLM`` class; its two workers in processes of
their own): stock, with 64 MiB of KV cache by hand, and elastic (``owner elastic``, a
32 MiB guarantee). The elastic engine's scheduler pool runs on the engine core's books of
the ranks' buffers, grows through one ``collective_rpc`` per growth, and must give the
stock engine's greedy tokens; afterwards every rank holds exactly the books' chunks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_e2e.engines import FIGURES, GREEDY_PROMPTS, HERE, KV_CACHE_BYTES, SERVED_MODEL, START_TIMEOUT_S, engine_env

pytestmark = pytest.mark.vllm_engine

TP = 2
POLICY = f"""version 1

gpu "cpu:0" {{
  capacity 256 MiB
}}

model "{SERVED_MODEL}" {{
  engine vllm
  min 32 MiB
  max 64 MiB
  pool full {{ owner elastic }}
}}
"""

COMMON = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core here; the workers in processes of their own (mp)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vLLM binds one NUMA node per CPU worker by default
}


def run_tp(python: Path, model: Path, work: Path, env: dict[str, str], sizing: list[str]) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    args = [str(python), str(HERE / "elastic_tp_run.py"), str(model), str(work / "result.json"), "--tp", str(TP), *sizing]
    for prompt in GREEDY_PROMPTS:
        args += ["--prompt", prompt]
    log = work / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.run(args, env=engine_env(work, COMMON | env), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S, cwd=work)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"the TP={TP} engine exited with {proc.returncode}; its log ends:\n{text[-6000:]}"
    return json.loads((work / "result.json").read_text())


@pytest.fixture(scope="module")
def tp_runs(e2e_venv: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    work = tmp_path_factory.mktemp("elastic-tp")
    stock = run_tp(e2e_venv.python, tiny_model, work / "stock", {}, ["--kv-cache-bytes", str(KV_CACHE_BYTES)])
    (work / "policy.kvp").write_text(POLICY)
    elastic = run_tp(e2e_venv.python, tiny_model, work / "elastic", {
        "KVPOLICY_ENABLE": "1",
        "KVPOLICY_POLICY": str(work / "policy.kvp"),
        "KVPOLICY_LEDGER_DIR": str(work / "ledger"),
        "KVPOLICY_FIGURES_WAIT": "0",  # the policy gives the capacity
        "KVPOLICY_MODEL": SERVED_MODEL,
        "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": "5",  # the engine core's books decide the give-back
    }, [])
    FIGURES.append(f"elastic TP={TP} (mp): {elastic['stats']['grown_blocks']} blocks grown, chunks {elastic['books']}")
    return stock, elastic


def test_the_elastic_tp_engine_gives_the_stock_engines_tokens(tp_runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    stock, elastic = tp_runs
    assert elastic["tokens"] == stock["tokens"]


def test_the_give_back_bound_reaches_the_engine_cores_books(tp_runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """With tensor parallel the scheduler's pool runs over the core's books of the ranks (``group_buffer``),
    built apart from the single-process buffer: ``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS`` must reach it too
    (5 chunks over the 2 layers' regions: 2 whole groups)."""
    _, elastic = tp_runs
    assert elastic["give_back_groups"] == 2


def test_the_scheduler_grew_on_the_books_and_every_rank_holds_the_same_chunks(
    tp_runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, elastic = tp_runs
    assert elastic["books_kind"] == "GroupMapping"
    assert elastic["stats"]["grown_blocks"] > 0 and elastic["stats"]["refusals"] == {}
    assert len(elastic["books"]) > 1  # more than the null block's chunk index
    assert sorted(r["rank"] for r in elastic["ranks"]) == list(range(TP))
    for rank in elastic["ranks"]:
        assert rank["mapped"] == elastic["books"], f"rank {rank['rank']} holds {rank['mapped']}"
