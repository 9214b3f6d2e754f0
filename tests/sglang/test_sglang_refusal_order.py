"""With a dtype transformers cannot read beside other faults, the SGLang plan names the dtype exactly where SGLang
0.5.23 stops at it; of two fields of kinds the strict classes refuse, it names first the one SGLang stops at.

SGLang meets a config's faults in stages: transformers' strict classes check each declared field's kind as they
build the config (``StrictDataclassFieldValidationError``), then read its dtype (``getattr(torch, name)``); the
classes' validators, the RoPE parameters' conversion and SGLang's own reading (the fields it requires, the V4
layout, the context length) come after. Each example writes DeepSeek-V4-Flash's fields (a V4 config, or a V4.1
one with them in ``text_config`` and the dtype at either level) with a dtype torch has no name for and one or two
other faults: a random value for a field the classes declare, or one of the faults the plan refuses after the
classes' checks. SGLang's own resolution (on the CPU) decides which it stops at, and the plan's first diagnostic
must be the dtype's exactly then. A config's model type and nesting are outside this test: the plan reads no
other layout, so it refuses one before anything else (docs/sglang.md). The second test writes two random values
at two declared fields instead, in either order; the third two faults of any stage, without the dtype, and
compares the plan's refusal with what it says of the one SGLang stops at.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.hf_config_kinds import FIELD_KINDS
from kvpolicy.adapters.hf_config_kinds import refused as kinds_wanted
from kvpolicy.adapters.hf_dtype import DTYPE_KEYS
from kvpolicy.adapters.sglang_dsv4.config_fields import TEXT_CONFIG
from kvpolicy.adapters.sglang_dsv4.geometry import GeometryError, ModelGeometry
from tests.sglang.sglang_support import RANDOM_EXAMPLES, single_process_parallel
from tests.sglang.test_sglang_config_nesting import FLASH, ours, sglangs

pytestmark = pytest.mark.sglang

V4 = {k: v for k, v in FLASH.items() if k not in DTYPE_KEYS}
UNREADABLE_DTYPES = ("bf16", "Float16", "fp8", "float32 ")
"""Names torch has no attribute of: transformers stops at each (``getattr``)."""

Fault = Callable[[dict[str, Any]], dict[str, Any]]


def without(key: str) -> Fault:
    return lambda fields: {k: v for k, v in fields.items() if k != key}


def setting(key: str, value: Any) -> Fault:
    return lambda fields: {**fields, key: value}


def ratios(fields: dict[str, Any]) -> list[Any]:
    """The compress ratios of ``fields``, or Flash's where another fault took them."""
    given = fields.get("compress_ratios")
    return given if isinstance(given, list) else V4["compress_ratios"]


LATER_FAULTS: dict[str, Fault] = {
    "no compress_ratios": without("compress_ratios"),
    "no index_head_dim": without("index_head_dim"),
    "no sliding_window": without("sliding_window"),
    "no architectures": without("architectures"),
    "no layers": setting("num_hidden_layers", 0),
    "negative layers": setting("num_hidden_layers", -1),
    "head_dim 256": setting("head_dim", 256),
    "qk_rope_head_dim 32": setting("qk_rope_head_dim", 32),
    "too few compress ratios": lambda fields: {**fields, "compress_ratios": ratios(fields)[:3]},
    "compress ratio 2": lambda fields: {**fields, "compress_ratios": [2, *ratios(fields)[1:]]},
    "compress ratios a string": setting("compress_ratios", "abc"),
    "compress ratio 1.5": lambda fields: {**fields, "compress_ratios": [1.5, *ratios(fields)[1:]]},
    "rope_scaling a number": setting("rope_scaling", 5),
    "rope_scaling a list": setting("rope_scaling", [1]),
    "yarn without factor": setting("rope_scaling", {"type": "yarn"}),
    "yarn factor 0.5": setting("rope_scaling", {"type": "yarn", "factor": 0.5,
                                                "original_max_position_embeddings": 65536}),
    "context length 1": setting("max_position_embeddings", 1),
    "max_seq_len a string": setting("max_seq_len", "x"),
    "max_seq_len 1": setting("max_seq_len", 1),
    "kv_source_layer_ids 1.5": setting("kv_source_layer_ids", [1.5]),
}
"""Faults the plan refuses that SGLang meets after the strict classes' field checks (or never: a context length of
1 it starts with, and fails at the first request; the plan refuses it)."""

