"""A config's ``sliding_window`` of any JSON value: the plan takes it as vLLM 0.33 does, or refuses it, placed.

Each random example writes a small config of a model type the plan knows (Llama, Mistral, Qwen2/3 with their
window on or off, Gemma-2/3, gpt-oss, DeepSeek-V2) with a ``sliding_window`` of any kind (integers of either sign and
0, whole and fractional floats, true/false, numeric and other strings, lists, objects, null) and, for the
models that read ``layer_types``, none, a random mix, all sliding or all full. vLLM loads the config, builds the
model on the meta device and plans it (tests/vllm/real_vllm.py); where it refuses at any of these steps, the
plan must refuse for the same reason, as a KVD007 problem at the window's value; where it plans, the plan
must give each layer vLLM's window and vLLM's blocks, bytes and concurrency. One divergence is kept on purpose:
a fractional window that a Llama layer takes as it is (from ``layer_types``), which vLLM's planning computes
with but its attention kernels cannot run, is refused. planning/sliding_window.py says what vLLM does.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.adapters.vllm_adapter.planning.class_defaults import config_class
from kvpolicy.adapters.vllm_adapter.planning.config_places import refusal
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config, model_specs
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan
from kvpolicy.cli import main
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE

EXAMPLES = int(os.environ.get("KVPOLICY_SLIDING_WINDOW_EXAMPLES", "60"))
"""Each example loads a config and builds a small model on the meta device (a fraction of a second)."""

SHAPE = {"vocab_size": 3072, "hidden_size": 384, "intermediate_size": 96, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
MODELS: dict[str, dict[str, Any]] = {  # model type → what its config needs besides SHAPE
    "llama": {"architectures": ["LlamaForCausalLM"]},
    "mistral": {"architectures": ["MistralForCausalLM"]},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "max_window_layers": 0},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "max_window_layers": 0},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "query_pre_attn_scalar": 64},
    "gemma3_text": {"architectures": ["Gemma3ForCausalLM"], "query_pre_attn_scalar": 64},
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2,
                "experts_per_token": 2},
}
PER_LAYER = ("llama", "gemma2", "gemma3_text")
"""Models whose layers follow ``layer_types``, drawn with one."""
MLA_BASE = "deepseek-v2-lite"

WINDOWS = {  # each kind of JSON value drawn as often as the others
    "positive": st.integers(1, 4096),
    "other integer": st.sampled_from([0, -1]) | st.integers(-4096, 0) | st.integers(-(1 << 40), 1 << 40),
    "float": st.sampled_from([0.0, -0.0, 512.0, 512.5, -3.0, 1e3]) | st.floats(-1e4, 1e4, allow_nan=False),
    "bool": st.booleans(),
    "string": st.sampled_from(["512", "0", "-3", " 64 ", "abc", "", "1e3", "4_096"]),
    "list or object": st.lists(st.integers(0, 512), max_size=2) | st.sampled_from([{}, {"size": 512}]),
    "null": st.none(),
}

REASONS = {  # vLLM's words → the plan's
    "Validation error for field 'sliding_window'": "takes a whole number or null, so transformers refuses",
    "validation error for CacheConfig": "vLLM's CacheConfig takes the model's window as a whole number",
    "TypeError": "vLLM fails planning the KV cache at start-up",
}


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    window = draw(st.sampled_from(sorted(WINDOWS)).flatmap(WINDOWS.__getitem__))
    if draw(st.integers(0, 7)) == 0:  # MLA: no model reads the window, but vLLM's CacheConfig checks it
        config = json.loads((CONFIGS / MLA_BASE / "config.json").read_text())
        config |= {"num_hidden_layers": 2, "hidden_size": 384, "intermediate_size": 96, "moe_intermediate_size": 96,
                   "n_routed_experts": 8, "num_experts_per_tok": 2, "vocab_size": 3072, "sliding_window": window}
        return config
    model_type = draw(st.sampled_from(sorted(MODELS)))
    n = draw(st.integers(2, 6))
    config = {**SHAPE, "model_type": model_type, **MODELS[model_type], "num_hidden_layers": n,
              "sliding_window": window}
    if model_type.startswith("qwen") and draw(st.integers(0, 3)):  # else the class's default: off
        config["use_sliding_window"] = draw(st.integers(0, 2)) > 0  # on mostly: off drops the window, once checked
    if model_type in PER_LAYER:
        kinds = st.sampled_from(["sliding_attention", "full_attention"])
        config["layer_types"] = draw(st.sampled_from([
            None, draw(st.lists(kinds, min_size=n, max_size=n)), ["sliding_attention"] * n, ["full_attention"] * n]))
        if config["layer_types"] is None:
            del config["layer_types"]
    return config


def windows_of(specs: dict[str, Any]) -> list[int | None]:
    """vLLM's window per layer, in layer order (as the integer it computes like)."""
    return [None if getattr(s, "sliding_window", None) is None else int(s.sliding_window) for s in specs.values()]


