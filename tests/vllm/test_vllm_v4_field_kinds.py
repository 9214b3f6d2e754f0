"""The kinds of value the plan takes for each DeepSeek-V4 field are those transformers' ``DeepseekV4Config`` takes.

vLLM 0.33 loads a ``deepseek_v4`` config with that class, a strict dataclass that checks every field's type as
the config loads. Each example writes DeepSeek-V4-Flash's config.json with one field set to a random value of a
random kind and builds the class from it, as vLLM 0.33's ``get_config`` does for this model type (which
test_vllm_class_defaults.py goes through); the class refuses the value's type exactly when
``adapters/deepseek_config_kinds.py`` says the field does not take it, and then ``kvpolicy plan`` refuses the
config at that value (for 0.33; 0.32's own class checks nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.deepseek_config_kinds import V4_FIELD_KINDS, is_kind
from kvpolicy.adapters.vllm_adapter.planning.deepseek_v4_fields import check_v4_field_kinds
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.document_codes import WRONG_TYPE
from tests.support.json_values import JSON_VALUES
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_V4_FIELD_EXAMPLES", "300"))
FLASH = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())


def test_the_table_is_the_classs_own_fields() -> None:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    assert set(V4_FIELD_KINDS) == set(DeepseekV4Config.__annotations__)


def test_a_field_of_a_kind_the_class_refuses_is_refused_at_its_value(tmp_path_factory: pytest.TempPathFactory) -> None:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    folder: Path = tmp_path_factory.mktemp("v4-kinds")
    seen = {"refused": 0, "taken": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(key=st.sampled_from(sorted(V4_FIELD_KINDS)), value=JSON_VALUES)
    def check(key: str, value: Any) -> None:
        config = {**FLASH, key: value}
        (folder / "config.json").write_text(json.dumps(config))
        try:
            DeepseekV4Config(**config)
            refused_type = False
        except Exception as exc:  # noqa: BLE001 - the class's own checks beyond types (values) are not the question
            refused_type = type(exc).__name__ == "StrictDataclassFieldValidationError" and f"'{key}'" in str(exc)
            if not refused_type:
                event(f"refused otherwise: {type(exc).__name__}")
        ours = not any(is_kind(value, kind) for kind in V4_FIELD_KINDS[key])
        assert ours == refused_type, (key, value)
        seen["refused" if ours else "taken"] += 1
        filled = load_config(folder / "config.json")
        if ours:
            with pytest.raises(ModelSpecError) as refused:
                check_v4_field_kinds(filled, "0.33.0")
            if refused.value.key == (key,):  # a field before it in the table may be the one refused
                assert refused.value.code is WRONG_TYPE
        check_v4_field_kinds(filled, "0.32.0")  # 0.32's class checks nothing

    check()
    assert seen["refused"] and seen["taken"], seen


@pytest.mark.parametrize(("key", "value", "says", "on_032"), [
    # 0.32's class keeps the null, and its model fails with it (tests/vllm_e2e/test_vllm_plan_v4_032.py)
    ("hc_mult", None, "hc_mult null: DeepseekV4Config takes a whole number only", "hc_mult null: vLLM 0.32's"),
    ("swiglu_limit", 10, "swiglu_limit 10: DeepseekV4Config takes a number with a decimal point (10.0, not 10) only",
     None),
])
def test_plan_places_the_refusal_at_the_value_for_0_33_and_plans_for_0_32_as_it_starts(
        capsys, tmp_path: Path, key: str, value: Any, says: str, on_032: str | None) -> None:
    from kvpolicy.cli import main

    path = tmp_path / "config.json"
    text = json.dumps({**FLASH, key: value}, indent=2)
    path.write_text(text)
    line, col = text[:text.index(f'"{key}"')].count("\n") + 1, len(f'  "{key}": ') + 1
    assert main(["plan", "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB"]) == 1
    assert capsys.readouterr().err.startswith(f"{path}:{line}:{col}: KVD007 error: {says}, so transformers refuses "
                                              "the config and vLLM cannot load it\n")
    code = main(["plan", "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB", "--vllm-version", "0.32"])
    err = capsys.readouterr().err
    if on_032 is None:
        assert code == 0, err
    else:
        assert code == 1 and err.startswith(f"{path}:{line}:{col}: KVD007 error: {on_032}"), err
