"""The keys every transformers config class reads for itself (``adapters/hf_base_config.py``) are refused by the
SGLang plan exactly where SGLang 0.5.23 stops at them.

SGLang builds a DeepSeek-V4 config with transformers' strict classes, whose base reads ``id2label``,
``num_labels`` and ``problem_type`` and cannot set the properties it derives. Each random example writes a few of
those keys, with values drawn near the edges, into Flash's config (V4, or V4.1 with them at the top level or in
``text_config``), and resolves it with SGLang's own code on the CPU.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.hf_base_config import (
    ATTENTION_LAYER_TYPES,
    BASE_KEYS,
    LEGACY_LAYER_TYPES,
    MLP_LAYER_TYPES,
    SINGLE_LABEL,
)
from kvpolicy.adapters.sglang_dsv4.config_fields import TEXT_CONFIG
from kvpolicy.adapters.sglang_dsv4.geometry import GeometryError
from tests.sglang.sglang_support import RANDOM_EXAMPLES, single_process_parallel
from tests.sglang.test_sglang_config_nesting import FLASH, ours, sglangs
from tests.vllm.test_vllm_base_config import VALUES, refused_key

pytestmark = pytest.mark.sglang

KEYS = st.lists(st.sampled_from(BASE_KEYS), min_size=1, max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({key: VALUES[key] for key in keys}))


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Flash's config with a few base keys: a V4 config, or a V4.1 one (its fields in ``text_config``, the keys
    there or at the top level)."""
    keys = draw(KEYS)
    layout = draw(st.sampled_from(["v4", "v41-top", "v41-text"]))
    if layout == "v4":
        return {**FLASH, **keys}
    text = {k: v for k, v in FLASH.items() if k not in ("architectures", "model_type")}
    top = {"architectures": FLASH["architectures"], "model_type": "deepseek_v41"}
    if layout == "v41-top":
        return {**top, **keys, TEXT_CONFIG: text}
    return {**top, TEXT_CONFIG: {**text, **keys}}


def test_the_plan_refuses_the_base_keys_exactly_where_sglang_does(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("base")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(config=configs())
    @example(config={**FLASH, "id2label": 3})
    @example(config={**FLASH, "num_labels": 1, "problem_type": SINGLE_LABEL})
    @example(config={**FLASH, "id2label": {"0": "a", "1": "b"}, "num_labels": 2.0})  # equal to the count: not set
    @example(config={**FLASH, "use_return_dict": True})
    def check(config: dict[str, Any]) -> None:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        real = sglangs(model_dir)
        stopped = refused_key(real) if isinstance(real, Exception) else None
        if stopped == "":
            event(f"SGLang stops otherwise: {type(real).__name__}")
            return
        mine = ours(model_dir)
        if stopped is None:
            assert not isinstance(mine, GeometryError), (config, mine)
            seen["starts"] += 1
            return
        assert isinstance(mine, GeometryError), (config, real)
        first = mine.problems.diagnostics[0].message
        assert first.startswith(stopped), (config, first, real)
        seen["refused"] += 1

    with single_process_parallel():
        check()
    assert seen["refused"] and seen["starts"], seen


@pytest.mark.parametrize("per_layer", [{"0": {"head_dim": 256}}, {"0": {"moe_intermediate_size": 1024}}, {}, None])
def test_a_config_whose_layers_differ_is_refused(tmp_path, sglang_env, per_layer: Any) -> None:
    """transformers' per-layer configs (``per_layer_config``) make each field they name vary by layer, which
    SGLang then cannot read (transformers raises on it, whichever field); the plan refuses any that names a field,
    and plans null or ``{}`` as the config without it."""
    (tmp_path / "config.json").write_text(json.dumps({**FLASH, "per_layer_config": per_layer}, indent=2))
    real, mine = sglangs(tmp_path), ours(tmp_path)
    if per_layer:
        assert type(real).__name__ == "AmbiguousGlobalPerLayerAttributeError", real
        assert isinstance(mine, GeometryError) and mine.problems.diagnostics[0].message.startswith(
            "per_layer_config:"), mine
    else:
        assert not isinstance(real, Exception), real
        (tmp_path / "config.json").write_text(json.dumps(FLASH, indent=2))
        assert mine == ours(tmp_path)


NAMES = st.sampled_from([*ATTENTION_LAYER_TYPES[:3], *LEGACY_LAYER_TYPES, *MLP_LAYER_TYPES, "x", 1, None, [1]])
LAYER_TYPES = st.one_of(
    st.integers(40, 45).flatmap(lambda n: st.lists(NAMES, min_size=n, max_size=n)),  # near Flash's 43 layers
    st.lists(NAMES, max_size=3),
    st.sampled_from(["x", "", 43, True, 1.5, {"full_attention": 1}]),
    st.integers(41, 44).map(lambda n: ["sliding_attention"] * n),
    st.integers(41, 44).map(lambda n: ["dense"] * n),
)
"""Values of ``layer_types`` and its siblings: lists of layer type names (known, legacy, of the MLP kind, or
none) of about the model's layer count, short lists, and values that are no list."""


@st.composite
def layer_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Flash's config (V4, or V4.1 with its fields in ``text_config``) with some of ``layer_types``,
    ``mlp_layer_types`` and ``mtp_layer_types``."""
    keys = draw(st.lists(st.sampled_from(["layer_types", "mlp_layer_types", "mtp_layer_types"]), min_size=1,
                         max_size=3, unique=True))
    fields = {**FLASH, **{key: draw(LAYER_TYPES) for key in keys}}
    if draw(st.booleans()):
        return fields
    text = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    return {"architectures": FLASH["architectures"], "model_type": "deepseek_v41", TEXT_CONFIG: text}


def test_the_plan_refuses_the_layer_types_exactly_where_sglang_does(tmp_path_factory, sglang_env):
    """Each class renames legacy layer types and then requires one known type per layer in ``layer_types``
    (and, beside it, in ``mlp_layer_types``); DeepseekV4Config also checks the kind of both. Random values of the
    three keys, in a V4 config or a V4.1 one: the plan refuses exactly where SGLang's own resolution stops, naming
    one of those keys first."""
    root = tmp_path_factory.mktemp("layer-types")
    dirs = count()
    seen: Counter[str] = Counter()

    @settings(max_examples=RANDOM_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(config=layer_configs())
    @example(config={**FLASH, "layer_types": ["full_attention"]})  # one entry for 43 layers
    @example(config={**FLASH, "layer_types": ["attention"] * 43, "mlp_layer_types": ["x"] * 43})  # legacy: renamed
    @example(config={**FLASH, "mlp_layer_types": ["x"]})  # not looked at without layer_types
    @example(config={"architectures": FLASH["architectures"], "model_type": "deepseek_v41",
                     TEXT_CONFIG: {**FLASH, "layer_types": "x"}})  # V4.1: no kind checked, a string by letters
    def check(config: dict[str, Any]) -> None:
        model_dir = root / str(next(dirs))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        real, mine = sglangs(model_dir), ours(model_dir)
        if not isinstance(real, Exception):
            assert not isinstance(mine, GeometryError), (config, mine)
            seen["starts"] += 1
            return
        assert isinstance(mine, GeometryError), (config, real)
        first = mine.problems.diagnostics[0].message
        assert first.startswith(("layer_types", "mlp_layer_types", "mtp_layer_types")), (config, first, real)
        seen["refused"] += 1

    with single_process_parallel():
        check()
    assert seen["refused"] and seen["starts"], seen
