"""What serving systems headline: time to first token and SLO attainment, from per-request times.

Pure functions (no engine, no clock), so the tenants' summaries and ``--combine`` compute
them the same way and the tests can state them exactly.

- **TTFT**: from a request's arrival to its first output token (the end of the step that
  generated it). Percentiles are over the requests that got a first token; a request
  abandoned before starting has none (it counts against the SLO instead).
- **SLO**: a request meets it when its TTFT is at most ``ttft_s`` and every gap between
  two of its consecutive tokens is at most ``gap_s`` (a preempted request's recompute
  stall is such a gap). Attainment is met / (completed + abandoned): an abandoned
  request misses; requests still running or waiting at the end are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_TTFT_S = 2.0
DEFAULT_GAP_S = 0.050


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q ≤ 1) of ``values``; None when there are none.

    Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = math.ceil(round(q * len(ordered), 9))  # rounded first: 0.99 × 700 is 693.0000000000001 in floats
    return ordered[max(1, rank) - 1]


def meets_slo(ttft: float, max_gap: float, *, ttft_s: float = DEFAULT_TTFT_S, gap_s: float = DEFAULT_GAP_S) -> bool:
    """Whether a completed request met the SLO: first token within ``ttft_s``, no gap over ``gap_s``."""
    return ttft <= ttft_s and max_gap <= gap_s


def attainment(met: int, missed: int) -> float | None:
    """The share of counted requests that met the SLO (None: none counted)."""
    total = met + missed
    return met / total if total else None


__all__ = ["DEFAULT_GAP_S", "DEFAULT_TTFT_S", "attainment", "meets_slo", "percentile"]
