"""Where the plan reads a DeepSeek-V4 model's fields is where SGLang 0.5.23 reads them, for any nesting, and
what it takes for a field no level gives is what SGLang takes.

Each example writes DeepSeek-V4-Flash's fields spread at random over a config's top level and its
``text_config`` (some in both, with different values where the config stays valid; some in neither), with a
``model_type`` of V4 or V4.1 (or none), architectures at either level or both, a ``vision_config`` and now
and then a ``text_config`` that is null, no object or holds another ``text_config``. SGLang's own resolution
(``prepare_server_args``, its ``ModelConfig`` and its configurator building the pools for 40 GiB on the
``meta`` device, on the CPU) and ``kvpolicy plan``'s reading must agree: both refuse, or both get the same
launch settings, the same fields of the pools' geometry and the same tensors. Now and then a config also holds a
sub-config SGLang's text-config lookup tries (``thinker_config``, ``llm_config``, ``language_config``: null, an
object SGLang cannot build from, one it can, or no object) and a dtype: where SGLang reads the model's layer
count and context length from such a sub-config, the plan refuses it (documented as stricter than SGLang), and
the test requires that SGLang did read them from there.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.config_fields import (
    SUB_CONFIGS,
    TEXT_CONFIG,
    VISION_CONFIG,
    ConfigShapeError,
    config_fields,
)
from kvpolicy.adapters.sglang_dsv4.geometry import (
    FILE_DEFAULTS,
    FILE_REQUIRED,
    V4_ARCHITECTURE,
    GeometryError,
    load_geometry,
)
from kvpolicy.adapters.sglang_dsv4.launch import Hardware, LaunchError, resolve_launch
from kvpolicy.adapters.sglang_dsv4.plan import PlanError, pool_tensors, size_from_budget
from kvpolicy.cli import main
from kvpolicy.document_codes import VALUE_NOT_ALLOWED
from kvpolicy.units import GiB
from tests.cli.test_plan_config_errors import assert_placed_at
from tests.sglang.sglang_support import (
    MODELS,
    RANDOM_EXAMPLES,
    engine_reading,
    published_resolution,
    real_sizes,
    real_tensors,
    resolve_for_real,
    single_process_parallel,
)

pytestmark = pytest.mark.sglang

FLASH = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
FIELDS = sorted(k for k in FLASH if k not in ("architectures", "model_type"))
ARCHITECTURES = (["DeepseekV4ForCausalLM"], ["DeepseekV41ForCausalLM"], ["DeepseekV3ForCausalLM"])
OTHER_VALUES = {  # a second value SGLang takes, for a field written at both levels
    "max_position_embeddings": st.integers(4096, 1 << 20),
    "sliding_window": st.sampled_from((64, 256, 512)),
}
ODD_TEXT_CONFIGS = (None, [], "", 0, False, [["max_position_embeddings", 4096]], [[1, 2]], ["ab"], "abc")
"""Values SGLang reads as ``dict(value)``: null and the empty ones give no field, a list of pairs gives its
pairs (a non-string name stops it), the rest stop it."""


LOOKUP_KEYS = tuple(key for key in SUB_CONFIGS if key != TEXT_CONFIG)


@cache
def buildable_sub_config() -> dict[str, Any]:
    """A sub-config SGLang can build the language model from: every field ``DeepseekV3Config`` has, with Flash's
    fields over them (a sub-config gets no class defaults)."""
    from transformers import DeepseekV3Config

    fields = {k: v for k, v in DeepseekV3Config().to_dict().items() if not k.startswith("_")}
    fields.pop("transformers_version", None)
    return {**fields, **{k: FLASH[k] for k in FIELDS}}


@st.composite
def sub_configs(draw) -> Any:
    """A value for a key SGLang's text-config lookup tries: null, an object it cannot build from, one it can (with
    Flash's context length or another), or no object."""
    kind = draw(st.sampled_from(("null", "empty", "buildable", "other context", "number", "list")))
    if kind in ("buildable", "other context"):
        sub = dict(buildable_sub_config())
        if kind == "other context":
            sub["max_position_embeddings"] = draw(st.integers(4096, 1 << 19))
        return sub
    return {"null": None, "empty": {}, "number": 7, "list": []}[kind]


def often(first: Any, *others: Any, times: int = 8) -> st.SearchStrategy[Any]:
    """``first`` about ``times`` times as often as each of ``others`` (and what an example shrinks to)."""
    return st.sampled_from((first,) * times + others)


