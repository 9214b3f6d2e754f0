"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's own planning for random standard-attention configs.

Each example writes a Qwen3-shaped config.json (random layer count, heads, KV heads,
head size, dtype, max_model_len) and a random budget; vLLM's real model class gives
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

EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_RANDOM_EXAMPLES", "12"))
"""Examples per run: each builds a real vLLM model on the meta device (about a second; more under load)."""


@st.composite
def configs(draw: st.DrawFn) -> dict:
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    config = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
    max_len = draw(st.integers(128, 1 << 20))
    config |= {
        "num_hidden_layers": draw(st.integers(2, 64)),
        "num_key_value_heads": kv_heads,
        "num_attention_heads": kv_heads * draw(st.sampled_from([1, 2, 4])),
        "head_dim": draw(st.sampled_from([64, 128, 256])),  # head sizes vLLM's CPU backend takes
        "hidden_size": 256,
        "intermediate_size": 512,
        "vocab_size": 512,
        "torch_dtype": draw(st.sampled_from(["bfloat16", "float16"])),
        "max_position_embeddings": max_len,
    }
    return config


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs(), budget=st.integers(1 << 20, 64 << 30), block_size=st.sampled_from([16, 32, 64]))
def test_random_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, config: dict, budget: int,
                                          block_size: int) -> None:
    from tests.vllm.real_vllm import Case, allocated_views, real_plan, vllm_config

    folder = tmp_path_factory.mktemp("random-qwen3")
    (folder / "config.json").write_text(json.dumps(config))
    max_len = config["max_position_embeddings"]
    case = Case(str(folder), block_size, max_model_len=max_len)  # an absolute name: config_dir is the folder
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
    event("planned")
    plan = make_plan(load_config(folder / "config.json"), ours, budget=budget)
    assert plan.num_blocks == real.kv_cache_config.num_blocks
    assert plan.bytes_per_block == real.bytes_per_block
    assert plan.total_bytes == sum(t.size for t in real.kv_cache_config.kv_cache_tensors)
    assert plan.max_concurrency == pytest.approx(real.max_concurrency, rel=1e-12)
    # What vLLM allocates for it: the plan names layers by index (model.layers.N), vLLM by module.
    mine = model_specs(load_config(folder / "config.json"), ours).layers
    allocated = allocated_views(real.kv_cache_config, case.layout)
    pools = {name: (mine[".".join(name.split(".")[:3])].pool, "") for name in allocated["layers"]}
    check_allocation(plan, pools, allocated)
