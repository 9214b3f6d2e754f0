"""A config.json integer written laxly (true, "43", 43.0, 43.5) is refused by the plan at that value, with
KVD007, and SGLang 0.5.23's own config loading (transformers' strict DeepseekV4Config, on the CPU) refuses it too."""

from __future__ import annotations

import json
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.launch import Hardware
from kvpolicy.cli import main
from tests.cli.test_plan_config_errors import assert_placed_at, corrupted
from tests.sglang.sglang_support import MODELS, resolve_for_real, single_process_parallel

pytestmark = pytest.mark.sglang

FLASH = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
FIELDS = ("num_hidden_layers", "head_dim", "qk_rope_head_dim", "index_head_dim", "sliding_window",
          "max_position_embeddings")
"""The integer fields SGLang's config classes type as int (DeepseekV4Config; qk_rope_head_dim: DeepseekV3Config)."""


def look_alikes(value: int) -> st.SearchStrategy[object]:
    """What a lax reader would take for ``value`` (or an integer near it): a bool, a numeric string, a float."""
    return st.sampled_from([True, False, str(value), float(value), value + 0.5])


@st.composite
def lax_configs(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[str | int, ...], object]:
    """V4-Flash (or a shorter V4 stack) with one integer, or one compress ratio, replaced by a look-alike."""
    layers = draw(st.integers(3, len(FLASH["compress_ratios"]) - 1))
    config = {**FLASH, "num_hidden_layers": layers, "compress_ratios": FLASH["compress_ratios"][: layers + 1]}
    if draw(st.booleans()):
        key: tuple[str | int, ...] = (draw(st.sampled_from(FIELDS)),)
    else:
        key = ("compress_ratios", draw(st.integers(0, layers)))
    value = config[key[0]] if len(key) == 1 else config["compress_ratios"][key[1]]
    return config, key, draw(look_alikes(value))


SHORT = {**FLASH, "num_hidden_layers": 4, "compress_ratios": FLASH["compress_ratios"][:5]}
EVERY_FIELD = [(SHORT, (field, ), bad) for field, bad in zip(FIELDS, [
    str(SHORT["num_hidden_layers"]), True, float(SHORT["qk_rope_head_dim"]), SHORT["index_head_dim"] + 0.5, False,
    str(SHORT["max_position_embeddings"])])] + [(SHORT, ("compress_ratios", 2), float(SHORT["compress_ratios"][2]))]
"""One look-alike for every field and a compress ratio, checked on every run (the random draws add others)."""


def sglang_refuses_or_differs(model_dir, key: tuple[str | int, ...]) -> bool:
    """Whether SGLang's config loading refuses the config, or (a compress ratio, which transformers maps through
    a dict, where 4.0 and false pass as 4 and 0) keeps a ratio that is no int, which the model's Compressor cannot
    size its tensors by."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError
    from sglang.srt.arg_groups.overrides import model_config_of

    try:
        real = resolve_for_real(model_dir, Hardware(), [])
    except (StrictDataclassFieldValidationError, TypeError, KeyError):
        return True
    ratio = model_config_of(real).hf_config.compress_ratios[key[1]] if key[0] == "compress_ratios" else None
    return type(ratio) is not int


def test_a_lax_integer_is_refused_at_it_and_sglang_refuses_it_too(tmp_path_factory, sglang_env, capsys):
    root = tmp_path_factory.mktemp("lax")
    dirs = count()

    @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=lax_configs(), indent=st.sampled_from([None, 2]))
    def check(case: tuple[dict[str, Any], tuple[str | int, ...], object], indent: int | None) -> None:
        config, key, bad = case
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        text = json.dumps(corrupted(config, key, bad), indent=indent)
        (model_dir / "config.json").write_text(text)
        capsys.readouterr()
        assert main(["plan", "--engine", "sglang", "--model-config", str(model_dir / "config.json"),
                     "--budget", "40GiB", "--format", "json"]) == 1
        (d,) = json.loads(capsys.readouterr().out)["error"]["diagnostics"]
        assert d["code"] == "KVD007", d
        assert d["hint"] and "strict config classes (DeepseekV4Config, DeepseekV3Config)" in d["hint"], d
        assert_placed_at(text, key, bad, d)
        assert sglang_refuses_or_differs(model_dir, key), (key, bad)
        event(f"{key[0]} {type(bad).__name__}")

    for case in EVERY_FIELD:
        check = example(case=case, indent=2)(check)
    with single_process_parallel():
        check()


def test_a_null_sliding_window_is_refused_as_sglang_refuses_it(tmp_path, sglang_env, capsys):
    """transformers' DeepseekV4Config types sliding_window as int (no None): SGLang stops loading the config."""
    (tmp_path / "config.json").write_text(json.dumps({**FLASH, "sliding_window": None}))
    assert main(["plan", "--engine", "sglang", "--model-config", str(tmp_path / "config.json"), "--budget", "40GiB"]) == 1
    err = capsys.readouterr().err
    assert "KVD007 error: sliding_window: must be a whole number, not null" in err
    assert "refuses null and has no default for sliding_window: write the model's value" in err  # nor has SGLang
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    with single_process_parallel(), pytest.raises(StrictDataclassFieldValidationError, match="sliding_window"):
        resolve_for_real(tmp_path, Hardware(), [])
