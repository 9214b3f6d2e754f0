"""``kvpolicy plan --engine vllm`` on a bare install: figures, JSON shape, CLI behaviour.

The figures here are the ones vLLM 0.33 itself produced for these configs
(test_vllm_planning.py re-checks them against vLLM's own code, where vllm is installed).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kvpolicy.adapters.vllm_adapter.planning.hf_config import (
    ModelSpecError,
    SpecSettings,
    load_config,
    model_specs,
)
from kvpolicy.adapters.vllm_adapter.planning.model_build import ModelBuildRefused
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan
from tests.vllm.vllm_paths import CONFIGS, POLICY_MODELS

from kvpolicy.commands.plan_vllm import add_vllm_arguments, parse_size, run_vllm
from kvpolicy.units import GiB, MiB

V4_FLASH = CONFIGS / "deepseek-v4-flash" / "config.json"
V4_PRO = CONFIGS / "deepseek-v4-pro" / "config.json"


def plan_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser)
    return parser.parse_args(list(argv))


def test_v4_flash_matches_vllms_own_figures() -> None:
    plan = make_plan(load_config(V4_FLASH), PlanSettings(max_model_len=65536), budget=60 * GiB)
    assert plan.kv_cache_layout == "BLHNC"
    assert [g.layers for g in plan.groups] == [22, 21, 62, 42, 20]
    assert [g.bytes_per_block for g in plan.groups] == [823_680, 786_240, 1_002_240, 870_912, 656_640]
    assert [g.block_size for g in plan.groups] == [64, 64, 256, 4, 8]
    assert plan.bytes_per_block == 1_002_240
    assert plan.num_blocks == 64_280
    assert plan.total_bytes == 64_280 * 1_002_240
    # The MLA group carries c4, c128 and indexer pages side by side and pads nothing.
    assert plan.groups[2].pool_bytes_per_block == {"indexer": 21 * 8640, "c4": 21 * 37_440, "c128": 20 * 1728}
    assert plan.groups[2].padding_per_block == 0
    assert plan.groups[0].padding_per_block == 1_002_240 - 823_680


def test_a_pools_bytes_per_block_sums_its_layers_over_every_group() -> None:
    # V4-Flash's swa layers fill two groups; Gemma-3-1B's sliding layers several.
    plan = make_plan(load_config(V4_FLASH), PlanSettings(max_model_len=65536), budget=60 * GiB)
    assert plan.pools["swa"].bytes_per_block == 823_680 + 786_240 == 1_609_920
    assert plan.pools["swa"].groups == [0, 1]
    gemma = make_plan(load_config(CONFIGS / "gemma-3-1b" / "config.json"), PlanSettings(max_model_len=32768),
                      budget=4 * GiB)
    for name, pool in gemma.pools.items():
        assert pool.bytes_per_block == sum(gemma.groups[i].pool_bytes_per_block[name] for i in pool.groups)
    assert len(gemma.pools["sliding_window"].groups) > 1
    state = plan.pools["compressor_state"]  # its parts split it, summed over groups the same way
    assert state.parts == {"indexer": 21 * 8640, "c4": 21 * 32_832, "c128": 20 * 32_832}
    assert sum(state.parts.values()) == state.bytes_per_block == 870_912 + 656_640


def test_v4_page_sizes_per_pool() -> None:
    specs = model_specs(load_config(V4_FLASH)).layers
    pages = {(s.pool, s.part): s.page_size_bytes for s in specs.values()}
    assert pages == {
        ("swa", ""): 37_440,
        ("c4", ""): 37_440,
        ("c128", ""): 1728,
        ("indexer", ""): 8640,
        ("compressor_state", "c4"): 32_832,
        ("compressor_state", "c128"): 32_832,
        ("compressor_state", "indexer"): 8640,
    }
    assert len(specs) == 167
    mxfp4 = model_specs(load_config(V4_FLASH), SpecSettings(indexer_kv_dtype="mxfp4")).layers
    assert {s.page_size_bytes for s in mxfp4.values() if s.pool == "indexer"} == {4608}


def test_v4_pro_layer_counts() -> None:
    specs = model_specs(load_config(V4_PRO)).layers
    by_pool: dict[str, int] = {}
    for s in specs.values():
        by_pool[s.pool] = by_pool.get(s.pool, 0) + 1
    assert by_pool == {"swa": 61, "c4": 30, "c128": 31, "indexer": 30, "compressor_state": 30 + 31 + 30}


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_policy_model_files_plan_like_full_configs(name: str) -> None:
    """The trimmed configs shipped in policies/models/ carry every field the plan reads."""
    trimmed = POLICY_MODELS / f"{name}.json"
    settings = PlanSettings(max_model_len=131072)
    full = make_plan(load_config(CONFIGS / name / "config.json"), settings, budget=40 * GiB)
    assert make_plan(load_config(trimmed), settings, budget=40 * GiB) == full


def test_standard_full_attention() -> None:
    plan = make_plan(load_config(CONFIGS / "qwen3-8b" / "config.json"), PlanSettings(max_model_len=32768), budget=60 * GiB)
    # 36 layers × 16 tokens × 8 KV heads × (128 + 128) × 2 bytes.
    assert plan.bytes_per_block == 36 * 16 * 8 * 256 * 2
    assert plan.num_blocks == 60 * GiB // plan.bytes_per_block
    assert [g.pools for g in plan.groups] == [["full"]]
    assert plan.per_request.blocks == 32768 // 16
    assert plan.max_concurrency == plan.num_blocks / 2048


def test_mla_default_block_and_latent() -> None:
    # On Hopper vLLM runs a 16-bit MLA cache on FlashAttention's MLA (block 16), an fp8 one on FlashMLA (64):
    # tests/vllm/test_vllm_cuda_defaults.py checks both against vLLM's backend selection.
    config = load_config(CONFIGS / "deepseek-v2-lite" / "config.json")
    plan = make_plan(config, PlanSettings(max_model_len=8192), budget=GiB)
    assert plan.groups[0].block_size == 16
    assert plan.bytes_per_block == 27 * 16 * (512 + 64) * 2
    assert list(plan.pools) == ["mla"]
    fp8 = make_plan(config, PlanSettings(max_model_len=8192, kv_cache_dtype="fp8"), budget=GiB)
    assert fp8.groups[0].block_size == 64 and fp8.bytes_per_block == 27 * 64 * (512 + 64)


def test_sliding_window_hybrid_groups() -> None:
    plan = make_plan(load_config(CONFIGS / "gemma-3-1b" / "config.json"), PlanSettings(max_model_len=32768), budget=GiB)
    # 22 sliding + 4 full layers: groups of 4 layers (the full count), sliding groups 4,4,4,4,3,3.
    assert [g.layers for g in plan.groups] == [4, 4, 4, 4, 3, 3, 4]
    assert [g.kind for g in plan.groups] == ["sliding_window"] * 6 + ["full"]
    assert plan.bytes_per_block == 4 * 16 * 1 * 512 * 2
    assert plan.groups[4].padding_per_block == plan.bytes_per_block // 4


def test_num_blocks_instead_of_budget() -> None:
    plan = make_plan(load_config(V4_FLASH), PlanSettings(max_model_len=4096), num_blocks=10_000)
    assert plan.num_blocks == 10_000 and plan.budget is None
    assert plan.total_bytes == 10_000 * 1_002_240


def test_budget_too_small_is_refused_with_figures() -> None:
    # vLLM's message and figures (tests/vllm/test_vllm_plan_v4_random.py compares them with vLLM's own).
    with pytest.raises(PlanError, match=r"to serve one request at max_model_len 65536, 6\.48 GiB of KV cache is needed "
                       r"\(6938 blocks of 1002240 B\), more than the 1\.0 GiB available .*estimated maximum model "
                       r"length is \d+; raise the budget"):
        make_plan(load_config(V4_FLASH), PlanSettings(max_model_len=65536), budget=GiB)
    with pytest.raises(PlanError, match="no available memory for the cache blocks"):
        make_plan(load_config(V4_FLASH), PlanSettings(max_model_len=65536), budget=1_002_240)


def test_contract_json_shape() -> None:
    args = plan_args("--model-config", str(V4_FLASH), "--budget", "60GiB", "--max-model-len", "65536", "--format", "json")
    out = _run(args)
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["engine"] == "vllm" and doc["engine_version"] == "0.33.0"
    for key in ("bytes_per_block", "num_blocks", "total_bytes", "groups", "pools", "max_concurrency"):
        assert key in doc
    for group in doc["groups"]:
        assert set(group) >= {"block_size", "bytes_per_block", "layers", "pools"}
    assert set(doc["pools"]) == {"swa", "c4", "c128", "indexer", "compressor_state"}
    assert all("bytes_per_block" in p for p in doc["pools"].values())
    assert isinstance(doc["max_concurrency"], float)
    assert doc["num_blocks"] == 64_280


def _run(args: argparse.Namespace) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_vllm(args) == 0
    return buf.getvalue()


def test_text_output_names_the_figures() -> None:
    out = _run(plan_args("--model-config", str(V4_FLASH), "--budget", "60 GiB", "--max-model-len", "65536"))
    assert "64,280 blocks × 1,002,240 B" in out
    assert "compressor_state" in out and "BLHNC" in out


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--budget", "1GiB"], 2, "--model-config is required"),
        (["--model-config", str(V4_FLASH), "--budget", "1GiB", "--vllm-version", "0.31"], 2,
         "--vllm-version 0.31: vLLM 0.31 is not a version kvpolicy's vLLM planning is validated against "
         "(validated: 0.32.0, 0.33.0)"),
        (["--model-config", str(V4_FLASH), "--max-model-len", "4096"], 2, "exactly one of --budget or --num-blocks"),
        (["--model-config", str(V4_FLASH), "--max-model-len", "4096", "--budget", "1GiB", "--num-blocks", "9"], 2, "exactly one"),
        (["--model-config", "/nonexistent/config.json", "--max-model-len", "4096", "--budget", "1GiB"], 2,
         "/nonexistent/config.json: cannot read the model config: No such file or directory"),
        (["--model-config", "/", "--max-model-len", "4096", "--budget", "1GiB"], 2, "/: cannot read the model config"),
        (["--model-config", str(V4_FLASH), "--max-model-len", "65536", "--budget", "1GiB"], 1, "to serve one request at max_model_len"),
        (["--model-config", str(V4_FLASH), "--max-model-len", "4096", "--budget", "1GiB", "--kv-cache-dtype", "bfloat16"], 1, "fp8_ds_mla"),
        (["--model-config", str(V4_FLASH), "--max-model-len", "4096", "--budget", "1GiB", "--block-size", "0"], 2, "--block-size"),
    ],
)
def test_cli_errors(argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_vllm(plan_args(*argv)) == code
    assert message in capsys.readouterr().err


def test_a_config_that_is_not_json_text_is_an_error_in_the_input(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    latin = tmp_path / "config.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    assert run_vllm(plan_args("--model-config", str(latin), "--max-model-len", "4096", "--budget", "1GiB")) == 1
    err = capsys.readouterr().err
    assert err == f"{latin}:1:14: KVD001 error: not UTF-8 (byte 0xe9)\n  hint: save the file as UTF-8\n"


def test_shared_options_are_not_added_twice() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget")  # as the SGLang part of the dispatcher would
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_vllm_arguments(parser)
    args = parser.parse_args(["--budget", "2GiB", "--model-config", str(V4_FLASH), "--max-model-len", "4096"])
    assert parse_size(args.budget) == 2 * GiB


@pytest.mark.parametrize(
    ("text", "value"),
    [("60GiB", 60 * GiB), ("60 GiB", 60 * GiB), ("512MiB", 512 * MiB), ("1.5GiB", 3 * GiB // 2), ("64424509440B", 60 * GiB), ("1GB", 10**9)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_rejects_garbage() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("lots")
    with pytest.raises(argparse.ArgumentTypeError, match="needs a unit"):
        parse_size("64424509440")  # a bare number is refused, as in the language


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "layer_types": ["full_attention", "linear_attention"], "head_dim": 8}, "linear_attention"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "sliding_window": 4096}, "add a layer_types list"),
        ({"num_attention_heads": 4, "head_dim": 8}, "no 'num_hidden_layers'"),
        ({"model_type": "deepseek_v32", "kv_lora_rank": 512, "index_topk": 2048}, "indexer other than DeepSeek-V4"),
        ({"model_type": "deepseek_v4", "num_hidden_layers": 3, "compress_ratios": [0, 4, 16]}, "supports 0, 4 and 128"),
    ],
)
def test_unplannable_configs_say_why(config: dict, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        model_specs(config)


def test_plan_imports_neither_torch_nor_vllm(tmp_path: Path) -> None:
    code = (
        "import argparse, sys\n"
        "from kvpolicy.commands.plan_vllm import add_vllm_arguments, run_vllm\n"
        "p = argparse.ArgumentParser(); add_vllm_arguments(p)\n"
        f"rc = run_vllm(p.parse_args(['--model-config', {str(V4_FLASH)!r}, '--budget', '8GiB', '--max-model-len', '4096', '--format', 'json']))\n"
        "heavy = sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)\n"
        "print('HEAVY', heavy, 'RC', rc, file=sys.stderr)\n"
        "sys.exit(1 if heavy or rc else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["engine"] == "vllm"


def test_options_join_the_plan_dispatcher() -> None:
    """add_vllm_arguments on the real `kvpolicy plan` parser: no clashes, --num-blocks
    excludes --budget like the dispatcher's other amounts, and run_vllm takes its args."""
    from kvpolicy.commands import plan as plan_command

    root = argparse.ArgumentParser()
    plan_command.add_parser(root.add_subparsers(dest="command"))
    parser = root._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
    add_vllm_arguments(parser)
    engine = parser._option_string_actions["--engine"].choices[0]  # the dispatcher adds "vllm"
    args = root.parse_args(
        ["plan", "--engine", engine, "--model-config", str(V4_FLASH), "--budget", "60GiB", "--max-model-len", "65536", "--format", "json"]
    )
    assert json.loads(_run(args))["num_blocks"] == 64_280
    with pytest.raises(SystemExit):
        root.parse_args(["plan", "--engine", engine, "--model-config", str(V4_FLASH), "--budget", "1GiB", "--num-blocks", "5"])


