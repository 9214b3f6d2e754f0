"""When an elastic pool gives memory back, and how much: pure decisions, and the state they carry between syncs.

Every ``sync()`` of a pool first applies the limit in force (a lowered limit is never
delayed: ``ChunkMapping.apply``, then a deferral continues), then gives back for two
reasons, each a decision here of how many bytes to keep:

- **Above the target.** The fully free chunks held above the target go: at once by
  default, or with a give-back delay of ``D`` seconds only the memory that stayed free
  above the target through a whole period of ``D`` (the least seen at any sync of the
  period). A busy engine above its target frees a finished request's blocks and takes
  them again a step or two later; the delay keeps those chunks mapped instead of
  unmapping and mapping them again.
- **Under pressure.** When another instance's elastic admission was refused for the
  GPU's budget, the limit source's ``pressure()`` counter moves; the next sync gives
  back the free memory beyond what the pool uses (whole chunk groups) plus one growth
  step, never below its guarantee (memory no one else could take). Memory below the
  target is otherwise kept mapped, as a warm cache. A pool whose own admission was
  refused since its last sync is the one short of memory and gives nothing back; nor
  does one whose lowered limit is deferred (the deferral is shrinking it already).

Two settings keep a pool from giving memory back only to map it again (the tug of war
of busy pools under full contention):

- **A hold time** (``hold_s``): under pressure, memory below the target goes back only
  if it stayed free (held and in no live block) through a whole hold period — a quiet
  engine's idle cache, not the blocks a busy one freed a step ago and takes again the
  next. Memory above the target goes at once, as before.
- **A reserve** (``reserve_bytes``): what a pool maps ahead of demand (``BlockPool.top_up``)
  and keeps free beyond its use when it gives back above the target, so a busy engine
  takes blocks from mapped memory and the step rarely waits on the driver. Pressure
  takes it like any free memory; the reserve is not refilled for a hold time after.

One setting bounds new work instead of giving back: **yield above the target**
(``yield_above_target_s``): for that long after a sync saw the pressure counter move, new
work takes the pool's memory only up to its target (``BlockPool.admission_room``), so a
busy pool above its target drains to it and pressure finds the memory it frees.

One setting bounds how much goes at once: **a bound per sync** (``release_chunks``): at most
that many chunk groups go back at one sync, above the target and under pressure together, the
rest at the next syncs (``held_back`` says some is left), so the driver's time between two of an
engine's steps stays bounded. A lowered limit is applied whole.

The functions decide; ``GiveBack`` keeps their state (the period, the pressure and
refusals last seen) and carries the decisions out on a ``ChunkMapping``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpolicy.alloc.mapping import ChunkMapping


def idle_above_target(held: int, used: int, target: int) -> int:
    """Bytes held above the target that no live block uses: what could go back for the target now."""
    return max(0, held - max(target, used))


@dataclass(frozen=True)
class IdlePeriod:
    """One period of a give-back delay: when it started, and the least idle memory above the target seen in it."""

    start: float
    least_idle: int | None = None

    def noting(self, idle: int) -> IdlePeriod:
        """The period after a sync that saw ``idle`` bytes free above the target."""
        return IdlePeriod(self.start, idle if self.least_idle is None else min(self.least_idle, idle))

    def over(self, now: float, delay: float) -> bool:
        return now - self.start >= delay

    def keep(self, held: int, target: int) -> int | None:
        """At the period's end: give back down to this (None: nothing), the memory idle through all of it."""
        return max(target, held - self.least_idle) if self.least_idle else None

    def less(self, gone: int) -> IdlePeriod:
        """The period after ``gone`` of its idle bytes were given back: the rest is still due."""
        return IdlePeriod(self.start, None if self.least_idle is None else max(0, self.least_idle - gone))


@dataclass(frozen=True)
class IdleWindow:
    """The least memory held and not in use seen over two back-to-back periods of the hold time:
    ``previous`` (complete; None while the first period runs) and ``current`` (since ``start``)."""

    start: float
    current: int | None = None
    previous: int | None = None

    def noting(self, now: float, idle: int, hold: float) -> IdleWindow:
        """The window after a sync at ``now`` that saw ``idle`` bytes free."""
        if now - self.start >= hold:
            done = idle if self.current is None else min(self.current, idle)
            return IdleWindow(now, idle, done)
        return IdleWindow(self.start, idle if self.current is None else min(self.current, idle), self.previous)

    def less(self, gone: int) -> IdleWindow:
        """The window after ``gone`` of the idle bytes were given back (what stays idle still counts)."""
        def minus(v: int | None) -> int | None:
            return None if v is None else max(0, v - gone)

        return IdleWindow(self.start, minus(self.current), minus(self.previous))

    def idle_through(self) -> int:
        """Bytes free at every sync of at least one whole hold period (0 before one completed)."""
        if self.previous is None:
            return 0
        return self.previous if self.current is None else min(self.previous, self.current)


