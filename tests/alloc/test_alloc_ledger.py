"""Block pools against the real ledger (kvpolicy.runtime): two instances on one GPU's segment.

The pool's LimitSource calls must keep the ledger's books exact: admitted bytes committed
or rolled back, mapped bytes equal to what the pool holds, acknowledgements of published
revisions (deferred, then applied). Needs the runtime's dependencies (pydantic); skipped
where they are absent (the GPU machine).
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic")

from kvpolicy.alloc import BlockPool, BlockSpec, HostDriver, OutOfBlocks
from kvpolicy.runtime.client import ASK_AGAIN_AFTER, attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.ledger import GpuLimits, InstanceLimits
from kvpolicy.units import GiB, MiB

CHUNK = 2 * MiB
QUARTER = BlockSpec(CHUNK // 4)


def publish(ledger_dir: Path, revision: int, budget: int, **limits: InstanceLimits) -> None:
    with LedgerDir(ledger_dir) as ld:
        skipped = ld.publish(ld.read(), revision, {"cuda:0": GpuLimits(100 * CHUNK, 0, 0, budget)}, limits)
    assert not skipped


@pytest.fixture
def two_pools(ledger_dir: Path) -> Iterator[tuple[Any, Any, BlockPool, BlockPool]]:
    """Instances a and b attached to one GPU's ledger, each with a block pool on the host driver."""
    a = attach(id="a", model="m", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
    b = attach(id="b", model="m", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
    driver = HostDriver(capacity=1 * GiB)
    pool_a = BlockPool(driver, QUARTER, 64, chunk=CHUNK, limit=a.limit_source(), name="a")
    pool_b = BlockPool(driver, QUARTER, 64, chunk=CHUNK, limit=b.limit_source(), name="b")
    try:
        yield a, b, pool_a, pool_b
    finally:
        pool_a.close()
        pool_b.close()
        a.detach()
        b.detach()
        driver.close()


def test_two_pools_share_the_gpu_budget_through_the_ledger(two_pools, ledger_dir: Path) -> None:
    a, b, pool_a, pool_b = two_pools
    publish(
        ledger_dir,
        1,
        10 * CHUNK,
        a=InstanceLimits(8 * CHUNK, 5 * CHUNK, 0),
        b=InstanceLimits(8 * CHUNK, 5 * CHUNK, 0),
    )
    ids_a = pool_a.alloc(24)  # 6 chunks
    assert a.snapshot().mapped == pool_a.held_bytes == 6 * CHUNK
    with pytest.raises(OutOfBlocks) as err:
        pool_b.alloc(20)  # 5 chunks, but only 4 of the GPU's budget are left
    assert err.value.reason == "admission" and "budget" in str(b.last_refusal)
    assert b.snapshot().pending == 0 and pool_b.held_bytes == 0
    ids_b = pool_b.alloc(16)
    assert b.snapshot().mapped == 4 * CHUNK

    # The controller lowers a's limit under what its live blocks pin: deferred, then applied as they go.
    publish(
        ledger_dir, 2, 10 * CHUNK, a=InstanceLimits(2 * CHUNK, CHUNK, 0), b=InstanceLimits(8 * CHUNK, 5 * CHUNK, 0)
    )
    pool_a.free(ids_a[4:8])  # chunk 1 is free before the pool even reads the new limit
    stats = pool_a.sync()
    view = a.snapshot()
    assert stats.deferred and (view.ack_revision, view.ack) == (2, "deferred") and view.deferred_since is not None
    assert view.mapped == pool_a.held_bytes == 5 * CHUNK and view.used == 20 * QUARTER.block_stride
    pool_a.free(ids_a[8:])
    view = a.snapshot()
    assert not pool_a.deferred and (view.ack_revision, view.ack) == (2, "applied")
    assert view.mapped == pool_a.held_bytes == 2 * CHUNK and view.pending == 0  # the limit holds
    pool_a.sync()  # and the target is reached when the engine syncs
    assert a.snapshot().mapped == pool_a.held_bytes == CHUNK
    assert pool_b.alloc(8)  # the budget a gave back is b's to take (within b's limit)
    assert b.snapshot().mapped == 6 * CHUNK

    pool_b.free(ids_b)
    pool_a.close()
    pool_b.close()
    assert a.snapshot().mapped == 0 and b.snapshot().mapped == 0


def test_a_refusal_for_the_budget_moves_pressure_and_the_other_pool_gives_back(two_pools, ledger_dir: Path) -> None:
    a, b, pool_a, pool_b = two_pools
    limits = InstanceLimits(8 * CHUNK, 8 * CHUNK, CHUNK)
    publish(ledger_dir, 1, 10 * CHUNK, a=limits, b=limits)
    ids_a = pool_a.alloc(24)
    pool_a.free(ids_a[4:])
    assert pool_a.sync().held_bytes == 6 * CHUNK  # 1 chunk in use, 5 free: under its target, kept
    start = a.pressure()
    assert not b.admit(9 * CHUNK) and b.last_refusal.reason == "limit"
    assert a.pressure() == start  # b's own limit: nobody else can help
    with pytest.raises(OutOfBlocks):
        pool_b.alloc(24)  # 6 chunks; the GPU's budget has 4 left
    assert b.last_refusal.reason == "budget" and a.pressure() == b.pressure() == start + 1
    with LedgerDir(ledger_dir) as ld:
        assert ld.read().gpus["cuda:0"].pressure == start + 1  # what status and metrics show
    assert pool_b.sync().held_bytes == 0  # the refused pool gives nothing back
    pool_a.sync()  # a sees the pressure: keeps its use (1 chunk) and one growth step (1 chunk)
    assert a.snapshot().mapped == pool_a.held_bytes == 2 * CHUNK and pool_a.live_blocks == 4
    ids_b = pool_b.alloc(24)
    assert b.snapshot().mapped == 6 * CHUNK and a.pressure() == start + 1
    pool_b.free(ids_b)
    pool_a.free(ids_a[:4])


def test_a_budget_refusal_is_remembered_while_the_gpu_and_the_limits_stay_as_they_were(two_pools, ledger_dir: Path) -> None:
    a, b, _, _ = two_pools
    limits = InstanceLimits(8 * CHUNK, 8 * CHUNK, 0)
    publish(ledger_dir, 1, 10 * CHUNK, a=limits, b=limits)
    assert a.admit(8 * CHUNK)
    a.commit(8 * CHUNK)  # 8 of the GPU's 10 chunks
    assert not b.certain_refusal(3 * CHUNK)  # nothing refused yet: ask the ledger
    assert not b.admit(3 * CHUNK) and b.last_refusal.reason == "budget"
    assert b.certain_refusal(3 * CHUNK) and b.certain_refusal(5 * CHUNK)
    assert not b.certain_refusal(2 * CHUNK)  # smaller than the refusal: it fits

    a.release(CHUNK)  # the GPU's totals move: what was refused may fit now
    assert not b.certain_refusal(3 * CHUNK)
    assert b.admit(3 * CHUNK)
    b.rollback(3 * CHUNK)

    assert a.admit(CHUNK)
    a.commit(CHUNK)
    assert not b.admit(3 * CHUNK) and b.certain_refusal(3 * CHUNK)
    publish(ledger_dir, 2, 10 * CHUNK, a=limits, b=limits)  # a new revision of b's limits and of the GPU's budget
    assert not b.certain_refusal(3 * CHUNK)

    assert not b.admit(3 * CHUNK)
    answered = [b.certain_refusal(3 * CHUNK) for _ in range(2 * ASK_AGAIN_AFTER)]
    assert answered == [True] * (ASK_AGAIN_AFTER - 1) + [False] * (ASK_AGAIN_AFTER + 1)  # then ask the ledger again
    a.release(8 * CHUNK)


def test_a_pool_refused_again_and_again_asks_the_ledger_once_in_so_many(two_pools, ledger_dir: Path) -> None:
    _, b, pool_a, pool_b = two_pools
    limits = InstanceLimits(8 * CHUNK, 8 * CHUNK, 0)
    publish(ledger_dir, 1, 10 * CHUNK, a=limits, b=limits)
    ids = pool_a.alloc(32)  # 8 chunks of the GPU's 10
    start = b.pressure()
    refusals = 3 * ASK_AGAIN_AFTER
    for _ in range(refusals):
        with pytest.raises(OutOfBlocks) as err:
            pool_b.alloc(12)  # 3 chunks: the budget has 2
        assert err.value.reason == "admission"
    # Every refusal counts as the pool's own (it is starved: pressure takes nothing from it), but the
    # ledger was asked, and its pressure counter moved, once per ASK_AGAIN_AFTER of them.
    assert pool_b.mapping.admission_refusals == refusals and pool_b.starved
    assert b.pressure() - start == refusals // ASK_AGAIN_AFTER
    assert b.snapshot().pending == 0 and pool_b.held_bytes == 0
    pool_a.free(ids[24:])
    pool_a.shrink(6 * CHUNK)  # a gives 2 chunks back: the GPU's totals move, and b's next growth is asked
    assert len(pool_b.alloc(12)) == 12
    assert b.pressure() - start == refusals // ASK_AGAIN_AFTER


def _holder(ledger_dir: Path, ready, stop, out) -> None:  # type: ignore[no-untyped-def]
    """Another engine process: holds 6 chunks of which it uses 1, and syncs every 10 ms as engines do."""
    try:
        inst = attach(id="holder", model="m", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
        driver = HostDriver(capacity=1 * GiB)
        pool = BlockPool(driver, QUARTER, 64, chunk=CHUNK, limit=inst.limit_source(), name="holder")
        while pool.sync().revision != 1:
            time.sleep(0.01)
        ids = pool.alloc(24)
        pool.free(ids[4:])
        ready.set()
        while not stop.wait(0.01):
            pool.sync()
        out.put(("ok", pool.held_bytes, pool.released_under_pressure))
        pool.free(ids[:4])
        pool.close()
        driver.close()
        inst.detach()
    except BaseException:  # noqa: BLE001 - the test reports it
        out.put(("error", traceback.format_exc(), 0))


def test_across_processes_a_starved_engine_gets_what_another_holds_unused(ledger_dir: Path) -> None:
    ctx = mp.get_context("fork")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    me = attach(id="starved", model="m", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
    holder = ctx.Process(target=_holder, args=(ledger_dir, ready, stop, out))
    holder.start()
    driver = HostDriver(capacity=1 * GiB)
    try:
        deadline = time.monotonic() + 120  # only to catch a hang
        while time.monotonic() < deadline:
            with LedgerDir(ledger_dir) as ld:
                if len(ld.read().instances()) == 2:
                    break
            time.sleep(0.01)
        limits = InstanceLimits(8 * CHUNK, 8 * CHUNK, CHUNK)
        publish(ledger_dir, 1, 10 * CHUNK, holder=limits, starved=limits)
        assert ready.wait(120), "the holder process did not start"
        deadline = time.monotonic() + 120  # the retries' own bound, not what the start-up left of one
        pool = BlockPool(driver, QUARTER, 64, chunk=CHUNK, limit=me.limit_source(), name="starved")
        with pytest.raises(OutOfBlocks):
            pool.alloc(24)  # the holder has 6 of the 10 chunks mapped
        ids: list[int] = []
        while not ids and time.monotonic() < deadline:  # as an engine retries at its next steps
            time.sleep(0.01)
            try:
                ids = pool.alloc(24)
            except OutOfBlocks:
                pass
        assert ids, "the holder never gave its unused memory back"
        stop.set()
        status, held, released = out.get(timeout=30)
        assert status == "ok", held
        assert held == 2 * CHUNK and released == 4 * CHUNK
        pool.free(ids)
        pool.close()
    finally:
        stop.set()
        holder.join(30)
        me.detach()
        driver.close()


def test_what_waits_for_memory_reaches_the_facts_in_whole_mib(two_pools, ledger_dir: Path) -> None:
    """A pool refused at its limit reports the growth with its usage; the ledger keeps it in whole MiB,
    rounded up (never 0 for something waiting), and the controller's facts carry it as ``elastic.waiting``."""
    a, _, pool_a, _ = two_pools
    publish(ledger_dir, 1, 10 * CHUNK, a=InstanceLimits(2 * CHUNK, 2 * CHUNK, CHUNK), b=InstanceLimits(8 * CHUNK, 8 * CHUNK, 0))
    pool_a.sync()
    pool_a.alloc(8)
    with pytest.raises(OutOfBlocks) as err:
        pool_a.alloc(5)  # 2 chunks more than its limit allows
    assert err.value.reason == "limit"
    pool_a.sync()
    slot = a.snapshot()
    assert slot.waiting == 2 * CHUNK and slot.facts(time.time()).elastic.waiting == 2 * CHUNK
    with LedgerDir(ledger_dir) as ld:
        facts = {i.id: i for i in ld.read().facts()[0].instances}  # what the controller decides on
    assert facts["a"].elastic.waiting == 2 * CHUNK and facts["b"].elastic.waiting == 0
    a.report(pool_a.used_bytes, pool_a.held_bytes, 1)  # one byte waits: a whole MiB, not nothing
    assert a.snapshot().waiting == MiB
    pool_a.sync()  # no refusal since the last sync
    assert a.snapshot().waiting == 0
