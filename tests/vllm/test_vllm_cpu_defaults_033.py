"""``plan --engine vllm --platform cpu --vllm-version 0.33`` assumes what a real vLLM 0.33 CPU launch resolves.

tests/vllm_e2e/test_vllm_cpu_defaults.py checks the CPU column against vLLM 0.32; 0.33 differs in where it
sets the block size (when a worker starts, ``update_block_size_for_backend``, no longer in the config), so
``resolve_defaults.py`` runs here under this venv's vLLM 0.33 (a subprocess: it sets up vLLM's distributed
state of its own), builds each model on the meta device and fits the block size as a worker does. The plan's
stated defaults must equal the result: block size, batched tokens (the server's default, its cap for short
models, the MLA override), batches in flight. This machine's CPU decides AMX, so the plan is asked with
``--cpu-amx`` when it has it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.commands.plan_vllm import add_vllm_arguments, run_vllm

pytestmark = pytest.mark.vllm

RESOLVE = Path(__file__).resolve().parents[1] / "vllm_e2e" / "resolve_defaults.py"


def has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def planned(config: Path, max_model_len: int, flags: dict, capsys: pytest.CaptureFixture[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser)
    amx = ["--cpu-amx"] if has_amx() else []
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    args = parser.parse_args(["--model-config", str(config), "--budget", "64GiB", "--max-model-len",
                              str(max_model_len), "--vllm-version", "0.33", "--platform", "cpu", *amx, *argv,
                              "--format", "json"])
    assert run_vllm(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_cpu_defaults_equal_a_real_vllm_033_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.vllm.real_vllm import v4_template_config

    # The test models, shrunk (the block size and the batch figures depend on the kind of attention only).
    def shrunk(name: str, **fields: object) -> Path:
        config = {**json.loads((CONFIGS / name / "config.json").read_text()), "num_hidden_layers": 2, **fields}
        if name.startswith("deepseek-v4"):
            config = v4_template_config(config)
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name

    qwen = shrunk("qwen3-8b")
    launches = [
        (qwen, 2048, {}),
        (qwen, 8, {}),  # a short model: vLLM caps the default batch at its 128 sequences x 8 tokens
        (qwen, 4096, {"tensor_parallel_size": 2}),  # 2048 x TP
        (qwen, 4096, {"max_num_batched_tokens": 3000, "kv_cache_dtype": "fp8"}),
        (shrunk("gemma-3-1b", layer_types=["sliding_attention", "full_attention"]), 4096, {}),
        (shrunk("deepseek-v2-lite", first_k_dense_replace=2), 8192, {}),
        (shrunk("deepseek-v4-flash"), 4096, {"kv_cache_dtype": "fp8", "max_num_batched_tokens": 1024}),
    ]
    stdin = json.dumps([{"model": str(m), "max_model_len": n, **f} for m, n, f in launches])
    out = subprocess.run([sys.executable, str(RESOLVE)], input=stdin, capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    real = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(real) == len(launches)
    for (model, max_len, flags), theirs in zip(launches, real):
        plan = planned(model / "config.json", max_len, flags, capsys)
        assumed = plan["assumed"]
        block_sizes = {g["block_size"] for g in plan["groups"] if g["kind"] in ("full", "mla")}
        assert block_sizes == {theirs["block_size"]}, (model, flags, assumed, theirs)
        if "max_num_batched_tokens" in assumed:
            assert assumed["max_num_batched_tokens"].startswith(f"{theirs['max_num_batched_tokens']} ("), theirs
            # The chunked-prefill switch the plan assumes is vLLM's.
            assert ("turns chunked prefill off" in assumed["max_num_batched_tokens"]) == (not theirs["chunked_prefill"])
        else:
            assert flags["max_num_batched_tokens"] == theirs["max_num_batched_tokens"] and theirs["chunked_prefill"]
        assert assumed["max_concurrent_batches"].startswith(f"{theirs['max_concurrent_batches']} ("), theirs