QWEN3 = CONFIGS / "qwen3-8b" / "config.json"


@pytest.mark.parametrize(("asked", "version"), [("0.32", "0.32.0"), ("0.33.0", "0.33.0")])
def test_vllm_version_names_the_release_planned(asked: str, version: str) -> None:
    doc = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "4GiB", "--max-model-len", "4096",
                                    "--vllm-version", asked, "--format", "json")))
    assert doc["engine_version"] == version
    assert "vllm_version" not in doc["assumed"]  # asked for: not a default


def test_the_default_version_is_the_installed_vllm_or_the_newest_validated() -> None:
    from kvpolicy.adapters.vllm_adapter.versions import installed_vllm
    from kvpolicy.commands.plan_vllm import resolve_vllm_version

    version, why = resolve_vllm_version(None)
    found = installed_vllm()
    if found is None:
        assert (version, why) == ("0.33.0", "the newest validated; no vLLM is installed here")
    else:
        assert (version, why) == (found.version, f"installed ({found.distribution})")


def test_max_model_len_defaults_to_vllms_and_every_default_is_stated() -> None:
    config = load_config(QWEN3)
    doc = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--format", "json")))
    assert doc["max_model_len"] == config["max_position_embeddings"] == 40960  # no RoPE scaling, no other key
    explicit = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--max-model-len",
                                         str(config["max_position_embeddings"]), "--format", "json")))
    assert doc["num_blocks"] == explicit["num_blocks"] and doc["per_request"] == explicit["per_request"]
    assumed = doc["assumed"]
    assert assumed["max_model_len"] == "40960 (the config's max_position_embeddings, as vLLM derives it)"
    assert assumed["block_size"].startswith("16 (") and assumed["kv_cache_layout"].startswith("LBNHC (")
    assert set(assumed) >= {"vllm_version", "kv_cache_dtype", "tensor_parallel_size", "max_num_batched_tokens"}
    assert "max_model_len" not in explicit["assumed"]
    text = _run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB"))
    assert "assumed (defaults no flag changed):" in text and "max_position_embeddings" in text


