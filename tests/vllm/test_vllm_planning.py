"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's own planning, run on a CPU.

For each case the real model class is built on the meta device, its attention
modules give their real ``KVCacheSpec``s, and vLLM's ``get_global_kv_cache_groups``
/ ``get_kv_cache_configs`` plan them; kvpolicy's pure plan must agree layer by
layer, group by group, and on blocks, bytes and concurrency.
"""

from __future__ import annotations

import pytest

from kvpolicy.adapters.vllm_adapter.planning.hf_config import (
    SpecSettings,
    load_config,
    model_specs,
)
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan

from kvpolicy.units import GiB, MiB

pytestmark = pytest.mark.vllm

CASES_SPEC = [
    # (name, block_size, layout, kv_cache_dtype, indexer, sliding-window block on vLLM's CPU backend)
    ("deepseek-v4-flash", 256, "BLHNC", "fp8", "fp8", None),
    ("deepseek-v4-flash", 256, "BLHNC", "fp8", "mxfp4", None),
    ("deepseek-v4-pro", 256, "BLHNC", "fp8", "fp8", None),
    ("qwen3-8b", 16, "LBNHC", "auto", "fp8", None),
    ("deepseek-v2-lite", 16, "LBNHC", "auto", "fp8", None),  # vLLM's CPU MLA kernel needs 16
    ("gpt-oss-20b", 32, "LBNHC", "auto", "fp8", None),
    ("gemma-3-1b", 32, "LBNHC", "auto", "fp8", None),
    # Block 16: vLLM's CPU backend gives sliding layers 32-token blocks, so full pages
    # are unified up to them (layer-outermost) or packed beside them (block-outermost).
    ("gemma-3-1b", 16, "LBNHC", "auto", "fp8", 32),
    ("gemma-3-1b", 16, "BLHNC", "auto", "fp8", 32),
]


def _case(spec: tuple) -> object:
    from tests.vllm.real_vllm import Case

    name, block, layout, dtype, indexer, sw_block = spec
    max_len = 65536 if name.startswith("deepseek-v4") else 32768
    return Case(name, block, max_model_len=max_len, kv_cache_dtype=dtype, layout=layout,
                indexer_kv_dtype=indexer, sliding_window_block_size=sw_block)


def _ids(spec: tuple) -> str:
    return "-".join(str(x) for x in spec if x is not None)


def settings_for(case, real_config) -> PlanSettings:
    """The plan's inputs, read from the same settings vLLM ran with."""
    return PlanSettings(
        max_model_len=case.max_model_len,
        block_size=case.block_size,
        sliding_window_block_size=case.sliding_window_block_size,
        kv_cache_dtype=case.kv_cache_dtype,
        indexer_kv_dtype=case.indexer_kv_dtype,
        kv_cache_layout=case.layout,
        max_num_batched_tokens=real_config.scheduler_config.max_num_batched_tokens,
        max_concurrent_batches=real_config.max_concurrent_batches,
    )


@pytest.mark.parametrize("spec", CASES_SPEC, ids=_ids)
def test_layer_specs_equal_vllms(spec: tuple) -> None:
    from tests.vllm.real_vllm import layer_specs

    case = _case(spec)
    real_specs = layer_specs(case)
    ours = model_specs(
        load_config(case.config_dir / "config.json"),
        SpecSettings(
            block_size=case.block_size,
            sliding_window_block_size=case.sliding_window_block_size,
            kv_cache_dtype=case.kv_cache_dtype,
            indexer_kv_dtype=case.indexer_kv_dtype,
        ),
    ).layers
    # Standard models: vLLM names the attention module inside each layer.
    real_by_layer = {_layer_key(name, ours): s for name, s in real_specs.items()}
    assert list(real_by_layer) == list(ours)
    for name, mine in ours.items():
        theirs = real_by_layer[name]
        assert (mine.page_size_bytes, mine.block_size) == (theirs.page_size_bytes, theirs.block_size), name
        assert mine.kind.value == _kind(theirs), name


def _layer_key(real_name: str, ours: dict) -> str:
    if real_name in ours:
        return real_name
    prefix = ".".join(real_name.split(".")[:3])  # model.layers.N
    assert prefix in ours, f"{real_name}: no layer {prefix} in the plan's specs"
    return prefix


def _kind(spec) -> str:
    from kvpolicy.adapters.vllm_adapter.pools import standard_pool

    return standard_pool(spec)[0]


@pytest.mark.parametrize("spec", CASES_SPEC, ids=_ids)
@pytest.mark.parametrize("budget", [60 * GiB, 60 * GiB - 40_000, 7 * GiB + 3 * MiB])
def test_plan_equals_get_kv_cache_configs(spec: tuple, budget: int) -> None:
    from tests.vllm.real_vllm import real_plan, vllm_config

    case = _case(spec)
    settings = settings_for(case, vllm_config(case))
    try:
        real = real_plan(case, budget)
    except ValueError as exc:  # vLLM refuses: so must the plan
        with pytest.raises(PlanError):
            make_plan(load_config(case.config_dir / "config.json"), settings, budget=budget)
        assert "KV cache" in str(exc) or "memory" in str(exc)
        return
    plan = make_plan(load_config(case.config_dir / "config.json"), settings, budget=budget)

    assert plan.num_blocks == real.kv_cache_config.num_blocks
    assert plan.bytes_per_block == real.bytes_per_block
    assert plan.total_bytes == real.kv_cache_config.kv_cache_tensors[0].size
    assert plan.max_concurrency == pytest.approx(real.max_concurrency, rel=1e-12)
    real_groups = real.kv_cache_config.kv_cache_groups
    assert len(plan.groups) == len(real_groups)
    for mine, theirs in zip(plan.groups, real_groups):
        assert mine.layers == len(theirs.layer_names)
        assert mine.block_size == theirs.kv_cache_spec.block_size
        inner = getattr(theirs.kv_cache_spec, "kv_cache_specs", None)
        pages = sum(s.page_size_bytes for s in inner.values()) if inner else (
            theirs.kv_cache_spec.page_size_bytes * len(theirs.layer_names))
        assert mine.bytes_per_block == pages


def test_v4_groups_hold_the_same_layers() -> None:
    """Not only the sizes: the same layers land in the same groups."""
    from kvpolicy.adapters.vllm_adapter.planning.kv_cache_planning import KVCacheLayout, kv_cache_groups
    from tests.vllm.real_vllm import real_plan

    case = _case(CASES_SPEC[0])
    real = real_plan(case, 60 * GiB)
    ours = kv_cache_groups(model_specs(load_config(case.config_dir / "config.json")).layers, KVCacheLayout.BLHNC)
    assert [list(g.layers) for g in ours] == [g.layer_names for g in real.kv_cache_config.kv_cache_groups]


def test_num_blocks_override_equals_num_gpu_blocks_override() -> None:
    from tests.vllm.real_vllm import real_plan, vllm_config

    case = _case(CASES_SPEC[0])
    cfg = vllm_config(case)
    cfg.cache_config.num_gpu_blocks_override = 40_000
    try:
        real = real_plan(case, 60 * GiB)
    finally:
        cfg.cache_config.num_gpu_blocks_override = None
    plan = make_plan(load_config(case.config_dir / "config.json"), settings_for(case, cfg), num_blocks=40_000)
    assert plan.num_blocks == real.kv_cache_config.num_blocks == 40_000
    assert plan.total_bytes == real.kv_cache_config.kv_cache_tensors[0].size
