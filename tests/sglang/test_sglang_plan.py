"""Closed forms and ``kvpolicy plan`` on a lean install (no torch, no sglang needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.geometry import GeometryError, ModelGeometry, load_geometry
from kvpolicy.adapters.sglang_dsv4.footprint import footprint
from kvpolicy.adapters.sglang_dsv4.plan import (
    REQ_TO_TOKEN,
    V4_POOL_NAMES,
    PlanError,
    PlanSettings,
    budget_for_reserve,
    plan_for_full_tokens,
    pool_tensors,
    size_from_full_tokens,
)
from kvpolicy.cli import main
from kvpolicy.units import GiB, MiB
from tests.sglang.sglang_support import MODELS, REPO

FLASH = MODELS / "deepseek-v4-flash.json"
PRO = MODELS / "deepseek-v4-pro.json"


def test_released_configs_have_the_layer_counts_of_the_reference():
    flash, pro = load_geometry(FLASH), load_geometry(PRO)
    assert (flash.num_hidden_layers, flash.layers(0), flash.layers(4), flash.layers(128)) == (43, 2, 21, 20)
    assert (pro.num_hidden_layers, pro.layers(0), pro.layers(4), pro.layers(128)) == (61, 0, 30, 31)
    assert len(flash.compress_ratios) == 44 and len(pro.compress_ratios) == 62  # + the MTP layer


def test_flash_4m_tokens_matches_the_pool_measured_on_the_h200():
    # Measured on an H200 (a V4 pool built alone): 4M full tokens, 256 running requests,
    # swa 0.1·N: 32,453,830,144 tensor bytes; cuMemGetInfo dropped by 32,671,531,008.
    geometry, settings = load_geometry(FLASH), PlanSettings(max_running_requests=256, swa_ratio=0.1)
    plan = plan_for_full_tokens(geometry, settings, 4 << 20)
    v4 = [p for name, p in plan.pools.items() if name in V4_POOL_NAMES]
    assert sum(p.bytes for p in v4) == 32_453_830_144
    tensors = pool_tensors(geometry, settings, size_from_full_tokens(geometry, settings, 4 << 20))
    assert footprint(t.nbytes for t in tensors if t.pool != REQ_TO_TOKEN) == 32_671_531_008
    assert sum(p.tensors for p in v4) == 167
    # Beside the pool, SGLang's request-to-token table: 257 rows of 1M + 4 int32 entries.
    assert plan.pools[REQ_TO_TOKEN].bytes == 257 * (1_048_576 + 4) * 4
    assert plan.total_bytes == 32_453_830_144 + 257 * (1_048_576 + 4) * 4


def test_flash_coefficient_per_full_token():
    # Reference: 7086.75 bytes per full token (Flash), 10115.25 (Pro), in ratio mode.
    from kvpolicy.adapters.sglang_dsv4.plan import _Configurator

    assert _Configurator(load_geometry(FLASH), PlanSettings()).bytes_per_full_token == 7086.75
    assert _Configurator(load_geometry(PRO), PlanSettings()).bytes_per_full_token == 10115.25


@pytest.mark.parametrize("reserve_gib", [1, 8, 40])
@pytest.mark.parametrize("settings", [PlanSettings(max_running_requests=64, swa_ratio=0.2),
                                      PlanSettings(max_running_requests=8)])
def test_budget_for_reserve_fits_the_footprint_in_the_reserve(reserve_gib, settings):
    reserve = reserve_gib * GiB
    try:
        plan = budget_for_reserve(load_geometry(FLASH), settings, reserve)
    except PlanError as exc:
        assert "cannot hold the smallest" in str(exc)
        return
    assert plan.total_footprint <= reserve
    # and it uses the reserve: less than one 2 MiB segment per tensor and one full page left over
    tensors = sum(p.tensors for p in plan.pools.values())
    assert reserve - plan.total_footprint < tensors * 2 * MiB + 256 * 7087 * 2


@settings(max_examples=25, deadline=None)
@given(reserve=st.integers(min_value=64 * MiB, max_value=96 * GiB), requests=st.integers(1, 512))
def test_the_chosen_budget_never_exceeds_the_reserve(reserve, requests):
    try:
        plan = budget_for_reserve(load_geometry(PRO), PlanSettings(max_running_requests=requests, swa_ratio=0.1), reserve)
    except PlanError:
        return
    assert plan.total_footprint <= reserve and plan.budget is not None


def test_without_max_running_requests_a_small_reserve_is_refused_with_the_reason():
    with pytest.raises(PlanError, match=r"c128 compressor state for 2048 requests.*--max-running-requests"):
        budget_for_reserve(load_geometry(FLASH), PlanSettings(), 8 * GiB)


def test_geometry_errors_name_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
                               "num_hidden_layers": 3, "head_dim": 512,
                               "index_head_dim": 128, "sliding_window": 128, "compress_ratios": [0, 2, 4],
                               "max_position_embeddings": 8}))
    with pytest.raises(GeometryError, match=r"config.json.*ratio-1/2"):
        load_geometry(bad)
    with pytest.raises(ValueError, match="V4 KV layout"):
        ModelGeometry(num_hidden_layers=1, head_dim=256, compress_ratios=(0,), max_position_embeddings=8)


def run_cli(capsys, *argv):
    code = main(["plan", "--engine", "sglang", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_has_the_contract_shape(capsys):
    code, out, _ = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["engine"] == "sglang" and doc["engine_version"] == "0.5.23"
    assert set(doc["tokens"]) >= {"full", "swa", "c4", "c128"}
    assert set(doc["pools"]) >= {"swa", "c4", "c128", "indexer", "compressor_state"}
    for pool in doc["pools"].values():
        assert isinstance(pool["bytes"], int) and pool["footprint"] >= pool["bytes"]
    assert doc["total_bytes"] == sum(p["bytes"] for p in doc["pools"].values())
    assert set(doc["pools"]["compressor_state"]["parts"]) == {"c4", "c4_indexer", "c128"}


def test_plan_text_has_a_bar_per_pool(capsys):
    code, out, _ = run_cli(capsys, "--model-config", str(PRO), "--full-tokens", "1048576",
                           "--max-running-requests", "256", "--swa-ratio", "0.1")
    assert code == 0
    lines = out.splitlines()
    for name in ("swa", "c4", "c128", "indexer", "compressor_state"):
        row = next(line for line in lines if line.startswith(name + " "))
        assert "█" in row or "·" in row
    assert "full 1,048,576" in out


def test_plan_errors_exit_1_with_a_message(capsys):
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "1MiB")
    assert code == 1 and "SWA pool (0 tokens) cannot hold even one request" in err  # as SGLang refuses it


def test_a_config_that_is_not_json_text_is_an_error_in_the_input(capsys, tmp_path):
    latin = tmp_path / "config.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    code, _, err = run_cli(capsys, "--model-config", str(latin), "--budget", "1GiB")
    assert code == 1 and err == f"{latin}:1:14: KVD001 error: not UTF-8 (byte 0xe9)\n  hint: save the file as UTF-8\n"


@pytest.mark.parametrize("where", ["nope.json", "."])
def test_a_config_that_cannot_be_read_is_a_usage_error(capsys, where):
    """Exit 2, as for every command's unreadable file; a directory is no traceback."""
    code, _, err = run_cli(capsys, "--model-config", str(REPO / where), "--budget", "1GiB")
    assert code == 2 and "cannot read the model config" in err


