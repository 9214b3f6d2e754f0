"""``kvpolicy plan`` on bad inputs: malformed model configs exit 1, bad flag values exit 2, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.paths import MAX_INPUT_BYTES

REPO = Path(__file__).resolve().parents[2]
FLASH = REPO / "policies" / "models" / "deepseek-v4-flash.json"
QWEN = REPO / "tests" / "vllm" / "configs" / "qwen3-8b" / "config.json"
CONFIG = {"sglang": FLASH, "vllm": QWEN}


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["plan", *argv])
    return code, capsys.readouterr().err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """argparse's message for a refused flag value, after asserting it exits 2."""
    with pytest.raises(SystemExit) as exc:
        main(["plan", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


MALFORMED = [
    ("deep.json", "[" * 100_000 + "]" * 100_000, "1:33: KVD004 error: nested more than 32 levels deep",
     "no model config nests more than a dozen levels: is it the right file?"),
    ("digits.json", '{"num_hidden_layers": ' + "9" * 5000 + "}",
     f"1:23: KVD005 error: a number with more than {sys.get_int_max_str_digits()} digits",
     "no model config holds a number this long: is it the right file?"),
]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(("name", "text", "message", "hint"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_model_config_is_an_error_in_the_input(capsys, tmp_path, engine, name, text, message, hint):
    """As any document's problem: at its place, with its code and a hint for a config."""
    config = tmp_path / name
    config.write_text(text)
    code, err = plan(capsys, "--engine", engine, "--model-config", str(config), "--budget", "40GiB")
    assert code == 1
    assert err == f"{config}:{message}\n  hint: {hint}\n"


@pytest.mark.parametrize("count", ["0", "-5"])
def test_num_blocks_must_be_positive(capsys, count):
    err = usage_error(capsys, "--engine", "vllm", "--model-config", str(QWEN), "--num-blocks", count)
    assert "argument --num-blocks:" in err and "is not a whole number of 1 or more" in err


@pytest.mark.parametrize(
    ("engine", "flag", "value"),
    [("vllm", "--max-model-len", "0"), ("sglang", "--gpu-memory", "0B"), ("sglang", "--gpu-memory", "0 GiB"),
     ("sglang", "--gpu-capacity", "0B")],
)
def test_zero_is_refused_not_taken_for_the_default(capsys, engine, flag, value):
    err = usage_error(capsys, "--engine", engine, "--model-config", str(CONFIG[engine]), "--budget", "40GiB",
                      flag, value)
    assert f"argument {flag}: '{value}'" in err and ("1 or more" in err or "more than 0 bytes" in err)


@pytest.mark.parametrize("version", ["", " "])
def test_an_empty_vllm_version_is_a_usage_error(capsys, version):
    code, err = plan(capsys, "--engine", "vllm", "--model-config", str(QWEN), "--budget", "40GiB",
                     "--vllm-version", version)
    assert code == 2 and f"--vllm-version {version!r}: give a release, e.g. 0.33" in err


def test_a_non_integer_swa_eviction_interval_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "abc")
    code, err = plan(capsys, "--engine", "sglang", "--model-config", str(FLASH), "--budget", "40GiB")
    assert code == 2 and "SGLANG_SWA_EVICTION_INTERVAL='abc' is not an integer" in err


@pytest.mark.parametrize("layers", [10**9, 10**20])
def test_more_layers_than_any_model_is_refused_at_once(capsys, tmp_path, layers):
    """10**9 layers built a spec per layer for minutes; 10**20 overflowed."""
    config = json.loads(QWEN.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": layers}))
    code, err = plan(capsys, "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB")
    assert code == 1 and f"num_hidden_layers is {layers}, more than any model has" in err


def test_a_message_names_a_value_without_dumping_it(capsys, tmp_path):
    config = json.loads(QWEN.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": "x" * 100_000}))
    code, err = plan(capsys, "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB")
    assert code == 1 and "'num_hidden_layers' must be a non-negative integer, got 'xxx" in err
    assert "(100,002 characters)" in err and len(err) < 1000


V4_FLASH = REPO / "tests" / "vllm" / "configs" / "deepseek-v4-flash" / "config.json"
WRONG_TYPES = [
    (QWEN, {"torch_dtype": ["bf16"]}, "torch_dtype ['bf16']: a dtype is the name of a torch dtype"),
    (QWEN, {"head_dim": "x"}, "'head_dim' must be a non-negative integer, got 'x'"),
    (QWEN, {"head_dim": 1.5}, "'head_dim' must be a non-negative integer, got 1.5"),
    (V4_FLASH, {"compress_ratios": [0, "a", 5] * 30}, "supports 0, 4 and 128, got 'a', 5"),
    (V4_FLASH, {"compress_ratios": None, "layer_types": [["x"]]}, "layer_types (a list of names)"),
    (V4_FLASH, {"compress_ratios": None, "layer_types": ["x"], "compress_rates": [1]}, "compress_rates must map"),
]


@pytest.mark.parametrize(("base", "change", "said"), WRONG_TYPES, ids=[str(c)[:30] for _, c, _ in WRONG_TYPES])
def test_a_value_of_the_wrong_type_is_named_not_a_traceback(capsys, tmp_path, base, change, said):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(base.read_text()), **change}))
    code, err = plan(capsys, "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB",
                     "--max-model-len", "4096")
    assert code == 1 and said in err, err


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_config_is_read_to_a_limit(capsys, tmp_path, engine):
    """/dev/zero as a config was read until memory ran out."""
    zero = tmp_path / "config.json"
    zero.symlink_to("/dev/zero")
    code, err = plan(capsys, "--engine", engine, "--model-config", str(zero), "--budget", "40GiB")
    assert code == 1 and f"{zero}:1:{MAX_INPUT_BYTES + 1}: KVD003 error: over 64 MiB: not read further" in err
    assert "hint: no model config is near this size: is it the right file?" in err