def test_a_config_without_max_position_embeddings_takes_its_class_default(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3Config's 32768; for a model type kvpolicy does not know, the default is unknown: asked for."""
    config = {k: v for k, v in json.loads(QWEN3.read_text()).items() if k != "max_position_embeddings"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    doc = json.loads(_run(plan_args("--model-config", str(path), "--budget", "8GiB", "--format", "json")))
    assert doc["max_model_len"] == 32768
    assert doc["assumed"]["max_model_len"] == "32768 (Qwen3Config's default max_position_embeddings, as vLLM derives it)"
    assert doc["assumed"]["config_defaults"].startswith("max_position_embeddings 32768, max_window_layers 28, ")
    assert doc["assumed"]["config_defaults"].endswith("(Qwen3Config's defaults for what config.json omits, as vLLM "
                                                      "reads them)")
    path.write_text(json.dumps({**config, "model_type": "unknown_llm"}))
    assert run_vllm(plan_args("--model-config", str(path), "--budget", "8GiB")) == 2
    assert "--max-model-len is required" in capsys.readouterr().err


def _v4_twelve_layers(tmp_path: Path) -> Path:
    """A 12-layer V4-shaped config with the ratios [0,4,4,128,4,4,128,4,4,0,4,128] (and an MTP entry)."""
    config = {**load_config(V4_FLASH), "num_hidden_layers": 12,
              "compress_ratios": [0, 4, 4, 128, 4, 4, 128, 4, 4, 0, 4, 128, 0]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_a_twelve_layer_v4_pattern_plans_as_vllm_with_its_scheduler(tmp_path: Path) -> None:
    # vLLM 0.33 (get_kv_cache_configs on the real specs) with 8192 batched tokens and one batch in flight:
    # 4,488 blocks of 327,744 B, 3,610 per request (1,183,155,840 B), concurrency 1.24. The per-request
    # worst case follows the scheduler: two batches in flight (async scheduling, CUDA's default) keep
    # twice the tokens in every sliding window and compressor-state ring.
    path = str(_v4_twelve_layers(tmp_path))
    one = json.loads(_run(plan_args("--model-config", path, "--budget", "1471026298B", "--max-model-len", "65536",
                                    "--max-concurrent-batches", "1", "--format", "json")))
    assert (one["num_blocks"], one["bytes_per_block"]) == (4488, 327_744)
    assert one["per_request"] == {"blocks": 3610, "bytes": 1_183_155_840}
    assert round(one["max_concurrency"], 2) == 1.24
    two = make_plan(load_config(path), PlanSettings(max_model_len=65536), budget=8 * GiB)
    assert two.per_request.blocks == 2 * 259 + 256 + 4099 + 2065  # swa ×2, mla, c4 state, c128 state


def test_the_cpu_platform_plans_vllms_cpu_defaults_and_says_so(tmp_path: Path) -> None:
    path = str(_v4_twelve_layers(tmp_path))
    doc = json.loads(_run(plan_args("--model-config", path, "--budget", "16GiB", "--max-model-len", "65536",
                                    "--platform", "cpu", "--max-num-batched-tokens", "4096", "--format", "json")))
    # No AMX: chunked prefill off, so a batch holds the whole max_model_len, over the flag; async scheduling off.
    assert doc["assumed"]["max_num_batched_tokens"].startswith("65536 (vLLM's CPU platform turns chunked prefill off")
    assert doc["assumed"]["max_concurrent_batches"].startswith("1 (")
    assert doc["assumed"]["platform"] == "cpu without AMX (pass --cpu-amx if it has AMX)"
    assert doc["per_request"]["blocks"] == 2 * 1025 + 256 + 16385 + 8193  # what vLLM 0.33 computes on this CPU
    amx = json.loads(_run(plan_args("--model-config", path, "--budget", "16GiB", "--max-model-len", "65536",
                                    "--platform", "cpu", "--cpu-amx", "--format", "json")))
    assert amx["assumed"]["max_num_batched_tokens"].startswith("2048 (vLLM's server default on CPU")
    qwen = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--platform", "cpu",
                                     "--format", "json")))
    assert {g["block_size"] for g in qwen["groups"]} == {128}
    assert qwen["assumed"]["block_size"] == "128 (vLLM's CPU platform default)"
    mla = json.loads(_run(plan_args("--model-config", str(CONFIGS / "deepseek-v2-lite" / "config.json"),
                                    "--budget", "8GiB", "--platform", "cpu", "--block-size", "64",
                                    "--format", "json")))
    assert {g["block_size"] for g in mla["groups"]} == {16}  # forced for the reference CPU MLA kernel
    assert mla["assumed"]["block_size"].endswith("forces it for MLA without AMX, over --block-size 64)")
    cuda = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--format", "json")))
    assert cuda["assumed"]["platform"].startswith("cuda (a Hopper GPU of 70 to 160 GiB (H100, H200)")
    assert cuda["assumed"]["max_concurrent_batches"].startswith("2 (")


