"""A config's dtype is refused by the SGLang plan exactly where SGLang 0.5.23 cannot start with it, or where
transformers reads it as something that is no torch dtype (``kvpolicy.adapters.hf_dtype``: stricter there).

Each example writes DeepSeek-V4-Flash's config (V4, or V4.1 with the fields in ``text_config`` and the dtype
at either level) with a random dtype (``tests/support/dtype_values.py``) and resolves it with SGLang's own
``prepare_server_args``, ``ModelConfig`` and configurator on the ``meta`` device (on the CPU). Where both
start, they build the same pools: the dtype of a checkpoint sizes none of DeepSeek-V4's.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.config_fields import TEXT_CONFIG
from kvpolicy.adapters.sglang_dsv4.geometry import GeometryError
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from tests.sglang.sglang_support import RANDOM_EXAMPLES, single_process_parallel
from tests.cli.test_plan_config_errors import assert_placed_at
from tests.sglang.test_sglang_config_nesting import FIELDS, FLASH, error_diagnostic, ours, sglangs, write
from tests.support.dtype_values import dtype_entries, is_torch_dtype

pytestmark = pytest.mark.sglang

V4 = {k: v for k, v in FLASH.items() if k not in ("dtype", "torch_dtype")}


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Flash's config with random dtype entries: a V4 one, or a V4.1 one with them at either level."""
    entries = draw(dtype_entries())
    if draw(st.booleans()):
        return {**V4, **entries}
    text = {k: V4[k] for k in FIELDS if k in V4}
    inside = draw(st.booleans())
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
            TEXT_CONFIG: {**text, **entries} if inside else text, **({} if inside else entries)}


def test_the_plan_refuses_a_dtype_where_sglang_stops_or_reads_no_dtype(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("dtype")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(config=configs())
    @example(config={**V4, "dtype": "bf16"})  # no such attribute: transformers stops
    @example(config={**V4, "dtype": "Tensor"})  # a class: SGLang starts, its model dtype is no dtype
    @example(config={**V4, "torch_dtype": "uint16", "dtype": None})
    @example(config={**V4, "dtype": "bfloat16", "torch_dtype": "nonsense"})  # transformers ignores the second
    def check(config: dict[str, Any]) -> None:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        mine, real = ours(model_dir), sglangs(model_dir)
        if isinstance(mine, Exception):
            assert isinstance(mine, GeometryError), (config, mine)
            (diagnostic,) = mine.problems.diagnostics
            assert diagnostic.code in (VALUE_NOT_ALLOWED.code, WRONG_TYPE.code) and "dtype" in diagnostic.message, mine
            if isinstance(real, Exception):
                seen["both refuse"] += 1
                event(f"both refuse (SGLang: {type(real).__name__})")
            else:  # stricter than SGLang: what it read is no dtype
                hf_config = real[0].hf_config
                assert not is_torch_dtype(hf_config.dtype), (config, hf_config.dtype)
                seen["stricter"] += 1
                event(f"stricter: SGLang read a {type(hf_config.dtype).__name__}")
            return
        assert not isinstance(real, Exception), (config, real)
        (_, planned, tensors), (model_config, live, real_pools) = mine, real
        assert is_torch_dtype(model_config.hf_config.dtype) or model_config.hf_config.dtype is None, config
        assert (planned, tensors) == (live, real_pools), config
        seen["both build"] += 1
        event("both build the same pools")

    with single_process_parallel():
        check()
    assert seen["both refuse"] and seen["stricter"] and seen["both build"], seen


def test_the_refusal_is_placed_at_the_value_transformers_reads(capsys, tmp_path):
    nested = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
              TEXT_CONFIG: {**{k: V4[k] for k in FIELDS if k in V4}, "torch_dtype": "bf16"}, "dtype": None}
    path, text = write(tmp_path, nested)
    d = error_diagnostic(capsys, path)
    assert_placed_at(text, (TEXT_CONFIG, "torch_dtype"), "bf16", d)
    assert (d["code"], d["message"]) == (VALUE_NOT_ALLOWED.code, 'torch_dtype "bf16" is not a torch dtype')
    assert "bfloat16, float16 or float32" in (d["hint"] or "")
