"""Admission as pure functions, and the shared-memory ledger deciding exactly as they do.

- The functions of ``kvpolicy.runtime.admission`` on figures worked out by hand.
- Their properties over random figures: monotone in the bytes asked, the instance's own
  bound first, the GPU's bound as docs/ledger.md states it, a static admission replacing
  the instance's own reservation rather than adding to it.
- A hypothesis state machine drives real instances on a real segment through elastic
  admissions, commits, rollbacks, releases, static admissions, pool reports, publishes,
  attaches and detaches. It keeps its own model of every instance and, at every
  admission, checks that the ledger accepted or refused — with the very ``Refusal`` or
  ``AdmissionRefused`` — as the pure functions say for the model's figures and running
  totals; after every step, that the header's totals are the model's sums.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.admission import (
    Holding,
    Refusal,
    elastic_budget,
    refuse_elastic,
    refuse_reserve,
    refuse_static,
    unmet,
)
from kvpolicy.runtime.client import Instance, attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.errors import AdmissionRefused, LedgerError
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.values import GpuFigures, GpuLimits, InstanceLimits, Totals
from kvpolicy.units import GiB, MiB
from tests.runtime.ledger_helpers import audit_locked

NO_FIGURES = GpuFigures("none", 0, 0, 0, 0, None, 0.0, 0)


def figures(
    source: str = "published", capacity: int = 80, headroom: int = 2, other: int = 6, budget: int | None = None
) -> GpuFigures:
    """GPU figures in GiB (``budget`` is A, published only)."""
    a = None if budget is None else budget * GiB
    return GpuFigures(source, 1, capacity * GiB, headroom * GiB, other * GiB, a, 0.0, 0)


def totals(reserved: int = 0, mapped: int = 0, pending: int = 0, guarantees: int = 0, unmet_: int = 0) -> Totals:
    """Running totals in GiB."""
    return Totals(reserved * GiB, mapped * GiB, pending * GiB, guarantees * GiB, 1, unmet_ * GiB)


# --- the functions, by hand -----------------------------------------------------------------------


def test_the_elastic_budget_is_zero_without_figures_then_live_memory_then_the_smaller_of_a_and_live() -> None:
    assert elastic_budget(NO_FIGURES, totals()) == 0
    assert elastic_budget(figures("provisional"), totals(reserved=40)) == 32 * GiB  # 80 − 2 − 6 − 40
    assert elastic_budget(figures("provisional"), totals(reserved=100)) == 0  # never below zero
    assert elastic_budget(figures(budget=20), totals(reserved=40)) == 20 * GiB  # A is smaller
    assert elastic_budget(figures(budget=50), totals(reserved=40)) == 32 * GiB  # a static admission since the publish


def test_the_instance_limit_is_checked_first_and_exactly_at_the_limit_admits() -> None:
    f, t = figures(budget=0), totals(mapped=6)  # the GPU has no budget left at all
    own = Holding(limit=8 * GiB, held=6 * GiB, guarantee=0)
    refusal = refuse_elastic(3 * GiB, f, t, own)
    assert refusal == Refusal(3 * GiB, "limit", 8 * GiB, 6 * GiB, 0, 0, "")
    assert "above its limit 8 GiB" in str(refusal)
    roomy = figures(budget=40)
    assert refuse_elastic(2 * GiB, roomy, t, own) is None


def test_guarantees_others_do_not_hold_yet_stay_free_for_them() -> None:
    f = figures(budget=10)
    own = Holding(limit=100 * GiB, held=1 * GiB, guarantee=3 * GiB)  # lacks 2 GiB of its guarantee
    t = totals(mapped=4, guarantees=8, unmet_=2 + 3)  # another instance lacks 3 GiB of its own
    assert refuse_elastic(3 * GiB, f, t, own) is None  # 4 + 3 + 3 = 10
    refusal = refuse_elastic(4 * GiB, f, t, own)
    assert refusal is not None and refusal.reason == "budget"
    assert (refusal.budget, refusal.gpu_committed) == (10 * GiB, 7 * GiB)
    assert "3 GiB of it is guaranteed to other instances and not yet theirs" in str(refusal)


def test_an_instance_may_take_its_own_unmet_guarantee() -> None:
    own = Holding(limit=5 * GiB, held=0, guarantee=5 * GiB)
    assert refuse_elastic(5 * GiB, figures(budget=5), totals(guarantees=5, unmet_=5), own) is None


def test_static_admission_replaces_the_instance_reservation_against_unreserved_memory() -> None:
    f, t = figures(), totals(reserved=30, guarantees=8)
    own = 10 * GiB  # of the 30 GiB reserved, 10 are this instance's and are replaced
    assert refuse_static(44 * GiB, f, t, own) is None  # 80 − 2 − 6 − 20 − 8 = 44
    refusal = refuse_static(45 * GiB, f, t, own)
    assert refusal is not None and refusal.reason == "unreserved"
    assert refusal.figures == {
        "asked": 45 * GiB, "capacity": 80 * GiB, "headroom": 2 * GiB, "other_used": 6 * GiB,
        "reserved_by_others": 20 * GiB, "guarantees": 8 * GiB, "unreserved": 44 * GiB, "elastic_mapped": 0,
    }
    error = refusal.error("cuda:3")
    assert isinstance(error, AdmissionRefused) and error.figures == refusal.figures
    assert "unreserved = C − H − U − R − G = 80 GiB − 2 GiB − 6 GiB − 20 GiB − 8 GiB = 44 GiB" in str(error)
    assert "from published figures" in str(error) and "free memory on cuda:3" in str(error)


def test_the_model_reserve_bounds_a_static_admission() -> None:
    assert refuse_reserve(4 * GiB, None) is None
    assert refuse_reserve(4 * GiB, 4 * GiB) is None
    refusal = refuse_reserve(4 * GiB + 1, 4 * GiB)
    assert refusal is not None and refusal.figures == {"asked": 4 * GiB + 1, "reserve": 4 * GiB}
    assert "is more than the model's reserve 4 GiB" in refusal.message("cuda:0")


# --- properties over random figures ---------------------------------------------------------------

size = st.integers(0, 64 * GiB)
small = st.integers(0, 8 * GiB)


@st.composite
def any_figures(draw: st.DrawFn) -> GpuFigures:
    source = draw(st.sampled_from(["none", "provisional", "published"]))
    if source == "none":
        return NO_FIGURES
    budget = draw(size) if source == "published" else None
    return GpuFigures(source, 1, draw(size), draw(small), draw(small), budget, 0.0, 0)


@st.composite
def elastic_case(draw: st.DrawFn) -> tuple[GpuFigures, Totals, Holding]:
    """Figures, totals and an own share that agree: the totals include what the instance holds and lacks."""
    own = Holding(limit=draw(size), held=draw(size), guarantee=draw(size))
    others_committed, others_unmet = draw(size), draw(size)
    t = Totals(
        runtime_reserved=draw(size),
        elastic_mapped=own.held + others_committed,
        elastic_pending=0,
        guarantees=own.guarantee + others_unmet,
        active=2,
        unmet_guarantees=unmet(own.guarantee, own.held) + others_unmet,
    )
    return draw(any_figures()), t, own


PROPERTIES = settings(max_examples=300, deadline=None)


@PROPERTIES
@given(elastic_case(), size, size)
def test_elastic_admission_is_monotone_in_the_bytes_asked(
    case: tuple[GpuFigures, Totals, Holding], n: int, m: int
) -> None:
    f, t, own = case
    lo, hi = min(n, m), max(n, m)
    if refuse_elastic(hi, f, t, own) is None:
        assert refuse_elastic(lo, f, t, own) is None
    if refuse_elastic(lo, f, t, own) is not None:
        assert refuse_elastic(hi, f, t, own) is not None


@PROPERTIES
@given(elastic_case(), size)
def test_elastic_admission_is_the_documented_pair_of_bounds(case: tuple[GpuFigures, Totals, Holding], n: int) -> None:
    f, t, own = case
    refusal = refuse_elastic(n, f, t, own)
    within_limit = own.held + n <= own.limit
    others_unmet = t.unmet_guarantees - unmet(own.guarantee, own.held)
    within_budget = t.elastic_committed + n + others_unmet <= elastic_budget(f, t)
    assert (refusal is None) == (within_limit and within_budget)
    if refusal is not None:
        assert refusal.reason == ("budget" if within_limit else "limit")


@PROPERTIES
@given(any_figures(), size, size)
def test_the_budget_is_never_above_a_nor_above_what_the_figures_leave(f: GpuFigures, reserved: int, n: int) -> None:
    t = Totals(reserved, 0, 0, 0, 1, 0)
    b = elastic_budget(f, t)
    assert 0 <= b <= max(0, f.capacity - f.headroom - f.other_used - reserved)
    if f.source == "published":
        assert f.elastic_budget is not None and b <= f.elastic_budget


@PROPERTIES
@given(any_figures(), size, size, size, size)
def test_a_static_admission_replaces_its_own_reservation(f: GpuFigures, others: int, own: int, g: int, n: int) -> None:
    with_own = Totals(others + own, 0, 0, g, 2, 0)
    without = Totals(others, 0, 0, g, 1, 0)
    a, b = refuse_static(n, f, with_own, own), refuse_static(n, f, without, 0)
    assert (a is None) == (b is None) == (n <= f.capacity - f.headroom - f.other_used - others - g)
    if a is not None and b is not None:
        assert a.figures == b.figures


# --- the ledger decides as the functions do ---------------------------------------------------------

U = MiB
amount = st.integers(0, 24).map(lambda k: k * U)
wide = st.integers(0, 96).map(lambda k: k * U)  # published limits: often above what the GPU has left
gpu_values = st.tuples(st.integers(0, 96), st.integers(0, 8), st.integers(0, 8), st.integers(0, 96)).map(
    lambda v: tuple(x * U for x in v)
)


@dataclass
class Model:
    """What the test believes one instance holds."""

    inst: Instance
    elastic: bool
    limit: int
    guarantee: int
    mapped: int = 0
    pending: int = 0
    static: int = 0
    runtime_pools: int = 0

    @property
    def held(self) -> int:
        return self.mapped + self.pending

    @property
    def counted_guarantee(self) -> int:
        return self.guarantee if self.elastic else 0

    def holding(self) -> Holding:
        return Holding(self.limit, self.held, self.counted_guarantee)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.base = Path(tempfile.mkdtemp(prefix="kvpolicy-test-", dir=shm))
        self.dir = self.base / "ledger"
        self.models: list[Model] = []
        self.figures = NO_FIGURES
        self.revision = 0
        self.pressure = 0
        self.attached = 0
        self.led: GpuLedger | None = None

    # --- the model's running totals ---

    def totals(self) -> Totals:
        ms = self.models
        return Totals(
            runtime_reserved=sum(m.static + m.runtime_pools for m in ms),
            elastic_mapped=sum(m.mapped for m in ms),
            elastic_pending=sum(m.pending for m in ms),
            guarantees=sum(m.counted_guarantee for m in ms),
            active=len(ms),
            unmet_guarantees=sum(unmet(m.counted_guarantee, m.held) for m in ms),
        )

    def model(self, i: int) -> Model:
        return self.models[i % len(self.models)]

    def _attach(self, elastic: bool, guarantee: int, **gpu: int) -> None:
        inst = attach(model="m", id=f"i{self.attached}", gpu="cuda:0", ledger_dir=self.dir, elastic=elastic,
                      guarantee=guarantee, slots=8, handle_signals=False, **gpu)
        self.attached += 1
        self.models.append(Model(inst, elastic, limit=guarantee, guarantee=guarantee))

    # --- rules ---

    @initialize(
        instances=st.lists(st.tuples(st.booleans(), amount), min_size=1, max_size=4),
        source=st.sampled_from(["none", "provisional", "published"]),
        gpu=gpu_values,
        limits=st.lists(st.tuples(wide, amount), min_size=4, max_size=4),
    )
    def setup(
        self, instances: list[tuple[bool, int]], source: str, gpu: tuple[int, ...], limits: list[tuple[int, int]]
    ) -> None:
        c, h, u, _ = gpu
        engine_figures = {"capacity": c, "headroom": h, "other_used": u} if source == "provisional" else {}
        for k, (elastic, g) in enumerate(instances):
            self._attach(elastic, g, **(engine_figures if k == 0 else {}))  # the first engine gives its figures
        if source == "provisional":
            self.figures = GpuFigures("provisional", 0, c, h, u, None, 0.0, 0)
        self.led = GpuLedger.open(self.dir, "cuda:0", create=False)
        if source == "published":
            self.publish(gpu, limits)

    @rule(i=st.integers(0, 3), n=amount)
    def admit(self, i: int, n: int) -> None:
        m = self.model(i)
        expected = refuse_elastic(n, self.figures, self.totals(), m.holding())
        assert m.inst.admit(n) == (expected is None)
        assert m.inst.last_refusal == expected
        event(f"elastic: {'admitted' if expected is None else expected.reason} ({self.figures.source} figures)")
        if expected is None:
            m.pending += n
        elif expected.reason == "budget":
            self.pressure += 1

    @rule(i=st.integers(0, 3), how=st.sampled_from(["commit", "rollback", "release"]), quarters=st.integers(0, 4))
    def settle(self, i: int, how: str, quarters: int) -> None:
        m = self.model(i)
        n = (m.mapped if how == "release" else m.pending) * quarters // 4
        getattr(m.inst, how)(n)
        if how == "commit":
            m.pending, m.mapped = m.pending - n, m.mapped + n
        elif how == "rollback":
            m.pending -= n
        else:
            m.mapped -= n

    @rule(i=st.integers(0, 3), how=st.sampled_from(["commit", "rollback", "release"]))
    def settle_more_than_held(self, i: int, how: str) -> None:
        m = self.model(i)
        with pytest.raises(LedgerError, match=r"bytes committed or rolled back|bytes released"):
            getattr(m.inst, how)((m.mapped if how == "release" else m.pending) + 1)

    @rule(
        i=st.integers(0, 3),
        n=amount,
        reserve_slack=st.none() | st.integers(-2, 2).map(lambda k: k * U),
        given=st.none() | gpu_values,
    )
    def admit_static(self, i: int, n: int, reserve_slack: int | None, given: tuple[int, ...] | None) -> None:
        m = self.model(i)
        reserve = None if reserve_slack is None else max(0, n + reserve_slack)
        offered = {} if given is None else {"capacity": given[0], "headroom": given[1], "other_used": given[2]}
        refusal = refuse_reserve(n, reserve)
        f = self.figures
        if refusal is None and f.source != "published":
            if given is not None:  # the engine's own figures: the most cautious of each wins
                c, h, u = given[:3]
                if f.source == "provisional":
                    c, h, u = min(c, f.capacity), max(h, f.headroom), max(u, f.other_used)
                f = GpuFigures("provisional", 0, c, h, u, None, 0.0, 0)
            elif f.source == "none":
                with pytest.raises(LedgerError, match="no controller has published figures") as info:
                    m.inst.admit_static(n, reserve=reserve)
                assert not isinstance(info.value, AdmissionRefused)
                return
        if refusal is None:
            refusal = refuse_static(n, f, self.totals(), own=m.static + m.runtime_pools)
        event(f"static: {'admitted' if refusal is None else refusal.reason} ({f.source} figures)")
        if refusal is not None:
            with pytest.raises(AdmissionRefused) as info:
                m.inst.admit_static(n, reserve=reserve, **offered)
            assert str(info.value) == refusal.message("cuda:0") and info.value.figures == refusal.figures
            return
        assert m.inst.admit_static(n, reserve=reserve, **offered) == n
        m.static, m.runtime_pools = n, 0
        self.figures = f  # offered figures are kept only by an admission that succeeds

    @rule(i=st.integers(0, 3), runtime=amount, elastic=amount)
    def report_pools(self, i: int, runtime: int, elastic: int) -> None:
        m = self.model(i)
        m.inst.report_pools({"kv": PoolFacts(bytes=runtime), "heap": PoolFacts(owner="elastic", bytes=elastic)})
        m.static, m.runtime_pools = 0, runtime

    @rule(i=st.integers(0, 3))
    def mark_elastic(self, i: int) -> None:
        m = self.model(i)
        m.inst.limit_source()
        m.elastic = True

    @rule(gpu=gpu_values, limits=st.lists(st.tuples(wide, amount), min_size=4, max_size=4))
    def publish(self, gpu: tuple[int, ...], limits: list[tuple[int, int]]) -> None:
        self.revision += 1
        pairs = list(zip(self.models, limits, strict=False))  # four limits, up to four instances
        per_instance = {m.inst.id: InstanceLimits(lim, lim, g) for m, (lim, g) in pairs}
        with LedgerDir(self.dir) as ld:
            assert ld.publish(ld.read(), self.revision, {"cuda:0": GpuLimits(*gpu)}, per_instance) == []
        for m, (lim, g) in pairs:
            m.limit, m.guarantee = lim, g
        self.figures = GpuFigures("published", self.revision, *gpu, 0.0, 0)

    @precondition(lambda self: len(self.models) > 1)
    @rule(i=st.integers(0, 3))
    def detach(self, i: int) -> None:
        m = self.model(i)
        m.inst.detach()
        self.models.remove(m)

    @precondition(lambda self: 0 < len(self.models) < 4)
    @rule(elastic=st.booleans(), guarantee=amount)
    def attach_another(self, elastic: bool, guarantee: int) -> None:
        self._attach(elastic, guarantee)

    # --- after every step ---

    @invariant()
    def the_header_totals_are_the_models_sums(self) -> None:
        if self.led is None:
            return
        assert audit_locked(self.led) == self.totals()  # and equal to the slots' own sums
        f = self.led.figures()
        assert (f.source, f.capacity, f.headroom, f.other_used, f.elastic_budget) == (
            self.figures.source, self.figures.capacity, self.figures.headroom, self.figures.other_used,
            self.figures.elastic_budget,
        )
        assert self.led.pressure() == self.pressure

    def teardown(self) -> None:
        for m in self.models:
            m.inst.detach()
        if self.led is not None:
            self.led.close()
        shutil.rmtree(self.base, ignore_errors=True)


def test_the_ledger_admits_and_refuses_exactly_as_the_pure_functions_say() -> None:
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )

