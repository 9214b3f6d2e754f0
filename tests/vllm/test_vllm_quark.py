"""A Quark checkpoint's KV cache in the plan against vLLM 0.33's own build (``planning/quark.py``).

Each example gives a small Qwen3 (or gpt-oss, whose model class renames ``exclude``'s entries) a Quark config
with a random ``exclude`` (exact vLLM names, HF-style names, ``re:`` patterns, shell globs, a broken pattern,
none at all) and a random ``kv_cache_group`` (none, a valid fp8_e4m3 per-tensor KV config, one vLLM's KV method
refuses, mismatched or empty ones), launched with a random ``--kv-cache-dtype``. vLLM builds its config and the
real model on the meta device: where it builds, the plan's bytes per block are its layers' and every layer
stores the flag's dtype (Quark's KV scheme never makes auto fp8); where it refuses, the plan refuses for the
same reason. vLLM 0.32 runs the same Quark code (the modules are the same but for MoE parts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.vllm.quant_configs import ABSENT, put
from tests.vllm.test_vllm_plan_random import EXAMPLES, SETTINGS
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

QWEN = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
SMALL = {"hidden_size": 256, "intermediate_size": 128, "vocab_size": 1024, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64}
FP8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}
REFUSALS = {  # vLLM's words → the plan's
    "fp8_e5m2 kv-cache is not supported with fp8 checkpoints": "vLLM refuses fp8_e5m2 with them",
    "Currently supported kv cache quantization is dtype=fp8_e4m3": "takes dtype fp8_e4m3 only",
    "Only support per-tensor scaling factor": "takes qscheme per_tensor only",
    "'NoneType' object is not iterable": "exclude must be a list",
    "The export key should be included": "needs an export object",
    "no kv_cache quantization settings were found": "names no layer_quant_config entry",
    "The quantization method used for kv_cache should be the same": "give different output_tensors",
    "The kv_cache quantization configuration is empty": "configuration is empty",
    "missing ) at position": "no regular expression",  # vLLM matches with the regex package
    "'list' object has no attribute 'get'": "not an object",
}
KV_DTYPES = ["auto", "auto", "fp8_e5m2", "fp8_e5m2", "bfloat16", "fp8"]


REGEX_ONLY = ["re:[[:alpha:]]+\\.layers\\.0\\..*", "re:\\p{Ll}+\\.layers\\.\\d+\\.self_attn\\.attn",
              "re:(?:model\\.layers\\.1\\.self_attn\\.atn){e<=1}$"]
"""Patterns the ``regex`` package, which vLLM matches with, reads otherwise than ``re``: a POSIX class (a set of
characters to ``re``), a Unicode property (an error in ``re``), fuzzy matching (literal braces to ``re``)."""


def attention(layer: int, name: str = "self_attn") -> str:
    return f"model.layers.{layer}.{name}.attn"


def exclude_entries(layers: int) -> st.SearchStrategy[str]:
    """Names and patterns an ``exclude`` may hold: the attention layers' vLLM names (as a gpt-oss checkpoint
    writes them too, ``self_attn``), their parents, regular expressions that match some or all of them, globs
    (which vLLM does not expand), other layers' names."""
    exact = st.integers(0, layers - 1).map(attention)
    return st.one_of(exact, exact, st.integers(0, layers - 1).map(lambda i: f"model.layers.{i}.self_attn"),
                     st.sampled_from(["lm_head", "re:.*attn$", "re:.*self_attn.*", "re:model\\.layers\\.0\\..*",
                                      "re:.*layers\\.[1-9].*", "*self_attn*", "model.layers.*.self_attn.attn",
                                      "re:.*mlp.*", *REGEX_ONLY]))


def excludes(layers: int) -> st.SearchStrategy[Any]:
    """A random ``exclude``: mostly a list of entries; at times absent, null, a name, or a broken pattern."""
    listed = st.lists(exclude_entries(layers), max_size=4).map(lambda e: ["lm_head", *e])
    odd = st.sampled_from([ABSENT, None, "lm_head", ["lm_head", "re:model.(layers"]])
    return st.one_of(listed, listed, listed, odd)


@st.composite
def kv_groups(draw: st.DrawFn) -> tuple[list[str], dict[str, Any]]:
    """(``export.kv_cache_group``, ``layer_quant_config``): none, the k/v projections with one KV config (valid,
    another dtype or scheme, null), with two that differ, or a group naming no entry."""
    kind = draw(st.sampled_from(["none", "none", "valid", "valid", "valid", "other", "mismatch", "unnamed"]))
    if kind == "none":
        return [], {}
    output = FP8
    if kind == "other":
        output = draw(st.sampled_from([{**FP8, "dtype": "fp8_e5m2"}, {**FP8, "qscheme": "per_channel"}, None, [FP8]]))
    entries = {name: {"weight": FP8, "input_tensors": FP8, "output_tensors": output} for name in ("*k_proj", "*v_proj")}
    if kind == "mismatch":  # another value, or the same one of another type (1 for True)
        other = draw(st.sampled_from([{**FP8, "symmetric": False}, {**FP8, "symmetric": 1}]))
        entries["*v_proj"] = {**entries["*v_proj"], "output_tensors": other}
    group = ["*k_proj", "*v_proj"] if kind != "unnamed" else ["*kv_proj"]
    return group, entries


