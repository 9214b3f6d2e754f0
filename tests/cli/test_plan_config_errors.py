"""``kvpolicy plan --model-config``: a model config's problems are reported as the other documents' are
(``kvpolicy.document_codes``): ``file:line:col: KVDnnn error: message`` and a hint, at the value the plan
refuses (inside ``text_config`` for a key read from there; at ``model_type`` for its class's default), and
carried by ``--format json``'s error document. A flag refused on its own stays a message without a place."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.geometry import REQUIRED_HINT, STRICT_HINT
from kvpolicy.adapters.vllm_adapter.planning.deepseek_v4_032 import READ_WITHOUT_DEFAULT
from kvpolicy.cli import main
from kvpolicy.json_positions import parse

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "vllm" / "configs"
QWEN = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
GEMMA = json.loads((CONFIGS / "gemma-3-1b" / "config.json").read_text())
MLA = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
V4 = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())
FLASH = json.loads((REPO / "policies" / "models" / "deepseek-v4-flash.json").read_text())


def wrapped(text: dict[str, Any], **outer: Any) -> dict[str, Any]:
    """A multimodal config (Gemma-3's shape): the language model's keys under text_config, beside a vision
    config whose keys of the same names would be a wrong place."""
    inner = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
    vision = {"head_dim": 64, "max_position_embeddings": 10, "num_hidden_layers": 4, "compress_ratios": [1]}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", **outer,
            "text_config": inner, "vision_config": vision}


def v41_wrapped(text: dict[str, Any]) -> dict[str, Any]:
    """A DeepSeek-V4.1 multimodal config: the language model's keys under text_config, which SGLang lays out flat,
    beside a vision config (whose keys SGLang reads under other names)."""
    inner = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": inner,
            "vision_config": {"num_hidden_layers": 4, "hidden_size": 64}}


def write(tmp_path: Path, config: object, indent: int | None = 2) -> tuple[Path, str]:
    path = tmp_path / "config.json"
    text = json.dumps(config, indent=indent)
    path.write_text(text)
    return path, text


def plan(capsys: pytest.CaptureFixture[str], engine: str, path: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["plan", "--engine", engine, "--model-config", str(path), "--budget", "40GiB", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def error_document(capsys: pytest.CaptureFixture[str], engine: str, path: Path, *flags: str) -> dict[str, Any]:
    code, out, _ = plan(capsys, engine, path, *flags, "--format", "json")
    error = json.loads(out)["error"]
    assert code == error["status"] == 1
    return error


def position(text: str, snippet: str, skip: int = 0) -> tuple[int, int]:
    """The 1-based line and column of the ``skip``-th character of the one ``snippet`` in ``text``."""
    assert text.count(snippet) == 1, snippet
    offset = text.index(snippet) + skip
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


# ---- the text: as any document's ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_syntax_error_is_the_documents_with_its_place_code_and_hint(capsys, tmp_path, engine):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "qwen3",\n "num_hidden_layers": 2,\n}\n')
    code, out, err = plan(capsys, engine, path)
    assert (code, out) == (1, "")
    assert err == (f"{path}:3:1: KVD002 error: not valid JSON: Expecting property name enclosed in double quotes\n"
                   "  hint: JSON allows no comma before ] or }\n")
    (d,) = error_document(capsys, engine, path)["diagnostics"]
    assert (d["line"], d["col"], d["code"], d["name"]) == (3, 1, "KVD002", "json-syntax")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_config_that_is_no_object_is_the_wrong_type_at_its_start(capsys, tmp_path, engine):
    path, _ = write(tmp_path, [QWEN], indent=None)
    code, _, err = plan(capsys, engine, path)
    assert code == 1 and err.startswith(f"{path}:1:1: KVD007 error: (top level): must be an object ({{...}}), not [{{")
    assert err.endswith("\n  hint: a model config is one JSON object, {...}\n")


# ---- vLLM: a value the plan refuses, at the value ----------------------------------------------------------


def test_a_value_of_the_wrong_type_is_placed_at_it(capsys, tmp_path):
    path, text = write(tmp_path, {**QWEN, "num_hidden_layers": "x"})
    code, out, err = plan(capsys, "vllm", path)
    line, col = position(text, '"num_hidden_layers": "x"', len('"num_hidden_layers": '))
    assert (code, out) == (1, "")
    assert err == f"{path}:{line}:{col}: KVD007 error: 'num_hidden_layers' must be a non-negative integer, got 'x'\n"


def test_the_json_error_document_carries_the_diagnostic(capsys, tmp_path):
    path, text = write(tmp_path, {**QWEN, "torch_dtype": "bf16"})
    error = error_document(capsys, "vllm", path)
    line, col = position(text, '"bf16"')
    assert error["diagnostics"] == [{
        "file": str(path), "line": line, "col": col, "end_line": line, "end_col": col + len('"bf16"'),
        "code": "KVD008", "name": "value-not-allowed", "severity": "error",
        "message": "torch_dtype 'bf16' is not a torch dtype",
        "hint": "write the checkpoint's dtype as torch names it: bfloat16, float16 or float32",
    }]
    assert error["more"] == 0 and error["message"].startswith(f"{path}:{line}:{col}: KVD008 error: torch_dtype")


def test_a_key_read_from_text_config_is_placed_inside_it(capsys, tmp_path):
    path, text = write(tmp_path, wrapped({**GEMMA, "head_dim": "x"}))
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"head_dim": "x"', len('"head_dim": '))
    assert code == 1 and err == f"{path}:{line}:{col}: KVD007 error: 'head_dim' must be a non-negative integer, got 'x'\n"


@pytest.mark.parametrize(("level", "key", "bad"), [
    ((), "dtype", "bf16"), (("text_config",), "dtype", "bf16"), (("vision_config",), "torch_dtype", "bf16"),
    (("text_config",), "torch_dtype", 5),
])
def test_a_wrappers_dtype_is_placed_at_the_level_transformers_reads_it(capsys, tmp_path, level, key, bad):
    """transformers builds the wrapper, its text config and its vision config each with its own dtype; the
    others are valid, so the refusal is the bad one's, where it is written."""
    config = wrapped({k: v for k, v in GEMMA.items() if k not in ("dtype", "torch_dtype")}, dtype="float32")
    config["text_config"]["dtype"] = config["vision_config"]["dtype"] = "bfloat16"
    (config if not level else config[level[0]]).pop("dtype")
    (config if not level else config[level[0]])[key] = bad
    path, text = write(tmp_path, config)
    d = error_document(capsys, "vllm", path)["diagnostics"][0]
    assert_placed_at(text, (*level, key), bad, d)
    assert d["code"] == ("KVD008" if isinstance(bad, str) else "KVD007")


def test_a_length_read_from_text_config_that_the_flag_passes_is_placed_inside_it(capsys, tmp_path):
    path, text = write(tmp_path, wrapped(GEMMA))
    code, _, err = plan(capsys, "vllm", path, "--max-model-len", "99999")
    line, col = position(text, '"max_position_embeddings": 32768', len('"max_position_embeddings": '))
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD011 error: --max-model-len 99999 is more than the "
                                        "32768 vLLM derives from the config (max_position_embeddings)")


