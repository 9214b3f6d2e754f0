"""A config's ``rope_scaling`` (or ``rope_parameters``) as SGLang 0.5.23 reads it: the plan derives the context
length SGLang derives, and refuses, at the value, what SGLang refuses or fails on.

The reference is SGLang's own config loading and ``ModelConfig`` (``prepare_server_args(...).resolve_once()`` on
the CPU): transformers 5 standardizes and validates the scaling (``modeling_rope_utils``), ``get_context_length``
multiplies by its factor, ``compute_mla_mscale_scaling`` compares the factor with 1.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.geometry import GeometryConfig, GeometryError, read_geometry
from kvpolicy.adapters.sglang_dsv4.launch import Hardware, resolve_launch
from kvpolicy.adapters.sglang_dsv4.rope import MIN_CONTEXT_LENGTH
from kvpolicy.cli import main
from kvpolicy.json_positions import parse
from tests.cli.test_plan_config_errors import assert_placed_at
from tests.sglang.sglang_support import MODELS, RANDOM_EXAMPLES, resolve_for_real, single_process_parallel

pytestmark = pytest.mark.sglang

FLASH = {k: v for k, v in json.loads((MODELS / "deepseek-v4-flash.json").read_text()).items() if k != "rope_scaling"}
KINDS = ["linear", "dynamic", "yarn", "llama3", "longrope", "default", "proportional", "bogus", None, 5]
FACTORS = st.one_of(
    st.integers(-4, 64), st.floats(-2, 64), st.sampled_from([0, 0.0, 1e-9, 0.5, 1e300, 1e305, float("inf"), float("nan")]),
    st.sampled_from(["4", "2.5", "x", True, False, None, [2], {"v": 2}]),
)
SOURCES = {
    "rope_scaling": lambda rope: {"rope_scaling": rope},
    "rope_parameters": lambda rope: {"rope_parameters": rope},  # transformers 5's name
    "both": lambda rope: {"rope_scaling": False, "rope_parameters": rope},  # a falsy rope_scaling leaves it
    "shadowing": lambda rope: {"rope_scaling": rope, "rope_parameters": {"type": "linear", "factor": 3}},
}
"""Where the drawn scaling goes: transformers takes ``rope_scaling or rope_parameters``."""
NOT_OBJECTS = ["linear", 4, 2.5, [1, 2], True, False, 0, "", [], {}, None]
"""rope_scaling values that are no object: transformers takes the falsy ones for none and refuses the others."""


@st.composite
def rope_scalings(draw: st.DrawFn) -> object:
    """A rope_scaling of any type (known, unknown, null), with or without each key SGLang reads, each of any kind."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(NOT_OBJECTS))
    rope: dict[str, Any] = {}
    for key in draw(st.sampled_from([("type",), ("rope_type",), ("type", "rope_type"), ()])):
        rope[key] = draw(st.sampled_from(KINDS))
    candidates = {
        "factor": FACTORS,
        "original_max_position_embeddings": st.one_of(st.integers(0, 1 << 17), st.sampled_from([None, "4096", 2048.0])),
        "low_freq_factor": st.sampled_from([1, 1.0, "1", None]), "high_freq_factor": st.sampled_from([4, 4.0, "4"]),
        "short_factor": st.sampled_from([[1.0] * 32, "1", 1.0]), "long_factor": st.sampled_from([[1.0] * 32, None]),
        "beta_fast": st.sampled_from([32, 0, "x", None]), "beta_slow": st.sampled_from([1, 2.0, "y", [1]]),
        "mscale_all_dim": st.sampled_from([1, 0.707, "1.0", None, "x"]),
        "apply_yarn_scaling": st.booleans(),
    }
    for key, values in candidates.items():  # factor in 4 of 5, so that most draws pass transformers' key check
        if draw(st.integers(0, 4)) >= (1 if key == "factor" else 3):
            rope[key] = draw(values)
    return rope


def sglangs_context_length(model_dir) -> int | Exception:
    """What SGLang's own resolution derives for the model directory, or what it raises."""
    from huggingface_hub.errors import StrictDataclassError
    from sglang.srt.arg_groups.overrides import model_config_of

    try:
        with single_process_parallel():
            return model_config_of(resolve_for_real(model_dir, Hardware(), [])).context_len
    except (StrictDataclassError, KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError) as exc:
        return exc