DECLARED = sorted(set(FIELD_KINDS["DeepseekV4Config"]) | set(FIELD_KINDS["DeepseekV3Config"]))
ODD_VALUES = st.sampled_from(["x", "43", 1.5, 43.0, True, None, [1], {"a": 1}, 7])


@st.composite
def faults(draw: st.DrawFn) -> tuple[str, Fault]:
    """One fault: a random value for a field the strict classes declare (often of a kind they refuse), or one of
    ``LATER_FAULTS``."""
    if draw(st.booleans()):
        key, value = draw(st.sampled_from(DECLARED)), draw(ODD_VALUES)
        return f"{key}={json.dumps(value)}", setting(key, value)
    name = draw(st.sampled_from(sorted(LATER_FAULTS)))
    return name, LATER_FAULTS[name]


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Flash's fields with one or two faults and an unreadable dtype, as a V4 config or a V4.1 one."""
    fields = dict(V4)
    for name, fault in draw(st.lists(faults(), min_size=1, max_size=2, unique_by=lambda f: f[0])):
        fields = fault(fields)
        event(name if name in LATER_FAULTS else "a declared field")
    dtype = {draw(st.sampled_from(DTYPE_KEYS)): draw(st.sampled_from(UNREADABLE_DTYPES))}
    if draw(st.booleans()):
        return {**fields, **dtype}
    top = {k: fields[k] for k in ("architectures",) if k in fields}
    text = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    inside = draw(st.booleans())
    return {**top, "model_type": "deepseek_v41", TEXT_CONFIG: {**text, **dtype} if inside else text,
            **({} if inside else dtype)}


def sglang_stops_at_the_dtype(real: object) -> bool:
    return isinstance(real, AttributeError) and "module 'torch' has no attribute" in str(real)