def test_a_length_vllm_reads_from_text_config_alone_is_placed_there(capsys, tmp_path):
    """A config with its layers at the top and a text_config: vLLM still takes the length from text_config."""
    path, text = write(tmp_path, {**QWEN, "text_config": {"max_position_embeddings": 0}})
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"max_position_embeddings": 0', len('"max_position_embeddings": '))
    assert code == 1 and err == (f"{path}:{line}:{col}: KVD008 error: 'max_position_embeddings' must be a positive "
                                 "number of tokens, got 0\n")


def test_a_key_text_config_lacks_is_placed_at_text_config_with_a_hint(capsys, tmp_path):
    text_config = {"num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 4096}
    path, text = write(tmp_path, wrapped(text_config, model_type="my_model"))
    error = error_document(capsys, "vllm", path)
    (d,) = error["diagnostics"]
    assert (d["line"], d["col"]) == position(text, '"text_config": {', len('"text_config": '))
    assert (d["code"], d["message"]) == ("KVD009", "the model config has no 'num_attention_heads', which sizes the KV cache")
    assert d["hint"] == ("the config class of model_type 'my_model' may have a default for it, which kvpolicy does not "
                         "know: write it in the config")


@pytest.mark.parametrize(("config", "at"), [
    ({"model_type": "llama", "num_key_value_heads": 8, "max_position_embeddings": 4096}, '"llama"'),
    # the class is named by the wrapper's model_type: the text config has none
    (wrapped({k: v for k, v in GEMMA.items() if k != "num_attention_heads"}), '"gemma3"'),
], ids=["llama", "gemma3-wrapper"])
def test_a_class_default_is_placed_at_model_type_and_said_to_be_one(capsys, tmp_path, config, at):
    path, text = write(tmp_path, config)
    code, _, err = plan(capsys, "vllm", path, "--tensor-parallel-size", "3")
    line, col = position(text, at)
    heads, cls = (32, "LlamaConfig") if at == '"llama"' else (8, "Gemma3TextConfig")
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD011 error: --tensor-parallel-size 3 does not divide "
                                        f"the model's {heads} attention heads, and vLLM refuses it at start-up")
    assert err.endswith(f"; num_attention_heads is {cls}'s default, which the file does not set\n")


