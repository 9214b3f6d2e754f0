"""A value of the wrong JSON kind anywhere in a model config is refused at a place, with a code, never as a bare
TypeError or a message without a place.

The random test puts values of every kind (null, booleans, numbers, strings, lists, objects, nested) at random
places of the test configs (top-level keys, list entries, a quantization config's fields, a multimodal
config's text config) and plans each with the default flags: the plan either plans or refuses with a
``ModelSpecError`` that names a key and a code (or a ``PlanError``, the budget). No input is known to reach the
plan's last resort, a ``TypeError`` caught while the specs are built; the explicit tests raise one there and
check that it is placed at the value of the wrong kind the config has, or else at ``model_type``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.vllm.quant_configs import kv_quant_configs
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.adapters.vllm_adapter.planning import hf_config
from kvpolicy.adapters.vllm_adapter.planning.class_defaults import with_class_defaults
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan
from kvpolicy.cli import main
from kvpolicy.document_codes import WRONG_TYPE

EXAMPLES = int(os.environ.get("KVPOLICY_WRONG_KINDS_EXAMPLES", "300"))
"""Each example is one pure plan (about a millisecond)."""

BASES = {name: json.loads((CONFIGS / name / "config.json").read_text())
         for name in ("qwen3-8b", "gemma-3-1b", "deepseek-v2-lite", "deepseek-v4-flash", "gpt-oss-20b")}
QUANT_KEYS = ["quant_method", "kv_cache_quant_algo", "kv_cache_scheme", "num_bits", "type", "quantization", "ignore",
              "producer", "name", "rope_type", "factor"]
SCALARS = (st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=5) | st.sampled_from(["fp8", "float16", "sliding_attention", "modelopt", "FP8"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(QUANT_KEYS), inner, max_size=3), max_leaves=6)


def places(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every place in ``value`` a value can be put (the first entries of lists)."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from places(inner, (*path, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value[:4]):
            yield from places(inner, (*path, i))


def put(config: Any, path: tuple[str | int, ...], value: Any) -> None:
    for step in path[:-1]:
        config = config[step]
    config[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A test config, with a quantization config at times, with one to three values replaced at random."""
    config = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    quant = draw(kv_quant_configs())
    if quant is not None and draw(st.booleans()):
        config["quantization_config"] = quant
    if draw(st.integers(0, 4)) == 0:  # Gemma-3's multimodal shape: the language model in text_config
        text = {k: v for k, v in copy.deepcopy(BASES["gemma-3-1b"]).items() if k != "architectures"}
        config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}
    for _ in range(draw(st.integers(1, 3))):
        put(config, draw(st.sampled_from(list(places(config)))), draw(VALUES))
    return config


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=mutated())
def test_a_value_of_any_kind_anywhere_is_planned_or_refused_at_a_place(config: dict[str, Any]) -> None:
    try:
        make_plan(with_class_defaults(config), PlanSettings(max_model_len=1024), budget=8 << 30)
    except ModelSpecError as exc:
        assert exc.key is not None, str(exc)
        assert "wrong kind in the model config" not in str(exc), str(exc)  # the last resort: see the module doc
    except PlanError:
        pass


QWEN = BASES["qwen3-8b"]


def raise_type_error(*args: Any, **kwargs: Any) -> None:
    raise TypeError("'<' not supported between instances of 'list' and 'int'")


def test_an_unforeseen_type_error_is_placed_at_model_type(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config, key, words = QWEN, "model_type", "a value of the wrong kind in the model config ('<' not supported"
    monkeypatch.setattr(hf_config, "check_build", raise_type_error)
    path = tmp_path / "config.json"
    text = json.dumps(config, indent=1)
    path.write_text(text)
    code = main(["plan", "--engine", "vllm", "--model-config", str(path), "--budget", "40GiB"])
    err = capsys.readouterr().err
    assert code == 1
    line = next(i for i, row in enumerate(text.splitlines()) if row.startswith(f' "{key}": ')) + 1
    assert f"config.json:{line}:{len(key) + 6}: KVD007 error: {words}" in err, err
    with pytest.raises(ModelSpecError) as refused:
        hf_config.model_specs(with_class_defaults(config))
    assert refused.value.key == (key,) and refused.value.code is WRONG_TYPE
