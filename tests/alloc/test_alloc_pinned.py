"""``PinnedFirst``: a pool's pinned chunks from a static allowance, the rest from the ledger (both adapters)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.alloc import BlockPool, BlockSpec, HostDriver, OutOfBlocks, StaticLimit
from kvpolicy.alloc.pinned import PinnedFirst
from kvpolicy.units import MiB

CHUNK = 2 * MiB


def test_pinned_first_keeps_the_ledger_to_elastic_bytes() -> None:
    inner = StaticLimit(10 * CHUNK, 4 * CHUNK)
    lim = PinnedFirst(inner, 2 * CHUNK, pinned_used=CHUNK)
    reading = lim.read()
    assert (reading.limit, reading.target) == (12 * CHUNK, 6 * CHUNK) and lim.read() is reading
    assert lim.admit(3 * CHUNK)  # 2 from the allowance, 1 from the ledger
    assert inner.pending == CHUNK
    lim.commit(3 * CHUNK)
    assert (inner.mapped, lim.pinned_held, lim.elastic_held) == (CHUNK, 2 * CHUNK, CHUNK)
    assert lim.admit(9 * CHUNK) and inner.pending == 9 * CHUNK
    lim.rollback(9 * CHUNK)
    assert inner.pending == 0
    assert not lim.admit(10 * CHUNK) and inner.pending == 0  # the ledger says no: nothing taken
    lim.report(5 * CHUNK, 3 * CHUNK)
    assert inner.used == 4 * CHUNK  # the null block is not the engine's KV
    lim.release(3 * CHUNK)  # at close: the elastic chunk first, then the pinned ones
    assert inner.mapped == 0 and lim.pinned_held == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["grow", "fail", "shrink"]), st.integers(1, 6)), max_size=40))
def test_pinned_first_books_balance(ops: list[tuple[str, int]]) -> None:
    """Through any sequence of a block pool's grows, failed grows and shrinks, the ledger holds the elastic bytes."""
    inner = StaticLimit(20 * CHUNK)
    lim = PinnedFirst(inner, CHUNK)
    driver = HostDriver(capacity=64 * CHUNK)
    pool = BlockPool(driver, BlockSpec(CHUNK // 2), 64, chunk=CHUNK, limit=lim)
    try:
        pool.claim([0])  # the null block: from the allowance
        assert inner.mapped == 0 and lim.pinned_held == CHUNK
        for op, k in ops:
            if op == "grow":
                try:
                    pool.grow(k)
                except OutOfBlocks:
                    pass
            elif op == "fail":
                driver.inject("cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY", after=1)
                try:
                    pool.grow(k + 2)
                except OutOfBlocks as exc:
                    assert exc.reason in ("device", "limit", "capacity")
                driver.clear_faults()
            else:
                pool.shrink(max(0, pool.held_bytes - k * CHUNK))
            assert inner.pending == 0
            assert inner.mapped == lim.elastic_held == pool.held_bytes - CHUNK
            assert pool.held_bytes <= 21 * CHUNK and pool.is_chunk_mapped(0)
    finally:
        pool.close()
        driver.close()
    assert inner.mapped == 0


def test_a_cap_bounds_the_elastic_limit_and_target_but_not_the_pinned_allowance() -> None:
    inner = StaticLimit(10 * CHUNK, 8 * CHUNK)
    lim = PinnedFirst(inner, CHUNK, cap=3 * CHUNK)
    reading = lim.read()
    assert (reading.limit, reading.target) == (4 * CHUNK, 4 * CHUNK)
    inner.set(2 * CHUNK)  # a ledger limit below the cap stands
    assert lim.read().limit == 3 * CHUNK