@pytest.mark.parametrize("dropped", [("hc_eps",), ("head_dim",), ("swiglu_limit", "head_dim", "vocab_size")])
def test_keys_vllm_032_has_no_default_for_are_placed_at_the_object_that_lacks_them(capsys, tmp_path, dropped):
    """vLLM 0.32's own DeepseekV4Config defaults none of them, transformers' (0.33's) some (head_dim, vocab_size):
    for 0.32 each is missing from the file, not a class's default; 0.33 plans the same file."""
    path, _ = write(tmp_path, {k: v for k, v in V4.items() if k not in dropped})
    code, _, err = plan(capsys, "vllm", path, "--vllm-version", "0.32")
    named = ", ".join(repr(k) for k in sorted(dropped, key=READ_WITHOUT_DEFAULT.index))
    count = "them" if len(dropped) > 1 else "it"
    assert code == 1 and err.startswith(f"{path}:1:1: KVD009 error: the model config has no {named}: vLLM 0.32's "
                                        f"DeepseekV4Config gives no default for {count}")
    assert "which the file does not set" not in err
    assert err.endswith("hint: write the key in config.json (the released config has it), or plan for vLLM 0.33 "
                        "(--vllm-version 0.33)\n")
    assert plan(capsys, "vllm", path, "--vllm-version", "0.33")[0] == 0


@pytest.mark.parametrize(("key", "value", "written"), [
    ("index_topk", None, "null"), ("sliding_window", None, "null"),
    ("hc_mult", 4.0, "a number with a decimal point"), ("q_lora_rank", "1024", "a string"),
])
def test_a_value_vllm_032_fails_with_is_placed_at_the_value(capsys, tmp_path, key, value, written):
    """0.32's own DeepseekV4Config keeps any value, which its model (index_topk, hc_mult, q_lora_rank) or its KV
    cache planning (sliding_window) fails with; the words are 0.32's, not transformers' (0.33's) refusal."""
    path, text = write(tmp_path, {**V4, key: value})
    code, _, err = plan(capsys, "vllm", path, "--vllm-version", "0.32")
    line, col = position(text, f'"{key}": {json.dumps(value)}', len(f'"{key}": '))
    assert code == 1 and err == (
        f"{path}:{line}:{col}: KVD007 error: {key} {json.dumps(value)}: vLLM 0.32's DeepseekV4Config checks no "
        f"value, and vLLM 0.32 fails at start-up with {written} there\n"
        "  hint: write a whole number, as DeepSeek-V4's own config.json does\n")
    assert "transformers refuses" in plan(capsys, "vllm", path, "--vllm-version", "0.33")[2]


