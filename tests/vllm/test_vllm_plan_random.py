"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's own planning for random standard-attention configs.

Each example writes a Qwen3-shaped config.json (random layer count, heads, KV heads,
head size, dtype, max_model_len), or a Gemma-3-shaped one whose layers are a random mix of
sliding-window and full attention (random window, one group per kind or several), and a
random budget and layout; vLLM's real model class gives
the layer specs on the meta device and vLLM's ``get_global_kv_cache_groups`` /
``get_kv_cache_configs`` plan them. The plan must agree on blocks, bytes per block, total
bytes and concurrency, or refuse where vLLM refuses, for vLLM's reason and with its figures.
vLLM's ``allocate_kv_cache`` then builds the plan on the ``meta`` device (no memory, so
budgets need no cap), and its views must be the plan's buffer and per-pool bytes
(tests/vllm/allocation_check.py).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tests.vllm.allocation_check import check_allocation
from tests.vllm.refusals import assert_same_refusal
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config, model_specs
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_RANDOM_EXAMPLES", "40"))
"""Examples per run and test: each builds a real vLLM model on the meta device (tens of milliseconds once
vLLM is imported; the first one of a process takes seconds)."""


@st.composite
def attention(draw: st.DrawFn, base: str) -> dict:
    """``base``'s config.json with random attention shapes, shrunk where the KV cache does not look."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    config = json.loads((CONFIGS / base / "config.json").read_text())
    config |= {
        "num_hidden_layers": draw(st.integers(2, 64)),
        "num_key_value_heads": kv_heads,
        "num_attention_heads": kv_heads * draw(st.sampled_from([1, 2, 4])),
        "head_dim": draw(st.sampled_from([64, 128, 256])),  # head sizes vLLM's CPU backend takes
        "hidden_size": 256,
        "intermediate_size": 512,
        "vocab_size": 512,
        "torch_dtype": draw(st.sampled_from(["bfloat16", "float16"])),
        "max_position_embeddings": draw(st.integers(128, 1 << 20)),
    }
    return config


@st.composite
def hybrid(draw: st.DrawFn) -> dict:
    """Gemma-3-shaped: each layer sliding-window or full attention, at random."""
    config = draw(attention("gemma-3-1b"))
    n = config["num_hidden_layers"]
    kinds = st.sampled_from(["sliding_attention", "full_attention"])
    config["layer_types"] = draw(st.lists(kinds, min_size=n, max_size=n))
    config["sliding_window"] = draw(st.integers(16, 8192))
    config["query_pre_attn_scalar"] = config["head_dim"]
    return config


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(config=attention("qwen3-8b"), budget=st.integers(1 << 20, 64 << 30), block_size=st.sampled_from([16, 32, 64]),
       layout=st.sampled_from(["LBNHC", "BLHNC"]))
def test_random_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, config: dict, budget: int,
                                          block_size: int, layout: str) -> None:
    plan_and_compare(tmp_path_factory, config, budget, block_size, layout)


@SETTINGS
@given(config=hybrid(), budget=st.integers(1 << 20, 64 << 30), block_size=st.sampled_from([32, 64, 128]),
       layout=st.sampled_from(["LBNHC", "BLHNC"]))
def test_random_sliding_window_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, config: dict,
                                                         budget: int, block_size: int, layout: str) -> None:
    """Block sizes of 32 and up: what vLLM's CPU backend keeps for sliding-window layers too (MultipleOf(32))."""
    kinds = set(config["layer_types"])
    event("sliding and full layers" if len(kinds) == 2 else f"{kinds.pop()} only")
    plan_and_compare(tmp_path_factory, config, budget, block_size, layout)


def plan_and_compare(tmp_path_factory: pytest.TempPathFactory, config: dict, budget: int, block_size: int,
                     layout: str) -> None:
    from tests.vllm.real_vllm import Case, allocated_views, real_plan, vllm_config

    folder = tmp_path_factory.mktemp("random-config")
    (folder / "config.json").write_text(json.dumps(config))
    max_len = config["max_position_embeddings"]
    case = Case(str(folder), block_size, max_model_len=max_len, layout=layout)  # an absolute name: config_dir is the folder
    assert case.config_dir == folder
    real_config = vllm_config(case)
    ours = PlanSettings(
        max_model_len=max_len,
        block_size=block_size,
        kv_cache_layout=case.layout,
        max_num_batched_tokens=real_config.scheduler_config.max_num_batched_tokens,
        max_concurrent_batches=real_config.max_concurrent_batches,
    )
    try:
        real = real_plan(case, budget)
    except ValueError as exc:  # vLLM refuses the budget: so must the plan, for vLLM's reason
        with pytest.raises(PlanError) as refused:
            make_plan(load_config(folder / "config.json"), ours, budget=budget)
        event(f"refused: {assert_same_refusal(str(refused.value), str(exc))}")
        return
    event(f"planned: {len(real.kv_cache_config.kv_cache_groups)} groups" if len(
        real.kv_cache_config.kv_cache_groups) > 1 else "planned: 1 group")
    plan = make_plan(load_config(folder / "config.json"), ours, budget=budget)
    assert plan.num_blocks == real.kv_cache_config.num_blocks
    assert plan.bytes_per_block == real.bytes_per_block
    assert {t.size for t in real.kv_cache_config.kv_cache_tensors} == {plan.total_bytes}  # the one backing buffer
    assert plan.max_concurrency == pytest.approx(real.max_concurrency, rel=1e-12)
    assert [(g.layers, g.block_size) for g in plan.groups] == [
        (len(g.layer_names), g.kv_cache_spec.block_size) for g in real.kv_cache_config.kv_cache_groups]
    # What vLLM allocates for it: the plan names layers by index (model.layers.N), vLLM by module.
    mine = model_specs(load_config(folder / "config.json"), ours).layers
    allocated = allocated_views(real.kv_cache_config, case.layout)
    pools = {name: (mine[".".join(name.split(".")[:3])].pool, "") for name in allocated["layers"]}
    check_allocation(plan, pools, allocated)
