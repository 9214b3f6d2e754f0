"""Request traces: per tenant, Poisson arrivals whose rate follows a busy/quiet cycle.

Tenant ``i`` is busy during ``[i × offset + k × period, i × offset + k × period + busy)``
and quiet otherwise. Arrivals are drawn segment by segment (an exact piecewise
Poisson process: the memoryless draw restarts at each phase boundary), prompts and
outputs uniform in their ranges. The same seed gives the same requests in both modes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from params import Trace


@dataclass(frozen=True)
class Request:
    key: int
    """Unique over all tenants; seeds the request's KV pattern."""
    arrival: float
    """Seconds from the start of the run."""
    prompt: int
    output: int


def busy_at(trace: Trace, index: int, t: float) -> bool:
    """Whether tenant ``index`` is in its busy phase at ``t``."""
    return (t - index * trace.phase_offset_s) % trace.period_s < trace.busy_s


def segments(trace: Trace, index: int) -> list[tuple[float, float, float]]:
    """``(start, end, rate)`` covering ``[0, duration)``: busy windows and the quiet gaps between them."""
    out: list[tuple[float, float, float]] = []
    t = 0.0
    for lo, hi in busy_windows(trace, index):
        if lo > t:
            out.append((t, lo, trace.idle_rate))
        out.append((lo, hi, trace.busy_rate))
        t = hi
    if t < trace.duration_s:
        out.append((t, trace.duration_s, trace.idle_rate))
    return out


def requests_for(trace: Trace, index: int) -> list[Request]:
    """Tenant ``index``'s requests in arrival order."""
    rng = random.Random(trace.seed * 1_000_003 + index)
    out: list[Request] = []
    for start, end, rate in segments(trace, index):
        if rate <= 0:
            continue
        t = start + rng.expovariate(rate)
        while t < end:
            out.append(Request(
                key=(index << 24) | len(out),
                arrival=t,
                prompt=rng.randint(*trace.prompt_tokens),
                output=rng.randint(*trace.output_tokens),
            ))
            t += rng.expovariate(rate)
    return out


def busy_windows(trace: Trace, index: int) -> list[tuple[float, float]]:
    """Tenant ``index``'s busy phases that overlap the run, clipped to it."""
    out = []
    start = index * trace.phase_offset_s % trace.period_s - trace.period_s
    while start < trace.duration_s:
        lo, hi = max(0.0, start), min(trace.duration_s, start + trace.busy_s)
        if hi > lo:
            out.append((lo, hi))
        start += trace.period_s
    return out
