"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's planning for random DeepSeek-V4 layer patterns.

One real DeepSeek-V4 model is built on the meta device (a shrunk template: every ratio twice); its
modules give the real ``KVCacheSpec`` of a ratio-0, ratio-4 and ratio-128 layer, which any pattern
reassembles in vLLM's registration order (``v4_layer_templates`` checks that this gives back the
template's own specs). For each example vLLM's ``get_global_kv_cache_groups`` / ``get_kv_cache_configs``
plan the pattern for a random budget, max_model_len and scheduler (batched tokens, async scheduling),
and the plan must agree field by field, the per-request worst case and the concurrency included, or
refuse where vLLM refuses, quoting vLLM's figures. vLLM's own ``allocate_kv_cache`` then builds the
planned cache on the ``meta`` device (so budgets need no cap), and its views must be the plan's
buffer, groups and per-pool bytes (tests/vllm/allocation_check.py).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.hf_config import model_specs
from kvpolicy.adapters.vllm_adapter.planning.plan import (
    PlanError,
    PlanSettings,
    make_plan,
)
from tests.vllm.allocation_check import check_allocation
from tests.vllm.refusals import assert_same_refusal
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_V4_EXAMPLES", "150"))
"""Examples per run: each resolves a VllmConfig (its max_model_len), plans and allocates on the meta device
(tens of milliseconds); the model is built once, in the fixture."""

RATIO_CHOICES = {  # what a pattern draws from: V4's mix, and patterns without 4 or without 128 layers
    "all ratios": (0, 4, 128),
    "no ratio-4 layers": (0, 128),
    "no ratio-128 layers": (0, 4),
    "compressed only": (4, 128),
    "sliding only": (0,),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict]:
    from tests.vllm.real_vllm import Case, v4_layer_templates, v4_template_config

    folder = tmp_path_factory.mktemp("v4-template")
    config = v4_template_config(json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text()))
    (folder / "config.json").write_text(json.dumps(config))
    case = Case(str(folder), 256, max_model_len=65536, kv_cache_dtype="fp8", layout="BLHNC")
    return folder, config, v4_layer_templates(case)


@st.composite
def spread(draw: st.DrawFn, low_bits: int, high_bits: int) -> int:
    """Log-uniform in [2**low_bits, 2**high_bits): every scale equally often, no round numbers."""
    bits = draw(st.integers(low_bits, high_bits - 1))
    return draw(st.integers(1 << bits, (2 << bits) - 1))


@st.composite
def patterns(draw: st.DrawFn) -> tuple[str, list[int]]:
    kind = draw(st.sampled_from(sorted(RATIO_CHOICES)))
    layers = draw(st.integers(2, 64))
    return kind, draw(st.lists(st.sampled_from(RATIO_CHOICES[kind]), min_size=layers, max_size=layers))


def test_random_v4_patterns_plan_as_vllm_does(template: tuple[Path, dict[str, Any], dict]) -> None:
    from tests.vllm.real_vllm import (
        Case,
        allocated_views,
        max_request_bytes,
        real_plan_for_specs,
        v4_specs,
        vllm_config,
    )

    folder, base, templates = template
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(pattern=patterns(), max_len=st.one_of(spread(7, 20), st.just(1 << 20)),
           budget=st.one_of(spread(20, 38), spread(28, 36)),
           batched=st.one_of(st.none(), spread(8, 17)), async_scheduling=st.booleans())
    def check(pattern: tuple[str, list[int]], max_len: int, budget: int, batched: int | None,
              async_scheduling: bool) -> None:
        _kind, ratios = pattern
        for ratio, label in ((4, "no ratio-4 layers"), (128, "no ratio-128 layers")):
            if ratio not in ratios:
                event(label)
                seen[label] += 1
        cfg = vllm_config(Case(str(folder), 256, max_model_len=max_len, kv_cache_dtype="fp8", layout="BLHNC"))
        sched = cfg.scheduler_config
        saved = sched.max_num_batched_tokens, sched.async_scheduling
        # The scheduler figures vLLM sizes sliding windows by: its CPU resolution, or others (as a GPU's).
        if batched is not None:
            sched.max_num_batched_tokens, sched.async_scheduling = batched, async_scheduling
        try:
            ours_settings = PlanSettings(
                max_model_len=max_len, block_size=256, kv_cache_dtype="fp8", kv_cache_layout="BLHNC",
                max_num_batched_tokens=sched.max_num_batched_tokens, max_concurrent_batches=cfg.max_concurrent_batches,
            )
            config = {**base, "num_hidden_layers": len(ratios), "compress_ratios": ratios}
            specs = v4_specs(templates, ratios)
            try:
                real = real_plan_for_specs(cfg, specs, budget, "BLHNC")
            except ValueError as exc:  # vLLM refuses: so must the plan, with vLLM's figures
                with pytest.raises(PlanError) as ours:
                    make_plan(config, ours_settings, budget=budget)
                event(f"refused: {assert_same_refusal(str(ours.value), str(exc))}")
                seen["refused"] += 1
                return
            plan = make_plan(config, ours_settings, budget=budget)
            need = max_request_bytes(cfg, real.groups)
            concurrency = real.max_concurrency
            allocated = allocated_views(real.kv_cache_config, "BLHNC")
        finally:
            sched.max_num_batched_tokens, sched.async_scheduling = saved
        event("planned")
        seen["planned"] += 1
        kc = real.kv_cache_config
        assert plan.num_blocks == kc.num_blocks
        assert plan.bytes_per_block == real.bytes_per_block
        # Every KVCacheTensor of a block-outermost plan aliases the one backing buffer, from byte 0.
        assert {t.size for t in kc.kv_cache_tensors} == {plan.total_bytes}
        assert plan.per_request.bytes == need  # vLLM's own worst case, whatever the group structure
        assert plan.max_concurrency == pytest.approx(concurrency, rel=1e-12)
        assert len(plan.groups) == len(kc.kv_cache_groups)
        for mine, theirs in zip(plan.groups, kc.kv_cache_groups):
            spec = theirs.kv_cache_spec
            inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs: a page per layer
            pages = sum(s.page_size_bytes for s in inner.values()) if inner else spec.page_size_bytes * len(
                theirs.layer_names)
            assert (mine.layers, mine.block_size, mine.bytes_per_block) == (
                len(theirs.layer_names), spec.block_size, pages)
        # What vLLM allocates for it, pool by pool, as the plan's layers name their pools.
        layer_pools = {name: (s.pool, s.part) for name, s in model_specs(config, ours_settings).layers.items()}
        check_allocation(plan, layer_pools, allocated)

    check()
    # The strategy must reach the cases the issue names, not only in principle.
    assert seen["refused"] and seen["planned"], seen
    assert seen["no ratio-4 layers"] and seen["no ratio-128 layers"], seen
