"""``kvpolicy plan --policy`` for an elastic DeepSeek-V4 SWA pool, against SGLang 0.5.23's own sizing and pools.

The closed forms say: the budget SGLang is handed, the SWA token count it resolves from
it (ratio or cap mode), the pages of each SWA layer tensor, and the static footprint of
the other tensors. The real configurator and pool builder, on CPU, must agree.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4 import hooks, plan as closed
from kvpolicy.adapters.sglang_dsv4.footprint import footprint
from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry, load_geometry
from kvpolicy.adapters.sglang_dsv4.plan import REQ_TO_TOKEN, PlanError, SWAElasticPolicy
from kvpolicy.cli import main
from kvpolicy.units import GiB, MiB
from tests.sglang.sglang_support import MODELS, TINY_RATIOS, kv_cache_configurator, real_sizes, real_tensors

FLASH = MODELS / "deepseek-v4-flash.json"
TINY = ModelGeometry(num_hidden_layers=7, compress_ratios=TINY_RATIOS, max_position_embeddings=65536)
CHUNK = 2 * MiB


def elastic(maximum: int, guarantee: int = 0, chunk: int = CHUNK) -> SWAElasticPolicy:
    return SWAElasticPolicy(chunk=chunk, guarantee=guarantee, maximum=maximum)


def test_the_elastic_reservation_is_the_swa_token_count_times_the_page_bytes():
    geometry = load_geometry(FLASH)
    s = closed.PlanSettings(max_running_requests=256, swa_ratio=0.1)
    plan = closed.budget_for_reserve(geometry, s, 40 * GiB, elastic(8 * GiB, 2 * GiB))
    e = plan.elastic["swa"]
    pages = -(-(plan.tokens.swa + 256) // 256)
    assert (e.layers, e.pages, e.page_bytes) == (43, pages, closed.page_bytes(256))
    assert e.tensor_bytes == 43 * pages * 149_760 == plan.pools["swa"].bytes
    assert e.virtual == 43 * (-(-pages * 149_760 // CHUNK)) * CHUNK
    assert e.pinned == 43 * CHUNK == plan.pools["swa"].footprint  # page 0 fits one chunk of each layer
    assert e.limit == 8 * GiB // (43 * CHUNK) * (43 * CHUNK) and e.guarantee == 2 * GiB // (43 * CHUNK) * 43 * CHUNK
    assert plan.total_footprint <= 40 * GiB
    static = closed.budget_for_reserve(geometry, s, 40 * GiB)
    # The SWA pool no longer takes part of the reserve: SGLang gets more full tokens, and by ratio more SWA.
    assert plan.tokens.full > static.tokens.full and plan.tokens.swa > static.tokens.swa


def test_a_max_that_cannot_map_one_page_is_refused_with_the_reason():
    with pytest.raises(PlanError, match="cannot map one SWA page") as info:
        closed.budget_for_reserve(load_geometry(FLASH), closed.PlanSettings(max_running_requests=8), 4 * GiB,
                                  elastic(80 * MiB))
    assert info.value.kind == "elastic_max"


@pytest.mark.sglang
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reserve=st.integers(min_value=24 * MiB, max_value=160 * MiB),
    requests=st.integers(1, 24),
    ratio=st.one_of(st.none(), st.sampled_from([0.1, 0.25, 0.5])),
    maximum=st.integers(min_value=14 * MiB, max_value=2 * GiB),
)
def test_the_plan_equals_what_sglang_builds_for_the_planned_budget(server_args, reserve, requests, ratio, maximum):
    flags = dict(max_running_requests=requests)
    if ratio is not None:
        flags["swa_full_tokens_ratio"] = ratio
    kvc = kv_cache_configurator(TINY, server_args(**flags))
    live = hooks.live_settings(kvc)
    try:
        plan = closed.budget_for_reserve(TINY, live, reserve, elastic(maximum))
    except PlanError as exc:
        assert exc.kind is None or exc.kind == "elastic_max"
        return
    real = real_sizes(kvc, plan.budget)
    assert (plan.tokens.full, plan.tokens.swa) == (real.max_total_num_tokens, real.swa_max_total_num_tokens)
    tensors = real_tensors(kvc, real)
    swa = [n for pool, n in tensors if pool == "swa"]
    e = plan.elastic["swa"]
    assert swa == [e.pages * e.page_bytes] * e.layers  # SGLang's SWA tensors are what the reservation views
    static = footprint(n for pool, n in tensors if pool != "swa")
    assert plan.total_footprint == static + e.pinned <= reserve
    assert e.limit <= min(maximum, e.virtual - e.pinned) and e.limit % (e.layers * CHUNK) == 0
    assert plan.pools[REQ_TO_TOKEN].bytes == dict(tensors)[REQ_TO_TOKEN]


def test_plan_with_a_policy_plans_the_elastic_swa_pool(tmp_path, capsys):
    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\n\ngpu "cuda:0" { chunk 4 MiB }\n\nmodel "deepseek-v4-flash" {\n  engine sglang\n'
                      '  reserve 40 GiB\n  min 2 GiB\n  max 10%\n  pool swa { owner elastic; max 12 GiB }\n}\n')
    code = main(["plan", "--policy", str(policy), "--model", "deepseek-v4-flash", "--model-config", str(FLASH),
                 "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    e = out["elastic"]["swa"]
    group = 43 * 4 * MiB
    h200 = 143_771 * MiB  # the GPU planned for: the model's 10% of it is 14 GiB, above the pool's own max
    assert h200 // 10 > 12 * GiB
    assert e["chunk"] == 4 * MiB and e["limit"] == 12 * GiB // group * group
    assert e["guarantee"] == 2 * GiB // group * group
    assert out["total_footprint"] <= 40 * GiB and out["pools"]["swa"]["footprint"] == e["pinned"] == group
    code = main(["plan", "--policy", str(policy), "--model", "deepseek-v4-flash", "--model-config", str(FLASH)])
    text = capsys.readouterr().out
    assert code == 0 and "swa: elastic, on kvpolicy's allocator" in text


def test_plan_refuses_an_elastic_swa_pool_with_tensor_parallel(tmp_path, capsys):
    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\nmodel "m" {\n  engine sglang\n  reserve 40 GiB\n  pool swa { owner elastic }\n}\n')
    code = main(["plan", "--policy", str(policy), "--model", "m", "--model-config", str(FLASH), "--tp-size", "8"])
    assert code == 1 and "needs --tp-size 1" in capsys.readouterr().err
