"""The keys every transformers config class reads for itself (``adapters/hf_base_config.py``) are refused by the
vLLM plan exactly where the class vLLM loads the config with refuses them, at the key it stops at.

A config class's base (``PreTrainedConfig``) reads ``id2label``, ``num_labels`` and ``problem_type`` as it
builds the config, and cannot set the properties it derives; vLLM builds every config of a file with such a
class (a Gemma-3 wrapper's text and vision configs too), so it does not start with a fault there. Each random
example writes a few of those keys, with values drawn to be near the edges, into one of the configs of a random
model type the plan knows, and loads it with the class vLLM 0.33's ``get_config`` builds.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.hf_base_config import BASE_KEYS, READ_ONLY, SINGLE_LABEL
from kvpolicy.adapters.hf_config_kinds import FIELD_KINDS
from kvpolicy.adapters.vllm_adapter.planning.class_defaults import CONFIG_CLASSES, WRAPPER_CLASSES
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.adapters.vllm_adapter.planning.load_order import check_config_load
from tests.support.json_values import JSON_VALUES
from tests.vllm.test_vllm_class_defaults import write
from tests.vllm.test_vllm_config_dtype import no_retry_sleep
from tests.vllm.test_vllm_field_kinds import load_as_vllm

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_BASE_CONFIG_EXAMPLES", "300"))
"""Each example is one config load (milliseconds once transformers is imported)."""


def test_the_read_only_keys_are_the_classes_properties_without_a_setter() -> None:
    import transformers
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    for name in FIELD_KINDS:
        cls = DeepseekV4Config if name == "DeepseekV4Config" else getattr(transformers, name)
        resolved = {key: inspect.getattr_static(cls, key) for base in cls.__mro__ for key in vars(base)}
        assert {key for key, p in resolved.items() if isinstance(p, property) and p.fset is None} == set(READ_ONLY), name


def refused_key(exc: Exception) -> str:
    """The base key a class's load failed on, from what it raised; "" for anything else."""
    text = str(exc)
    setter = re.search(r"property '(\w+)' of '\w+' object has no setter", text)
    if setter:
        return setter.group(1)
    if isinstance(exc, TypeError) and "cannot be interpreted as an integer" in text:
        return "num_labels"
    if isinstance(exc, ValueError) and "problem_type" in text:
        return "problem_type"
    if "has no attribute 'items'" in text or "has no len()" in text or "invalid literal for int()" in text:
        return "id2label"
    return ""


def levels(model_type: str) -> list[str]:
    """The configs of a file of ``model_type`` transformers builds: "" the top level's (a wrapper's own)."""
    return ["", "text_config", "vision_config"] if model_type in WRAPPER_CLASSES else [""]


LABEL_IDS = st.sampled_from(["0", "1", "2", " 3 ", "1_0", "01", "-1", "a", "1.0", "", "٣"])
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id2label": st.one_of(JSON_VALUES, st.dictionaries(LABEL_IDS, st.just("LABEL"), max_size=3)),
    "num_labels": st.one_of(JSON_VALUES, st.integers(-2, 4), st.booleans()),
    "problem_type": st.one_of(st.sampled_from([SINGLE_LABEL, "regression", "multi_label_classification"]),
                              JSON_VALUES),
    **{key: JSON_VALUES for key in READ_ONLY},
}
CASES = st.sampled_from(sorted(CONFIG_CLASSES)).flatmap(lambda model_type: st.tuples(
    st.just(model_type), st.sampled_from(levels(model_type)),
    st.lists(st.sampled_from(BASE_KEYS), min_size=1, max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({key: VALUES[key] for key in keys}))))
"""(model type, the config the keys go in, the keys and their values)."""


def write_base_keys(folder: Path, model_type: str, level: str, keys: dict[str, Any]) -> None:
    write(folder, model_type, {}, text_type=True)
    config = json.loads((folder / "config.json").read_text())
    (config.setdefault(level, {}) if level else config).update(keys)
    (folder / "config.json").write_text(json.dumps(config))


