"""``kvpolicy plan --policy FILE --model NAME``: the plan of what each engine's adapter does at start-up.

Lean: no torch, no engine. SGLang's half is checked against the real budget hook in
tests/sglang (test_sglang_real.py); here the command's dispatch, its agreement with the
closed forms and with ``plan --budget``, and its errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy.adapters.sglang_dsv4.geometry import load_geometry
from kvpolicy.adapters.sglang_dsv4.launch import LaunchFlags, resolve_launch
from kvpolicy.adapters.sglang_dsv4.plan import budget_for_reserve
from kvpolicy.cli import main
from kvpolicy.units import GiB, MiB

REPO = Path(__file__).resolve().parents[2]
FLASH = REPO / "policies" / "models" / "deepseek-v4-flash.json"
QWEN = REPO / "tests" / "vllm" / "configs" / "qwen3-8b" / "config.json"

POLICY = """version 1

gpu "cuda:1" { capacity 80 GiB }

model "deepseek-v4-flash" {
  engine sglang
  reserve 40 GiB
}

model "qwen3-8b" {
  engine vllm
  reserve 20000 MiB
}

model "qwen3-elastic" {
  engine vllm
  min 2 GiB
  max 25%
  pool full { owner elastic }
}

model "loose" { reserve 8 GiB }

