"""``kvpolicy plan --engine vllm --vllm-version 0.32`` equals vLLM 0.32.0's planning for random DeepSeek-V4 patterns.

vLLM 0.32.0 has DeepSeek-V4 (``vllm/models/deepseek_v4``) and plans it in ``v1/core/kv_cache_utils.py``.
Hypothesis draws the cases here (the same kinds as tests/vllm/test_vllm_plan_v4_random.py, which runs
0.33.0 in-process), for DeepSeek-V4-Flash's config and for one randomly drawn shape per run (head_dim and
index_head_dim of 128 or 512, any sliding window); ``v4_plan_probe.py`` plans each config's cases under the
e2e venv's vLLM 0.32.0 in one process (one template model built on the meta device), and every figure must
equal the plan's, refusals included;
0.32.0's ``allocate_kv_cache`` builds each plan on the ``meta`` device, and its views must be the plan's
buffer, groups and per-pool bytes (tests/vllm/allocation_check.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.deepseek_v4_032 import READ_WITHOUT_DEFAULT, TAKES_032, JsonKind
from kvpolicy.adapters.vllm_adapter.planning.hf_config import model_specs
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan
from kvpolicy.document_codes import MISSING_FIELD, WRONG_TYPE
from tests.vllm.allocation_check import check_allocation
from tests.vllm.refusals import assert_same_refusal

pytestmark = [pytest.mark.vllm_engine]

HERE = Path(__file__).resolve().parent
FLASH = HERE.parent / "vllm" / "configs" / "deepseek-v4-flash" / "config.json"
EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_V4_EXAMPLES", "40"))
RATIO_CHOICES = {
    "all ratios": (0, 4, 128),
    "no ratio-4 layers": (0, 128),
    "no ratio-128 layers": (0, 4),
    "compressed only": (4, 128),
    "sliding only": (0,),
}


@st.composite
def spread(draw: st.DrawFn, low_bits: int, high_bits: int) -> int:
    bits = draw(st.integers(low_bits, high_bits - 1))
    return draw(st.integers(1 << bits, (2 << bits) - 1))


def drawn_shape() -> dict:
    """Config fields a DeepSeek-V4 model's specs depend on, drawn once per run (vLLM builds any pattern)."""
    shape: dict = {}

    @settings(max_examples=1, deadline=None, database=None)
    @given(head_dim=st.sampled_from([128, 512]), index_head_dim=st.sampled_from([128, 512]),
           sliding_window=st.one_of(st.sampled_from([64, 128, 256, 512]), st.integers(8, 2048)))
    def draw(head_dim: int, index_head_dim: int, sliding_window: int) -> None:
        shape.update(head_dim=head_dim, index_head_dim=index_head_dim, sliding_window=sliding_window)

    draw()
    return shape


def drawn_cases(examples: int) -> list[dict]:
    cases: list[dict] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(kind=st.sampled_from(sorted(RATIO_CHOICES)), data=st.data(),
           max_len=st.one_of(spread(7, 20), st.just(1 << 20)), budget=st.one_of(spread(20, 38), spread(28, 36)),
           batched=st.one_of(st.none(), spread(8, 17)), async_scheduling=st.booleans())
    def collect(kind: str, data: st.DataObject, max_len: int, budget: int, batched: int | None,
                async_scheduling: bool) -> None:
        layers = data.draw(st.integers(2, 64))
        ratios = data.draw(st.lists(st.sampled_from(RATIO_CHOICES[kind]), min_size=layers, max_size=layers))
        for ratio, label in ((4, "no ratio-4 layers"), (128, "no ratio-128 layers")):
            if ratio not in ratios:
                event(label)
        cases.append({"ratios": ratios, "max_len": max_len, "budget": budget, "batched": batched,
                      "async_scheduling": async_scheduling})

    collect()
    return cases


def probe(python: Path, config: Path, cases: list[dict]) -> list[dict]:
    """vLLM 0.32's figures for each case of the V4 model ``config`` (v4_plan_probe.py, one process)."""
    out = subprocess.run([str(python), str(HERE / "v4_plan_probe.py"), str(config)], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=1200, check=False,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-4000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases)
    return results