def test_plan_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--engine", "sglang", "--model-config", str(FLASH), "--budget", "40 GiBB"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--engine", "sglang", "--model-config", str(FLASH)])  # neither --budget nor --full-tokens
    assert exc.value.code == 2


def test_plan_imports_neither_torch_nor_sglang():
    code = (
        "import sys; from kvpolicy.cli import main; "
        f"main(['plan','--engine','sglang','--model-config',{str(FLASH)!r},'--budget','40GiB','--format','json']); "
        "print('HEAVY', sorted(m for m in ('torch', 'sglang') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_plan_defaults_to_a_default_launch_and_says_so(capsys):
    code, out, _ = run_cli(capsys, "--model-config", str(FLASH), "--budget", "4GiB")
    assert code == 0
    assert "launch: deepseek_v4 on GPUs of 140.40 GiB (143,771 MiB), TP 1" in out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ") and "  " in line[2:]}
    assert "256" in rows["page size"] and "SGLang's DeepSeek-V4 override" in rows["page size"]
    assert "fp8_e4m3" in rows["KV cache dtype"]
    assert "256" in rows["max running requests"] and "default" in rows["max running requests"]
    assert "0.1" in rows["SWA full-tokens ratio"] and "explicit" in rows["SWA full-tokens ratio"]
    assert "8,192" in rows["chunked prefill size"] and "143,771 MiB" in rows["chunked prefill size"]
    assert "1,048,576" in rows["context length"]
    assert "(ratio 0.1)" in out and "req_to_token" in out  # the example: SGLang builds it by ratio


def test_plan_json_reports_the_launch_it_assumes(capsys):
    code, out, _ = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--gpu-memory", "40GiB",
                           "--tp-size", "4", "--attn-dp-size", "2", "--page-size", "128", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    launch, settings = doc["launch"], doc["settings"]
    assert launch["model_type"] == "deepseek_v4" and launch["kv_cache_dtype"] == "fp8_e4m3"
    assert launch["hardware"] == {"gpu_memory": 40 * GiB, "tp_size": 4}
    assert settings["chunked_prefill_size"] == 4096 // 2  # 4096 below 60 GiB, per attention-DP rank
    assert settings["page_size"] == 256 and "replaces --page-size 128" in launch["sources"]["page_size"]
    assert settings["attn_dp_size"] == 2 and doc["mode"] == "ratio"
    assert set(launch["sources"]) >= {"page_size", "kv_cache_dtype", "max_running_requests", "swa_ratio",
                                      "chunked_prefill_size", "context_length"}


def test_a_deepseek_v41_config_sizes_swa_from_the_request_cap(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(FLASH.read_text()), "model_type": "deepseek_v41"}))
    code, out, _ = run_cli(capsys, "--model-config", str(config), "--budget", "40GiB", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["mode"] == "cap" and doc["settings"]["swa_ratio"] is None
    code, out, _ = run_cli(capsys, "--model-config", str(config), "--budget", "40GiB", "--swa-ratio", "0.1",
                           "--format", "json")
    assert code == 0 and json.loads(out)["mode"] == "ratio"


def test_launch_refusals_exit_with_sglangs_reason(capsys, monkeypatch):
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--swa-ratio", "1.5")
    assert code == 2 and "(0, 1.0]" in err
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--kv-cache-dtype", "fp8_e5m2")
    assert code == 2 and "fp8_e5m2 is not supported" in err
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--kv-cache-dtype", "bfloat16")
    assert code == 1 and "DeepSeekV4SingleKVPool asserts fp8" in err
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--tp-size", "4",
                           "--attn-dp-size", "3")
    assert code == 2 and "not a multiple" in err
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--context-length", "2000000")
    assert code == 2 and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in err
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--context-length", "1")
    assert code == 2 and "--context-length 1 leaves no room for a request" in err and "Memory pool size" in err
    code, out, _ = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--context-length", "2",
                           "--format", "json")
    assert code == 0 and json.loads(out)["settings"]["context_length"] == 2
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    code, out, _ = run_cli(capsys, "--model-config", str(FLASH), "--budget", "40GiB", "--context-length", "2000000",
                           "--format", "json")
    assert code == 0 and json.loads(out)["settings"]["context_length"] == 2_000_000
    code, _, err = run_cli(capsys, "--model-config", str(FLASH), "--num-blocks", "5")
    assert code == 2 and "--num-blocks is vLLM's" in err


def test_the_derived_context_length_follows_sglangs_rules():
    flash = json.loads(FLASH.read_text())
    derived = lambda **extra: ModelGeometry.model_validate({**flash, **extra}).derived_context_length  # noqa: E731 - a one-line helper of this test
    assert derived() == 1_048_576
    assert derived(seq_length=5000, model_max_length=7000) == 5000  # the first key SGLang looks at wins
    assert derived(max_position_embeddings=65536, rope_scaling={"type": "linear", "factor": 4}) == 262_144
    assert derived(max_position_embeddings=65536, rope_scaling={"rope_type": "dynamic", "factor": 2.5}) == 163_840
    assert derived(max_position_embeddings=65536, rope_scaling={"type": "yarn", "factor": 16}) == 65536
    assert derived(max_position_embeddings=65536,
                   rope_scaling={"type": "linear", "factor": 4, "original_max_position_embeddings": 4096}) == 65536
