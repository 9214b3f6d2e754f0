"""Attach, both kinds of admission, publishing, acknowledgements and facts — one process, real segments."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvpolicy.alloc.limits import LimitReading
from kvpolicy.facts import Facts, PoolFacts
from kvpolicy.runtime.client import Instance, attach
from kvpolicy.runtime.directory import GpuSample, LedgerDir
from kvpolicy.runtime.errors import (
    AdmissionRefused,
    Detached,
    DuplicateInstance,
    LedgerError,
    SlotsFull,
)
from kvpolicy.runtime.ledger import ADMITTED_POOL, GpuLedger, GpuLimits, InstanceLimits
from kvpolicy.units import GiB, MiB
from tests.runtime.ledger_helpers import audit_locked

CHUNK = 2 * MiB


@pytest.fixture
def make(ledger_dir: Path):
    made: list[Instance] = []

    def _make(**kw) -> Instance:
        kw.setdefault("gpu", "cuda:0")
        kw.setdefault("model", "m")
        kw.setdefault("ledger_dir", ledger_dir)
        kw.setdefault("handle_signals", False)
        inst = attach(**kw)
        made.append(inst)
        return inst

    yield _make
    for inst in made:
        inst.detach()


def publish(ledger_dir: Path, revision: int, gpu: GpuLimits | None, **limits: InstanceLimits) -> list[str]:
    with LedgerDir(ledger_dir) as ld:
        view = ld.read()
        return ld.publish(view, revision, {"cuda:0": gpu} if gpu else {}, limits)


def test_attach_registers_a_slot_and_detach_frees_it(make, ledger_dir: Path) -> None:
    inst = make(model="qwen3-8b", engine="vllm", rank=1, engine_id="qwen")
    view = inst.snapshot()
    assert (view.id, view.model, view.engine, view.engine_id, view.rank) == ("qwen3-8b/1", "qwen3-8b", "vllm", "qwen", 1)
    led = GpuLedger.open(ledger_dir, "cuda:0")
    assert led.totals().active == 1
    inst.detach()
    assert led.slots() == ([], []) and led.totals().active == 0
    with pytest.raises(Detached):
        inst.admit_static(1)
    with pytest.raises(Detached, match="'qwen3-8b/1' on cuda:0 is detached"):
        inst.read()
    led.close()


def test_duplicate_id_on_the_gpu_is_refused_with_its_holder(make) -> None:
    first = make(id="dsv4/0")
    with pytest.raises(DuplicateInstance, match=rf"'dsv4/0' is already attached on cuda:0 .*pid {first.pid}"):
        make(id="dsv4/0")


def test_duplicate_id_on_another_gpu_is_refused(make) -> None:
    make(id="dsv4/0", gpu="cuda:0")
    with pytest.raises(DuplicateInstance, match="attached on another GPU"):
        make(id="dsv4/0", gpu="cuda:1")


def test_strings_too_long_for_the_layout_are_refused_with_the_limit(make) -> None:
    with pytest.raises(LedgerError, match=r"model 'xxxx.*' is 65 bytes of UTF-8; at most 64 fit"):
        make(id="a", model="x" * 65)
    with pytest.raises(LedgerError, match=r"engine .* at most 16"):
        make(engine="e" * 17)


def test_slots_full(make) -> None:
    make(id="a", slots=2)
    make(id="b", slots=2)
    with pytest.raises(SlotsFull, match="all 2 slots of cuda:0"):
        make(id="c", slots=2)


def test_before_any_publish_the_limit_is_the_guarantee(make) -> None:
    inst = make(guarantee=64 * MiB, elastic=True)
    assert inst.read() == LimitReading(limit=64 * MiB, target=64 * MiB, revision=0, guarantee=64 * MiB)


def test_published_limits_reach_the_hot_path_and_unchanged_reads_reuse_one_object(make, ledger_dir: Path) -> None:
    inst = make(elastic=True)
    first = inst.read()
    assert inst.read() is first  # nothing published: the same object, no allocation
    skipped = publish(ledger_dir, 5, GpuLimits(80 * GiB, GiB, 0, 60 * GiB),
                      **{"m/0": InstanceLimits(limit=10 * GiB, target=6 * GiB, guarantee=2 * GiB)})
    assert skipped == []
    r = inst.read()
    assert r == LimitReading(limit=10 * GiB, target=6 * GiB, revision=5, guarantee=2 * GiB)
    assert inst.read() is r


def test_publish_skips_a_slot_that_changed_hands(make, ledger_dir: Path) -> None:
    inst = make(id="x")
    with LedgerDir(ledger_dir) as ld:
        view = ld.read()
        inst.detach()
        again = make(id="x")
        skipped = ld.publish(view, 1, {}, {"x": InstanceLimits(1, 1, 1)})
    assert len(skipped) == 1 and "changed hands" in skipped[0]
    assert again.read().revision == 0


def test_elastic_admission_respects_the_instance_limit(make, ledger_dir: Path) -> None:
    inst = make(elastic=True, guarantee=8 * CHUNK, capacity=80 * GiB)
    assert inst.admit(6 * CHUNK)
    assert not inst.admit(3 * CHUNK)
    assert inst.last_refusal is not None and inst.last_refusal.reason == "limit"
    assert "above its limit 16 MiB" in str(inst.last_refusal)
    inst.commit(4 * CHUNK)
    inst.rollback(2 * CHUNK)
    assert inst.admit(4 * CHUNK) and inst.last_refusal is None
    inst.commit(4 * CHUNK)
    inst.release(8 * CHUNK)
    v = inst.snapshot()
    assert (v.mapped, v.pending) == (0, 0)
    audit_locked(inst._ledger)


def test_elastic_admission_respects_the_gpu_budget_across_instances(make, ledger_dir: Path) -> None:
    a = make(id="a", elastic=True)
    b = make(id="b", elastic=True)
    publish(ledger_dir, 1, GpuLimits(capacity=100 * CHUNK, headroom=0, other_used=0, elastic_budget=10 * CHUNK),
            a=InstanceLimits(8 * CHUNK, 5 * CHUNK, 0), b=InstanceLimits(8 * CHUNK, 5 * CHUNK, 0))
    assert a.admit(6 * CHUNK)
    assert not b.admit(5 * CHUNK)
    assert b.last_refusal.reason == "budget" and b.last_refusal.budget == 10 * CHUNK
    assert b.admit(4 * CHUNK)
    assert not b.admit(1)


def test_elastic_budget_follows_a_static_admission_made_after_the_publish(make, ledger_dir: Path) -> None:
    e = make(id="e", elastic=True)
    s = make(id="s")
    publish(ledger_dir, 1, GpuLimits(capacity=100 * CHUNK, headroom=0, other_used=0, elastic_budget=100 * CHUNK),
            e=InstanceLimits(100 * CHUNK, 100 * CHUNK, 0))
    s.admit_static(95 * CHUNK)
    assert not e.admit(6 * CHUNK)  # C − H − U − R = 5 chunks now, whatever A said
    assert e.admit(5 * CHUNK)


def test_without_gpu_figures_nothing_elastic_is_admitted(make) -> None:
    inst = make(elastic=True, guarantee=8 * CHUNK)
    assert not inst.admit(CHUNK)
    assert "no GPU figures yet" in str(inst.last_refusal)


def test_commit_rollback_release_without_the_bytes_are_errors(make) -> None:
    inst = make(elastic=True, guarantee=8 * CHUNK, capacity=GiB)
    with pytest.raises(LedgerError, match="needs a matching admit"):
        inst.commit(CHUNK)
    with pytest.raises(LedgerError, match="only 0 are mapped"):
        inst.release(CHUNK)
    assert inst.admit(CHUNK)
    with pytest.raises(LedgerError, match="needs a matching admit"):
        inst.rollback(2 * CHUNK)


def test_static_admission_formula_and_refusal_figures(make, ledger_dir: Path) -> None:
    g = make(id="g", elastic=True, guarantee=10 * GiB)
    a = make(id="a")
    b = make(id="b")
    assert a.admit_static(40 * GiB, reserve=40 * GiB, capacity=100 * GiB, headroom=4 * GiB, other_used=6 * GiB) == 40 * GiB
    # unreserved for b = 100 − 4 − 6 − 40 − 10 = 40 GiB
    with pytest.raises(AdmissionRefused) as err:
        b.admit_static(40 * GiB + 1, reserve=50 * GiB)
    f = err.value.figures
    assert (f["capacity"], f["headroom"], f["other_used"], f["reserved_by_others"], f["guarantees"], f["unreserved"]) == (
        100 * GiB, 4 * GiB, 6 * GiB, 40 * GiB, 10 * GiB, 40 * GiB)
    assert "40 GiB (42949672960 B)" in str(err.value) and "provisional" in str(err.value)
    assert b.admit_static(40 * GiB, reserve=50 * GiB) == 40 * GiB
    with pytest.raises(AdmissionRefused, match="more than the model's reserve"):
        b.admit_static(51 * GiB, reserve=50 * GiB)
    # re-admitting replaces the instance's own reservation, it does not add to it
    assert a.admit_static(30 * GiB) == 30 * GiB
    assert GpuLedger.open(ledger_dir, "cuda:0").totals().runtime_reserved == 70 * GiB
    del g


def test_static_admission_needs_figures(make) -> None:
    inst = make()
    with pytest.raises(LedgerError, match="no controller has published figures for cuda:0"):
        inst.admit_static(GiB)


def test_published_figures_win_over_the_callers(make, ledger_dir: Path) -> None:
    a = make(id="a")
    publish(ledger_dir, 1, GpuLimits(capacity=50 * GiB, headroom=0, other_used=0, elastic_budget=50 * GiB))
    with pytest.raises(AdmissionRefused, match="published figures"):
        a.admit_static(60 * GiB, capacity=100 * GiB)


def test_provisional_figures_keep_the_most_cautious(make, ledger_dir: Path) -> None:
    make(id="a", capacity=100 * GiB, headroom=2 * GiB)
    make(id="b", capacity=90 * GiB, headroom=1 * GiB, other_used=3 * GiB)
    f = GpuLedger.open(ledger_dir, "cuda:0").figures()
    assert (f.source, f.capacity, f.headroom, f.other_used) == ("provisional", 90 * GiB, 2 * GiB, 3 * GiB)


def test_pool_report_replaces_the_admission(make, ledger_dir: Path) -> None:
    inst = make(id="dsv4/0", engine="sglang")
    inst.admit_static(40 * GiB, reserve=40 * GiB, capacity=141 * GiB)
    facts = inst.snapshot().facts(time.time())
    assert facts.pools == {ADMITTED_POOL: PoolFacts(owner="runtime", bytes=40 * GiB)}
    pools = {
        "swa": PoolFacts(bytes=2_640_000_000, tensor_bytes=2_600_000_000),
        "c4": PoolFacts(bytes=3_223_000_000),
        "c128": PoolFacts(bytes=100_000_000),
        "indexer": PoolFacts(bytes=800_000_000),
        "compressor_state": PoolFacts(bytes=50_000_000, parts={"c4": 40_000_000, "c128": 10_000_000}),
        "other": PoolFacts(bytes=1_000),
        "kv": PoolFacts(owner="elastic", bytes=GiB),
    }
    inst.report_pools(pools)
    view = inst.snapshot()
    assert view.pools == pools and view.static_admitted == 0
    assert view.runtime_reserved == sum(p.bytes for p in pools.values() if p.owner == "runtime")
    assert GpuLedger.open(ledger_dir, "cuda:0").totals().runtime_reserved == view.runtime_reserved
    with pytest.raises(LedgerError, match="at most 24 fit"):
        inst.report_pools({"p" * 25: PoolFacts(bytes=1)})
    with pytest.raises(LedgerError, match="a slot holds at most 8"):
        inst.report_pools({f"p{i}": PoolFacts(bytes=1) for i in range(9)})


def test_acknowledgements_and_stuck_deferrals(make) -> None:
    inst = make(elastic=True)
    inst.acknowledge(3, "deferred")
    since = inst.snapshot().deferred_since
    time.sleep(0.01)
    inst.acknowledge(4, "deferred")  # still deferring: the deferral keeps its start
    v = inst.snapshot()
    assert (v.ack_revision, v.ack, v.deferred_since) == (4, "deferred", since)
    assert v.stuck(since + 61, after=60) and not v.stuck(since + 59, after=60)
    inst.acknowledge(4, "applied")
    v = inst.snapshot()
    assert (v.ack, v.deferred_since, v.stuck(since + 1000, after=60)) == ("applied", None, False)
    with pytest.raises(LedgerError, match="'applied' or 'deferred'"):
        inst.acknowledge(5, "done")  # type: ignore[arg-type]


def test_facts_from_the_ledger(make, ledger_dir: Path) -> None:
    dsv4 = make(id="dsv4-flash/0", model="deepseek-v4-flash", engine="sglang")
    qwen = make(id="qwen/0", model="qwen3-8b", engine="vllm", engine_id="qwen", elastic=True, guarantee=GiB)
    dsv4.admit_static(4 * GiB, capacity=141 * GiB)
    dsv4.report_pools({"swa": PoolFacts(bytes=2 * GiB), "c4": PoolFacts(bytes=GiB)})
    publish(ledger_dir, 1, GpuLimits(141 * GiB, 4 * GiB, 0, 100 * GiB),
            **{"qwen/0": InstanceLimits(limit=50 * GiB, target=20 * GiB, guarantee=GiB)})
    assert qwen.admit(GiB)
    qwen.commit(GiB)
    qwen.report(used=GiB // 2, mapped=GiB)
    with LedgerDir(ledger_dir) as ld:
        view = ld.read(now=time.time() + 5)
        facts, notes = view.facts({"cuda:0": GpuSample(capacity=141 * GiB, used=70 * GiB)})
    assert notes == []
    assert isinstance(facts, Facts)
    assert [(g.id, g.capacity, g.other_used) for g in facts.gpus] == [("cuda:0", 141 * GiB, 70 * GiB - 3 * GiB - GiB)]
    by_id = {i.id: i for i in facts.instances}
    assert by_id["dsv4-flash/0"].runtime_bytes == 3 * GiB and by_id["dsv4-flash/0"].elastic is None
    q = by_id["qwen/0"]
    assert (q.engine_group, q.elastic.used, q.elastic.mapped) == ("qwen", GiB // 2, GiB)
    assert q.idle_seconds >= 5
    assert Facts.model_validate_json(facts.to_json()) == facts


def test_gpu_without_capacity_is_left_out_of_facts_with_a_note(make, ledger_dir: Path) -> None:
    make(id="a", gpu="cuda:3")
    with LedgerDir(ledger_dir) as ld:
        facts, notes = ld.read().facts()
    assert facts.gpus == () and facts.instances == ()
    assert "cuda:3: left out with 1 instance(s): its capacity is unknown" in notes[0]


def test_restarted_controller_continues_from_the_ledger(make, ledger_dir: Path) -> None:
    make(id="a", elastic=True)
    publish(ledger_dir, 41, GpuLimits(GiB, 0, 0, GiB), a=InstanceLimits(GiB, GiB, 0))
    with LedgerDir(ledger_dir) as ld:
        assert ld.read().revision == 41


def test_heartbeat_and_staleness(ledger_dir: Path, make) -> None:
    make(id="a")
    with LedgerDir(ledger_dir) as ld:
        assert ld.read().controller_stale(10)
        ld.heartbeat(now=1000.0)
        assert ld.read(now=1005.0).heartbeat == 1000.0
        assert not ld.read(now=1005.0).controller_stale(10)
        assert ld.read(now=1011.0).controller_stale(10)


def test_one_controller_per_ledger(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    with ld.claim_controller(), pytest.raises(LedgerError, match=r"another controller \(pid \d+\) is running"):
        LedgerDir(ledger_dir).claim_controller()
    LedgerDir(ledger_dir).claim_controller().release()  # free again once released


def test_generation_moves_with_engine_changes_only(make, ledger_dir: Path) -> None:
    inst = make(id="a", elastic=True, capacity=GiB)
    with LedgerDir(ledger_dir) as ld:
        g0 = ld.generations()["cuda:0"]
        ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(GiB, 0, 0, GiB)}, {"a": InstanceLimits(GiB, GiB, 0)})
        ld.heartbeat()
        assert ld.generations()["cuda:0"] == g0
        inst.admit(CHUNK)
        assert ld.generations()["cuda:0"] == g0 + 1


def test_instance_implements_the_allocators_limit_source() -> None:
    import inspect

    from kvpolicy.alloc.limits import LimitSource

    for name, member in inspect.getmembers(LimitSource, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = getattr(Instance, name)
        theirs = list(inspect.signature(member).parameters)
        assert list(inspect.signature(ours).parameters) == theirs, name


def test_limit_source_marks_the_slot_elastic_and_counts_its_guarantee(make, ledger_dir: Path) -> None:
    inst = make(guarantee=GiB)
    led = GpuLedger.open(ledger_dir, "cuda:0")
    assert not inst.snapshot().elastic and led.totals().guarantees == 0
    assert inst.limit_source() is inst
    assert inst.snapshot().elastic and led.totals().guarantees == GiB
    inst.admit_static(0, capacity=4 * GiB)  # the claim moved on; the instance still owns its slot
    led.close()


def test_two_growing_instances_cannot_take_a_third_ones_guarantee(make, ledger_dir: Path) -> None:
    # A = 10 GiB; c is guaranteed 4 GiB, so a and b may each grow to 10 - 4 = 6 GiB alone,
    # but together only to the 6 GiB that is not c's.
    a = make(model="a", elastic=True).limit_source()
    b = make(model="b", elastic=True).limit_source()
    c = make(model="c", elastic=True).limit_source()
    publish(ledger_dir, 1, GpuLimits(capacity=10 * GiB, headroom=0, other_used=0, elastic_budget=10 * GiB),
            **{"a/0": InstanceLimits(limit=6 * GiB, target=3 * GiB, guarantee=0),
               "b/0": InstanceLimits(limit=6 * GiB, target=3 * GiB, guarantee=0),
               "c/0": InstanceLimits(limit=10 * GiB, target=4 * GiB, guarantee=4 * GiB)})
    for inst in (a, b):
        assert inst.admit(3 * GiB)
        inst.commit(3 * GiB)
    assert not a.admit(CHUNK)  # within a's limit, but the rest of the budget is c's guarantee
    assert a.last_refusal.reason == "budget" and "guaranteed to other instances" in a.last_refusal.figures
    assert c.admit(4 * GiB)  # c finds all of its guarantee
    c.commit(4 * GiB)
    assert audit_locked(GpuLedger.open(ledger_dir, "cuda:0")).unmet_guarantees == 0
    c.release(2 * GiB)  # c holds 2 of its 4: 2 GiB stay kept for it
    assert not b.admit(CHUNK)
    assert c.admit(2 * GiB)
    c.rollback(2 * GiB)
    assert audit_locked(GpuLedger.open(ledger_dir, "cuda:0")).unmet_guarantees == 2 * GiB
