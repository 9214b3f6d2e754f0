"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's planning for random DeepSeek-V4 layer patterns.

For each drawn model shape (head_dim and index_head_dim of 128 or 512, any sliding window, KV cache dtype
auto or an fp8 variant, fp8 or MXFP4 indexer, tensor parallel size) one real DeepSeek-V4 model is built on
the meta device (a shrunk template: every ratio twice; built once per shape, in milliseconds); its modules
give the real ``KVCacheSpec`` of a ratio-0, ratio-4 and ratio-128 layer, which any pattern reassembles in
vLLM's registration order (``v4_layer_templates`` checks that this gives back the template's own specs).
For each example vLLM's ``get_global_kv_cache_groups`` / ``get_kv_cache_configs`` plan the pattern for a
random budget, max_model_len and scheduler (batched tokens, async scheduling), and the plan must agree field
by field, the per-request worst case and the concurrency included, or refuse where vLLM refuses, quoting
vLLM's figures. vLLM's own ``allocate_kv_cache`` then builds the planned cache on the ``meta`` device (so
budgets need no cap), and its views must be the plan's buffer, groups and per-pool bytes
(tests/vllm/allocation_check.py). Head sizes vLLM's compressors refuse are drawn in a test of their own,
each model built whole (the template would hold compressors a pattern may not have).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, model_specs
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


@dataclass(frozen=True)
class Shape:
    """What a DeepSeek-V4 model's specs depend on besides its pattern: config fields and launch flags."""

    head_dim: int = 512
    index_head_dim: int = 128
    sliding_window: int = 128
    kv_cache_dtype: str = "fp8"
    indexer_kv_dtype: str = "fp8"
    tensor_parallel_size: int = 1

    def case(self, folder: Path, max_model_len: int = 65536) -> Any:
        from tests.vllm.real_vllm import Case

        return Case(str(folder), 256, max_model_len=max_model_len, kv_cache_dtype=self.kv_cache_dtype,
                    layout="BLHNC", indexer_kv_dtype=self.indexer_kv_dtype,
                    tensor_parallel_size=self.tensor_parallel_size)

    def settings(self, **figures: Any) -> PlanSettings:
        return PlanSettings(block_size=256, kv_cache_dtype=self.kv_cache_dtype, kv_cache_layout="BLHNC",
                            indexer_kv_dtype=self.indexer_kv_dtype,  # type: ignore[arg-type]
                            tensor_parallel_size=self.tensor_parallel_size, **figures)


FLASH = json.loads((CONFIGS / "deepseek-v4-flash" / "config.json").read_text())


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    """A shape vLLM builds every pattern of (the flash config's, one in four times)."""
    if draw(st.integers(0, 3)) == 0:
        return Shape()
    indexer = draw(st.sampled_from(["fp8", "mxfp4"]))
    return Shape(
        head_dim=draw(st.sampled_from([128, 512])),
        index_head_dim=128 if indexer == "mxfp4" else draw(st.sampled_from([128, 512])),
        sliding_window=draw(st.one_of(st.sampled_from([64, 128, 256, 512]), st.integers(8, 2048))),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"])),
        indexer_kv_dtype=indexer,
        tensor_parallel_size=draw(st.sampled_from([1, 2, 4, 8])),
    )


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Shape], tuple[Path, dict[str, Any], dict]]:
    """The template model of a shape (its folder, config and per-ratio specs), built once per shape."""
    from tests.vllm.real_vllm import v4_layer_templates, v4_template_config

    built: dict[Shape, tuple[Path, dict[str, Any], dict]] = {}

    def template(shape: Shape) -> tuple[Path, dict[str, Any], dict]:
        if shape not in built:
            folder = tmp_path_factory.mktemp("v4-template")
            config = v4_template_config(FLASH) | {
                "head_dim": shape.head_dim, "index_head_dim": shape.index_head_dim,
                "sliding_window": shape.sliding_window}
            (folder / "config.json").write_text(json.dumps(config))
            built[shape] = folder, config, v4_layer_templates(shape.case(folder))
        return built[shape]

    return template


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


