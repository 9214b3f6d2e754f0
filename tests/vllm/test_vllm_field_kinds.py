"""The kinds of value the plan takes for each field of a config class are those the class takes.

vLLM loads a config.json with transformers' class for its model type, a strict dataclass that checks every
declared field's type as the config loads (``adapters/hf_config_kinds.py``). The tables must be the classes'
annotations (and validators), in the order the classes declare (and check) them. Each example writes a config
of a random model type the plan knows with one field (for a Gemma-3 wrapper, one of its own or one of its text
config's) set to a random value of a random kind, and loads it with the class vLLM 0.33's ``get_config``
builds: the class refuses the value's type, or its range, exactly where ``planning/field_kinds.py`` refuses it,
at that field (where the class fails on the value otherwise, the plan may have refused it already). With two
such fields the plan names the one the class stops at; beside an unreadable dtype, what the class meets first. For DeepSeek-V4 on vLLM 0.32, whose own class checks nothing, the plan does
not (tests/vllm_e2e/test_vllm_plan_v4_032.py checks what 0.32 takes instead).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.hf_config_kinds import FIELD_KINDS, FIELD_RANGES, SUB_CONFIGS
from kvpolicy.adapters.vllm_adapter.planning.class_defaults import CONFIG_CLASSES, WRAPPER_CLASSES, WRAPPER_SUB_CONFIGS
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.field_kinds import check_field_kinds
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from tests.support.json_values import JSON_VALUES
from tests.vllm.test_vllm_class_defaults import write
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_FIELD_KINDS_EXAMPLES", "300"))
"""Each example is one config load (milliseconds once vLLM is imported)."""
FLASH = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())
QWEN3 = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())


def is_config_class(member: Any) -> bool:
    """A wrapper's sub-config class (``Gemma3TextConfig``), which its field takes written as a JSON object."""
    from transformers import PreTrainedConfig

    return isinstance(member, type) and issubclass(member, PreTrainedConfig)