def held_through_hold(keep: int, *, held: int, target: int, idle_through: int) -> int:
    """Under pressure with a hold time: keep at least what is below the target and was not free
    through the whole hold period (above the target, ``keep`` stands)."""
    return max(keep, min(target, held - idle_through))


def pressure_floor(used: int, guarantee: int, *, group_bytes: int, grow_chunks: int) -> int:
    """What a pool keeps when another instance is short of memory: its use in whole chunk groups
    plus one growth step, never less than its guarantee."""
    in_use = -(-used // group_bytes) * group_bytes
    return max(guarantee, in_use + grow_chunks * group_bytes)


def keep_under_pressure(
    *,
    pressed: bool,
    starved: bool,
    deferred: bool,
    used: int,
    guarantee: int,
    group_bytes: int,
    grow_chunks: int,
) -> int | None:
    """Bytes to give back down to for another instance's refusal (None: nothing).

    ``pressed``: the pressure counter moved since the last look; ``starved``: this pool's
    own admission was refused since then; ``deferred``: its lowered limit is deferred.
    """
    if not pressed or starved or deferred:
        return None
    return pressure_floor(used, guarantee, group_bytes=group_bytes, grow_chunks=grow_chunks)


class ContentionWindow:
    """Whether the GPU's budget refused an instance memory within the last ``seconds``, as far as the
    limit source's pressure counter, handed to ``note`` now and then, can tell: the window opens
    for ``seconds`` at each ``note`` that sees the counter moved since the one before. Never
    open with ``seconds`` 0. (``yield_above_target_s``: new work yields above the target while
    it is open.)"""

    def __init__(self, seconds: float, pressure: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds < 0:
            raise ValueError(f"yield_above_target_s must be >= 0, got {seconds}")
        self.seconds = seconds
        self._seen = pressure
        self._clock = clock
        self._until = float("-inf")

    def note(self, pressure: int) -> None:
        """The pressure counter now."""
        if self.seconds and pressure != self._seen:
            self._until = self._clock() + self.seconds
        self._seen = pressure

    def is_open(self) -> bool:
        return self._clock() < self._until


def groups_within(chunks: int | None, arenas: int) -> int | None:
    """The chunk groups one give-back may release so that it unmaps at most ``chunks`` chunks, where a
    group is one chunk in each of ``arenas`` arenas — a bound on the driver's calls, whatever the
    layout — but at least one group, or nothing would ever go (None: no bound)."""
    if chunks is None:
        return None
    if chunks < 1 or arenas < 1:
        raise ValueError(f"a bound of {chunks} chunk(s) over {arenas} arena(s): both must be >= 1")
    return max(1, chunks // arenas)


class GiveBack:
    """One pool's give-back policy: the decisions above with their state between syncs.

    ``pressure`` and ``refusals`` are the limit source's pressure counter and the
    mapping's admission refusals when the pool starts (what was before is not news).
    """

    def __init__(
        self,
        *,
        group_bytes: int,
        grow_chunks: int = 1,
        delay_s: float = 0.0,
        under_pressure: bool = True,
        clock: Callable[[], float] = time.monotonic,
        pressure: int = 0,
        refusals: int = 0,
        hold_s: float = 0.0,
        reserve_bytes: int = 0,
        pressure_keeps_reserve: bool = False,
        yield_above_target_s: float = 0.0,
        release_chunks: int | None = None,
    ) -> None:
        if grow_chunks < 1:
            raise ValueError(f"grow_chunks must be >= 1, got {grow_chunks}")
        if delay_s < 0:
            raise ValueError(f"give_back_delay_s must be >= 0, got {delay_s}")
        if hold_s < 0:
            raise ValueError(f"give_back_hold_s must be >= 0, got {hold_s}")
        if reserve_bytes < 0:
            raise ValueError(f"the reserve must be >= 0 bytes, got {reserve_bytes}")
        if release_chunks is not None and release_chunks < 1:
            raise ValueError(f"release_chunks must be >= 1 or None, got {release_chunks}")
        self.release_chunks = release_chunks
        """At most this many chunk groups go back per sync, for the target and under pressure together
        (None: no bound); the rest goes at the next syncs. A lowered limit is never held back by it."""
        self._release_left: int | None = None  # bytes this sync may still give back (None: no bound)
        self.held_back = False
        """Whether the last sync's give-back stopped at ``release_chunks`` with more to give: an owner
        that gives back only now and then should sync again at its next step."""
        self.contention = ContentionWindow(yield_above_target_s, pressure, clock)
        """While open, new work yields above the target (``BlockPool.admission_room``)."""
        self.hold_s = hold_s
        self.reserve_bytes = reserve_bytes
        self.pressure_keeps_reserve = pressure_keeps_reserve
        """Under pressure, keep use plus the reserve (not just one growth step) mapped."""
        self._idle = IdleWindow(clock())
        self._quiet_until = float("-inf")  # no top-up before this (a give-back under pressure, or a refused top-up)
        self.group_bytes = group_bytes
        self.grow_chunks = grow_chunks
        self.delay_s = delay_s
        self.under_pressure = under_pressure
        self._clock = clock
        self._period = IdlePeriod(clock())
        self._pressure_seen = pressure
        self._refusals_seen = refusals
        self.released_under_pressure = 0
        """Bytes given back because another instance was short of memory (cumulative)."""

    def pressed(self, pressure: int) -> bool:
        """Whether the next ``sync`` gives back under pressure, given the limit source's counter now."""
        return self.under_pressure and pressure != self._pressure_seen

    def starved(self, refusals: int) -> bool:
        """Whether the pool's own admission was refused since the last ``sync``, given the mapping's count now."""
        return refusals != self._refusals_seen

    def sync(self, mapping: ChunkMapping, used: int) -> None:
        """A pool's ``sync()``: apply the limit in force, continue a deferral, give back above the
        target and under pressure, report. ``used``: the bytes of live blocks."""
        reading = mapping.refresh()
        self._release_left = None if self.release_chunks is None else self.release_chunks * self.group_bytes
        self.held_back = False
        if mapping.deferred:
            mapping.continue_deferred(None)
        if self.hold_s:
            self._idle = self._idle.noting(self._clock(), max(0, mapping.held_bytes - used), self.hold_s)
        self._above_target(mapping, used, reading.target)
        pressure = mapping.limit.pressure()
        self.contention.note(pressure)
        if not self.under_pressure:
            self._pressure_seen = pressure  # what ``_under_pressure`` would have noted
        else:
            self._under_pressure(mapping, pressure, used, reading.guarantee, reading.target)
        mapping.report()

    def contended(self) -> bool:
        """Whether an instance was refused memory for the GPU's budget within the last
        ``yield_above_target_s`` (as of the last ``sync``): then new work takes this pool's memory
        only up to its target (``BlockPool.admission_room``). Never, with the setting 0."""
        return self.contention.is_open()

    def may_top_up(self, pressure: int) -> bool:
        """Whether the pool may map ahead now: it keeps a reserve, nobody else is short of
        memory since its last sync, and no give-back under pressure or refusal is recent."""
        return bool(self.reserve_bytes) and not self.pressed(pressure) and self._clock() >= self._quiet_until

    def top_up_refused(self) -> None:
        """A top-up was refused (limit or admission): wait a hold time before the next."""
        self._quiet_until = self._clock() + self.hold_s

    def _reserve_floor(self, used: int) -> int:
        """Use in whole chunk groups plus the reserve: what a give-back above the target keeps."""
        if not self.reserve_bytes:
            return 0
        return -(-used // self.group_bytes) * self.group_bytes + self.reserve_bytes

    def _above_target(self, mapping: ChunkMapping, used: int, target: int) -> None:
        held = mapping.held_bytes
        target = max(target, min(self._reserve_floor(used), mapping.reading.limit))
        if not self.delay_s:
            if held > target:
                self._release(mapping, target)
            return
        self._period = self._period.noting(idle_above_target(held, used, target))
        now = self._clock()
        if not self._period.over(now, self.delay_s):
            return
        keep = self._period.keep(held, target)
        if keep is not None and self._release(mapping, keep):
            # Bounded: the rest of what stayed idle through the period goes at the next syncs.
            self._period = self._period.less(held - mapping.held_bytes)
            return
        self._period = IdlePeriod(now)

    def _release(self, mapping: ChunkMapping, keep: int) -> bool:
        """Give back down to ``keep`` bytes, within what this sync may still give back; True if the
        bound stopped it above ``keep`` (the rest is for the next syncs)."""
        bounded = False
        if self._release_left is not None:
            floor = mapping.held_bytes - self._release_left
            bounded, keep = floor > keep, max(keep, floor)
        before = mapping.held_bytes
        mapping.release_down_to(keep)
        if self._release_left is not None:
            self._release_left -= before - mapping.held_bytes
        self.held_back |= bounded
        return bounded

    def _under_pressure(self, mapping: ChunkMapping, pressure: int, used: int, guarantee: int, target: int) -> None:
        refusals = mapping.admission_refusals
        keep = keep_under_pressure(
            pressed=pressure != self._pressure_seen,
            starved=refusals != self._refusals_seen,
            deferred=mapping.deferred,
            used=used,
            guarantee=guarantee,
            group_bytes=self.group_bytes,
            grow_chunks=self.grow_chunks,
        )
        self._pressure_seen, self._refusals_seen = pressure, refusals
        if keep is not None and self.pressure_keeps_reserve:
            keep = max(keep, self._reserve_floor(used))
        if keep is None:
            return
        before = mapping.held_bytes
        if self.hold_s:
            keep = held_through_hold(keep, held=before, target=target, idle_through=self._idle.idle_through())
        self._release(mapping, keep)
        gone = before - mapping.held_bytes
        self.released_under_pressure += gone
        if gone and self.hold_s:  # what went is no longer idle here; and no refill of the reserve for a hold
            self._idle = self._idle.less(gone)
            self._quiet_until = self._clock() + self.hold_s
