"""The simulated clock's statistics: the drain after the policy edit, and the ratios over many seeds.

A single trace's ratio swings by a few percent with its seed (which requests a full pool
admits or lets go), so a lever is judged on the mean over seeds; and a lever that gains
tokens by never moving memory to the edit's new targets must show that it does not.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "colocate"
SMALL = Path(__file__).resolve().parent / "small.toml"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from analysis import drain_after_edit, drain_tolerance, drains_after_edit
from simulate import longest_drain, seed_range, seed_summary

MiB = 1 << 20


def _tenant(rows: list[list[float]]) -> dict:
    return {"samples": {"columns": ["t", "held", "target"], "rows": rows}, "pool": {"block_bytes": 2 * MiB, "group_bytes": 8 * MiB}}


def test_the_drain_runs_from_the_edit_to_the_first_sample_within_the_new_target() -> None:
    rows = [[9.9, 22 * MiB, 22 * MiB], [10.0, 22 * MiB, 22 * MiB], [10.1, 22 * MiB, 10 * MiB],
            [12.0, 15 * MiB, 10 * MiB], [14.5, 11 * MiB, 10 * MiB], [15.0, 9 * MiB, 10 * MiB]]
    assert drain_after_edit(_tenant(rows), 10.0, tolerance=1 * MiB) == {"held": 22 * MiB, "target": 10 * MiB, "seconds": 4.5}
    assert drain_after_edit(_tenant(rows), 10.0, tolerance=0)["seconds"] == 5.0  # 11 MiB is above a 10 MiB target
    never = rows[:4]
    assert drain_after_edit(_tenant(never), 10.0, tolerance=0)["seconds"] is None  # above it until the run ended
    within = [[10.0, 8 * MiB, 10 * MiB], [10.5, 9 * MiB, 12 * MiB], [11.5, 20 * MiB, 12 * MiB]]
    assert drain_after_edit(_tenant(within), 10.0, tolerance=0) is None  # the edit left it within; later growth is not a drain


def test_a_pool_at_its_target_may_keep_its_reserve_and_one_growth_step() -> None:
    pool = {"block_bytes": 2 * MiB, "group_bytes": 8 * MiB}
    assert drain_tolerance(pool, 0) == 8 * MiB
    assert drain_tolerance(pool, 64) == 128 * MiB + 8 * MiB
    assert drain_tolerance(pool, 5) == 16 * MiB + 8 * MiB  # 10 MiB of reserve is two whole growth steps
    held = [[0.0, 48 * MiB, 48 * MiB], [0.5, 48 * MiB, 16 * MiB], [1.0, 41 * MiB, 16 * MiB], [3.0, 16 * MiB + 24 * MiB, 16 * MiB]]
    tenants = {"a": _tenant(held), "b": _tenant([[0.5, 8 * MiB, 16 * MiB]])}
    assert drains_after_edit(tenants, 0.5, reserve_blocks=8) == {"a": {"held": 48 * MiB, "target": 16 * MiB, "seconds": 2.5}}


def test_seed_ranges() -> None:
    assert seed_range("1-4") == [1, 2, 3, 4] and seed_range("7") == [7]
    for bad in ("4-1", "a-b", "1-"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_range(bad)


def _figures(tokens: int, preempted: int, met: int, drained: dict | None = None) -> dict:
    return {"t": {"tokens": tokens, "preempted": preempted, "slo": {"met": met, "missed": 100 - met}, "drained": drained}}


def test_the_summary_is_the_mean_and_standard_error_of_the_per_seed_ratios() -> None:
    per_seed = {
        1: {"static": _figures(1000, 10, 20), "kvpolicy": _figures(1100, 5, 30, {"held": 2, "target": 1, "seconds": 4.0}),
            "kvpolicy-old": _figures(1000, 20, 20, {"held": 2, "target": 1, "seconds": None})},
        2: {"static": _figures(2000, 10, 40), "kvpolicy": _figures(1800, 10, 40),
            "kvpolicy-old": _figures(2000, 30, 40)},
    }
    s = seed_summary(per_seed)
    assert s["kvpolicy"]["tokens"]["values"] == pytest.approx([1.1, 0.9])
    assert s["kvpolicy"]["tokens"]["mean"] == pytest.approx(1.0)
    assert s["kvpolicy"]["tokens"]["se"] == pytest.approx(0.1)  # stdev 0.1414 over √2
    assert s["kvpolicy"]["preempted"]["mean"] == pytest.approx(0.75) and s["kvpolicy"]["slo"]["values"] == pytest.approx([1.5, 1.0])
    assert s["kvpolicy"]["drain_s"] == {"max": 4.0, "values": [4.0, None]}
    assert s["kvpolicy-old"]["drain_s"]["max"] == math.inf  # a pool never drained: no token figure makes up for it
    assert s["paired"]["tokens"]["values"] == pytest.approx([0.1, -0.1])
    assert longest_drain(per_seed[2]["kvpolicy"]) is None


def test_many_seeds_on_the_simulated_clock_agree_with_single_runs(tmp_path: Path) -> None:
    """``--seeds 0-1``: seed 0 is the trace file's own, so its ratio is the single run's; seed 1 is another trace."""
    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, str(BENCH / "simulate.py"), "--params", str(SMALL), "--no-old", *args],
                              capture_output=True, text=True, check=False, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout

    run("--json", str(tmp_path / "one.json"))
    one = json.loads((tmp_path / "one.json").read_text())["runs"]
    out = run("--seeds", "0-1", "--json", str(tmp_path / "many.json"))
    many = json.loads((tmp_path / "many.json").read_text())
    assert many["seeds"] == [0, 1] and "over 2 seeds (0–1)" in out
    tokens = {mode: sum(t["tokens"] for t in one[mode].values()) for mode in ("static", "kvpolicy")}
    values = many["summary"]["kvpolicy"]["tokens"]["values"]
    assert values[0] == pytest.approx(tokens["kvpolicy"] / tokens["static"])
    assert values[1] != pytest.approx(values[0])  # another seed is another trace
    assert many["summary"]["kvpolicy"]["tokens"]["mean"] == pytest.approx(sum(values) / 2)
    # The small trace's edit swaps two tenants' weights: the one that lost its share drains to its new target.
    drained = {n: t["drained"] for n, t in one["kvpolicy"].items() if t.get("drained")}
    assert drained and all(d["seconds"] is not None and d["held"] > d["target"] for d in drained.values()), drained


def test_the_pooled_yardstick_is_one_shared_pool_without_a_policy() -> None:
    """``pooled`` (a reference, not kvpolicy): no tenant keeps a guarantee, each may take the whole
    budget, and memory goes back the step it is freed — so what one tenant frees, another can have."""
    from dsv4 import planned, policy_reserve
    from params import load_params
    from simulate import pooled_reference, simulate

    params = load_params(SMALL)
    reference = pooled_reference(params)
    e = reference.engine
    assert (e.give_back_delay_s, e.give_back_hold_s, e.reserve_blocks, e.yield_above_target_s) == (0, 0, 0, 0)
    assert not e.map_between_steps and reference.kv.elastic_chunk_bytes == reference.kv.chunk
    reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint
    result = simulate(reference, "pooled", reserved)
    assert set(result) == set(params.tenants)
    for name, s in result.items():
        assert s["groups_mapped_at_start"] == 0, name  # no guarantee mapped up front
        assert s["groups_unmapped"] > 0 and s["tokens"] > 0, name  # it served, and gave memory back
        assert s["arrived"] == s["completed"] + s["abandoned"] + s["running_at_end"] + s["waiting_at_end"], name
        assert "drained" not in s  # no policy, so no edit to carry out


@pytest.mark.parametrize("published", [True, False])
def test_a_simulated_pool_keeps_the_guarantee_it_is_published_under_pressure(published: bool) -> None:
    """The controller publishes each instance's guarantee with its limit and target, and a pool under
    pressure gives back only what lies above it — as a ledger-backed pool does. An idle pool whose
    reading carried no guarantee (the simulation before) gave its guarantee to the busy ones."""
    from types import SimpleNamespace

    from params import load_params
    from simulate import SharedBudget, publish

    from kvpolicy.alloc import BlockPool, open_driver

    params = load_params(SMALL)
    kv, guarantee = params.kv, 8 * MiB
    budget = SharedBudget(params.budget.elastic)
    source = budget.source("idle", guarantee)
    decision = SimpleNamespace(limit=params.budget.elastic, target=guarantee, guarantee=guarantee if published else 0)
    assert publish(source, decision, 0) == 1 and publish(source, decision, 1) == 1  # one revision per change
    assert source.reading.guarantee == decision.guarantee
    now = [0.0]
    driver = open_driver("host", host_capacity=2 * params.budget.elastic)
    with BlockPool(driver, kv.layout, params.elastic_blocks, chunk=kv.elastic_chunk_bytes, limit=source, name="idle",
                   give_back_under_pressure=True, give_back_hold_s=0.5, clock=lambda: now[0]) as pool:
        pool.ensure_mapped(range(guarantee // pool.block_bytes))
        assert pool.held_bytes == guarantee and pool.used_bytes == 0
        for step in range(1, 301):  # 3 s of 10 ms steps; every step another tenant is refused for the budget
            now[0] = step / 100
            budget.refused("busy", 1)
            pool.sync()
        if published:
            assert pool.held_bytes == guarantee
        else:  # all but one growth step went back (``pressure_floor``)
            assert pool.held_bytes == pool.mapping.group_bytes < guarantee


def test_a_random_step_order_is_drawn_from_its_seed() -> None:
    """``--order-seed``: each step takes the tenants in an order drawn from the seed, so one seed is
    one run, again and again; static pools never meet, so their run is the same in any order."""
    from dsv4 import planned, policy_reserve
    from params import load_params
    from simulate import simulate

    params = load_params(SMALL)
    reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint

    def served(result: dict[str, dict]) -> dict[str, tuple[int, int, int]]:
        return {n: (s["tokens"], s["completed"], s["preempted"]) for n, s in result.items()}

    assert served(simulate(params, "static", reserved, order_seed=5)) == served(simulate(params, "static", reserved))
    runs = {seed: served(simulate(params, "kvpolicy", reserved, order_seed=seed)) for seed in (None, 5, 6, 7)}
    assert served(simulate(params, "kvpolicy", reserved, order_seed=5)) == runs[5]
    outcomes = {tuple(r.values()) for r in runs.values()}
    assert len(outcomes) > 1, runs  # in kvpolicy mode the pools meet: who steps first can take what another gave back


def test_a_late_step_costs_the_intervals_its_driver_time_fills() -> None:
    """``DriverCost``: time past the step's interval is lost, as the device's pacing loses it
    (a late step is not made up for), a whole interval per lost step, the remainder carried."""
    from simulate import DriverCost, Pacing

    step = 0.010
    paced = Pacing(DriverCost(us_per_chunk=1000, step_busy_ms=2))
    assert not paced.skips(step)
    paced.ran(7, step)  # 2 + 7 ms: within the interval
    assert paced.late_s == 0 and not paced.skips(step)
    paced.ran(33, step)  # 2 + 33 ms: 25 ms past it, two whole intervals and half of one
    assert [paced.skips(step) for _ in range(3)] == [True, True, False]
    paced.ran(13, step)  # 5 ms more: with the 5 carried, one more interval
    assert paced.skips(step) and not paced.skips(step)
    assert paced.lost == 3 and paced.late_s == pytest.approx(0)
    free = Pacing(None)
    free.ran(10**6, step)
    assert not free.skips(step) and free.lost == 0


def test_driver_time_costs_the_elastic_tenants_steps_and_static_none() -> None:
    """With ``driver_cost`` the tenants that map and unmap lose steps and the tokens those would have
    served; static pools, mapped before the trace starts, lose none and serve exactly what they did."""
    from dsv4 import planned, policy_reserve
    from params import load_params
    from simulate import DriverCost, simulate

    params = load_params(SMALL)
    reserved = planned(params, policy_reserve(params, params.policy)[0]).total_footprint
    cost = DriverCost(us_per_chunk=20_000)  # two intervals a chunk: a step that maps or unmaps is late

    def served(result: dict[str, dict]) -> dict[str, tuple[int, int, int]]:
        return {n: (s["tokens"], s["completed"], s["steps"]) for n, s in result.items()}

    free, paid = simulate(params, "static", reserved), simulate(params, "static", reserved, driver_cost=cost)
    assert served(paid) == served(free) and all(t["steps_lost"] == 0 for t in paid.values())
    free, paid = simulate(params, "kvpolicy", reserved), simulate(params, "kvpolicy", reserved, driver_cost=cost)
    assert all(t["steps_lost"] == 0 for t in free.values())
    for name in params.tenants:
        ops = paid[name]["groups_mapped"] - paid[name]["groups_mapped_at_start"] + paid[name]["groups_unmapped"]
        assert ops and paid[name]["steps_lost"], name
        assert paid[name]["steps"] + paid[name]["steps_lost"] == free[name]["steps"], name
    assert sum(t["tokens"] for t in paid.values()) < sum(t["tokens"] for t in free.values())