def quark_config(exclude: Any, group: list[str], entries: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "quant_method": "quark", "export": {"kv_cache_group": group, "pack_method": "reorder"},
        "global_quant_config": {"weight": FP8, "input_tensors": FP8, "output_tensors": None},
        "layer_quant_config": entries, "layer_type_quant_config": {},
    }
    put(config, "exclude", exclude)
    return config


def vllm_outcome(folder: Path, kv_cache_dtype: str) -> dict[str, Any] | str:
    """vLLM's layer specs for the checkpoint in ``folder``, or its refusal's words. The model class's renames and
    fused layers reach the Quark config as vLLM's ``initialize_model`` passes them (``configure_quant_config``),
    which ``layer_specs`` alone does not."""
    import regex
    from tests.vllm.real_vllm import Case, layer_specs, vllm_config
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.model_executor.model_loader.utils import configure_quant_config

    case = Case(str(folder), 16, max_model_len=4096, kv_cache_dtype=kv_cache_dtype)
    try:
        cfg = vllm_config(case)
        if cfg.quant_config is not None:
            configure_quant_config(cfg.quant_config, get_model_architecture(cfg.model_config)[0])
        return layer_specs(case)
    except (ValueError, NotImplementedError, TypeError, AttributeError, regex.error) as exc:
        return f"{type(exc).__name__}: {exc}"


def compare(folder: Path, kv_cache_dtype: str, same_bytes: bool = True) -> str:
    """Assert the plan builds where vLLM builds, with its bytes (``same_bytes``: for a model whose layers all
    take the block size asked for on this CPU), and refuses where vLLM refuses, for its reason; return which."""
    import torch

    theirs = vllm_outcome(folder, kv_cache_dtype)
    settings_ = PlanSettings(max_model_len=4096, block_size=16, kv_cache_dtype=kv_cache_dtype)
    try:
        mine = make_plan(load_config(folder / "config.json"), settings_, budget=1 << 30, platform="cpu")
    except ModelSpecError as exc:
        assert isinstance(theirs, str), f"the plan refuses what vLLM builds: {exc}"
        words = next((w for w in REFUSALS if w in theirs), None)
        assert words is not None, f"vLLM refuses for a reason this test does not know: {theirs}"
        assert REFUSALS[words] in str(exc), (str(exc), theirs)
        return f"refused: {words}"
    assert not isinstance(theirs, str), f"the plan plans what vLLM refuses: {theirs}"
    assert not same_bytes or mine.bytes_per_block == sum(s.page_size_bytes for s in theirs.values())
    expected = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16}.get(kv_cache_dtype, torch.uint8)
    assert {s.dtype for s in theirs.values()} == {expected}  # every layer stores the flag's dtype, excluded or not
    return f"planned: {kv_cache_dtype}"