@st.composite
def nested_configs(draw) -> dict[str, Any]:
    model_type = draw(often(draw(st.sampled_from(("deepseek_v41", "deepseek_v41_text", "deepseek_v4"))), None))
    # SGLang reads a deepseek_v4 config at its top level only: there, a text_config is mostly left out.
    nests = model_type not in ("deepseek_v4", None) or draw(often(False, True))
    top: dict[str, Any] = {} if model_type is None else {"model_type": model_type}
    text: dict[str, Any] = {}
    for key in FIELDS:
        where = draw(often(draw(st.sampled_from(("top", "text", "both"))), "neither", times=20))
        if where in ("top", "both") or (where == "text" and not nests):
            top[key] = FLASH[key]
        if where in ("text", "both") and nests:
            text[key] = draw(OTHER_VALUES[key]) if key in OTHER_VALUES and where == "both" else FLASH[key]
    for level in draw(often(draw(st.sampled_from(((top,), (text,), (top, text)))), ())):
        level["architectures"] = draw(often(ARCHITECTURES[0], *ARCHITECTURES[1:]))
    if draw(st.booleans()):
        text["model_type"] = draw(st.sampled_from(("deepseek_v4", "deepseek_v41_text", "gemma3_text")))
    if draw(st.integers(0, 19)) == 0:
        text[TEXT_CONFIG] = {"max_position_embeddings": 4096}
    if draw(st.integers(0, 4)) == 0:  # a sub-config the text-config lookup tries, at either level
        for key in draw(st.lists(st.sampled_from(LOOKUP_KEYS), min_size=1, max_size=2, unique=True)):
            draw(st.sampled_from((top, text) if nests else (top,)))[key] = draw(sub_configs())
    if draw(st.integers(0, 3)) == 0:
        top[draw(st.sampled_from(("dtype", "torch_dtype")))] = "bfloat16"
    if nests:
        top[TEXT_CONFIG] = draw(often(text, *ODD_TEXT_CONFIGS, draw(sub_configs())))
    vision = draw(often("absent", "object", "null", "number"))
    if vision != "absent":
        top[VISION_CONFIG] = {"object": {"num_hidden_layers": 3, "hidden_size": 64}, "null": None, "number": 1}[vision]
    return top


BUDGET = 40 * GiB


def ours(model_dir: Path):
    """(the geometry, the launch settings, the tensors of the pools for BUDGET) of ``kvpolicy plan``, or its refusal."""
    try:
        geometry = load_geometry(model_dir / "config.json")
        launch = resolve_launch(geometry)
        sizes = size_from_budget(geometry, launch.settings, BUDGET)
        return geometry, launch.settings, [(t.pool, t.nbytes) for t in pool_tensors(geometry, launch.settings, sizes)]
    except (GeometryError, LaunchError, PlanError) as exc:
        return exc


class BuildsOtherPools(Exception):
    """SGLang resolves the launch for a model of another architecture: it builds no DeepSeek-V4 pools."""


def sglangs(model_dir: Path):
    """(its ModelConfig, what the adapter reads of the launch, the tensors of the pools it builds for BUDGET) of
    SGLang's own reading of the config, or what it raises."""
    try:
        real = resolve_for_real(model_dir, Hardware(), [])
        with published_resolution(real):
            live, _dtype, kvc = engine_reading(real)
            if V4_ARCHITECTURE not in kvc.model_config.hf_config.architectures:
                return BuildsOtherPools(kvc.model_config.hf_config.architectures)
            return kvc.model_config, live, real_tensors(kvc, real_sizes(kvc, BUDGET))
    except Exception as exc:  # noqa: BLE001 - whatever SGLang raises, it does not start
        return exc


