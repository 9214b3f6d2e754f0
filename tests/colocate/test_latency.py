"""TTFT, SLO attainment and driver work per token: the figures the co-location report headlines.

Pure computations on hand-made figures (``latency.py``, ``report.py``), and the engine's
stamping of first tokens and gaps on a step-by-step run whose times the test chooses.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "colocate"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from latency import attainment, meets_slo, percentile
from report import driver_work_per_1k, pooled, ratios, serving_table


def test_percentile_is_the_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.2) == 1.0 and percentile(values, 0.21) == 2.0
    assert percentile(values, 1.0) == 5.0
    hundred = [float(i) for i in range(1, 101)]
    assert percentile(hundred, 0.99) == 99.0 and percentile(hundred, 0.50) == 50.0
    assert percentile([float(i) for i in range(700)], 0.99) == 692.0  # 0.99 × 700 is 693 ranks, not 694
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError):
        percentile(values, 0.0)


def test_the_slo_needs_both_the_first_token_and_every_gap_in_time() -> None:
    assert meets_slo(2.0, 0.05, ttft_s=2.0, gap_s=0.05)  # at the bounds: met
    assert not meets_slo(2.01, 0.01, ttft_s=2.0, gap_s=0.05)
    assert not meets_slo(0.1, 0.051, ttft_s=2.0, gap_s=0.05)
    assert attainment(3, 1) == 0.75 and attainment(0, 0) is None


def _tenant(tokens: int, *, mapped: int, at_start: int, unmapped: int, ttft: list[float], met: int, missed: int,
            preempted: int = 0, arenas: int = 1) -> dict:
    return {"tokens": tokens, "preempted": preempted, "step_ms_p50": 1.0, "step_ms_p99": 2.0,
            "ttft_ms_p50": 1000 * percentile(ttft, 0.5), "ttft_ms_p99": 1000 * percentile(ttft, 0.99), "ttft_s": ttft,
            "slo": {"met": met, "missed": missed, "attainment": attainment(met, missed)},
            "groups_mapped": mapped, "groups_unmapped": unmapped, "groups_mapped_at_start": at_start,
            "arenas": arenas, "regrowths": 0}


def test_driver_work_per_1k_tokens_leaves_out_start_up_and_counts_every_arena() -> None:
    t = _tenant(20_000, mapped=164, at_start=64, unmapped=40, ttft=[0.1], met=1, missed=0)
    assert driver_work_per_1k(t) == (5.0, 2.0)  # 100 mapped after start-up, 40 unmapped, per 20k tokens
    t2 = _tenant(20_000, mapped=164, at_start=64, unmapped=40, ttft=[0.1], met=1, missed=0, arenas=4)
    assert driver_work_per_1k(t2) == (20.0, 8.0)  # a group is one chunk per arena
    assert driver_work_per_1k({**t, "groups_mapped_at_start": None}) is None  # a run from before it was counted
    assert driver_work_per_1k({**t, "tokens": 0}) is None


def test_the_modes_pooled_and_against_static() -> None:
    static = {
        "a": _tenant(10_000, mapped=256, at_start=256, unmapped=0, ttft=[1.0, 3.0, 9.0], met=1, missed=3, preempted=4),
        "b": _tenant(30_000, mapped=256, at_start=256, unmapped=0, ttft=[0.5], met=1, missed=1, preempted=0),
    }
    kv = {
        "a": _tenant(20_000, mapped=164, at_start=64, unmapped=40, ttft=[0.2, 0.3, 0.4, 1.0], met=3, missed=1, preempted=6),
        "b": _tenant(30_000, mapped=94, at_start=64, unmapped=30, ttft=[0.5], met=2, missed=0, preempted=2),
    }
    p = pooled(kv)
    assert p["tokens"] == 50_000 and p["preempted"] == 8
    assert p["ttft_ms_p50"] == pytest.approx(400.0) and p["ttft_ms_p99"] == pytest.approx(1000.0)  # over both tenants' requests
    assert p["slo_attainment"] == pytest.approx(5 / 6)
    assert p["map_unmap_per_1k_tokens"] == pytest.approx(1000 * (140 + 60) / 50_000)  # chunks over tokens, all tenants
    assert pooled(static)["map_unmap_per_1k_tokens"] == 0.0  # a static pool maps at start-up only
    r = ratios(static, kv)
    assert r["tokens"] == pytest.approx(50_000 / 40_000)
    assert r["preempted"] == (4, 8) and r["preempted_ratio"] == 2.0
    assert r["ttft_p99"] == pytest.approx(1.0 / 9.0)
    assert r["slo"] == pytest.approx((5 / 6) / (2 / 6))
    assert r["tenants"]["a"]["slo"] == pytest.approx(0.75 / 0.25)
    assert r["tenants"]["a"]["map_unmap_per_1k_tokens"] == pytest.approx(7.0)
    table = serving_table({"static": static, "kvpolicy": kv})
    assert "| a | kvpolicy | 20,000 | 6 | 1.00 / 2.00 | 0.30 / 1.00 | 75.0% | 5.0 / 2.0 |" in table
    assert "| all | kvpolicy | 50,000 | 8 | | 0.40 / 1.00 | 83.3% | 4.0 (both) |" in table


@pytest.mark.parametrize(("clock", "met"), [(None, 1), ([0.0, 0.01, 0.2], 0)], ids=["step-times", "late-token"])
def test_the_engine_stamps_first_tokens_and_gaps(clock: list[float] | None, met: int) -> None:
    """Two requests on a pool of 4 blocks (the token clock is read once a step): one runs (first token
    in the step after its admission),
    the other waits for memory and its client leaves. With a token clock that puts the second token
    190 ms after the first, the running one misses the 50 ms gap."""
    pytest.importorskip("torch", reason="the engine's KV work is torch work over the pool's views")
    pytest.importorskip("numpy")
    from engine import Engine
    from kvwork import KVWork
    from traces import Request

    from params import load_params

    from kvpolicy.alloc import BlockPool, StaticLimit, open_driver

    p = load_params(Path(__file__).resolve().parent / "small.toml")
    pool = BlockPool(open_driver("host", host_capacity=64 << 20), p.kv.layout, 4, chunk=p.kv.chunk,
                     limit=StaticLimit(2 << 20), name="t")
    pool.ensure_mapped(range(4))
    work = KVWork(pool, attn_layers=1, max_batch=8, window=1)
    reqs = [Request(key=1, arrival=0.0, prompt=16, output=2), Request(key=2, arrival=0.0, prompt=64, output=2)]
    times = iter(clock or ())
    token_clock: Callable[[], float] | None = None if clock is None else (lambda: next(times))
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=8, prefill_tokens_per_step=1024,
                    max_running=8, patience_s=0.015, token_clock=token_clock, slo_ttft_s=2.0, slo_gap_s=0.05)
    for t in (0.0, 0.01, 0.02):
        engine.step(t)
    s = engine.summary()
    assert (s["completed"], s["abandoned"]) == (1, 1)
    assert s["ttft_s"] == [0.01] and s["ttft_ms_p50"] == pytest.approx(10.0)  # admitted at 0.00, first token at 0.01
    assert s["slo"]["met"] == met and s["slo"]["missed"] == 2 - met  # the abandoned one always misses
    assert s["slo"]["attainment"] == met / 2
    del work
    pool.close()


def test_issue_17s_goals_from_the_ratios() -> None:
    from report import issue17_goals

    clean = {"oom": 0, "corrupted": 0}
    r = {"step_p99_max": 1.5, "step_p50_max": 1.21, "tokens": 1.6, "preempted_ratio": 1.3, "ttft_p99": 0.5, "slo": 1.49}
    g = issue17_goals(r, clean, clean)
    assert g["i17_step_p99_at_most_1.5x"] and not g["i17_step_p50_at_most_1.2x"]
    assert g["i17_tokens_at_least_1.0x"] and g["i17_bursty_tokens_at_least_1.5x"]
    assert not g["i17_preempted_at_most_1.25x"] and g["i17_bursty_ttft_p99_2x_lower"] and not g["i17_bursty_slo_at_least_1.5x"]
    assert g["i17_zero_oom_corrupted"] and not issue17_goals(r, clean, {"oom": 1, "corrupted": 0})["i17_zero_oom_corrupted"]
    assert not issue17_goals({**r, "ttft_p99": None}, clean, clean)["i17_bursty_ttft_p99_2x_lower"]  # no TTFT: not met


def test_the_old_allocator_is_the_parameters_without_issue_17s_levers() -> None:
    """``--mode kvpolicy-old`` and simulate.py's kvpolicy-old run: the same trace, budget and
    give-back delay, with no hold, no reserve, the old pressure floor and the static chunk."""
    from params import load_params

    p = load_params(BENCH / "default.toml")
    old = p.old_allocator()
    e = old.engine
    assert (e.give_back_hold_s, e.reserve_blocks, e.pressure_keeps_reserve) == (0.0, 0, False)
    assert (e.map_between_steps, e.yield_above_target_s, e.driver_chunks_between_steps) == (False, 0.0, None)
    assert old.kv.elastic_chunk_bytes == old.kv.chunk == p.kv.chunk  # elastic pools map by the static pools' chunk
    assert (old.trace, old.budget, old.policy, old.engine.give_back_delay_s) == (p.trace, p.budget, p.policy, p.engine.give_back_delay_s)
    assert p.engine.reserve_blocks and p.engine.pressure_keeps_reserve and p.engine.map_between_steps  # the new set differs
    assert p.engine.yield_above_target_s > 0 and p.engine.driver_chunks_between_steps
    assert p.kv.elastic_chunk_bytes == 8 << 20
    assert p.old_allocator().old_allocator() == old
