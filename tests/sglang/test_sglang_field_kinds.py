"""A DeepSeek-V4 field of a kind SGLang 0.5.23's strict config classes refuse is refused by the plan, at its value.

SGLang loads a ``deepseek_v4`` config.json with transformers' ``DeepseekV4Config`` and with its own alias of
``DeepseekV3Config``, a ``deepseek_v41`` one with its ``DeepseekV41Config`` (a ``DeepseekV3Config``), all strict
dataclasses that check each declared field's type as the config loads
(``adapters/hf_config_kinds.py``). Each example writes DeepSeek-V4-Flash's config with one field of
either class set to a random value of a random kind (for V4.1, at the top level or in ``text_config``, which
SGLang lays out flat) and resolves it with SGLang's own ``prepare_server_args``
(on the CPU): SGLang refuses the value's type exactly when ``kvpolicy plan --engine sglang`` refuses the config
with KVD007 at that value (or SGLang's own code fails with the value before the classes see it), and wherever
SGLang stops, for whatever reason, the plan refuses the config too.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.hf_config_kinds import FIELD_KINDS
from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry
from kvpolicy.adapters.sglang_dsv4.launch import Hardware
from kvpolicy.cli import main
from kvpolicy.json_positions import parse
from tests.cli.test_plan_config_errors import assert_placed_at
from tests.sglang.sglang_support import MODELS, RANDOM_EXAMPLES, resolve_for_real, single_process_parallel
from tests.support.json_values import JSON_VALUES

pytestmark = pytest.mark.sglang

FLASH = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
V3_FIELD_KINDS, V4_FIELD_KINDS = FIELD_KINDS["DeepseekV3Config"], FIELD_KINDS["DeepseekV4Config"]
FIELDS = {
    "deepseek_v4": sorted(set(V4_FIELD_KINDS) | set(V3_FIELD_KINDS)),
    # A V4.1 config loads through DeepseekV3Config alone; the fields the plan reads itself it reads strictly
    # (test_sglang_strict_config.py), as V4 takes them, which is stricter than SGLang for V4.1's head_dim.
    "deepseek_v41": sorted(set(V3_FIELD_KINDS) | (set(V4_FIELD_KINDS) - set(ModelGeometry.model_fields))),
}
V41_TOP = {"architectures": FLASH["architectures"], "model_type": "deepseek_v41"}
V41_TEXT = {k: v for k, v in FLASH.items() if k not in V41_TOP}
FIELD = st.sampled_from(sorted(FIELDS)).flatmap(lambda model_type: st.tuples(
    st.just(model_type), st.sampled_from(FIELDS[model_type])))
"""(model type, one of the fields its classes declare)."""


def test_the_tables_are_the_classes_sglang_loads_with(sglang_env: str) -> None:
    from sglang.srt.utils.hf_transformers.common import _CONFIG_REGISTRY
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    assert issubclass(_CONFIG_REGISTRY["deepseek_v4"], DeepseekV3Config)
    assert issubclass(_CONFIG_REGISTRY["deepseek_v41"], DeepseekV3Config)
    # the kinds of their fields are the classes' annotations (tests/vllm/test_vllm_field_kinds.py)
    assert set(V3_FIELD_KINDS) == set(DeepseekV3Config.__annotations__)
    assert set(V4_FIELD_KINDS) == set(DeepseekV4Config.__annotations__)


def sglang_refusal(model_dir: Path, key: str) -> str | None:
    """How SGLang's resolution of the launch stops: "type" at a strict class's type check of ``key``, "other"
    at anything else (its own code computing with the value), None where it resolves."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    try:
        resolve_for_real(model_dir, Hardware(), [])
    except StrictDataclassFieldValidationError as exc:
        return "type" if f"'{key}'" in str(exc) else "other"
    except Exception as exc:  # noqa: BLE001 - whatever SGLang raises, it does not start
        event(f"refused otherwise: {type(exc).__name__}")
        return "other"
    return None


def test_a_field_of_a_kind_sglang_refuses_is_refused_at_its_value(tmp_path_factory, sglang_env, capsys) -> None:
    root = tmp_path_factory.mktemp("kinds")
    dirs = count()
    seen = {"refused": 0, "taken": 0}

    @settings(max_examples=RANDOM_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(field=FIELD, value=JSON_VALUES, nested=st.booleans())
    @example(field=("deepseek_v4", "hc_mult"), value=None, nested=False)
    @example(field=("deepseek_v4", "swiglu_limit"), value=10, nested=False)  # a float field: an integer is refused
    @example(field=("deepseek_v4", "kv_lora_rank"), value=512.0, nested=False)  # DeepseekV3Config's only
    @example(field=("deepseek_v4", "rope_theta"), value=10000.0, nested=False)  # float | int: taken
    @example(field=("deepseek_v41", "hc_mult"), value=4.0, nested=False)  # V4.1: DeepseekV4Config's only, not checked
    @example(field=("deepseek_v41", "q_lora_rank"), value="1024", nested=False)
    @example(field=("deepseek_v41", "q_lora_rank"), value="1024", nested=True)  # in text_config, laid out flat
    @example(field=("deepseek_v41", "hc_mult"), value="4", nested=False)  # SGLang compares it with 1
    @example(field=("deepseek_v41", "layer_types"), value="x", nested=True)  # the base class's validator
    @example(field=("deepseek_v4", "layer_types"), value=["sliding_attention"], nested=False)  # one per layer
    def check(field: tuple[str, str], value: Any, nested: bool) -> None:
        model_type, key = field
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        if nested and model_type == "deepseek_v41":  # a multimodal V4.1 config: SGLang reads text_config flat
            config, path = {**V41_TOP, "text_config": {**V41_TEXT, key: value}}, ("text_config", key)
        else:
            config, path = {**FLASH, "model_type": model_type, key: value}, (key,)
        text = json.dumps(config, indent=2)
        (model_dir / "config.json").write_text(text)
        capsys.readouterr()
        code = main(["plan", "--engine", "sglang", "--model-config", str(model_dir / "config.json"),
                     "--budget", "40GiB", "--format", "json"])
        out = json.loads(capsys.readouterr().out)
        at_key = [d for d in out["error"]["diagnostics"] if (d["line"], d["col"]) == place(text, path)] if code else []
        ours = any(d["code"] == "KVD007" for d in at_key)
        real = sglang_refusal(model_dir, key)
        # The type checks are the classes': refused by them exactly where the plan refuses the kind. SGLang's
        # own code may refuse a value first (a string it divides), and may refuse values of a right kind.
        assert ours == (real == "type") or (ours and real == "other"), (key, value, real, at_key)
        assert real is None or code == 1, (key, value, real)  # whatever stops SGLang, the plan refuses too
        if ours:
            (d,) = at_key
            assert_placed_at(text, path, value, d)
        seen["refused" if ours else "taken"] += 1

    with single_process_parallel():
        check()
    assert seen["refused"] and seen["taken"], seen


def place(text: str, path: tuple[str, ...]) -> tuple[int, int]:
    """The line and column of the value at ``path`` in ``text``."""
    document = parse(text)
    assert document is not None
    start, _end = document.span_of(path)
    return text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
