"""The give-back policy's decisions, without arenas: the target, the delay period, pressure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.alloc.giveback import (
    ContentionWindow,
    GiveBack,
    IdlePeriod,
    IdleWindow,
    groups_within,
    held_through_hold,
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
    # A give-back bounded per sync takes part of it: the rest stays due in the same period.
    assert IdlePeriod(10.0, 5).less(3) == IdlePeriod(10.0, 2) and IdlePeriod(10.0, 5).less(9) == IdlePeriod(10.0, 0)


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


def test_an_idle_window_knows_what_stayed_free_through_a_whole_hold() -> None:
    w = IdleWindow(0.0).noting(0.5, 6, hold=2.0).noting(1.5, 4, hold=2.0)
    assert w.idle_through() == 0  # no whole hold period yet
    w = w.noting(2.0, 9, hold=2.0)  # the first period (least 4) is complete; a new one starts at 2.0
    assert w == IdleWindow(2.0, 9, 4) and w.idle_through() == 4
    assert w.noting(3.0, 1, hold=2.0).idle_through() == 1  # freed memory taken again: only 1 stayed free
    assert w.less(3) == IdleWindow(2.0, 6, 1) and w.less(20).idle_through() == 0  # given back: no longer idle here


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), sizes), min_size=1, max_size=15), st.floats(0.1, 2))
def test_idle_through_never_exceeds_what_was_free_at_any_sync_of_the_last_hold(
    steps: list[tuple[float, int]], hold: float
) -> None:
    t, w, seen = 0.0, IdleWindow(0.0), []
    for dt, idle in steps:
        t += dt
        w = w.noting(t, idle, hold)
        seen.append((t, idle))
    through = w.idle_through()
    if through:
        assert t >= hold  # a whole hold period passed
        recent = [idle for at, idle in seen if at >= t - hold]
        assert through <= min(recent)


@settings(max_examples=300, deadline=None)
@given(keep=sizes, held=sizes, target=sizes, idle=sizes)
def test_under_a_hold_only_memory_idle_through_it_goes_below_the_target(keep: int, held: int, target: int, idle: int) -> None:
    idle = min(idle, held)
    kept = held_through_hold(keep, held=held, target=target, idle_through=idle)
    assert kept >= keep
    assert held - kept <= max(idle, held - max(target, keep))  # below the target, at most what stayed idle


def test_the_contention_window_opens_for_its_seconds_at_each_move_of_the_counter() -> None:
    now = [0.0]
    window = ContentionWindow(0.25, pressure=3, clock=lambda: now[0])
    window.note(3)
    assert not window.is_open()  # the counter as it was at the start: nobody refused since
    window.note(4)
    now[0] = 0.2
    assert window.is_open()
    window.note(4)  # no move: the window is not extended
    now[0] = 0.25
    assert not window.is_open()
    window.note(9)
    assert window.is_open()
    now[0] = 0.49
    assert window.is_open()
    never = ContentionWindow(0.0, clock=lambda: now[0])
    never.note(1)
    assert not never.is_open()
    with pytest.raises(ValueError, match="yield_above_target_s must be >= 0"):
        ContentionWindow(-1.0)


def test_a_bound_in_chunks_becomes_whole_chunk_groups_at_least_one() -> None:
    """The adapters bound a give-back in chunks (each one unmap and release); a group is one chunk in
    every arena, so the bound is the groups whose chunks fit it, but never none."""
    assert groups_within(None, 36) is None
    assert groups_within(128, 1) == 128
    assert groups_within(128, 36) == 3  # 108 chunks
    assert groups_within(35, 36) == 1  # one group of 36: more than the bound, or nothing would go
    for chunks, arenas in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            groups_within(chunks, arenas)