@settings(SETTINGS, max_examples=max(EXAMPLES // 2, 20))
@given(layers=st.integers(1, 3), data=st.data(), kv_cache_dtype=st.sampled_from(KV_DTYPES))
def test_random_quark_excludes_and_kv_groups_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory,
                                                               layers: int, data: st.DataObject,
                                                               kv_cache_dtype: str) -> None:
    group, entries = data.draw(kv_groups())
    quant = quark_config(data.draw(excludes(layers)), group, entries)
    folder = tmp_path_factory.mktemp("quark")
    (folder / "config.json").write_text(json.dumps({**QWEN, **SMALL, "num_hidden_layers": layers,
                                                    "quantization_config": quant}))
    event(compare(folder, kv_cache_dtype))


@pytest.mark.parametrize(("exclude", "verdict"), [
    (["lm_head"], "refused: fp8_e5m2 kv-cache is not supported with fp8 checkpoints"),
    (["lm_head", attention(0), attention(1)], "planned: fp8_e5m2"),
    (["lm_head", "re:.*attn$"], "planned: fp8_e5m2"),
    (["lm_head", attention(0)], "refused: fp8_e5m2 kv-cache is not supported with fp8 checkpoints"),
    (["lm_head", "*self_attn*"], "refused: fp8_e5m2 kv-cache is not supported with fp8 checkpoints"),
], ids=["none-excluded", "all-by-name", "all-by-pattern", "one-of-two", "glob-matches-nothing"])
def test_excluded_attention_layers_take_fp8_e5m2(tmp_path: Path, exclude: list[str], verdict: str) -> None:
    """The note that "an excluded attention layer could take fp8_e5m2": it does, but vLLM refuses the model at
    the first attention layer ``exclude`` does not name, so only a checkpoint that excludes them all plans."""
    (tmp_path / "config.json").write_text(json.dumps({**QWEN, **SMALL, "num_hidden_layers": 2,
                                                      "quantization_config": quark_config(exclude, [], {})}))
    assert compare(tmp_path, "fp8_e5m2") == verdict


@pytest.mark.parametrize("pattern", REGEX_ONLY)
def test_exclude_patterns_are_vllms_regular_expressions(tmp_path: Path, pattern: str) -> None:
    """Each of these matches a layer as vLLM reads it (the ``regex`` package), where ``re`` matches none or cannot
    compile it: the layer it names is excluded, and with the other one named too, the model plans."""
    others = {"re:[[:alpha:]]+\\.layers\\.0\\..*": attention(1)}
    exclude = ["lm_head", pattern, others.get(pattern, attention(0))]
    (tmp_path / "config.json").write_text(json.dumps({**QWEN, **SMALL, "num_hidden_layers": 2,
                                                      "quantization_config": quark_config(exclude, [], {})}))
    assert compare(tmp_path, "fp8_e5m2") == "planned: fp8_e5m2"


OSS = {k: v for k, v in json.loads((CONFIGS / "gpt-oss-20b" / "config.json").read_text()).items()
       if k != "quantization_config"}
SMALL_OSS = {**SMALL, "num_hidden_layers": 2, "num_local_experts": 4, "layer_types": ["sliding_attention",
                                                                                       "full_attention"]}


@pytest.mark.parametrize(("attention_name", "verdict"), [
    ("self_attn", "planned: fp8_e5m2"), ("attn", "planned: fp8_e5m2"),
    ("self-attn", "refused: fp8_e5m2 kv-cache is not supported with fp8 checkpoints"),
])
def test_gpt_oss_renames_exclude_entries_as_vllm_does(tmp_path: Path, attention_name: str, verdict: str) -> None:
    """vLLM's gpt-oss model names its attention ``model.layers.N.attn`` and renames ``.self_attn.`` in the entries
    a checkpoint's ``exclude`` gives (HF names): either name excludes the layer."""
    exclude = ["lm_head", "re:.*mlp.*", attention(0, attention_name), attention(1, attention_name)]
    (tmp_path / "config.json").write_text(json.dumps({**OSS, **SMALL_OSS,
                                                      "quantization_config": quark_config(exclude, [], {})}))
    assert compare(tmp_path, "fp8_e5m2", same_bytes=False) == verdict


def test_quark_refusals_are_placed_at_the_value(tmp_path: Path) -> None:
    """A KV config vLLM's Quark KV method refuses is placed at kv_cache_group; an exclude vLLM cannot iterate at
    exclude; a broken pattern at its entry."""
    cases = [(quark_config(["lm_head"], ["*k_proj"], {"*k_proj": {"output_tensors": {**FP8, "dtype": "int8"}}}),
              ("quantization_config", "export", "kv_cache_group")),
             (quark_config(None, [], {}), ("quantization_config", "exclude")),
             (quark_config(["lm_head", "re:("], [], {}), ("quantization_config", "exclude", 1))]
    for quant, key in cases:
        config = {**QWEN, **SMALL, "num_hidden_layers": 2, "quantization_config": quant}
        with pytest.raises(ModelSpecError) as refused:
            make_plan(config, PlanSettings(max_model_len=4096, block_size=16), budget=1 << 30, platform="cpu")
        assert refused.value.key == key


KV_GROUP_CASES = {  # name → (exclude, the k/v projections' output_tensors, --kv-cache-dtype, what vLLM does)
    "list, attention excluded": (["lm_head", "re:.*attn$"], ([FP8], [FP8]), "auto", "planned: auto"),
    "list": (["lm_head"], ([FP8], [FP8]), "auto", "refused: 'list' object has no attribute 'get'"),
    "1 for true": (["lm_head"], (FP8, {**FP8, "symmetric": 1}), "auto",
                   "refused: The quantization method used for kv_cache should be the same"),
    "per channel, attention excluded": (["lm_head", "re:.*attn$"], ({**FP8, "qscheme": "per_channel"},) * 2,
                                        "fp8_e5m2", "planned: fp8_e5m2"),
}


@pytest.mark.parametrize("name", sorted(KV_GROUP_CASES))
def test_kv_groups_vllm_meets_seldom(tmp_path: Path, name: str) -> None:
    """KV configs the random test draws seldom: vLLM compares them with their types (1 is not true), reads one
    that is a list only at an attention layer exclude leaves, and loads none where exclude names them all."""
    exclude, (k_out, v_out), kv_cache_dtype, verdict = KV_GROUP_CASES[name]
    same = {"weight": FP8, "input_tensors": FP8}  # the weights' config of q_proj, as vLLM's fused qkv needs
    entries = {"*k_proj": {**same, "output_tensors": k_out}, "*v_proj": {**same, "output_tensors": v_out}}
    quant = quark_config(exclude, ["*k_proj", "*v_proj"], entries)
    (tmp_path / "config.json").write_text(json.dumps({**QWEN, **SMALL, "num_hidden_layers": 2,
                                                      "quantization_config": quant}))
    assert compare(tmp_path, kv_cache_dtype) == verdict