def test_the_plan_reads_a_nested_config_where_sglang_does(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("nesting")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(config=nested_configs())
    @example(config={"model_type": "deepseek_v41", "architectures": ARCHITECTURES[1],
                     "max_position_embeddings": 4096, TEXT_CONFIG: {k: FLASH[k] for k in FIELDS}})  # the top's wins
    @example(config={**FLASH, TEXT_CONFIG: None})  # a deepseek_v4 config: any text_config stops SGLang
    def check(config: dict[str, Any]) -> None:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        mine, real = ours(model_dir), sglangs(model_dir)
        if refuses_a_sub_config(config) and not isinstance(real, Exception):
            model_config = real[0]  # stricter than SGLang, where SGLang reads the model from the sub-config:
            assert model_config.hf_text_config is not model_config.hf_config, config
            event("refused: a sub-config SGLang reads the model from")
            seen["stricter"] += 1
            return
        if isinstance(mine, Exception) or isinstance(real, Exception):
            assert isinstance(mine, Exception) and isinstance(real, Exception), (config, mine, real)
            event(f"refused: {type(mine).__name__}, SGLang: {type(real).__name__}")
            seen["refused"] += 1
            return
        (geometry, planned, tensors), (model_config, live, real_pools) = mine, real
        assert planned == live, config
        assert tensors == real_pools, config
        assert (geometry.sliding_window, list(geometry.compress_ratios), geometry.head_dim, geometry.index_head_dim,
                geometry.qk_rope_head_dim) == (model_config.window_size, list(model_config.compress_ratios),
                                               model_config.head_dim, model_config.index_head_dim,
                                               model_config.qk_rope_head_dim), config
        assert planned.context_length == model_config.context_len
        event(f"built: {geometry.model_type}")
        seen["nested" if isinstance(config.get(TEXT_CONFIG), dict) and config[TEXT_CONFIG] else "flat"] += 1

    with single_process_parallel():
        check()
    assert seen["refused"] and seen["nested"] and seen["flat"], seen


def refuses_a_sub_config(config: dict[str, Any]) -> bool:
    """Whether the plan refuses ``config`` for a sub-config that SGLang's text-config lookup would read."""
    try:
        config_fields(config)
    except ConfigShapeError as exc:
        return exc.problem.code == VALUE_NOT_ALLOWED and exc.problem.key[-1] in SUB_CONFIGS
    return False


def test_the_defaults_are_the_class_sglang_loads_with_last(sglang_env):
    """What the plan takes for a field the file leaves out is ``DeepseekV3Config``'s default, and it has none
    for the fields the plan requires (SGLang's deepseek_v4 and deepseek_v41 classes are both one)."""
    from sglang.srt.utils.hf_transformers.common import _CONFIG_REGISTRY
    from transformers import DeepseekV3Config

    assert all(issubclass(_CONFIG_REGISTRY[t], DeepseekV3Config) for t in ("deepseek_v4", "deepseek_v41"))
    defaults = DeepseekV3Config()
    assert {key: getattr(defaults, key) for key in FILE_DEFAULTS} == FILE_DEFAULTS
    assert [key for key in FILE_REQUIRED if getattr(defaults, key, None) is not None] == []


def write(tmp_path: Path, config: dict[str, Any]) -> tuple[Path, str]:
    path = tmp_path / "config.json"
    text = json.dumps(config, indent=2)
    path.write_text(text)
    return path, text


def error_diagnostic(capsys, path: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", "--engine", "sglang", "--model-config", str(path), "--budget", "40GiB",
                 "--format", "json"]) == 1
    (d,) = json.loads(capsys.readouterr().out)["error"]["diagnostics"]
    return d


V41_WRAPPED = {"architectures": ARCHITECTURES[1], "model_type": "deepseek_v41",
               TEXT_CONFIG: {k: FLASH[k] for k in FIELDS}, VISION_CONFIG: {"num_hidden_layers": 3}}


def test_a_v41_text_configs_problem_is_placed_inside_it(capsys, tmp_path):
    """A field read from text_config is refused at its value there: a geometry field, and one of the strict
    class's (V4.1 loads through DeepseekV3Config)."""
    for key, bad, code in (("sliding_window", 0, "KVD008"), ("q_lora_rank", "1024", "KVD007")):
        config = json.loads(json.dumps(V41_WRAPPED))
        config[TEXT_CONFIG][key] = bad
        path, text = write(tmp_path, config)
        d = error_diagnostic(capsys, path)
        assert d["code"] == code, d
        assert_placed_at(text, (TEXT_CONFIG, key), bad, d)


def test_a_model_type_the_plan_does_not_read_is_refused_at_it(capsys, tmp_path, sglang_env):
    """transformers stops without a model type; a config of another type loads through another class, with
    other defaults, which the plan does not know: refused at the key, though SGLang may build it."""
    path, _ = write(tmp_path, {k: v for k, v in FLASH.items() if k != "model_type"})
    d = error_diagnostic(capsys, path)
    assert (d["code"], d["line"], d["col"], d["message"]) == ("KVD009", 1, 1, "model_type: required, not given"), d
    with single_process_parallel(), pytest.raises(ValueError, match="Should have a `model_type` key"):
        resolve_for_real(tmp_path, Hardware(), [])
    for other in ("deepseek_v3", "llama"):
        path, text = write(tmp_path, {**FLASH, "model_type": other})
        d = error_diagnostic(capsys, path)
        assert d["code"] == "KVD008" and "the plan reads the DeepSeek-V4 types" in d["message"], d
        assert_placed_at(text, ("model_type",), other, d)


