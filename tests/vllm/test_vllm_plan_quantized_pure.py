"""``kvpolicy plan --engine vllm`` for quantized checkpoints, on a bare install (``planning/kv_dtype.py``).

What vLLM's code gives (tests/vllm/test_vllm_kv_dtype.py and test_vllm_plan_quantized.py check it against vLLM
0.33, tests/vllm_e2e/test_vllm_kv_dtype_032.py against 0.32) turned into plans: a quantized config under
``--kv-cache-dtype auto`` plans as the same config unquantized with the dtype vLLM resolves auto to, where the
plan cannot build vLLM's model here too (CUDA: FlashMLA's block size for ModelOpt's fp8 MLA cache; DeepSeek-V4,
whose attention turns any fp8 into its fp8_ds_mla cache); where the plan reads the quantization config from (an
hf_quant_config.json beside config.json, a multimodal text config); what it says of auto; what it refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvpolicy.adapters.vllm_adapter.planning.config_values import ConfigInvalid
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import kv_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, VllmPlan, make_plan
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.cli import main

QWEN = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
GEMMA = json.loads((CONFIGS / "gemma-3-1b" / "config.json").read_text())
MLA = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
V4 = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())
MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
MODELOPT_029 = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
          "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                              "symmetric": True}}
QUARK = {"quant_method": "quark", "export": {"kv_cache_group": []}, "exclude": ["lm_head"]}
"""A Quark checkpoint with no KV config: its attention layers load KV scales all the same, but those it excludes."""
GiB = 1 << 30


def plan(config: dict[str, Any], kv_cache_dtype: str = "auto", **kwargs: Any) -> VllmPlan:
    settings = PlanSettings(max_model_len=kwargs.pop("max_model_len", 32768), kv_cache_dtype=kv_cache_dtype)
    return make_plan(config, settings, budget=40 * GiB, **kwargs)


def figures(p: VllmPlan) -> tuple[Any, ...]:
    return p.num_blocks, p.bytes_per_block, [(g.block_size, g.bytes_per_block) for g in p.groups], p.max_concurrency


@pytest.mark.parametrize(("base", "quant", "resolved"), [
    (QWEN, MODELOPT_FP8, "fp8_e4m3"), (GEMMA, MODELOPT_FP8, "fp8_e4m3"), (MLA, MODELOPT_FP8, "fp8_e4m3"),
    (QWEN, MODELOPT_029, "fp8_e4m3"), (V4, MODELOPT_FP8, "fp8_e4m3"),
    (QWEN, CT_FP8, "fp8"), (GEMMA, CT_FP8, "fp8"), (MLA, CT_FP8, "auto"), (V4, CT_FP8, "auto"),
    (QWEN, {**MODELOPT_FP8, "kv_cache_quant_algo": "INT8"}, "auto"), (QWEN, {"quant_method": "fp8"}, "auto"),
], ids=["modelopt-qwen3", "modelopt-gemma3", "modelopt-mla", "modelopt-0.29-qwen3", "modelopt-v4", "ct-qwen3",
        "ct-gemma3", "ct-mla", "ct-v4", "modelopt-unknown-algorithm", "fp8-weights"])
@pytest.mark.parametrize("platform", ["cuda", "cpu"])
def test_auto_plans_as_the_dtype_vllm_resolves_it_to(base: dict[str, Any], quant: dict[str, Any], resolved: str,
                                                     platform: str) -> None:
    """Bytes, blocks and block sizes (on CUDA, MLA's 64 of FlashMLA for an fp8 cache) are those of the unquantized
    config with ``--kv-cache-dtype`` what vLLM resolves auto to for the checkpoint."""
    version = "0.32.0" if platform == "cpu" else "0.33.0"  # 0.33's CPU MLA refuses fp8 (tested against vLLM)
    quantized = plan({**base, "quantization_config": quant}, platform=platform, engine_version=version)
    assert figures(quantized) == figures(plan(base, resolved, platform=platform, engine_version=version))


def test_modelopts_fp8_halves_the_bytes_and_quadruples_mla_blocks_on_hopper() -> None:
    """The gap this closes: vLLM stores 1 byte where the model's dtype is 2, and FlashMLA takes 64-token blocks."""
    assert plan({**QWEN, "quantization_config": MODELOPT_FP8}).bytes_per_block * 2 == plan(QWEN).bytes_per_block
    mla = plan({**MLA, "quantization_config": MODELOPT_FP8})
    assert [g.block_size for g in mla.groups] == [64]
    assert mla.bytes_per_block * 2 == plan(MLA).bytes_per_block * 4


def test_an_explicit_kv_cache_dtype_wins_over_the_checkpoints() -> None:
    for quant in (MODELOPT_FP8, CT_FP8):
        quantized = {**QWEN, "quantization_config": quant}
        assert figures(plan(quantized, "bfloat16")) == figures(plan(QWEN, "bfloat16"))


def test_hf_quant_config_json_beside_the_config_is_read_where_it_gives_none(tmp_path: Path) -> None:
    """ModelOpt 0.29 kept its quantization config in hf_quant_config.json; vLLM reads it when config.json has none."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(MODELOPT_029))
    assert kv_dtype(load_config(tmp_path / "config.json"), "auto", "standard").layers == "fp8_e4m3"
    (tmp_path / "config.json").write_text(json.dumps({**QWEN, "quantization_config": {"quant_method": "fp8"}}))
    assert kv_dtype(load_config(tmp_path / "config.json"), "auto", "standard").layers == "auto"
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    for text, code, place in (("[1]", "KVD007", (1, 1)), ('{"quant_method": "modelopt",\n "producer": {},}', "KVD002", (2, 17))):
        (tmp_path / "hf_quant_config.json").write_text(text)
        with pytest.raises(ConfigInvalid) as refused:  # its problems are a document's, as config.json's are
            load_config(tmp_path / "config.json")
        (d,) = refused.value.diagnostics
        assert (Path(d.file).name, d.code, (d.line, d.col)) == ("hf_quant_config.json", code, place)


def test_a_multimodal_text_configs_quantization_reaches_the_layers_not_the_cache_config(tmp_path: Path) -> None:
    """vLLM's cache config reads the wrapper's quantization_config only; its model reads the text config's where
    the wrapper has none: a compressed-tensors scheme there still makes the layers fp8, a ModelOpt algorithm
    does not change auto."""
    def wrapped(quant: dict[str, Any], **outer: Any) -> dict[str, Any]:
        text = {k: v for k, v in GEMMA.items() if k not in ("architectures", "model_type")}
        config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                  "text_config": {**text, "quantization_config": quant}, **outer}
        (tmp_path / "config.json").write_text(json.dumps(config))
        return load_config(tmp_path / "config.json")

    assert kv_dtype(wrapped(CT_FP8), "auto", "standard").layers == "fp8"
    assert kv_dtype(wrapped(MODELOPT_FP8), "auto", "standard").layers == "auto"
    assert kv_dtype(wrapped(CT_FP8, quantization_config=MODELOPT_FP8), "auto", "standard").layers == "fp8_e4m3"


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, Any], *flags: str) -> tuple[int, str]:
    (tmp_path / "config.json").write_text(json.dumps(config, indent=1))
    code = main(["plan", "--engine", "vllm", "--model-config", str(tmp_path / "config.json"), "--budget", "40GiB",
                 "--vllm-version", "0.33", *flags])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize(("base", "quant", "said"), [
    (QWEN, MODELOPT_FP8, "auto (fp8_e4m3, as the checkpoint's quantization_config (modelopt) gives "
                         "kv_cache_quant_algo 'FP8')"),
    (QWEN, CT_FP8, "auto (fp8, as the checkpoint's quantization_config (compressed-tensors) declares a "
                   "kv_cache_scheme)"),
    (MLA, CT_FP8, "auto (bfloat16, the model's dtype as vLLM's --dtype auto resolves it; the checkpoint's "
                  "quantization_config (compressed-tensors) declares a kv_cache_scheme, which vLLM's MLA attention "
                  "does not read)"),
    (QWEN, {**MODELOPT_FP8, "kv_cache_quant_algo": "int8"}, "auto (bfloat16, the model's dtype as vLLM's --dtype "
     "auto resolves it; the checkpoint's quantization_config (modelopt) gives kv_cache_quant_algo 'int8', which "
     "vLLM does not know: it keeps auto)"),
    (QWEN, None, "auto (bfloat16, the model's dtype as vLLM's --dtype auto resolves it)"),
])
def test_the_plan_says_what_auto_became_and_why(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                base: dict[str, Any], quant: dict[str, Any] | None, said: str) -> None:
    config = {**base, "quantization_config": quant} if quant is not None else base
    code, out = run(capsys, tmp_path, config, "--format", "json")
    assert code == 0, out
    assert json.loads(out)["assumed"]["kv_cache_dtype"] == said


def test_an_nvfp4_cache_is_refused_at_the_checkpoints_kv_algorithm(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    code, out = run(capsys, tmp_path, {**QWEN, "quantization_config": {**MODELOPT_FP8, "kv_cache_quant_algo": "NVFP4"}})
    assert code == 1
    assert "KVD008 error: --kv-cache-dtype auto (the checkpoint's quantization_config (modelopt) gives " \
           "kv_cache_quant_algo 'NVFP4': nvfp4): vLLM stores an nvfp4 KV cache for this checkpoint, which kvpolicy " \
           "does not plan" in out, out


@pytest.mark.parametrize(("base", "quant", "refused"), [
    (QWEN, MODELOPT_FP8, True), (MLA, MODELOPT_FP8, True), (QWEN, {"quant_method": "fp8"}, True),
    (QWEN, QUARK, True), (QWEN, {**QUARK, "exclude": ["lm_head", "re:.*attn$"]}, False), (MLA, QUARK, False),
    (QWEN, CT_FP8, True), (MLA, CT_FP8, False),
    (QWEN, {**CT_FP8, "kv_cache_scheme": None}, False), (QWEN, {"quant_method": "awq"}, False),
    (MLA, {"quant_method": "fp8"}, False),
])
def test_fp8_e5m2_is_refused_where_the_attention_loads_kv_scales(base: dict[str, Any], quant: dict[str, Any],
                                                                  refused: bool) -> None:
    """Checked on CPU with vLLM 0.32, whose MLA backend takes fp8_e5m2 (Hopper's MLA backends refuse it first,
    and 0.33's CPU one)."""
    config = {**base, "quantization_config": quant}
    if not refused:
        plan(config, "fp8_e5m2", platform="cpu", engine_version="0.32.0")
        return
    with pytest.raises(ModelSpecError, match="vLLM refuses fp8_e5m2 with them") as exc:
        plan(config, "fp8_e5m2", platform="cpu", engine_version="0.32.0")
    key = "kv_cache_scheme" if "kv_cache_scheme" in quant else "quant_method"
    assert exc.value.key == ("quantization_config", key)


def test_vllm_032_knows_no_mixed_precision_modelopt_export() -> None:
    """0.32 normalises a ModelOpt export named by its producer without MIXED_PRECISION, and refuses it as it loads
    the config; 0.33 takes it with its recipes (and mixed precision loads KV scales in standard attention only
    when it names a KV algorithm)."""
    mixed = {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
        "quantized_layers": {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"}}}}
    config = {**QWEN, "quantization_config": mixed}
    with pytest.raises(ModelSpecError, match=r"vLLM 0\.32\.0 knows no such ModelOpt algorithm"):
        plan(config, engine_version="0.32.0")
    assert figures(plan(config)) == figures(plan(QWEN, "fp8_e4m3"))


def test_modelopts_fp8_mla_cache_is_refused_by_vllm_033s_cpu_backend_with_a_way_out() -> None:
    with pytest.raises(ModelSpecError, match=r"MLA attention on CPU takes auto, bfloat16 or float16 only, and "
                                             r"refuses the launch; pass --kv-cache-dtype bfloat16") as exc:
        plan({**MLA, "quantization_config": MODELOPT_FP8}, platform="cpu", engine_version="0.33.0")
    assert exc.value.key == ("quantization_config", "kv_cache_quant_algo")