def test_random_v4_patterns_plan_as_vllm_does(templates: Callable[[Shape], tuple[Path, dict[str, Any], dict]]) -> None:
    from tests.vllm.real_vllm import (
        allocated_views,
        max_request_bytes,
        real_plan_for_specs,
        v4_specs,
        vllm_config,
    )

    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shape=shapes(), pattern=patterns(), max_len=st.one_of(spread(7, 20), st.just(1 << 20)),
           budget=st.one_of(spread(20, 38), spread(28, 36)),
           batched=st.one_of(st.none(), spread(8, 17)), async_scheduling=st.booleans())
    def check(shape: Shape, pattern: tuple[str, list[int]], max_len: int, budget: int, batched: int | None,
              async_scheduling: bool) -> None:
        _kind, ratios = pattern
        for ratio, label in ((4, "no ratio-4 layers"), (128, "no ratio-128 layers")):
            if ratio not in ratios:
                event(label)
                seen[label] += 1
        if shape != Shape():
            event(f"shape: head_dim {shape.head_dim}, index_head_dim {shape.index_head_dim}, "
                  f"indexer {shape.indexer_kv_dtype}, tp {shape.tensor_parallel_size}")
            seen["other shapes"] += 1
        folder, base, templates_ = templates(shape)
        cfg = vllm_config(shape.case(folder, max_len))
        sched = cfg.scheduler_config
        saved = sched.max_num_batched_tokens, sched.async_scheduling
        # The scheduler figures vLLM sizes sliding windows by: its CPU resolution, or others (as a GPU's).
        if batched is not None:
            sched.max_num_batched_tokens, sched.async_scheduling = batched, async_scheduling
        try:
            ours_settings = shape.settings(max_model_len=max_len, max_num_batched_tokens=sched.max_num_batched_tokens,
                                           max_concurrent_batches=cfg.max_concurrent_batches)
            config = {**base, "num_hidden_layers": len(ratios), "compress_ratios": ratios}
            specs = v4_specs(templates_, ratios)
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
    assert seen["no ratio-4 layers"] and seen["no ratio-128 layers"] and seen["other shapes"], seen


HEAD_SIZES = [64, 128, 256, 512]
V4_REFUSALS = {  # vLLM's compressor refusals → the plan's words for them, naming the same size
    "Unsupported head_dim for fused quant+cache": "compressor caches only head sizes 128 and 512",
    "MXFP4 cache is only supported for indexer": "MXFP4 indexer cache takes index_head_dim 128 only",
}


@settings(max_examples=max(EXAMPLES // 6, 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(head_dim=st.sampled_from(HEAD_SIZES), index_head_dim=st.sampled_from(HEAD_SIZES),
       indexer=st.sampled_from(["fp8", "mxfp4"]), ratios=st.lists(st.sampled_from([0, 4, 128]), min_size=1, max_size=4))
def test_v4_head_sizes_build_or_refuse_as_vllm(tmp_path_factory: pytest.TempPathFactory, head_dim: int,
                                               index_head_dim: int, indexer: str, ratios: list[int]) -> None:
    """Any head sizes: vLLM builds the whole model (its compressors refuse some sizes), and the plan must
    build the same layer specs or refuse for the same reason."""
    from tests.vllm.real_vllm import layer_specs, v4_template_config

    folder = tmp_path_factory.mktemp("v4-heads")
    config = v4_template_config(FLASH) | {"head_dim": head_dim, "index_head_dim": index_head_dim,
                                          "num_hidden_layers": len(ratios), "compress_ratios": [*ratios, 0]}
    (folder / "config.json").write_text(json.dumps(config))
    shape = Shape(head_dim=head_dim, index_head_dim=index_head_dim, indexer_kv_dtype=indexer)
    try:
        real = layer_specs(shape.case(folder))
    except (ValueError, AssertionError) as exc:
        reason = next((r for r in V4_REFUSALS if r in str(exc)), None)
        assert reason is not None, exc  # a refusal the plan does not know of
        # The size refused: vLLM names the unsupported one; an MXFP4 indexer refuses 512.
        size = str(exc).rsplit(":", 1)[-1].strip() if reason.startswith("Unsupported") else "512"
        with pytest.raises(ModelSpecError) as ours:
            model_specs(config, shape.settings(max_model_len=4096))
        assert V4_REFUSALS[reason] in str(ours.value) and f" {size}" in str(ours.value), (exc, ours.value)
        event(f"refused: {reason}")
        return
    mine = model_specs(config, shape.settings(max_model_len=4096)).layers
    assert [(n, s.page_size_bytes, s.block_size) for n, s in mine.items()] == [
        (n, s.page_size_bytes, s.block_size) for n, s in real.items()]
    event("built")