# Qwen3-8B's config with other length keys and RoPE scalings, and the max_model_len vLLM 0.33 serves it with
# (tests/vllm/test_vllm_max_model_len.py compares the derivation with vLLM's over random configs).
QWEN3_LENGTHS = [
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 163840, "max_position_embeddings × RoPE factor 4"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.5}}, 102400, "max_position_embeddings × RoPE factor 2.5"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 3.0}}, 122880, "max_position_embeddings × RoPE factor 3"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 40960,
     "max_position_embeddings,"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, 40960, "max_position_embeddings,"),
    ({"seq_length": 8192}, 8192, "seq_length,"),
    ({"model_max_length": 65536}, 65536, "model_max_length,"),
    ({"model_max_length": 1000, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 2000,
     "model_max_length × RoPE factor 2"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64, "factor": 4.0},
      "original_max_position_embeddings": 4096}, 4096, "original_max_position_embeddings"),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64},
      "original_max_position_embeddings": 4096}, 4096, "original_max_position_embeddings"),
]


@pytest.mark.parametrize(("extra", "length", "why"), QWEN3_LENGTHS, ids=[str(i) for i in range(len(QWEN3_LENGTHS))])
def test_the_default_max_model_len_is_vllms_derivation(tmp_path: Path, extra: dict, length: int, why: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**load_config(QWEN3), **extra}))
    doc = json.loads(_run(plan_args("--model-config", str(path), "--budget", "64GiB", "--format", "json")))
    assert doc["max_model_len"] == length
    assert doc["assumed"]["max_model_len"].startswith(f"{length} (the config's {why}")