def test_a_kind_the_text_config_class_refuses_is_placed_in_the_text_config(capsys, tmp_path):
    """Gemma-3's wrapper: the text config is a Gemma3TextConfig, which refuses an integer for rms_norm_eps."""
    path, text = write(tmp_path, wrapped({**GEMMA, "rms_norm_eps": 1}))
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"rms_norm_eps": 1', len('"rms_norm_eps": '))
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD007 error: rms_norm_eps 1: Gemma3TextConfig takes a "
                                        "number with a decimal point (10.0, not 10) only, so transformers refuses")
    assert text.index('"text_config"') < text.index('"rms_norm_eps": 1')


def test_a_kind_the_wrapper_class_refuses_is_placed_at_the_wrappers_own_field(capsys, tmp_path):
    """Gemma-3's wrapper is a Gemma3Config, which takes a whole number or null for mm_tokens_per_image; a field
    written after the text config is still found in the wrapper."""
    path, text = write(tmp_path, {**wrapped(GEMMA), "mm_tokens_per_image": "256"})
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"mm_tokens_per_image": "256"', len('"mm_tokens_per_image": '))
    assert code == 1 and err.startswith(f'{path}:{line}:{col}: KVD007 error: mm_tokens_per_image "256": Gemma3Config '
                                        "takes a whole number or null only, so transformers refuses")


def test_a_kind_the_vision_config_class_refuses_is_placed_in_the_vision_config(capsys, tmp_path):
    """Gemma-3's vision config is a SiglipVisionConfig, which takes a whole number or a list of them for
    image_size; the wrapper's other keys of the same name (num_hidden_layers in the text config) stay apart."""
    config = wrapped(GEMMA)
    config["vision_config"] = {**config["vision_config"], "image_size": 896.0}
    path, text = write(tmp_path, config)
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"image_size": 896.0', len('"image_size": '))
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD007 error: vision_config.image_size 896.0: "
                                        "SiglipVisionConfig takes a whole number or a list of whole numbers only")


def test_a_refusal_in_vllms_words_is_placed_at_the_value_it_is_about(capsys, tmp_path):
    """The words are vLLM's refusal's (tests/vllm compares them); at TP 1 the config alone is at fault."""
    path, text = write(tmp_path, {**QWEN, "num_attention_heads": 12})
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"num_key_value_heads": 8', len('"num_key_value_heads": '))
    assert code == 1 and err == (f"{path}:{line}:{col}: KVD008 error: the model's 12 attention heads are not a multiple "
                                 "of its 8 KV heads, and vLLM's attention layer refuses it when it builds the model at "
                                 "start-up\n")


def test_a_rope_conflict_is_placed_at_the_rope_parameters(capsys, tmp_path):
    path, text = write(tmp_path, {**QWEN, "rope_scaling": {"rope_type": "yarn", "type": "linear", "factor": 2}})
    code, _, err = plan(capsys, "vllm", path)
    line, col = position(text, '"rope_scaling": {', len('"rope_scaling": '))
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD008 error: rope_scaling gives rope_type 'yarn' and "
                                        "type 'linear'; vLLM refuses the conflict: keep one")


def test_a_flag_refused_on_its_own_is_a_message_without_a_place(capsys, tmp_path):
    path, _ = write(tmp_path, QWEN)
    code, _, err = plan(capsys, "vllm", path, "--kv-cache-dtype", "fp9")
    assert code == 1 and err.startswith(f"kvpolicy plan --engine vllm: {path}: --kv-cache-dtype 'fp9' is not planned")
    error = error_document(capsys, "vllm", path, "--kv-cache-dtype", "fp9")
    assert error["diagnostics"] == [] and error["more"] == 0


# ---- SGLang: each field of the geometry, at its place ------------------------------------------------------