@pytest.mark.vllm
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs(), budget=st.integers(256 << 20, 8 << 30), max_len=st.integers(16, 8192))
def test_any_window_is_planned_or_refused_as_vllm_does(tmp_path_factory: pytest.TempPathFactory,
                                                        config: dict[str, Any], budget: int, max_len: int) -> None:
    from tests.vllm.real_vllm import Case, layer_specs, real_plan
    from vllm.transformers_utils import repo_utils

    folder = tmp_path_factory.mktemp("window")
    (folder / "config.json").write_text(json.dumps(config))
    block = 16 if "kv_lora_rank" in config else 32  # what vLLM's CPU backends take (MLA; sliding windows)
    case = Case(str(folder), block, max_model_len=max_len)
    window = config["sliding_window"]
    theirs: Any  # vLLM's RealPlan, or the exception it refused with
    # vLLM retries a config transformers refuses after a 2 s sleep: a refusal is no network failure here.
    with mock.patch.object(repo_utils, "time", types.SimpleNamespace(sleep=lambda _: None)):
        try:
            theirs = real_plan(case, budget)
            specs = layer_specs(case)
        except Exception as exc:  # noqa: BLE001 - any step of vLLM's start-up; the reason is compared below
            theirs, specs = exc, {}
    mine = load_config(folder / "config.json")
    settings_ = PlanSettings(max_model_len=max_len, block_size=block)
    if not isinstance(theirs, Exception):  # the batches vLLM's scheduler keeps in flight on this host
        settings_ = settings_.model_copy(update={
            "max_num_batched_tokens": theirs.config.scheduler_config.max_num_batched_tokens,
            "max_concurrent_batches": theirs.config.max_concurrent_batches})
    try:
        ours: Any = make_plan(mine, settings_, budget=budget, platform="cpu")
    except (ModelSpecError, PlanError) as exc:
        ours = exc
    kind = type(window).__name__
    if isinstance(ours, ModelSpecError) and "would take a negative window" in str(ours):
        # vLLM plans it into nonsense, or fails dividing by zero (test_a_negative_window_is_refused_at_it).
        assert float(window) < 0 and ours.code is VALUE_NOT_ALLOWED, (window, ours)  # a number, or a numeric string
        assert not isinstance(theirs, Exception) or isinstance(theirs, ZeroDivisionError), theirs
        event("refused by the plan alone: a negative window")
        return
    if isinstance(theirs, Exception):
        said = f"{type(theirs).__name__}: {theirs}"
        reason = next((r for r in REASONS if r in said), None)
        assert reason is not None, said
        assert isinstance(ours, ModelSpecError), (said, ours)
        assert REASONS[reason] in str(ours), (said, str(ours))
        assert ours.key == ("sliding_window",) and ours.code is WRONG_TYPE
        placed = refusal(ours, mine)
        assert placed is not None and placed.diagnostics[0].code == "KVD007"
        event(f"refused: {reason} ({kind})")
        return
    if isinstance(ours, ModelSpecError) and "a fraction of a token" in str(ours):
        # vLLM plans a Llama layer's fractional window as it is; its kernels take whole numbers (module doc).
        assert isinstance(window, float) and not window.is_integer() and config.get("model_type") == "llama"
        event("refused by the plan alone: a fractional window")
        return
    assert not isinstance(ours, Exception), (window, ours)
    assert windows_of(specs) == [s.sliding_window for s in model_specs(mine, settings_).layers.values()]
    assert ours.num_blocks == theirs.kv_cache_config.num_blocks
    assert ours.bytes_per_block == theirs.bytes_per_block
    assert ours.max_concurrency == pytest.approx(theirs.max_concurrency, rel=1e-12)
    event(f"planned: {kind}, {'sliding' if any(windows_of(specs)) else 'full'}")


# ---- explicit examples, placed as `kvpolicy plan` reports them (no vLLM needed) --------------------------------


def plan_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=1))
    code = main(["plan", "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB"])
    return code, capsys.readouterr().err


def at(config: dict[str, Any], key: str) -> str:
    """``config.json:LINE:COL`` of ``key``'s value as ``plan_errors`` writes the file."""
    lines = json.dumps(config, indent=1).splitlines()
    line = next(i for i, text in enumerate(lines) if text.startswith(f' "{key}": '))
    return f"config.json:{line + 1}:{len(key) + 6}"