def test_the_dtype_is_named_first_exactly_where_sglang_stops_at_it(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("order")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES // 2, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(config=configs())
    @example(config={**V4, "compress_ratios": V4["compress_ratios"][:3], "dtype": "bf16"})  # a class validator
    @example(config={**V4, "rope_scaling": 5, "dtype": "bf16"})  # the RoPE parameters' conversion
    @example(config={**V4, "num_hidden_layers": "43", "dtype": "bf16"})  # a field the plan reads
    @example(config={**V4, "vocab_size": 1.5, "dtype": "bf16"})  # one it does not
    @example(config={**V4, "vocab_size": 1.5, "compress_ratios": V4["compress_ratios"][:3], "dtype": "bf16"})
    def check(config: dict[str, Any]) -> None:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        mine, real = ours(model_dir), sglangs(model_dir)
        assert isinstance(mine, GeometryError), (config, mine)
        first = mine.problems.diagnostics[0].message
        at_dtype = sglang_stops_at_the_dtype(real)
        assert first.startswith(DTYPE_KEYS) == at_dtype, (config, first, real)
        seen["the dtype" if at_dtype else "another field"] += 1

    with single_process_parallel():
        check()
    assert seen["the dtype"] and seen["another field"], seen


@st.composite
def two_field_configs(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """Flash's fields with random values for two fields the strict classes declare, written in either order, as a
    V4 config or a V4.1 one (in ``text_config``); and the two fields."""
    keys = draw(st.lists(st.sampled_from(DECLARED), min_size=2, max_size=2, unique=True))
    odd = {key: draw(ODD_VALUES) for key in keys}
    fields = {**{k: v for k, v in FLASH.items() if k not in keys}, **odd}
    if draw(st.booleans()):
        return fields, keys
    text = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    return {"architectures": FLASH["architectures"], "model_type": "deepseek_v41", TEXT_CONFIG: text}, keys


def test_of_two_refused_fields_the_plan_names_the_one_sglang_stops_at(tmp_path_factory, sglang_env):
    """Each strict class checks its fields in the order it declares them, whatever the file's; SGLang builds
    ``DeepseekV4Config`` before its ``DeepseekV3Config`` alias. Where SGLang stops at one of two fields of kinds a
    class refuses, the plan's refusal names that field first (its diagnostics list both, in the file's order);
    where the plan's own reading refuses one of them, its message, which is not compared here."""
    root = tmp_path_factory.mktemp("two-kinds")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES // 2, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(drawn=two_field_configs())
    @example(drawn=({**FLASH, "swiglu_limit": 10, "vocab_size": 1.5}, ["swiglu_limit", "vocab_size"]))
    @example(drawn=({**FLASH, "kv_lora_rank": 1.5, "hc_eps": 1}, ["kv_lora_rank", "hc_eps"]))  # V4's first
    @example(drawn=({**FLASH, "rope_interleave": 7, "kv_lora_rank": 1.5}, ["rope_interleave", "kv_lora_rank"]))
    def check(drawn: tuple[dict[str, Any], list[str]]) -> None:
        config, keys = drawn
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        real = sglangs(model_dir)
        stopped = re.search(r"Validation error for field '(\w+)'", str(real)) if isinstance(real, Exception) else None
        if stopped is None or stopped.group(1) not in keys:
            event("SGLang stops otherwise, or starts")
            return
        mine = ours(model_dir)
        assert isinstance(mine, GeometryError), (config, mine)
        headline = str(mine).split(": ", 1)[1]
        if "not a DeepSeek-V4 config" in headline:
            event("the plan's own reading refuses a field first")
            return
        assert headline.startswith(f"{stopped.group(1)} "), (keys, headline, real)
        seen[("the first written", "the second written")[keys.index(stopped.group(1))]] += 1

    with single_process_parallel():
        check()
    assert seen["the first written"] and seen["the second written"], seen


LATE = {"no compress_ratios", "no index_head_dim", "no sliding_window", "no architectures", "no layers", "head_dim 256",
        "qk_rope_head_dim 32", "context length 1", "max_seq_len a string", "max_seq_len 1", "kv_source_layer_ids 1.5"}
"""``LATER_FAULTS`` SGLang meets in its own reading of the config, after transformers' classes have built it."""
ROPE = {"yarn without factor", "yarn factor 0.5"}
LAYERS = {"no layers", "negative layers"}
RATIOS = {"compress ratio 2", "compress ratio 1.5", "compress ratios a string", "too few compress ratios"}


Staged = tuple[str, Fault, bool]
"""A fault (``faults``), and whether the plan's geometry may refuse it: one SGLang meets only in its own reading
(a named one of ``LATE``, or a random value both strict classes take), or a random value at a field the
geometry reads."""


@st.composite
def staged_faults(draw: st.DrawFn) -> Staged:
    name, fault = draw(faults())
    if name in LATER_FAULTS:
        return name, fault, name in LATE
    key, value = name.split("=", 1)
    taken = all(kinds_wanted(FIELD_KINDS[c], key, json.loads(value)) is None
                for c in ("DeepseekV4Config", "DeepseekV3Config"))
    return name, fault, taken or key in ModelGeometry.model_fields


def modelled(a: Staged, b: Staged) -> bool:
    """Whether the plan models which of two faults SGLang meets first (docs/sglang.md): not a RoPE fault beside
    one the geometry may refuse (the plan reads the RoPE parameters of a geometry it could build), nor a compress
    ratio beside a layer count the geometry refuses, which hides it."""
    names = {a[0], b[0]}
    return not ((names & ROPE and (a[2] or b[2])) or (names & LAYERS and names & RATIOS))


def lead(refusal: object) -> str | None:
    """The first problem a refusal of the plan names (a missing field's name of a list of them), None for a plan."""
    if not isinstance(refusal, Exception):
        return None
    headline = str(refusal).split(": ", 1)[-1]
    for prefix in ("not a DeepSeek-V4 config: ", "SGLang derives no context length it can start with from it: "):
        headline = headline.removeprefix(prefix)
    first = headline.split("; ")[0]
    missing = re.match(r"([\w.]+)(, [\w.]+)* not given", first)
    return f"{missing.group(1)} not given" if missing else first


def test_of_two_faults_the_plan_names_first_the_one_sglang_stops_at(tmp_path_factory, sglang_env):
    """Two faults of a V4 config (a random value at a field the strict classes declare, or one of
    ``LATER_FAULTS``): SGLang's own resolution of the config with each alone and with both says which it stops at
    (what it raises with both is what it raises with that one alone), and the plan's refusal of both must name
    first what it names for that one alone. SGLang meets them in stages: DeepseekV4Config checks the kinds of its
    fields, reads the dtype and its base keys, checks ``rope_scaling`` as its ``rope_parameters``, maps the
    compress ratios to layer types, divides by ``qk_rope_head_dim`` and compares the ratios' count with the
    layers; the RoPE parameters are converted, its alias ``DeepseekV3Config`` checks its fields' kinds, and
    SGLang's own reading comes last, in its own order."""
    root = tmp_path_factory.mktemp("two-faults")
    dirs = count()
    seen: Counter[str] = Counter()
    flash = {**V4, "torch_dtype": "bfloat16"}

    def both(config: dict[str, Any]) -> tuple[str | None, str | None]:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        real = sglangs(model_dir)
        if not isinstance(real, Exception):
            return None, lead(ours(model_dir))
        return f"{type(real).__name__}: {str(real).replace(str(model_dir), '')}", lead(ours(model_dir))

    @settings(max_examples=RANDOM_EXAMPLES // 2, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(drawn=st.lists(staged_faults(), min_size=2, max_size=2, unique_by=lambda f: f[0]))
    @example(drawn=[("num_key_value_heads={}", setting("num_key_value_heads", {}), False),
                    ("sliding_window=null", setting("sliding_window", None), False)])  # one the plan reads
    @example(drawn=[("rope_scaling a number", LATER_FAULTS["rope_scaling a number"], False),
                    ("attention_bias=\"x\"", setting("attention_bias", "x"), False)])  # rope_scaling: after it
    @example(drawn=[("too few compress ratios", LATER_FAULTS["too few compress ratios"], False),
                    ("no index_head_dim", LATER_FAULTS["no index_head_dim"], True)])  # the class's validator
    @example(drawn=[("yarn without factor", LATER_FAULTS["yarn without factor"], False),
                    ("kv_lora_rank=1.5", setting("kv_lora_rank", 1.5), False)])  # the RoPE conversion, then V3's
    @example(drawn=[("no architectures", LATER_FAULTS["no architectures"], True),
                    ("topk_group=43.0", setting("topk_group", 43.0), False)])  # V3's kinds, then SGLang's reading
    @example(drawn=[("no sliding_window", LATER_FAULTS["no sliding_window"], True),
                    ("max_seq_len a string", LATER_FAULTS["max_seq_len a string"], True)])  # the context length first
    @example(drawn=[("no compress_ratios", LATER_FAULTS["no compress_ratios"], True),
                    ("no index_head_dim", LATER_FAULTS["no index_head_dim"], True)])  # its own order of the fields
    def check(drawn: list[Staged]) -> None:
        (a, fault_a, _), (b, fault_b, _) = drawn
        if not modelled(*drawn):
            event("an order the plan does not model")
            return
        alone_a, alone_b = both(fault_a(dict(flash))), both(fault_b(dict(flash)))
        paired = both(fault_b(fault_a(dict(flash))))
        said = (alone_a[0], alone_b[0])
        if None in (*said, paired[0]) or said[0] == said[1] or paired[0] not in said:
            event("SGLang does not tell the two apart")
            return
        stopped, other = (alone_a, alone_b) if paired[0] == alone_a[0] else (alone_b, alone_a)
        assert stopped[1] is not None, (a, b, stopped)
        assert paired[1] == stopped[1], (a, b, paired, stopped, other)
        seen["the first drawn" if stopped is alone_a else "the second drawn"] += 1

    with single_process_parallel():
        check()
    assert seen["the first drawn"] and seen["the second drawn"], seen