def test_sglang_refuses_each_field_at_its_place_in_the_order_of_the_text(capsys, tmp_path):
    path, text = write(tmp_path, {**FLASH, "num_hidden_layers": "x", "head_dim": -3})
    code, out, err = plan(capsys, "sglang", path)
    first = position(text, '"num_hidden_layers": "x"', len('"num_hidden_layers": '))
    second = position(text, '"head_dim": -3', len('"head_dim": '))
    assert first < second, "the file has num_hidden_layers first, and the order of the file is kept"
    assert (code, out) == (1, "")
    assert err == (f"{path}:{first[0]}:{first[1]}: KVD007 error: num_hidden_layers: must be a whole number, not \"x\"\n"
                   f"  hint: {STRICT_HINT}\n"
                   f"{path}:{second[0]}:{second[1]}: KVD008 error: head_dim: must be greater than 0, not -3\n")
    assert [d["code"] for d in error_document(capsys, "sglang", path)["diagnostics"]] == ["KVD007", "KVD008"]


def test_sglang_places_a_ratio_and_a_missing_field(capsys, tmp_path):
    ratios = [*FLASH["compress_ratios"][:5], 2, *FLASH["compress_ratios"][6:]]
    path, text = write(tmp_path, {**FLASH, "compress_ratios": ratios}, indent=None)
    code, _, err = plan(capsys, "sglang", path)
    line, col = position(text, f"{json.dumps(ratios[:6])[:-1]}", len(json.dumps(ratios[:5])[:-1]) + 2)
    assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD008 error: compress_ratios.5: compress ratios [2] "
                                        "are not DeepSeek-V4 ratios")
    path, _ = write(tmp_path, {k: v for k, v in FLASH.items() if k != "compress_ratios"})
    assert plan(capsys, "sglang", path)[2] == (f"{path}:1:1: KVD009 error: compress_ratios: required, not given\n"
                                               f"  hint: {REQUIRED_HINT}\n")


def test_sglang_places_a_text_configs_field_inside_it(capsys, tmp_path):
    path, text = write(tmp_path, v41_wrapped({**FLASH, "sliding_window": 0}))
    code, _, err = plan(capsys, "sglang", path)
    line, col = position(text, '"sliding_window": 0', len('"sliding_window": '))
    assert code == 1 and err == f"{path}:{line}:{col}: KVD008 error: sliding_window: must be greater than 0, not 0\n"


def test_sglang_places_an_architecture_it_does_not_build(capsys, tmp_path):
    path, text = write(tmp_path, {**FLASH, "architectures": ["DeepseekV3ForCausalLM"]})
    code, _, err = plan(capsys, "sglang", path)
    line, col = position(text, '"DeepseekV3ForCausalLM"')
    assert code == 1 and err == (f"{path}:{line}:{col}: KVD008 error: architecture DeepseekV3ForCausalLM: SGLang 0.5.23 "
                                 "builds DeepSeek-V4 pools for DeepseekV4ForCausalLM only\n")


# ---- any value the plan reads, corrupted: placed exactly there ----------------------------------------------

INTS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
        "intermediate_size", "max_position_embeddings")
VLLM_READS: dict[str, tuple[dict[str, Any], list[tuple[str | int, ...]]]] = {
    "qwen3": (QWEN, [(k,) for k in (*INTS, "torch_dtype")]),
    "gemma3": (GEMMA, [(k,) for k in (*INTS, "torch_dtype", "layer_types")] + [("layer_types", i) for i in (0, 5, 25)]),
    "mla": (MLA, [(k,) for k in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "vocab_size",
                                 "intermediate_size", "moe_intermediate_size", "n_shared_experts",
                                 "first_k_dense_replace", "moe_layer_freq", "max_position_embeddings", "torch_dtype")]),
    "v4": (V4, [(k,) for k in ("num_hidden_layers", "head_dim", "index_head_dim", "sliding_window", "vocab_size",
                               "max_position_embeddings", "torch_dtype", "compress_ratios")]
           + [("compress_ratios", i) for i in (0, 2, 3, 42)]),
    "wrapped": (wrapped(GEMMA), [("text_config", k) for k in (*INTS, "torch_dtype", "layer_types")]),
}
"""Per config, keys of it the vLLM plan reads and refuses a value of the wrong type at (the paths in the file)."""
SGLANG_READS = [(k,) for k in ("num_hidden_layers", "head_dim", "qk_rope_head_dim", "index_head_dim", "sliding_window",
                               "max_position_embeddings", "compress_ratios")] + [("compress_ratios", i) for i in (0, 2, 42)]