def test_a_sub_config_sglang_would_read_the_model_from_is_refused_at_it(capsys, tmp_path, sglang_env):
    """A V4 config's text_config (SGLang stops at ours), a language_config SGLang builds the model from (its
    context length, not the top level's: the plan would have planned another model), one inside a V4.1
    text_config, and a value no object in a config with a dtype (SGLang stops giving it the dtype)."""
    path, text = write(tmp_path, {**FLASH, TEXT_CONFIG: {}})
    d = error_diagnostic(capsys, path)
    assert d["code"] == "KVD008" and "reads the model's layer count and context length from" in d["message"], d
    assert_placed_at(text, (TEXT_CONFIG,), {}, d)

    sub = {**buildable_sub_config(), "max_position_embeddings": 8192}
    path, text = write(tmp_path, {**FLASH, "language_config": sub})
    d = error_diagnostic(capsys, path)
    assert d["code"] == "KVD008" and d["message"].startswith("language_config: "), d
    assert_placed_at(text, ("language_config",), sub, d)
    with single_process_parallel():
        real = resolve_for_real(tmp_path, Hardware(), [])
        with published_resolution(real):
            _live, _dtype, kvc = engine_reading(real)
    assert (kvc.model_config.context_len, FLASH["max_position_embeddings"]) == (8192, 1 << 20)

    config = json.loads(json.dumps(V41_WRAPPED))
    config[TEXT_CONFIG]["thinker_config"] = {}
    path, text = write(tmp_path, config)
    d = error_diagnostic(capsys, path)
    assert d["code"] == "KVD008" and d["message"].startswith(f"{TEXT_CONFIG}.thinker_config: "), d
    assert_placed_at(text, (TEXT_CONFIG, "thinker_config"), {}, d)

    path, text = write(tmp_path, {**FLASH, "thinker_config": None, "language_config": [], "dtype": "bfloat16"})
    d = error_diagnostic(capsys, path)
    assert d["code"] == "KVD007" and "the config's dtype" in d["message"], d
    assert_placed_at(text, ("language_config",), [], d)
    path, _ = write(tmp_path, {**FLASH, "thinker_config": None, "language_config": [], TEXT_CONFIG: {}})
    assert main(["plan", "--engine", "sglang", "--model-config", str(path), "--budget", "40GiB"]) == 0, \
        "a null thinker_config ends SGLang's lookup at the top level: the keys after it are not read"

    path, text = write(tmp_path, {**V41_WRAPPED, TEXT_CONFIG: 7})
    d = error_diagnostic(capsys, path)
    assert d["code"] == "KVD007" and "dict(text_config)" in d["message"], d
    assert_placed_at(text, (TEXT_CONFIG,), 7, d)


@pytest.mark.parametrize("architectures, sglang_builds_v4_pools", [
    ([V4_ARCHITECTURE], True),
    ([V4_ARCHITECTURE, V4_ARCHITECTURE], True),
    ([V4_ARCHITECTURE, "DeepseekV3ForCausalLM"], False),  # V3 in the list: MLA, V4's pools cannot be sized
    ([V4_ARCHITECTURE, "FooForCausalLM"], True),  # refused all the same: stricter than SGLang
    (["FooForCausalLM", V4_ARCHITECTURE], False),  # another first name: SGLang's hybrid-SWA configurator, not V4's
])
def test_a_list_of_architectures_is_planned_only_of_v4_alone(capsys, tmp_path, sglang_env, architectures,
                                                              sglang_builds_v4_pools):
    """SGLang reads the architecture list by its first name in some places and by membership in others; the plan
    reads lists of V4's name alone, and refuses any other name at its place."""
    path, text = write(tmp_path, {**FLASH, "architectures": architectures})
    real = sglangs(tmp_path)
    assert isinstance(real, Exception) != sglang_builds_v4_pools, real
    if set(architectures) == {V4_ARCHITECTURE}:
        assert main(["plan", "--engine", "sglang", "--model-config", str(path), "--budget", "40GiB"]) == 0
        assert real[1] == resolve_launch(load_geometry(path)).settings
        return
    d = error_diagnostic(capsys, path)
    at = next(i for i, name in enumerate(architectures) if name != V4_ARCHITECTURE)
    assert d["code"] == "KVD008" and architectures[at] in d["message"], d
    assert_placed_at(text, ("architectures", at), architectures[at], d)