model "v4-without-reserve" { engine sglang }  # kvpolicy: ignore[KV028] plan's own refusal is under test
"""


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    path = tmp_path / "p.kvp"
    path.write_text(POLICY)
    return path


def plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sglang_plans_the_budget_whose_pools_and_table_fit_the_reserve(capsys, policy_path):
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "deepseek-v4-flash",
                        "--model-config", str(FLASH), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    geometry = load_geometry(FLASH)
    expected = budget_for_reserve(geometry, resolve_launch(geometry).settings, 40 * GiB)
    assert doc["budget"] == expected.budget and doc["tokens"] == expected.tokens.model_dump()
    assert doc["total_footprint"] == expected.total_footprint <= 40 * GiB
    assert doc["policy"] == {"policy": str(policy_path), "model": "deepseek-v4-flash", "block": "deepseek-v4-flash",
                             "line": 5, "gpu": "cuda:0", "reserve": 40 * GiB}
    # The same budget through --budget gives the same pools: --policy only chooses the amount.
    code, out, _ = plan(capsys, "--engine", "sglang", "--model-config", str(FLASH), "--budget", f"{doc['budget']} B",
                        "--format", "json")
    assert code == 0 and json.loads(out)["pools"] == doc["pools"]


def test_sglang_policy_plans_take_the_launch_flags(capsys, policy_path):
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "deepseek-v4-flash", "--model-config",
                        str(FLASH), "--max-running-requests", "64", "--context-length", "131072", "--format", "json")
    geometry = load_geometry(FLASH)
    flags = LaunchFlags(max_running_requests=64, context_length=131072)
    expected = budget_for_reserve(geometry, resolve_launch(geometry, flags=flags).settings, 40 * GiB)
    assert code == 0 and json.loads(out)["budget"] == expected.budget


def test_the_text_names_the_policy_line_and_the_budget(capsys, policy_path):
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "deepseek-v4-flash", "--model-config", str(FLASH))
    assert code == 0
    assert f"for the reserve of 40 GiB of 'deepseek-v4-flash' ({policy_path}:5) on cuda:0: budget " in out.splitlines()[0]


def test_vllm_static_plans_the_reserve_in_whole_granules(capsys, policy_path):
    code, out, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8b", "--model-config", str(QWEN),
                          "--max-model-len", "32768", "--format", "json")
    assert code == 0, err
    # The adapter sets kv_cache_memory_bytes to the admitted reserve rounded down to 2 MiB.
    budget = 20000 * MiB - (20000 * MiB) % (2 * MiB)
    assert json.loads(out)["budget"] == budget and f"kv_cache_memory_bytes {budget}" in err
    code, same, _ = plan(capsys, "--engine", "vllm", "--model-config", str(QWEN), "--budget", f"{budget} B",
                         "--max-model-len", "32768", "--format", "json")
    assert code == 0 and json.loads(same) == json.loads(out)


def test_vllm_elastic_plans_its_max_with_the_block_outermost_layout(capsys, policy_path):
    code, out, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-elastic", "--gpu", "cuda:1",
                          "--model-config", str(QWEN), "--max-model-len", "32768", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["budget"] == 20 * GiB  # 25% of the policy's 80 GiB for cuda:1
    assert doc["kv_cache_layout"] == "BLHNC" and "elastic" in err
    # A percentage without a capacity cannot be resolved, as the adapter says at start-up.
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-elastic", "--model-config", str(QWEN),
                        "--max-model-len", "32768")
    assert code == 1 and "percentages" in err and "capacity" in err
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-elastic", "--gpu-capacity", "40GiB",
                        "--model-config", str(QWEN), "--max-model-len", "32768", "--format", "json")
    assert code == 0 and json.loads(out)["budget"] == 10 * GiB


def test_errors(capsys, policy_path):
    args = ["--model-config", str(FLASH)]
    code, _, err = plan(capsys, "--policy", str(policy_path), *args)
    assert code == 2 and "--model" in err
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "loose", *args)
    assert code == 2 and "names no engine: give --engine" in err
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8b", "--engine", "sglang", *args)
    assert code == 2 and "binds 'qwen3-8b' to engine vllm" in err
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "v4-without-reserve", *args)
    assert code == 1 and "has no `reserve`" in err
    code, _, err = plan(capsys, "--policy", str(policy_path.with_name("nope.kvp")), "--model", "x", *args)
    assert code == 2 and "no such file" in err
    bad = policy_path.with_name("bad.kvp")
    bad.write_text('version 1\nmodel "m" { reserve 4 GiBB }\n')
    code, _, err = plan(capsys, "--policy", str(bad), "--model", "m", "--engine", "sglang", *args)
    assert code == 1 and f"{bad}:2:" in err and "KV001" in err
    code, _, err = plan(capsys, *args, "--budget", "4GiB")
    assert code == 2 and "--engine is required" in err


@pytest.mark.parametrize("engine", [[], ["--engine", "vllm"]], ids=["no-engine", "engine"])
def test_a_model_no_block_binds_is_named_with_the_blocks_there_are(capsys, policy_path, engine):
    """Whether or not --engine is given, the name is at fault (exit 2), not a missing engine or reserve."""
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8bb", *engine,
                        "--model-config", str(QWEN))
    assert code == 2
    assert f"{policy_path}: no model block binds --model 'qwen3-8bb'; did you mean 'qwen3-8b'?" in err
    assert "(its model blocks: 'deepseek-v4-flash', 'qwen3-8b', 'qwen3-elastic', 'loose', 'v4-without-reserve')" in err
    code, _, err = plan(capsys, "--policy", str(policy_path), "--model", "nosuch", *engine,
                        "--model-config", str(QWEN))
    assert code == 2 and "binds --model 'nosuch' (its model blocks: 'deepseek-v4-flash'," in err
    assert "did you mean" not in err


def test_a_policy_without_model_blocks_says_so(capsys, tmp_path):
    empty = tmp_path / "empty.kvp"
    empty.write_text("version 1\n")
    code, _, err = plan(capsys, "--policy", str(empty), "--model", "m", "--model-config", str(QWEN))
    assert code == 2 and f"{empty}: no model block binds --model 'm': the policy has no model blocks" in err


def test_a_loose_block_plans_with_the_engine_given(capsys, policy_path):
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "loose", "--engine", "sglang",
                        "--model-config", str(FLASH), "--format", "json")
    assert code == 0 and json.loads(out)["total_footprint"] <= 8 * GiB


def test_vllm_policy_plans_default_max_model_len_as_vllm_and_say_what_they_assume(capsys, policy_path, tmp_path):
    """Without --max-model-len, vLLM serves the length it derives from the config (its length keys times the
    RoPE scaling factor): so does the plan, and its ``assumed`` names that and the layout it assumed (static:
    vLLM's default for the model's backends; elastic: the adapter's block-outermost one)."""
    code, out, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8b", "--model-config", str(QWEN),
                          "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    positions = json.loads(QWEN.read_text())["max_position_embeddings"]
    assert doc["max_model_len"] == positions == 40960
    assert doc["assumed"]["max_model_len"].startswith(f"{positions} (the config's max_position_embeddings")
    # A linear RoPE scaling of 2: vLLM 0.33 serves 2 × 40960 (tests/vllm/test_vllm_max_model_len.py checks the
    # derivation against vLLM's over random configs).
    scaled = tmp_path / "config.json"
    scaled.write_text(json.dumps({**json.loads(QWEN.read_text()), "rope_scaling": {"rope_type": "linear", "factor": 2}}))
    code, out, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8b", "--model-config", str(scaled),
                          "--format", "json")
    assert code == 0, err
    assert json.loads(out)["max_model_len"] == 81920
    assert json.loads(out)["assumed"]["max_model_len"] == (
        "81920 (the config's max_position_embeddings × RoPE factor 2, as vLLM derives it)")
    assert doc["kv_cache_layout"] == "LBNHC" and doc["assumed"]["kv_cache_layout"].startswith("LBNHC (")
    code, same, _ = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-8b", "--model-config", str(QWEN),
                         "--max-model-len", str(positions), "--format", "json")
    assert code == 0 and {**json.loads(same), "assumed": {}} == {**doc, "assumed": {}}
    # The elastic model's layout is the block-outermost one the adapter plans it with, and says so.
    code, out, err = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-elastic", "--gpu", "cuda:1",
                          "--model-config", str(QWEN), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["max_model_len"] == positions and doc["kv_cache_layout"] == "BLHNC"
    assert doc["assumed"]["kv_cache_layout"] == "BLHNC (the layout the adapter plans an elastic model with)"
    assert "layout BLHNC" in err
    code, out, _ = plan(capsys, "--policy", str(policy_path), "--model", "qwen3-elastic", "--gpu", "cuda:1",
                        "--model-config", str(QWEN), "--kv-cache-layout", "BHLNC", "--format", "json")
    assert code == 0 and "kv_cache_layout" not in json.loads(out)["assumed"]  # a flag's value is no assumption
