"""Admission as pure functions: (the GPU's figures, its totals, the instance's own share) → a refusal or None.

These are the formulas of docs/ledger.md ("Admission"), with no shared memory in
sight. ``GpuLedger`` reads the records under the segment's write lock, asks these
functions, and writes what they let through; tests check them on plain values and
against a real segment.

Static (runtime-owned pools), ``own`` = R_own, the instance's current reservation,
which the new one replaces::

    n ≤ reserve                                  (when the model's reserve is given)
    n ≤ C − H − U − (R − R_own) − G               (unreserved memory of the GPU)

Elastic, ``own`` = the instance's limit, what it holds (mapped + pending) and its
guarantee as the totals count it::

    held + n ≤ limit                                   (the instance)
    Σ (mapped + pending) + n + Σ' unmet ≤ B            (the GPU; Σ' over the others)
    B = min(A, C − H − U − R)   once a controller published (the smaller bound wins)
        C − H − U − R           with provisional figures only
        0                       with no figures at all
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvpolicy.runtime.errors import AdmissionRefused
from kvpolicy.runtime.values import GpuFigures, Totals
from kvpolicy.units import format_bytes

# --- the GPU's elastic budget ---------------------------------------------------------------------


def _live(f: GpuFigures, t: Totals) -> int:
    """C − H − U − R, what the figures and the live reservations leave (never below 0)."""
    return max(0, f.capacity - f.headroom - f.other_used - t.runtime_reserved)


def elastic_budget(f: GpuFigures, t: Totals) -> int:
    """B, the GPU's elastic budget now."""
    if f.source == "none":
        return 0
    live = _live(f, t)
    if f.source == "provisional":
        return live
    assert f.elastic_budget is not None, "published figures without an elastic budget"
    return min(f.elastic_budget, live)


def explain_budget(f: GpuFigures, t: Totals) -> str:
    """How B was found, in words (for refusals and status)."""
    if f.source == "none":
        return "no GPU figures yet: no controller published and no engine gave its capacity"
    live = _live(f, t)
    if f.source == "provisional":
        return f"provisional: C − H − U − R = {format_bytes(live)}"
    return f"published A {format_bytes(f.elastic_budget or 0)}, C − H − U − R now {format_bytes(live)}"


def unmet(guarantee: int, held: int) -> int:
    """The part of a guarantee its instance does not hold yet."""
    return guarantee - held if guarantee > held else 0


# --- elastic admission ----------------------------------------------------------------------------


class Holding(NamedTuple):
    """An instance's own share in an elastic admission."""

    limit: int
    """Its published limit (its guarantee before the first publish)."""
    held: int
    """What it holds: mapped + pending."""
    guarantee: int
    """Its guarantee as the totals count it (0 unless the instance has an elastic pool)."""


@dataclass(frozen=True)
class Refusal:
    """Why an elastic admission said no, with the figures."""

    nbytes: int
    reason: str
    """``limit`` (the instance's limit) or ``budget`` (the GPU's elastic budget)."""
    limit: int
    instance_committed: int
    budget: int
    gpu_committed: int
    figures: str

    def __str__(self) -> str:
        if self.reason == "limit":
            return (
                f"{format_bytes(self.nbytes)} more would take the instance to "
                f"{format_bytes(self.instance_committed + self.nbytes)}, above its limit {format_bytes(self.limit)}"
            )
        return (
            f"{format_bytes(self.nbytes)} more would take the GPU's elastic pools to "
            f"{format_bytes(self.gpu_committed + self.nbytes)}, above its elastic budget "
            f"{format_bytes(self.budget)} ({self.figures})"
        )


def refuse_elastic(nbytes: int, figures: GpuFigures, totals: Totals, own: Holding) -> Refusal | None:
    """Why ``nbytes`` more for the instance holding ``own`` would not fit; None if they fit.

    The instance's limit is checked first. Then the GPU's: what others are guaranteed but
    do not hold yet stays theirs, so two instances growing at once cannot take a third
    one's guarantee between them.
    """
    if own.held + nbytes > own.limit:
        return Refusal(nbytes, "limit", own.limit, own.held, 0, 0, "")
    budget = elastic_budget(figures, totals)
    others_unmet = totals.unmet_guarantees - unmet(own.guarantee, own.held)
    committed = totals.elastic_mapped + totals.elastic_pending
    if committed + nbytes + others_unmet > budget:
        why = explain_budget(figures, totals)
        if others_unmet:
            why += f"; {format_bytes(others_unmet)} of it is guaranteed to other instances and not yet theirs"
        return Refusal(nbytes, "budget", own.limit, own.held, budget, committed + others_unmet, why)
    return None


# --- static admission -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticRefusal:
    """Why a static admission said no: ``reserve`` (above the model's reserve) or ``unreserved``."""

    reason: str
    figures: dict[str, int]
    """Every term of the bound that refused (``AdmissionRefused.figures``)."""
    source: str = ""
    """Where C, H and U came from (``provisional`` or ``published``) when the reason is ``unreserved``."""

    def message(self, gpu: str) -> str:
        x = self.figures
        asked = x["asked"]
        if self.reason == "reserve":
            return (
                f"kvpolicy ledger: {format_bytes(asked)} ({asked} B) asked for on {gpu} is more than the "
                f"model's reserve {format_bytes(x['reserve'])} ({x['reserve']} B)"
            )
        return (
            f"kvpolicy ledger: cannot admit {format_bytes(asked)} ({asked} B) of runtime-owned KV memory on "
            f"{gpu}: unreserved = C − H − U − R − G = {format_bytes(x['capacity'])} − "
            f"{format_bytes(x['headroom'])} − {format_bytes(x['other_used'])} − "
            f"{format_bytes(x['reserved_by_others'])} − "
            f"{format_bytes(x['guarantees'])} = {format_bytes(x['unreserved'])} ({x['unreserved']} B) "
            f"[capacity, headroom, other use from {self.source} figures; R reserved by other instances; "
            f"G guarantees of elastic instances]. Lower the model's reserve, or free memory on {gpu}."
        )

    def error(self, gpu: str) -> AdmissionRefused:
        return AdmissionRefused(self.message(gpu), dict(self.figures))


def refuse_reserve(nbytes: int, reserve: int | None) -> StaticRefusal | None:
    """``n ≤ reserve``: checked before anything else, figures or not."""
    if reserve is not None and nbytes > reserve:
        return StaticRefusal("reserve", {"asked": nbytes, "reserve": reserve})
    return None


def refuse_static(nbytes: int, figures: GpuFigures, totals: Totals, own: int) -> StaticRefusal | None:
    """``n ≤ C − H − U − (R − own) − G`` for an instance whose current reservation ``own`` it replaces."""
    f, t = figures, totals
    others = t.runtime_reserved - own
    unreserved = f.capacity - f.headroom - f.other_used - others - t.guarantees
    if nbytes <= unreserved:
        return None
    return StaticRefusal(
        "unreserved",
        {
            "asked": nbytes,
            "capacity": f.capacity,
            "headroom": f.headroom,
            "other_used": f.other_used,
            "reserved_by_others": others,
            "guarantees": t.guarantees,
            "unreserved": unreserved,
            "elastic_mapped": t.elastic_mapped,
        },
        f.source,
    )
