"""The give-back policy's decisions, without arenas: the target, the delay period, pressure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.alloc.giveback import (
    GiveBack,
    IdlePeriod,
    idle_above_target,
    keep_under_pressure,
    pressure_floor,
)

G = 4  # bytes per chunk group, small so that hypothesis covers the rounding
sizes = st.integers(0, 40 * G)


def test_idle_above_target_is_free_memory_above_both_target_and_use() -> None:
    assert idle_above_target(held=10, used=3, target=6) == 4
    assert idle_above_target(held=10, used=8, target=6) == 2  # live blocks above the target are not idle
    assert idle_above_target(held=5, used=3, target=6) == 0


def test_a_period_keeps_the_least_idle_seen_and_gives_it_back_when_over() -> None:
    period = IdlePeriod(start=10.0).noting(8).noting(5).noting(7)
    assert period == IdlePeriod(10.0, 5)
    assert not period.over(10.9, delay=1.0) and period.over(11.0, delay=1.0)
    assert period.keep(held=20, target=6) == 15  # the 5 bytes idle through the whole period go
    assert period.keep(held=8, target=6) == 6  # never below the target
    assert IdlePeriod(10.0, 0).keep(held=20, target=6) is None  # nothing stayed idle: nothing goes
    assert IdlePeriod(10.0).keep(held=20, target=6) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(sizes, sizes), min_size=1, max_size=12), sizes)
def test_at_the_end_of_a_period_what_stayed_idle_throughout_goes(samples: list[tuple[int, int]], target: int) -> None:
    """Samples (held, used) seen at the syncs of one period: the last sync gives back the least idle."""
    samples = [(held, min(used, held)) for held, used in samples]
    period = IdlePeriod(0.0)
    for held, used in samples:
        period = period.noting(idle_above_target(held, used, target))
    held, used = samples[-1]
    least = min(max(0, h - max(target, u)) for h, u in samples)
    keep = period.keep(held, target)
    if least == 0:
        assert keep is None
    else:
        assert keep == max(target, held - least)
        assert held - keep <= idle_above_target(held, used, target)  # never memory in use now


@settings(max_examples=300, deadline=None)
@given(used=sizes, guarantee=sizes, grow_chunks=st.integers(1, 4))
def test_pressure_keeps_use_in_whole_groups_plus_a_growth_step_never_below_the_guarantee(
    used: int, guarantee: int, grow_chunks: int
) -> None:
    floor = pressure_floor(used, guarantee, group_bytes=G, grow_chunks=grow_chunks)
    assert floor >= guarantee and floor >= used + grow_chunks * G
    if floor > guarantee:
        assert floor % G == 0 and floor - grow_chunks * G - used < G  # the use rounded up to one group, no more


def test_pressure_takes_nothing_from_a_starved_or_deferred_pool_nor_without_news() -> None:
    args = dict(used=5, guarantee=0, group_bytes=G, grow_chunks=1)
    assert keep_under_pressure(pressed=True, starved=False, deferred=False, **args) == 3 * G
    assert keep_under_pressure(pressed=False, starved=False, deferred=False, **args) is None
    assert keep_under_pressure(pressed=True, starved=True, deferred=False, **args) is None
    assert keep_under_pressure(pressed=True, starved=False, deferred=True, **args) is None


def test_the_policy_sees_pressure_and_refusals_as_news_only_once_started() -> None:
    policy = GiveBack(group_bytes=G, pressure=7, refusals=2, clock=lambda: 0.0)
    assert not policy.pressed(7) and policy.pressed(8)
    assert not policy.starved(2) and policy.starved(3)
    assert not GiveBack(group_bytes=G, under_pressure=False).pressed(8)