def value_at(config: dict[str, Any], key: tuple[str, ...]) -> object:
    node: Any = config
    for part in key:
        node = node[part]
    return node


def assert_placed(text: str, config: dict[str, Any], d: dict[str, Any]) -> None:
    """``d`` is at the value its message names (``rope_scaling.factor: ...``), or at the object that lacks it."""
    key = tuple(d["message"].split(":", 1)[0].split("."))
    if d["code"] == "KVD009":  # at the { of the object that lacks the key
        document = parse(text)
        assert document is not None
        offset = document.span_of(key[:-1])[0]
        assert (d["line"], d["col"]) == (text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset))
        assert text[offset] == "{", d
        return
    assert_placed_at(text, key, value_at(config, key), d)


def test_the_context_length_or_refusal_is_sglangs_over_random_rope_scalings(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("rope")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=max(RANDOM_EXAMPLES * 4 // 15, 10), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(rope=rope_scalings(), length=st.one_of(st.sampled_from([65536, 1_048_576]), st.integers(1, 6000)),
           indent=st.sampled_from([None, 2]), source=st.sampled_from(list(SOURCES)))
    @example(rope={"type": "linear", "factor": "4"}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": "4"}, length=3, indent=None, source="rope_scaling")  # SGLang: int("444"), no scaling
    @example(rope={"type": "dynamic", "factor": True}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"factor": False}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": None}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "yarn", "factor": None}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": -2}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": 0}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": 0.5}, length=65537, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": 1.7}, length=65537, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": 0.5}, length=3, indent=2, source="rope_scaling")  # scaled to 1
    @example(rope={"type": "yarn", "factor": 4}, length=1, indent=2, source="rope_scaling")  # 1, not scaled
    @example(rope=None, length=2, indent=2, source="rope_scaling")  # the least SGLang starts with
    @example(rope={"type": "linear", "factor": 1e305}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"rope_type": "bogus", "factor": 3}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"rope_type": None, "type": "yarn", "factor": 4}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear", "factor": 4, "original_max_position_embeddings": 4096}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "default", "factor": "4", "original_max_position_embeddings": 4096}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "linear"}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "llama3", "factor": 4}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "yarn", "factor": 4, "original_max_position_embeddings": 0}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "yarn", "factor": 4, "original_max_position_embeddings": "4096"}, length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "yarn", "factor": 4, "mscale_all_dim": "x"}, length=65536, indent=2, source="rope_scaling")
    @example(rope="linear", length=65536, indent=2, source="rope_scaling")
    @example(rope=[], length=65536, indent=2, source="rope_scaling")
    @example(rope={"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": "4"}, length=65536,
             indent=2, source="rope_scaling")
    @example(rope={"type": "longrope", "short_factor": 1.0, "long_factor": [1.0]}, length=65536, indent=2,
             source="rope_scaling")
    @example(rope={"type": "yarn", "factor": 4, "beta_fast": "x"}, length=65536, indent=2, source="rope_scaling")
    @example(rope=False, length=65536, indent=2, source="rope_parameters")
    @example(rope={"type": "linear", "factor": 4}, length=65536, indent=2, source="both")
    @example(rope={"type": "linear", "factor": 4}, length=65536, indent=2, source="shadowing")
    @example(rope={"main": {"rope_type": "default"}, "compress": {"rope_type": "yarn", "factor": 16}}, length=65536,
             indent=2, source="rope_parameters")
    @example(rope={"main": {"rope_type": "default"}, "compress": {"rope_type": "yarn"}}, length=65536, indent=2,
             source="rope_parameters")
    @example(rope={"main": {"rope_type": "default"}, "compress": {"type": "linear", "factor": 2}, "factor": 3},
             length=65536, indent=2, source="rope_scaling")
    def check(rope: object, length: int, indent: int | None, source: str) -> None:
        config = {**FLASH, "max_position_embeddings": length, **SOURCES[source](rope)}
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        text = json.dumps(config, indent=indent)
        (model_dir / "config.json").write_text(text)
        real = sglangs_context_length(model_dir)
        try:
            ours: GeometryConfig | GeometryError = read_geometry(model_dir / "config.json")
        except GeometryError as exc:
            ours = exc
        if isinstance(ours, GeometryConfig):
            assert not isinstance(real, Exception), (rope, length, real)
            assert ours.geometry.derived_context_length == real, (rope, length)
            assert resolve_launch(ours.geometry).settings.context_length == real
            seen["same length"] += 1
            event("accepted: scaled" if real != length else "accepted: as max_position_embeddings")
            return
        diagnostics = [d.model_dump() for d in ours.diagnostics]
        assert diagnostics and all(d["message"].startswith(("rope_scaling", "rope_parameters", "max_position_embeddings"))
                                   for d in diagnostics), diagnostics
        for d in diagnostics:
            assert d["hint"], d
            assert_placed(text, config, d)
        if isinstance(real, Exception):
            seen["both refuse"] += 1
            event(f"refused: SGLang raises {type(real).__name__}, plan {diagnostics[0]['code']}")
            return
        # SGLang resolves a launch it cannot serve: a context length its worker stops at start-up with (under
        # MIN_CONTEXT_LENGTH, which its ModelConfig does not check), or the int of a repeated string.
        factor = rope.get("factor") if isinstance(rope, dict) else None  # the drawn scaling is the one read here
        assert real < MIN_CONTEXT_LENGTH or isinstance(factor, str), (rope, length, real, diagnostics)
        seen["sglang unusable"] += 1
        unusable = "a length it cannot start with" if real < MIN_CONTEXT_LENGTH else "a repeated string"
        event(f"refused: SGLang derives {unusable}")

    check()
    assert seen["same length"] and seen["both refuse"], seen