def test_a_max_model_len_above_vllms_is_refused_unless_vllm_is_told_to_allow_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    assert run_vllm(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--max-model-len", "40961")) == 1
    err = capsys.readouterr().err
    assert "--max-model-len 40961 is more than the 40960 vLLM derives from the config (max_position_embeddings)" in err
    assert "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in err
    _run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--max-model-len", "40960"))
    # vLLM lets model_max_length admit a longer one, and the variable any.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**load_config(QWEN3), "seq_length": 4096, "model_max_length": 50000}))
    assert json.loads(_run(plan_args("--model-config", str(path), "--budget", "8GiB", "--max-model-len", "50000",
                                     "--format", "json")))["max_model_len"] == 50000
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "64GiB", "--max-model-len", "100000",
                                     "--format", "json")))["max_model_len"] == 100000


def test_without_max_position_embeddings_the_other_keys_still_bound_max_model_len(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' class default may lower vLLM's length below the keys present, never raise it."""
    config = {k: v for k, v in json.loads(QWEN3.read_text()).items() if k != "max_position_embeddings"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "seq_length": 8192, "model_type": "unknown_llm"}))
    assert run_vllm(plan_args("--model-config", str(path), "--budget", "8GiB")) == 2
    assert "--max-model-len is required" in capsys.readouterr().err
    assert run_vllm(plan_args("--model-config", str(path), "--budget", "8GiB", "--max-model-len", "8193")) == 1
    assert "more than the 8192 vLLM derives" in capsys.readouterr().err


@pytest.mark.parametrize(("dtype", "page"), [("float32", 2), ("float16", 2), ("bfloat16", 2), (None, 2)])
def test_the_auto_kv_dtype_is_the_dtype_vllm_serves_the_model_in(tmp_path: Path, dtype: str | None, page: int) -> None:
    """vLLM downcasts float32 (and a config without a dtype, read as float32) to bfloat16."""
    config = {k: v for k, v in load_config(QWEN3).items() if k not in ("torch_dtype", "dtype")}
    if dtype is not None:
        config["torch_dtype"] = dtype
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    doc = json.loads(_run(plan_args("--model-config", str(path), "--budget", "8GiB", "--format", "json")))
    assert doc["bytes_per_block"] == 36 * 16 * 8 * 256 * page
    served = "float16" if dtype == "float16" else "bfloat16"
    assert doc["assumed"]["kv_cache_dtype"].startswith(f"auto ({served}, the model's dtype")


@pytest.mark.parametrize(("checkpoint", "flag", "served", "page"), [
    ("bfloat16", "float32", "float32", 4), ("bfloat16", "float", "float32", 4), ("float32", "float32", "float32", 4),
    ("bfloat16", "half", "float16", 2), ("float32", "float16", "float16", 2), (None, "bfloat16", "bfloat16", 2),
    ("float16", "auto", "float16", 2),
])
def test_dtype_is_the_model_dtype_and_an_auto_kv_caches(tmp_path: Path, checkpoint: str | None, flag: str, served: str,
                                                        page: int) -> None:
    """--dtype as vLLM takes it: an explicit dtype is served as it is (4 bytes an element for float32), auto as
    vLLM resolves the checkpoint's; the plan says which, and where it comes from when no flag said."""
    config = {k: v for k, v in load_config(QWEN3).items() if k not in ("torch_dtype", "dtype")}
    if checkpoint is not None:
        config["dtype"] = checkpoint
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    doc = json.loads(_run(plan_args("--model-config", str(path), "--budget", "16GiB", "--dtype", flag,
                                    "--format", "json")))
    assert doc["bytes_per_block"] == 36 * 16 * 8 * 256 * page
    assert doc["assumed"]["kv_cache_dtype"].startswith(f"auto ({served}, the model's dtype")
    assert "dtype" not in doc["assumed"]
    unset = json.loads(_run(plan_args("--model-config", str(path), "--budget", "8GiB", "--format", "json")))
    assert unset["assumed"]["dtype"].startswith(f"auto ({'float16' if checkpoint == 'float16' else 'bfloat16'}: ")


@pytest.mark.parametrize(
    ("config", "argv", "message"),
    [
        ("gemma-3-1b", ["--dtype", "float16"], "vLLM refuses float16 for model_type 'gemma3_text'"),
        ("gemma-3-1b", ["--dtype", "half"], "vLLM refuses float16 for model_type 'gemma3_text'"),
        ("deepseek-v2-lite", ["--dtype", "float32"], "none of vLLM's MLA backends for Hopper"),
        ("qwen3-8b", ["--dtype", "float32", "--kv-cache-dtype", "bfloat16"], "serves this model in float32"),
        ("qwen3-8b", ["--tensor-parallel-size", "3"], "does not divide the model's 32 attention heads"),
        ("deepseek-v2-lite", ["--tensor-parallel-size", "3"], "does not divide the model's 16 attention heads"),
        ("deepseek-v2-lite", ["--platform", "cpu", "--kv-cache-dtype", "fp8"],
         "vLLM 0.33.0's MLA attention on CPU takes auto, bfloat16 or float16 only"),
        ("deepseek-v2-lite", ["--kv-cache-dtype", "fp8_e5m2"], "none of vLLM's MLA backends for Hopper"),
    ],
)
def test_launches_vllm_refuses_are_refused(config: str, argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = plan_args("--model-config", str(CONFIGS / config / "config.json"), "--budget", "8GiB",
                     "--max-model-len", "4096", "--vllm-version", "0.33", *argv)
    assert run_vllm(args) == 1
    assert message in capsys.readouterr().err


def test_kv_heads_that_tensor_parallel_cannot_split_are_refused(tmp_path: Path) -> None:
    # A vocabulary (a multiple of 64 × 12) and an MLP that 12 ranks can split: Qwen3-8B's cannot.
    config = {**load_config(QWEN3), "num_attention_heads": 24, "num_key_value_heads": 6, "vocab_size": 153600}
    with pytest.raises(ModelSpecError, match="neither divides the model's 6 KV heads nor is a multiple"):
        model_specs(config, SpecSettings(tensor_parallel_size=4))
    # Fewer KV heads than ranks: each rank keeps a copy of one.
    assert {s.num_kv_heads for s in model_specs(config, SpecSettings(tensor_parallel_size=12)).layers.values()} == {1}


@pytest.mark.parametrize(("fields", "tp", "message", "module"), [
    ({"num_attention_heads": 24, "vocab_size": 151936}, 3, "does not divide the vocabulary of 151,936 tokens as vLLM pads it (151,936",
     "model.embed_tokens"),
    ({"num_attention_heads": 24, "vocab_size": 151900}, 3, "vocabulary of 151,900 tokens as vLLM pads it (151,936", "model.embed_tokens"),
    ({"num_attention_heads": 24, "num_key_value_heads": 3, "vocab_size": 3072, "intermediate_size": 1000}, 3, "does not divide intermediate_size 1,000 (layer 0's MLP)",
     "model.layers.0.mlp"),
    ({"vocab_size": 3072, "num_attention_heads": 12, "num_key_value_heads": 8}, 1,
     "12 attention heads are not a multiple of its 8 KV heads", "model.layers.0.self_attn"),
    ({"vocab_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 2, "intermediate_size": 1000}, 3,
     "neither divides the model's 2 KV heads", "model.layers.0.self_attn"),  # the attention before the MLP
])
def test_model_dimensions_vllm_cannot_split_are_refused(fields: dict, tp: int, message: str, module: str) -> None:
    """What vLLM checks as it builds the model, in its order: the padded vocabulary, then layer 0's attention
    (KV heads, heads per KV head), then its MLP."""
    with pytest.raises(ModelBuildRefused, match=re.escape(message)) as refused:
        model_specs({**load_config(QWEN3), **fields}, SpecSettings(tensor_parallel_size=tp))
    assert refused.value.module == module


def test_deepseek_moe_widths_are_checked_in_vllms_layer_order() -> None:
    """DeepSeek-V2-Lite: layer 0 dense (intermediate_size 10944), then MoE layers (1408 × 2 shared, 1408 routed)."""
    lite = {**load_config(CONFIGS / "deepseek-v2-lite" / "config.json"), "num_attention_heads": 80}
    cases = [
        ({}, "intermediate_size 10,944", "model.layers.0.mlp"),  # 5 divides the heads and vocabulary, not this
        ({"intermediate_size": 9600, "moe_intermediate_size": 1001}, "moe_intermediate_size × n_shared_experts 2,002",
         "model.layers.1.mlp.shared_experts"),
        ({"intermediate_size": 9600, "moe_intermediate_size": 1001, "n_shared_experts": 5}, "moe_intermediate_size 1,001",
         "model.layers.1.mlp.experts"),
        ({"first_k_dense_replace": 0, "moe_intermediate_size": 1001}, "moe_intermediate_size × n_shared_experts 2,002",
         "model.layers.0.mlp.shared_experts"),
    ]
    for fields, message, module in cases:
        with pytest.raises(ModelBuildRefused, match=re.escape(message)) as refused:
            model_specs({**lite, **fields}, SpecSettings(tensor_parallel_size=5))
        assert refused.value.module == module


def test_vllm_032_starts_mla_with_an_fp8_cache_on_cpu() -> None:
    """0.32's CPU platform does not check the MLA cache dtype (0.33 refuses): the plan follows the version."""
    args = plan_args("--model-config", str(CONFIGS / "deepseek-v2-lite" / "config.json"), "--budget", "8GiB",
                     "--max-model-len", "4096", "--vllm-version", "0.32", "--platform", "cpu", "--kv-cache-dtype",
                     "fp8", "--format", "json")
    assert json.loads(_run(args))["bytes_per_block"] == 27 * 16 * (512 + 64)


@pytest.mark.parametrize(
    ("extra", "indexer", "message"),
    [
        ({"index_head_dim": 64}, "fp8", "index_head_dim 64: vLLM's DeepSeek-V4 compressor caches only"),
        ({"head_dim": 256}, "fp8", "head_dim 256: vLLM's DeepSeek-V4 compressor caches only"),
        ({"index_head_dim": 512}, "mxfp4", "takes index_head_dim 128 only"),
    ],
)
def test_v4_head_sizes_vllm_cannot_cache_are_refused(extra: dict, indexer: str, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        model_specs({**load_config(V4_FLASH), **extra}, SpecSettings(indexer_kv_dtype=indexer))
    # A sliding-only pattern builds no compressor, so vLLM starts it.
    sliding = {**load_config(V4_FLASH), **extra, "num_hidden_layers": 2, "compress_ratios": [0, 0, 0]}
    assert len(model_specs(sliding, SpecSettings(indexer_kv_dtype=indexer)).layers) == 2


def test_an_mxfp4_indexer_plans_for_the_blackwell_gpus_vllm_runs_it_on() -> None:
    doc = json.loads(_run(plan_args("--model-config", str(V4_FLASH), "--budget", "60GiB", "--max-model-len", "65536",
                                    "--indexer-kv-dtype", "mxfp4", "--format", "json")))
    assert doc["assumed"]["platform"].startswith("cuda (a Blackwell datacenter GPU of 160 GiB or more")
    assert doc["assumed"]["max_num_batched_tokens"].startswith("16384 (vLLM's server default on a Blackwell")


def test_a_short_model_caps_the_default_batch_as_vllm_does() -> None:
    doc = json.loads(_run(plan_args("--model-config", str(QWEN3), "--budget", "8GiB", "--max-model-len", "4",
                                    "--format", "json")))
    assert doc["assumed"]["max_num_batched_tokens"].startswith("4096 (")  # 1024 sequences × 4 tokens
