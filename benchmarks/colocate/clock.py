"""A tenant's clock: where it is in its trace, in seconds from the start.

Two kinds (``[engine] clock`` in the parameters):

- ``wall``: trace time is wall time since the run's start. A step that runs late is
  not made up for: the requests that arrived meanwhile wait for the next step, and a
  slow step costs the tenant steps, hence tokens. This is what a GPU run measures
  (the H200 figures are about real time: mapping inside the step makes steps late).
- ``steps``: every step advances trace time by exactly ``step_ms``, however long it
  took. A slow or loaded machine then serves the same trace in more wall time
  (every request arrives, the schedule is the same), so CI does not depend on the
  machine's speed.

In both kinds the steps are paced by the wall clock, at most one every ``step_ms``
(a step never starts early). So on a machine fast enough to keep every step on time
the two clocks agree: ``steps`` trace time is ``n × step_ms``, ``wall`` trace time
the same plus how late the steps ran so far (sleep overshoot: well under a step).
"""

from __future__ import annotations

import time
from typing import Literal

ClockKind = Literal["wall", "steps"]


class TraceClock:
    """Trace time for one tenant; 0 until ``start``."""

    def __init__(self, kind: ClockKind, step_s: float) -> None:
        if kind not in ("wall", "steps"):
            raise ValueError(f"clock must be 'wall' or 'steps', got {kind!r}")
        self.kind = kind
        self.step_s = step_s
        self.steps = 0
        self._origin: float | None = None  # time.monotonic() at the run's start

    def start(self, t0: float) -> None:
        """The run starts at wall-clock time ``t0`` (``time.time()`` seconds; it may be in the future)."""
        self._origin = time.monotonic() + (t0 - time.time())

    def now(self) -> float:
        """Seconds into the trace (monotonic; 0 before ``start``). Pools' give-back delays read it."""
        if self._origin is None:
            return 0.0
        if self.kind == "steps":
            return self.steps * self.step_s
        return max(0.0, time.monotonic() - self._origin)

    def tick(self) -> None:
        """One engine step is done."""
        self.steps += 1