GEMMA2 = {**SHAPE, "model_type": "gemma2", **MODELS["gemma2"], "num_hidden_layers": 4}
LLAMA = {**SHAPE, "model_type": "llama", **MODELS["llama"], "num_hidden_layers": 4}


@pytest.mark.parametrize(("config", "words"), [
    ({**GEMMA2, "sliding_window": 4096.0}, "sliding_window 4096.0: Gemma2Config takes a whole number or null"),
    ({**GEMMA2, "sliding_window": True}, "sliding_window true: Gemma2Config takes a whole number or null"),
    ({**GEMMA2, "sliding_window": "4096"}, 'sliding_window "4096": Gemma2Config takes a whole number or null'),
    ({**SHAPE, "model_type": "qwen3", **MODELS["qwen3"], "num_hidden_layers": 4, "sliding_window": 4096.0,
      "use_sliding_window": False}, "sliding_window 4096.0: Qwen3Config takes a whole number or null"),
    ({**LLAMA, "sliding_window": 4096.5}, "sliding_window 4096.5: vLLM's CacheConfig takes"),
    ({**LLAMA, "sliding_window": [4096]}, "sliding_window [4096]: vLLM's CacheConfig takes"),
    ({**LLAMA, "sliding_window": "4096", "layer_types": ["sliding_attention", "full_attention"] * 2},
     'sliding_window "4096": vLLM\'s llama model gives it as it is to layer 0'),
    ({**LLAMA, "sliding_window": 4096.5, "layer_types": ["full_attention", "sliding_attention"] * 2},
     "sliding_window 4096.5: layer 1 (sliding_attention) would take a window of a fraction of a token"),
])
def test_a_window_vllm_refuses_is_placed_at_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               config: dict[str, Any], words: str) -> None:
    code, err = plan_errors(capsys, tmp_path, config)
    assert code == 1
    assert f"{at(config, 'sliding_window')}: KVD007 error: {words}" in err, err
    assert "hint: write the window as a whole number of tokens" in err


@pytest.mark.parametrize(("window", "layer_types", "windows"), [
    (None, None, [None] * 4),
    (0, None, [None] * 4),  # vLLM turns 0 off
    (0.0, None, [None] * 4),
    (False, None, [None] * 4),
    (512.0, None, [512] * 4),  # CacheConfig makes it 512
    ("512", None, [512] * 4),
    (True, ["sliding_attention", "full_attention"] * 2, [1, None, 1, None]),
    ("abc", ["full_attention"] * 4, [None] * 4),  # no layer reads it
])
def test_a_llama_window_plans_as_vllm_takes_it(window: Any, layer_types: list[str] | None,
                                               windows: list[int | None]) -> None:
    config = {**LLAMA, "sliding_window": window, **({"layer_types": layer_types} if layer_types else {})}
    assert [s.sliding_window for s in model_specs(config).layers.values()] == windows


@pytest.mark.parametrize(("config", "layer"), [
    ({**LLAMA, "sliding_window": -8}, 0),
    ({**LLAMA, "sliding_window": -3.0, "layer_types": ["full_attention", "sliding_attention"] * 2}, 1),
    ({**SHAPE, "model_type": "gpt_oss", **MODELS["gpt_oss"], "num_hidden_layers": 2, "sliding_window": -8255}, 0),
])
def test_a_negative_window_is_refused_at_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            config: dict[str, Any], layer: int) -> None:
    """vLLM starts with a negative window but plans nonsense with it (a negative concurrency, or a division by zero,
    depending on --max-model-len: the random test meets both); the plan refuses it."""
    code, err = plan_errors(capsys, tmp_path, config)
    assert code == 1
    shown = json.dumps(config["sliding_window"])
    assert (f"{at(config, 'sliding_window')}: KVD008 error: sliding_window {int(config['sliding_window'])}: layer {layer} "
            "would take a negative window") in err, (shown, err)
    assert "hint: write the window as a positive number of tokens, or null for none" in err


def test_deepseek_v4_refuses_a_null_or_zero_window() -> None:
    config = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())
    assert config_class(config) is not None
    with pytest.raises(ModelSpecError, match="sliding_window null: DeepseekV4Config takes a whole number") as null:
        model_specs({**config, "sliding_window": None})
    assert null.value.code is WRONG_TYPE
    with pytest.raises(ModelSpecError, match="sliding_window 0: vLLM turns a window of 0 off") as zero:
        model_specs({**config, "sliding_window": 0})
    assert zero.value.code is VALUE_NOT_ALLOWED