def plan_error(capsys, tmp_path, rope: object, length: int = 65536) -> tuple[str, dict[str, Any]]:
    """The text of a config with ``rope`` and the one diagnostic ``kvpolicy plan`` gives for it."""
    text = json.dumps({**FLASH, "max_position_embeddings": length, "rope_scaling": rope}, indent=2)
    (tmp_path / "config.json").write_text(text)
    capsys.readouterr()
    assert main(["plan", "--engine", "sglang", "--model-config", str(tmp_path / "config.json"),
                 "--budget", "40GiB", "--format", "json"]) == 1
    (d,) = json.loads(capsys.readouterr().out)["error"]["diagnostics"]
    return text, d


@pytest.mark.parametrize(("rope", "code", "message", "hint"), [
    ({"type": "linear", "factor": "4"}, "KVD007", 'rope_scaling.factor: must be a number, not "4"',
     "repeats a string rather than scaling it"),
    ({"type": "linear", "factor": None}, "KVD007", "rope_scaling.factor: must be a number, not null", "fails on null"),
    ({"type": "yarn", "factor": None}, "KVD007", "rope_scaling.factor: must be a number, not null",
     "compute_mla_mscale_scaling"),
    ({"type": "linear", "factor": 0}, "KVD008", "rope_scaling.factor: 0 scales the context length 65536 to 0",
     "a factor of 1 or more"),
    ({"type": "linear", "factor": -2}, "KVD008", "rope_scaling.factor: -2 scales the context length 65536 to -131072",
     "a factor of 1 or more"),
    ({"factor": False}, "KVD008", "rope_scaling.factor: false scales the context length 65536 to 0",
     "a factor of 1 or more"),
    ({"type": "linear", "factor": 1e305}, "KVD008", "rope_scaling.factor: 1e+305 × 65536 is no finite number",
     "infinite or NaN product"),
    ({"type": "linear"}, "KVD009", "rope_scaling.factor: required, not given", "refuses a linear rope scaling without"),
    ({"type": "yarn", "factor": 4, "original_max_position_embeddings": 0}, "KVD008",
     "rope_scaling.original_max_position_embeddings: must not be 0", "divides max_position_embeddings (65536) by it"),
    ("linear", "KVD007", 'rope_scaling: must be an object ({...}), not "linear"', "transformers' strict config"),
])
def test_what_sglang_refuses_is_placed_with_the_value_and_a_hint(capsys, tmp_path, rope, code, message, hint):
    text, d = plan_error(capsys, tmp_path, rope)
    assert (d["code"], d["message"]) == (code, message), d
    assert hint in d["hint"], d
    assert_placed(text, {"rope_scaling": rope}, d)