@pytest.mark.parametrize("shape", ["flash", "drawn"])
def test_random_v4_patterns_plan_as_vllm_032_does(e2e_python: Path, tmp_path: Path, shape: str) -> None:
    config_path = FLASH
    if shape == "drawn":
        config_path = tmp_path / "config.json"
        config_path.write_text(json.dumps({**json.loads(FLASH.read_text()), **drawn_shape()}))
    cases = drawn_cases(EXAMPLES if shape == "flash" else max(EXAMPLES // 2, 10))
    results = probe(e2e_python, config_path, cases)
    base = json.loads(config_path.read_text())
    seen: Counter[str] = Counter()
    for case, real in zip(cases, results):
        ratios = case["ratios"]
        seen["no ratio-4 layers"] += 4 not in ratios
        seen["no ratio-128 layers"] += 128 not in ratios
        config = {**base, "num_hidden_layers": len(ratios), "compress_ratios": ratios}
        ours_settings = PlanSettings(
            max_model_len=case["max_len"], block_size=256, kv_cache_dtype="fp8", kv_cache_layout="BLHNC",
            max_num_batched_tokens=real["max_num_batched_tokens"], max_concurrent_batches=real["max_concurrent_batches"],
        )
        if "refused" in real:
            seen["refused"] += 1
            with pytest.raises(PlanError) as ours:
                make_plan(config, ours_settings, budget=case["budget"], engine_version="0.32.0")
            assert_same_refusal(str(ours.value), real["refused"])
            continue
        seen["planned"] += 1
        plan = make_plan(config, ours_settings, budget=case["budget"], engine_version="0.32.0")
        assert (plan.num_blocks, plan.bytes_per_block, [plan.total_bytes], plan.per_request.bytes) == (
            real["num_blocks"], real["bytes_per_block"], real["tensor_sizes"], real["per_request_bytes"]), case
        assert plan.max_concurrency == pytest.approx(real["max_concurrency"], rel=1e-12)
        assert [[g.layers, g.block_size, g.bytes_per_block] for g in plan.groups] == real["groups"], case
        layer_pools = {name: (s.pool, s.part) for name, s in model_specs(config, ours_settings).layers.items()}
        check_allocation(plan, layer_pools, real["allocated"])
    assert seen["refused"] and seen["planned"], seen
    assert seen["no ratio-4 layers"] and seen["no ratio-128 layers"], seen


KINDS: tuple[JsonKind, ...] = ("int", "float", "bool", "str", "list", "dict", "null")
PLAN_STRICTER = {("sliding_window", "float"), ("sliding_window", "bool"), ("num_hidden_layers", "bool"),
                 ("torch_dtype", "int"), ("torch_dtype", "float"), ("torch_dtype", "bool"), ("torch_dtype", "dict")}
"""Values 0.32 starts with that the plan refuses, as it reads them itself: a window of 128.0 or true, true layers,
a torch_dtype that is no string (the plan resolves the model's dtype from a string only)."""


def of_kind(value: Any, kind: JsonKind) -> Any:
    """A value of ``kind`` made from the config's own ``value`` (the number as a float, true, its text, ...)."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 1
    return {"int": int(number), "float": float(number), "bool": True, "str": value if isinstance(value, str) else
            str(value), "list": value if isinstance(value, list) else [value], "dict": {"value": value},
            "null": None}[kind]


@pytest.fixture(scope="module")
def one_key_changed(e2e_python: Path) -> dict[str, list[tuple[str, str, dict, dict]]]:
    """DeepSeek-V4 configs with one key removed, and with one key given a value of each kind, in turn: per change,
    (key, kind, config, whether vLLM 0.32 starts it) (v4_config_probe.py, one process for all); under "removed",
    the whole config first (key "")."""
    from tests.vllm.real_vllm import v4_template_config

    base = v4_template_config(json.loads(FLASH.read_text()))
    keys = [key for key in base if key != "model_type"]
    changed = {
        "removed": [("", "", base)] + [(key, "", {k: v for k, v in base.items() if k != key}) for key in keys],
        "kind": [(key, kind, {**base, key: of_kind(base[key], kind)}) for key in keys for kind in KINDS],
    }
    configs = [config for cases in changed.values() for *_, config in cases]
    out = subprocess.run([str(e2e_python), str(HERE / "v4_config_probe.py")], input=json.dumps(configs),
                         capture_output=True, text=True, timeout=1200, check=False,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-4000:]
    results = iter([json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")])
    probed = {change: [(*case, next(results)) for case in cases] for change, cases in changed.items()}
    assert next(results, None) is None
    return probed


SETTINGS_032 = PlanSettings(max_model_len=65536, block_size=256, kv_cache_dtype="fp8", kv_cache_layout="BLHNC")


def test_keys_the_plan_needs_for_032_are_those_vllm_032_cannot_start_without(one_key_changed) -> None:
    """Every key of a DeepSeek-V4 config taken out in turn: vLLM 0.32 starts (builds its model, plans its KV
    cache) exactly when the plan for 0.32 plans the config, and where it fails for the key, the plan names it
    (``READ_WITHOUT_DEFAULT``); the whole config plans and starts."""
    refused: list[str] = []
    for key, _, config, real in one_key_changed["removed"]:
        if "built" in real:
            make_plan(config, SETTINGS_032, budget=1 << 32, engine_version="0.32.0")
            continue
        assert real["refused"] == f"AttributeError: 'DeepseekV4Config' object has no attribute {key!r}", (key, real)
        with pytest.raises(ModelSpecError) as ours:
            make_plan(config, SETTINGS_032, budget=1 << 32, engine_version="0.32.0")
        assert (ours.value.code, ours.value.key) == (MISSING_FIELD, (key,)), key
        refused.append(key)
    assert sorted(refused) == sorted(READ_WITHOUT_DEFAULT)


def test_the_kinds_of_value_the_plan_takes_for_032_are_those_vllm_032_starts_with(one_key_changed) -> None:
    """Every key of a DeepSeek-V4 config given a value of each JSON kind in turn: ``TAKES_032`` is the kinds
    vLLM 0.32 starts with; where 0.32 fails, the plan for 0.32 refuses the value at its place; where 0.32 starts,
    the plan plans, but for the values it reads itself and is stricter about (``PLAN_STRICTER``)."""
    started: dict[str, list[str]] = {}
    stricter: set[tuple[str, str]] = set()
    for key, kind, config, real in one_key_changed["kind"]:
        if "built" in real:
            started.setdefault(key, []).append(kind)
            try:
                make_plan(config, SETTINGS_032, budget=1 << 32, engine_version="0.32.0")
            except ModelSpecError as refused:
                assert refused.code is WRONG_TYPE and refused.key == (key,), (key, kind, refused)
                stricter.add((key, kind))
            continue
        with pytest.raises(ModelSpecError) as ours:
            make_plan(config, SETTINGS_032, budget=1 << 32, engine_version="0.32.0")
        assert (ours.value.code, ours.value.key) == (WRONG_TYPE, (key,)), (key, kind, real)
    assert stricter == PLAN_STRICTER
    assert {key: sorted(kinds) for key, kinds in started.items() if len(kinds) < len(KINDS)} == {
        key: sorted(kinds) for key, kinds in TAKES_032.items()}