def declared_kinds(annotation: Any) -> set[str]:
    """The JSON kinds a field annotation takes: ``int | None`` → {"int", "null"}; ``list[int]`` → {"int list"};
    a sub-config's class → {"dict"}."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds: set[str] = set()
    for member in typing.get_args(annotation) if union else (annotation,):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if member is type(None):
            kinds.add("null")
        elif member in (int, float, str, bool):
            kinds.add(member.__name__)
        elif member is dict or origin is dict or typing.is_typeddict(member) or is_config_class(member):
            kinds.add("dict")
        elif origin is list and args in ((int,), (str,)):
            kinds.add(f"{args[0].__name__} list")
        elif origin is tuple:
            continue  # JSON loads no tuple (SigLIP's image_size takes a list as its list[int])
        else:
            raise AssertionError(f"no JSON kind for {member!r}")
    return kinds


def test_the_tables_are_the_classes_own_fields() -> None:
    import transformers
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    subs = {name for fields in SUB_CONFIGS.values() for name in fields.values()}
    assert {cls.name for cls in CONFIG_CLASSES.values()} | set(WRAPPER_CLASSES.values()) | subs == set(FIELD_KINDS)
    for name, table in FIELD_KINDS.items():
        cls = DeepseekV4Config if name == "DeepseekV4Config" else getattr(transformers, name)
        declared = {key: declared_kinds(annotation) for key, annotation in cls.__annotations__.items()}
        assert {key: set(kinds) for key, kinds in table.items()} == declared, name
        assert list(table) == [f.name for f in dataclasses.fields(cls) if f.name in table], name  # checked so
        validated = {f.name for f in dataclasses.fields(cls) if (f.metadata or {}).get("validator")}
        assert validated == set(FIELD_RANGES.get(name, {})), name


def load_as_vllm(folder: Path, model_type: str) -> Any:
    """The config class vLLM's ``get_config`` builds for the folder's config.json: transformers' for the model
    type, but for kimi_k2, for which vLLM registers ``DeepseekV3Config`` (without ``get_config``'s retries, which
    sleep a second per failure; test_vllm_get_config_refuses_as_the_class_does checks the two agree)."""
    from transformers import AutoConfig, DeepseekV3Config

    return (DeepseekV3Config if model_type == "kimi_k2" else AutoConfig).from_pretrained(str(folder))


def refusal(load: Callable[[], Any], key: str) -> str | None:
    """How loading a config stops: "type" at the class's type check of ``key``, "range" at a validator of its
    value, "other" at anything else (the class's cross-field checks), None where it loads."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    try:
        load()
    except StrictDataclassFieldValidationError as exc:
        if f"'{key}'" not in str(exc):
            return "other"
        return "type" if f"TypeError: Field '{key}'" in str(exc) else "range"
    except Exception as exc:  # noqa: BLE001 - whatever it raises, vLLM does not start
        event(f"refused otherwise: {type(exc).__name__}")
        return "other"
    return None


@pytest.mark.parametrize(("model_type", "key", "value"), [
    ("qwen3", "rms_norm_eps", 1), ("kimi_k2", "kv_lora_rank", None), ("llama", "attention_dropout", 0),
])
def test_vllm_get_config_refuses_as_the_class_does(tmp_path: Path, model_type: str, key: str, value: Any) -> None:
    from vllm.transformers_utils.config import get_config

    folder = write(tmp_path, model_type, {key: value}, text_type=True)
    real = refusal(lambda: get_config(str(folder), trust_remote_code=False), key)
    assert real == refusal(lambda: load_as_vllm(folder, model_type), key)
    assert real == (None if key == "attention_dropout" else "type")


def places(model_type: str) -> list[tuple[str, ...]]:
    """Where a config of ``model_type`` has fields a class checks: () the language model's (a wrapper's text
    config), ("wrapper",) a multimodal wrapper's own, ("wrapper", field) a config object the wrapper holds."""
    wrapper = WRAPPER_CLASSES.get(model_type)
    return [()] if wrapper is None else [(), ("wrapper",), *(("wrapper", f) for f in SUB_CONFIGS.get(wrapper, {}))]


def class_at(model_type: str, place: tuple[str, ...]) -> str:
    if not place:
        return CONFIG_CLASSES[model_type].name
    wrapper = WRAPPER_CLASSES[model_type]
    return SUB_CONFIGS[wrapper][place[1]] if len(place) > 1 else wrapper


FIELD = st.sampled_from(sorted(CONFIG_CLASSES)).flatmap(lambda model_type: st.sampled_from(places(model_type)).flatmap(
    lambda place: st.tuples(st.just(model_type), st.sampled_from(sorted(FIELD_KINDS[class_at(model_type, place)])),
                            st.just(place))))
"""(model type, a field its class declares, where the field is: ``places``)."""


def write_fields(folder: Path, model_type: str, fields: Sequence[tuple[str, Any, tuple[str, ...]]]
                 ) -> list[tuple[str, ...]]:
    """Write a config of ``model_type`` with each (key, value, place) of ``fields`` set, in that order; each
    value's path in the file as the plan reads it (a text config's key without its text_config)."""
    write(folder, model_type, {}, text_type=True)
    config = json.loads((folder / "config.json").read_text())
    for key, value, place in fields:
        if not place:
            holder = config["text_config"] if model_type in WRAPPER_CLASSES else config
        else:
            holder = config.setdefault(place[1], {}) if len(place) > 1 else config
        holder[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return [(*place[1:], key) for key, _, place in fields]


def write_field(folder: Path, model_type: str, key: str, value: Any, place: tuple[str, ...]) -> tuple[str, ...]:
    return write_fields(folder, model_type, [(key, value, place)])[0]


def test_a_field_of_a_kind_the_class_refuses_is_refused_at_its_value(tmp_path_factory: pytest.TempPathFactory) -> None:
    seen = {"refused": 0, "taken": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(field=FIELD, value=JSON_VALUES)
    @example(field=("qwen3", "rms_norm_eps", ()), value=1)  # a float field: an integer is refused
    @example(field=("gemma3", "hidden_activation", ()), value=None)  # in the wrapper's text config
    @example(field=("gemma3", "mm_tokens_per_image", ("wrapper",)), value="256")  # the wrapper's own
    @example(field=("gemma3", "text_config", ("wrapper",)), value=[1])
    @example(field=("gemma3", "image_size", ("wrapper", "vision_config")), value=[896, "896"])
    @example(field=("deepseek_v4", "hc_mult", ()), value=None)
    @example(field=("llama", "attention_dropout", ()), value=0)  # float | int | None: taken
    @example(field=("llama", "initializer_range", ()), value=2.0)  # a float out of the class's range
    def check(field: tuple[str, str, tuple[str, ...]], value: Any) -> None:
        model_type, key, place = field
        folder = tmp_path_factory.mktemp("kinds")
        path = write_field(folder, model_type, key, value, place)
        try:
            check_field_kinds(load_config(folder / "config.json"), "0.33.0")
            ours = None
        except ModelSpecError as refused:
            # a text config written as an object is the text class's to check, field by field, as vLLM's is
            assert refused.key == path or (key == "text_config" and isinstance(value, dict)), (field, value)
            ours = {WRONG_TYPE: "type", VALUE_NOT_ALLOWED: "range"}[refused.code]
        real = refusal(lambda: load_as_vllm(folder, model_type), key)
        # Where the class refuses the kind or the range, the plan refuses the same; where it fails otherwise
        # (its cross-field checks of values) the plan may have refused the value already.
        assert ours == (real if real in ("type", "range") else None) or (ours and real == "other"), (
            model_type, key, value, real)
        seen["refused" if ours else "taken"] += 1
        if model_type == "deepseek_v4":
            check_field_kinds(load_config(folder / "config.json"), "0.32.0")  # 0.32's own class checks nothing

    check()
    assert seen["refused"] and seen["taken"], seen


def declared_at(model_type: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each (field, place) a class checks in a config of ``model_type``, but for a wrapper's sub-configs as
    whole values (which would replace the config a field of the pair is written in)."""
    return [(key, place) for place in places(model_type) for key in FIELD_KINDS[class_at(model_type, place)]
            if not (place == ("wrapper",) and key in WRAPPER_SUB_CONFIGS)]


TWO_FIELDS = st.sampled_from(sorted(CONFIG_CLASSES)).flatmap(lambda model_type: st.tuples(
    st.just(model_type), st.lists(st.sampled_from(declared_at(model_type)), min_size=2, max_size=2,
                                  unique_by=lambda field: field[0])))
"""(model type, two fields of distinct names, each with its place), in the order they are written."""


def stopped_at(folder: Path, model_type: str) -> str | None:
    """The field whose type or range check the class's load of the folder's config stops at; "" where it
    stops otherwise (its cross-field checks), None where it loads."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    try:
        load_as_vllm(folder, model_type)
    except StrictDataclassFieldValidationError as exc:
        named = re.search(r"Validation error for field '(\w+)'", str(exc))
        return named.group(1) if named else ""
    except Exception:  # noqa: BLE001 - a class's cross-field checks
        return ""
    return None


def test_of_two_refused_fields_the_plan_names_the_one_the_class_checks_first(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A class checks its fields in the order it declares them, whatever the file's, and a Gemma-3 wrapper its
    own fields before its text config's, before its vision config's. Two random values at two random fields,
    written in either order: the kinds check names the field the class's load stops at, and nothing where it
    loads; so does the whole plan, whose own checks of the fields it reads (vLLM's, after the load) may refuse
    the other field first (``kinds_first``)."""
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan

    seen = {"first": 0, "second": 0, "loads": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(drawn=TWO_FIELDS, values=st.tuples(JSON_VALUES, JSON_VALUES))
    @example(drawn=("qwen3", [("rms_norm_eps", ()), ("vocab_size", ())]), values=(1, "x"))  # declared: vocab first
    @example(drawn=("gemma3", [("hidden_activation", ()), ("mm_tokens_per_image", ("wrapper",))]),
             values=(None, "256"))  # the wrapper's own before its text config's, which the file has first
    @example(drawn=("gemma3", [("image_size", ("wrapper", "vision_config")), ("rms_norm_eps", ())]),
             values=("896", 1))  # the text config's before the vision config's
    @example(drawn=("qwen3", [("num_attention_heads", ()), ("rms_norm_eps", ())]),
             values=(-8, 1))  # the plan's own check of the heads refuses them, but the class stops at the float
    def check(drawn: tuple[str, list[tuple[str, tuple[str, ...]]]], values: tuple[Any, Any]) -> None:
        model_type, fields = drawn
        folder = tmp_path_factory.mktemp("two-kinds")
        paths = write_fields(folder, model_type, [(key, value, place) for (key, place), value in zip(fields, values)])
        stopped = stopped_at(folder, model_type)
        keys = [key for key, _ in fields]
        if stopped == "" or (stopped is not None and stopped not in keys):
            event("the class stops otherwise")
            return
        try:
            check_field_kinds(load_config(folder / "config.json"), "0.33.0")
            named = None
        except ModelSpecError as refused:
            named = refused.key
        expected = None if stopped is None else paths[keys.index(stopped)]
        assert named == expected, (drawn, values, stopped)
        seen["loads" if stopped is None else ("first", "second")[keys.index(stopped)]] += 1
        if expected is not None:
            with pytest.raises(ModelSpecError) as refused:
                make_plan(load_config(folder / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                          budget=1 << 30, platform="cpu")
            assert refused.value.key == expected, (drawn, values, stopped, refused.value)

    check()
    assert seen["first"] and seen["second"], seen


@pytest.mark.parametrize(("config", "key", "value", "says", "on_032"), [
    # 0.32's class keeps the null, and its model fails with it (tests/vllm_e2e/test_vllm_plan_v4_032.py)
    (FLASH, "hc_mult", None, "hc_mult null: DeepseekV4Config takes a whole number only", "hc_mult null: vLLM 0.32's"),
    (FLASH, "swiglu_limit", 10,
     "swiglu_limit 10: DeepseekV4Config takes a number with a decimal point (10.0, not 10) only", None),
    # 0.32 loads Qwen3 with the same transformers class as 0.33
    (QWEN3, "rms_norm_eps", 1, "rms_norm_eps 1: Qwen3Config takes a number with a decimal point (10.0, not 10) only",
     "rms_norm_eps 1: Qwen3Config takes"),
], ids=["v4-null", "v4-int-for-float", "qwen3-int-for-float"])
def test_plan_places_the_refusal_at_the_value_for_0_33_and_for_0_32_as_it_loads(
        capsys, tmp_path: Path, config: dict, key: str, value: Any, says: str, on_032: str | None) -> None:
    from kvpolicy.cli import main

    path = tmp_path / "config.json"
    text = json.dumps({**config, key: value}, indent=2)
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


def test_a_field_of_a_refused_kind_is_named_before_a_dtype_transformers_cannot_read(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A class checks each field's kind as the config loads, then its dtype; a multimodal wrapper its own fields,
    then its text config's (and its dtype), its vision config's (and its dtype), then its own dtype. With
    ``"dtype": "bf16"`` (no torch name) at one of those levels beside a random field value, the plan names first
    what the class's load stops at: the field where it refuses the value's kind or range, else the dtype."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan

    seen = {"field": 0, "dtype": 0}

    @settings(max_examples=EXAMPLES // 2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(field=FIELD, value=JSON_VALUES, level=st.sampled_from(["", "text_config", "vision_config"]))
    @example(field=("qwen3", "rms_norm_eps", ()), value=1, level="")
    @example(field=("qwen3", "rms_norm_eps", ()), value=1e-6, level="")
    @example(field=("gemma3", "hidden_activation", ()), value=None, level="")  # in the wrapper's text config
    @example(field=("gemma3", "mm_tokens_per_image", ("wrapper",)), value="256", level="")  # the wrapper's own
    @example(field=("gemma3", "attention_dropout", ("wrapper", "vision_config")), value=None, level="text_config")
    @example(field=("llama", "initializer_range", ()), value=2.0, level="")  # out of the class's range
    def check(field: tuple[str, str, tuple[str, ...]], value: Any, level: str) -> None:
        model_type, key, place = field
        folder = tmp_path_factory.mktemp("kinds-dtype")
        path = write_field(folder, model_type, key, value, place)
        config = json.loads((folder / "config.json").read_text())
        if model_type == "gemma3" and level:
            inner = config.get(level)
            config[level] = {**(inner if isinstance(inner, dict) else {}), "dtype": "bf16"}
            # the plan reads a text config's keys as the model's, unless the wrapper gives a dtype of its own
            dtype_at = (level, "dtype") if level == "vision_config" or "dtype" in config else ("dtype",)
        else:
            config["dtype"], dtype_at = "bf16", ("dtype",)
        (folder / "config.json").write_text(json.dumps(config))
        try:
            load_as_vllm(folder, model_type)
            raise AssertionError(f"loaded with dtype bf16: {field}, {value!r}, {level}")
        except StrictDataclassFieldValidationError as exc:
            real = "field" if f"'{key}'" in str(exc) else "other"
        except AttributeError as exc:
            real = "dtype" if "'bf16'" in str(exc) else "other"
        except Exception:  # noqa: BLE001 - a class's cross-field checks: no order to compare
            real = "other"
        if real == "other":
            event("the class stops otherwise")
            return
        with pytest.raises(ModelSpecError) as refused:
            make_plan(load_config(folder / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                      budget=1 << 30, platform="cpu")
        assert refused.value.key == (path if real == "field" else dtype_at), (field, value, level, refused.value)
        seen[real] += 1
        event(f"named: the {real}")

    check()
    assert seen["field"] and seen["dtype"], seen


@pytest.mark.parametrize(("earlier", "later", "key"), [
    ("text_config", "", ("text_config", "dtype")),  # the wrapper's own is the one vLLM reads: the text's by name
    ("text_config", "vision_config", ("dtype",)),  # without one of the wrapper's, the text's is the model's
    ("vision_config", "", ("vision_config", "dtype")),
])
def test_a_wrappers_dtypes_are_refused_in_the_order_transformers_builds_its_configs(
        tmp_path: Path, earlier: str, later: str, key: tuple[str, ...]) -> None:
    """Gemma-3's wrapper builds its text config, then its vision config, then reads its own dtype (""): with two
    of the three unreadable, transformers stops at the earlier, and the plan names it."""
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan

    write(tmp_path, "gemma3", {}, text_type=True)
    config = json.loads((tmp_path / "config.json").read_text())
    for level, name in ((earlier, "bf16a"), (later, "bf16b")):
        (config.setdefault(level, {}) if level else config)["dtype"] = name
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AttributeError, match="'bf16a'"):
        load_as_vllm(tmp_path, "gemma3")
    with pytest.raises(ModelSpecError) as refused:
        make_plan(load_config(tmp_path / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                  budget=1 << 30, platform="cpu")
    assert refused.value.key == key and "'bf16a'" in str(refused.value), refused.value


def test_a_field_of_a_refused_kind_is_named_before_a_rope_fault(tmp_path_factory: pytest.TempPathFactory) -> None:
    """transformers checks each field's kind as it builds the config, and converts the RoPE parameters after
    (vLLM checks them later still). A random value at a random field of a model's own config beside one of the
    RoPE faults vLLM refuses: where vLLM's ``get_config`` stops at the field, the plan names it; where the field
    alone loads, the plan names the RoPE parameters."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
    from vllm.transformers_utils.config import get_config

    from tests.vllm.test_vllm_config_dtype import ROPE_FAULTS, no_retry_sleep

    seen = {"field": 0, "rope": 0}
    own = st.sampled_from(sorted(t for t in CONFIG_CLASSES if t not in WRAPPER_CLASSES)).flatmap(
        lambda model_type: st.tuples(st.just(model_type), st.sampled_from(sorted(FIELD_KINDS[class_at(model_type, ())]))))

    def loads(folder: Path) -> Exception | None:
        try:
            with no_retry_sleep():
                get_config(str(folder), trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - whatever it raises, vLLM does not start
            return exc
        return None

    @settings(max_examples=EXAMPLES // 3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(field=own, value=JSON_VALUES, fault=st.sampled_from(sorted(ROPE_FAULTS)))
    @example(field=("qwen3", "rms_norm_eps"), value=1, fault="not a mapping")
    @example(field=("llama", "vocab_size"), value="x", fault="rope_type and type conflict")
    @example(field=("qwen3", "rms_norm_eps"), value=1e-6, fault="a list")
    def check(field: tuple[str, str], value: Any, fault: str) -> None:
        model_type, key = field
        if key in ROPE_FAULTS[fault] or key == "rope_parameters":
            return
        folder = tmp_path_factory.mktemp("kinds-rope")
        write(folder, model_type, {key: value}, text_type=True)
        alone = loads(folder)
        write(folder, model_type, {key: value, **ROPE_FAULTS[fault]}, text_type=True)
        both = loads(folder)
        if isinstance(both, StrictDataclassFieldValidationError) and f"'{key}'" in str(both):
            expected = "field"
        elif alone is None and both is not None:
            expected = "rope"
        else:
            event("vLLM stops otherwise")
            return
        with pytest.raises(ModelSpecError) as refused:
            make_plan(load_config(folder / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                      budget=1 << 30, platform="cpu")
        named = refused.value.key
        assert named is not None and named[0] == (key if expected == "field" else next(iter(ROPE_FAULTS[fault]))), (
            field, value, fault, refused.value, both)
        seen[expected] += 1

    check()
    assert seen["field"] and seen["rope"], seen