WRONG = ["x", [1], {"a": 1}, True, -3]
"""Values of the wrong type (or, -3, out of range) for every key above."""
SGLANG_WRONG = ["x", [1], {"a": 1}, 1.5, True, -3]


def allowed_kind(key: tuple[str | int, ...], bad: object) -> bool:
    """Whether ``bad`` is of the kind the value at ``key`` is, but not allowed (KVD008), rather than of the wrong
    kind (KVD007): a negative number of a number, a name no dtype or layer type has, a list too short."""
    last = key[-1]
    if isinstance(last, int):  # an entry of compress_ratios (a number) or of layer_types (a name)
        return bad == -3 if key[-2] == "compress_ratios" else bad == "x"
    if last in ("layer_types", "compress_ratios"):
        return bad == [1]
    return bad == "x" if last == "torch_dtype" else bad == -3


def corrupted(config: dict[str, Any], key: tuple[str | int, ...], bad: object) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    node: Any = changed
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = bad
    return changed


def assert_placed_at(text: str, key: tuple[str | int, ...], bad: object, d: dict[str, Any]) -> None:
    """``d`` is at the value at ``key``: what the text holds from its line and column is ``bad``, and it ends there."""
    lines = text.split("\n")
    offset = sum(len(row) + 1 for row in lines[: d["line"] - 1]) + d["col"] - 1
    value, end = json.JSONDecoder().raw_decode(text, offset)
    assert json.dumps(value) == json.dumps(bad), (d, text[offset:offset + 40])
    assert (text.count("\n", 0, end) + 1, end - text.rfind("\n", 0, end)) == (d["end_line"], d["end_col"])
    document = parse(text)
    assert document is not None and document.span_of(key) == (offset, end), "the value at that key, not another"


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), model=st.sampled_from(sorted(VLLM_READS)), bad=st.sampled_from(WRONG),
       indent=st.sampled_from([None, 1, 2, 4]))
def test_a_wrong_value_anywhere_the_vllm_plan_reads_is_placed_at_it(capsys, tmp_path, data, model, bad, indent):
    config, keys = VLLM_READS[model]
    key = data.draw(st.sampled_from(keys))
    _, text = write(tmp_path, corrupted(config, key, bad), indent)
    error = error_document(capsys, "vllm", tmp_path / "config.json")
    (d,) = error["diagnostics"]
    assert d["code"] == ("KVD008" if allowed_kind(key, bad) else "KVD007"), d
    assert_placed_at(text, key, bad, d)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(SGLANG_READS), bad=st.sampled_from(SGLANG_WRONG), indent=st.sampled_from([None, 1, 2, 4]),
       text_config=st.booleans())
def test_a_wrong_value_anywhere_the_sglang_plan_reads_is_placed_at_it(capsys, tmp_path, key, bad, indent, text_config):
    config = v41_wrapped(FLASH) if text_config else FLASH
    where = ("text_config", *key) if text_config else key
    _, text = write(tmp_path, corrupted(config, where, bad), indent)
    (d,) = error_document(capsys, "sglang", tmp_path / "config.json")["diagnostics"]
    assert d["code"] == ("KVD008" if allowed_kind(key, bad) else "KVD007"), d
    if key == ("compress_ratios",) and bad == [1]:  # ratio 1 has no layer type: met before the count, at the entry
        where, bad = (*where, 0), 1
    assert_placed_at(text, where, bad, d)
