"""Checks shared by the ledger tests (imported by forked workers too)."""

from __future__ import annotations

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.ledger import GpuLedger, Totals


def slot_sums(led: GpuLedger) -> Totals:
    """Σ over the slots, computed from the slot records (not the header's totals)."""
    views, problems = led.slots()
    assert not problems, problems
    return Totals(
        runtime_reserved=sum(v.runtime_reserved for v in views),
        elastic_mapped=sum(v.mapped for v in views),
        elastic_pending=sum(v.pending for v in views),
        guarantees=sum(v.guarantee for v in views if v.elastic),
        active=len(views),
        unmet_guarantees=sum(max(0, v.guarantee - v.mapped - v.pending) for v in views if v.elastic),
    )


def audit_locked(led: GpuLedger) -> Totals:
    """Under the write lock: the header totals equal the slot sums (a repair pending counts as fine)."""
    with led.seg.locked():
        if led.seg.words[L.OFF_DIRTY // 8]:
            return slot_sums(led)  # a writer died inside a change; the next change repairs the totals
        totals = led.totals()
        sums = slot_sums(led)
        assert totals == sums, f"header totals {totals} != slot sums {sums}"
        return totals