def test_a_context_length_sglang_cannot_start_with_is_refused_where_it_comes_from(capsys, tmp_path):
    """SGLang's worker asserts that the longest request (the context length − 1 tokens) holds a token: a length of
    1 from the context key itself, or scaled to 1 by the factor, is refused at that value; 2 is planned."""
    text, d = plan_error(capsys, tmp_path, None, length=1)
    assert (d["code"], d["message"]) == ("KVD008", "max_position_embeddings: 1 is the context length SGLang derives")
    assert "Memory pool size is too small" in d["hint"], d
    assert_placed(text, {"max_position_embeddings": 1}, d)
    text, d = plan_error(capsys, tmp_path, {"type": "linear", "factor": 0.5}, length=3)
    assert (d["code"], d["message"]) == ("KVD008", "rope_scaling.factor: 0.5 scales the context length 3 to 1")
    assert_placed(text, {"rope_scaling": {"type": "linear", "factor": 0.5}}, d)
    (tmp_path / "config.json").write_text(json.dumps({**FLASH, "max_position_embeddings": 2}))
    assert read_geometry(tmp_path / "config.json").geometry.derived_context_length == MIN_CONTEXT_LENGTH == 2


@pytest.mark.parametrize(("rope", "length"), [
    (None, 65536), (False, 65536), ({}, 65536), ([], 65536), ("", 65536),  # none, as transformers takes a falsy one
    ({"type": "linear", "factor": True}, 65536),  # true is 1 to Python
    ({"type": "linear", "factor": 2.5}, 163_840), ({"type": "dynamic", "factor": 0.5}, 32768),
    ({"type": "bogus", "factor": 4}, 262_144), ({"rope_type": None, "type": "yarn", "factor": 4}, 262_144),
    ({"type": "default", "factor": 4}, 262_144), ({"type": "yarn", "factor": "4"}, None),
    ({"type": "default", "factor": "4", "original_max_position_embeddings": 4096}, 65536),  # no factor read
    ({"type": "linear", "factor": "4", "original_max_position_embeddings": 4096}, None),  # the MLA scale reads it
    ({"type": "yarn", "factor": 16}, 65536),
    ({"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}, 65536),
])
def test_the_context_length_of_each_rope_scaling(tmp_path, rope, length):
    """Figures the random test checks against SGLang, written out (None: refused)."""
    (tmp_path / "config.json").write_text(json.dumps({**FLASH, "max_position_embeddings": 65536, "rope_scaling": rope}))
    if length is None:  # no context factor here, but SGLang's MLA scale compares the factor with 1
        with pytest.raises(GeometryError, match=r"rope_scaling\.factor: must be a number"):
            read_geometry(tmp_path / "config.json")
        return
    assert read_geometry(tmp_path / "config.json").geometry.derived_context_length == length


@pytest.mark.parametrize(("fields", "outcome"), [
    ({"rope_parameters": {"rope_type": "linear", "factor": 4}}, 262_144),  # transformers 5's name is read too
    ({"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 4}}, 262_144),
    ({"rope_scaling": {"type": "linear", "factor": 2}, "rope_parameters": {"type": "linear", "factor": 4}}, 131_072),
    ({"rope_parameters": {"main": {"rope_type": "default"}, "compress": {"rope_type": "yarn", "factor": 16}}}, 65536),
    ({"rope_parameters": False}, ("KVD007", "rope_parameters: must be an object ({...}), not false")),
    ({"rope_parameters": {"main": {"rope_type": "default"}, "compress": {"rope_type": "yarn"}}},
     ("KVD009", "rope_parameters.compress.factor: required, not given")),
])
def test_rope_parameters_is_read_where_rope_scaling_is_none(capsys, tmp_path, fields, outcome):
    """transformers takes ``rope_scaling or rope_parameters``; DeepseekV4Config checks a nested one's parameters."""
    text = json.dumps({**FLASH, "max_position_embeddings": 65536, **fields}, indent=2)
    (tmp_path / "config.json").write_text(text)
    if isinstance(outcome, int):
        assert read_geometry(tmp_path / "config.json").geometry.derived_context_length == outcome
        return
    with pytest.raises(GeometryError) as refused:
        read_geometry(tmp_path / "config.json")
    (d,) = [d.model_dump() for d in refused.value.diagnostics]
    assert (d["code"], d["message"]) == outcome and d["hint"], d
    assert_placed(text, fields, d)