def test_the_plan_refuses_the_base_keys_exactly_where_the_class_does(tmp_path_factory) -> None:
    seen = {"refused": 0, "loads": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=CASES)
    @example(case=("qwen3", "", {"id2label": 3}))
    @example(case=("qwen3", "", {"id2label": {"0": "a", "x": "b"}}))
    @example(case=("qwen3", "", {"id2label": {"1": "a", "01": "b"}, "problem_type": SINGLE_LABEL}))  # one id
    @example(case=("llama", "", {"num_labels": True, "problem_type": SINGLE_LABEL}))  # true is one label
    @example(case=("llama", "", {"num_labels": None, "id2label": {"0": "a", "1": "b"}}))
    @example(case=("gemma3", "text_config", {"use_return_dict": True}))
    @example(case=("gemma3", "vision_config", {"num_labels": 2.0}))
    @example(case=("gemma3", "", {"is_heterogeneous": False}))  # the wrapper's own
    def check(case: tuple[str, str, dict[str, Any]]) -> None:
        model_type, level, keys = case
        folder = tmp_path_factory.mktemp("base")
        write_base_keys(folder, model_type, level, keys)
        try:
            load_as_vllm(folder, model_type)
            real = None
        except Exception as exc:  # noqa: BLE001 - whatever the class raises, vLLM does not start
            real = refused_key(exc)
            if not real:
                event(f"the class stops otherwise: {type(exc).__name__}")
                return
        try:
            check_config_load(load_config(folder / "config.json"), "0.33.0")
            ours = None
        except ModelSpecError as refused:
            where = (level,) if level else ()
            assert refused.key[:len(where)] == where, (case, refused)
            ours = refused.key[len(where)]
        assert ours == real, (case, ours, real)
        seen["loads" if real is None else "refused"] += 1

    check()
    assert seen["refused"] and seen["loads"], seen


@pytest.mark.parametrize(("keys", "path", "says"), [
    ({"id2label": 3}, ("id2label",), "id2label 3: transformers reads the labels as an object"),
    ({"id2label": {"0": "a", "x": "b"}}, ("id2label", "x"), "id2label key 'x': transformers reads each label id as"),
    ({"num_labels": "2"}, ("num_labels",), "num_labels '2': transformers sets that many labels"),
    ({"num_labels": 1, "problem_type": SINGLE_LABEL}, ("problem_type",),
     "problem_type 'single_label_classification' with one label"),
    ({"use_return_dict": True}, ("use_return_dict",), "use_return_dict: transformers derives it and cannot set it"),
], ids=["id2label-int", "id2label-key", "num-labels-string", "single-label", "read-only"])
def test_vllm_refuses_them_and_the_plan_places_each_at_its_value(
        capsys, tmp_path: Path, keys: dict, path: tuple[str, ...], says: str) -> None:
    from kvpolicy.cli import main
    from kvpolicy.json_positions import parse
    from vllm.transformers_utils.config import get_config

    write(tmp_path, "qwen3", keys, text_type=True)
    with no_retry_sleep(), pytest.raises((AttributeError, TypeError, ValueError)):
        get_config(str(tmp_path), trust_remote_code=False)
    config = tmp_path / "config.json"
    code = main(["plan", "--engine", "vllm", "--model-config", str(config), "--budget", "40GiB", "--format", "json"])
    (first, *_) = json.loads(capsys.readouterr().out)["error"]["diagnostics"]
    text = config.read_text()
    document = parse(text)
    assert document is not None
    start, _ = document.span_of(path)
    assert code == 1 and first["message"].startswith(says), first
    assert (first["line"], first["col"]) == (text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)), first


def test_a_config_whose_layers_differ_is_refused_and_one_whose_do_not_is_planned(tmp_path: Path) -> None:
    """transformers' per-layer configs (``per_layer_config``) give a layer its own values, from which vLLM 0.33
    sizes that layer (its model-architecture convertor); the plan reads one value for every layer, so it refuses
    a config where one varies, and plans an empty one (no field varies) as the config without it."""
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
    import vllm.config  # noqa: F401 - the convertor's module imports back into it
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    def planned(per_layer: Any) -> Any:
        folder = tmp_path / json.dumps(per_layer).encode().hex()
        folder.mkdir()
        write(folder, "qwen3", {"num_hidden_layers": 2, "num_key_value_heads": 8, "per_layer_config": per_layer},
              text_type=True)
        hf = get_config(str(folder), trust_remote_code=False)
        layers = ModelArchConfigConvertorBase(hf, hf.get_text_config()).get_per_layer_hf_configs()
        heads = None if layers is None else [text.num_key_value_heads for _, text in layers]
        try:
            plan = make_plan(load_config(folder / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                             budget=1 << 30, platform="cpu")
        except ModelSpecError as refused:
            return heads, refused.key
        return heads, plan.bytes_per_block

    assert planned({"0": {"num_key_value_heads": 4}}) == ([4, 8], ("per_layer_config",))
    uniform = planned(None)
    assert uniform[0] is None and isinstance(uniform[1], int)
    assert planned({}) == ([8, 8], uniform[1])
