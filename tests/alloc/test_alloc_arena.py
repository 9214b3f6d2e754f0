"""The arena: chunks mapped on demand, a handle pool, driver-call counts, all-or-nothing grows."""

from __future__ import annotations

import itertools

import pytest
from tests.alloc.alloc_support import resources

from kvpolicy.alloc import AllocError, Arena, DeviceOutOfMemory, DriverError
from kvpolicy.units import MiB


def test_grow_and_shrink_count_every_driver_call(driver):
    with Arena(driver, 64 * MiB, 4 * MiB) as arena:
        assert arena.num_chunks == 16 and arena.va % driver.granularity == 0
        result = arena.grow(3)
        assert result.indices == (0, 1, 2) and result.created == 3
        c = arena.calls
        assert (c.address_reserve, c.create, c.map, c.set_access) == (1, 3, 3, 3)
        assert arena.mapped_bytes == arena.held_bytes == 12 * MiB
        assert arena.shrink(2) == [2, 1]  # highest first
        assert (c.unmap, c.release) == (2, 2)  # no handle pool: memory really goes back
        assert arena.held_bytes == 4 * MiB
    assert arena.calls.address_free == 1 and arena.calls.failures == 0


def test_handle_pool_skips_create_up_to_its_high_water_mark(driver):
    with Arena(driver, 32 * MiB, 2 * MiB, keep_handles=2) as arena:
        arena.grow(4)
        arena.shrink(4)
        assert arena.pooled_handles == 2 and arena.calls.release == 2
        assert arena.held_bytes == 4 * MiB  # pooled handles still hold device memory
        before = arena.calls.copy()
        result = arena.grow(3)
        assert result.fresh == (False, False, True)
        delta = arena.calls - before
        assert (delta.create, delta.map, delta.set_access) == (1, 3, 3)
        arena.shrink(3, keep_handles=False)
        assert arena.pooled_handles == 0
        arena.grow(1)
        arena.unmap_chunks([0])
        assert arena.release_pooled() == 1 and arena.held_bytes == 0


def test_chunk_must_be_a_multiple_of_the_granularity(driver):
    with pytest.raises(ValueError, match="multiple of the driver's granularity"):
        Arena(driver, 64 * MiB, 3 * MiB)


def test_bad_chunk_indices_are_refused_before_any_driver_call(driver):
    with Arena(driver, 16 * MiB, 2 * MiB) as arena:
        arena.map_chunks([1])
        before = arena.calls.copy()
        with pytest.raises(ValueError, match="already mapped"):
            arena.map_chunks([0, 1])
        with pytest.raises(ValueError, match="out of range"):
            arena.map_chunks([8])
        with pytest.raises(ValueError, match="repeat"):
            arena.map_chunks([2, 2])
        with pytest.raises(ValueError, match="not mapped"):
            arena.unmap_chunks([3])
        assert arena.calls == before and arena.mapped_indices() == [1]
        with pytest.raises(AllocError, match="7 unmapped chunks, 9 requested"):
            arena.grow(9)


@pytest.mark.parametrize(
    ("call", "after", "pooled"),
    [
        (call, after, pooled)
        for call, after, pooled in itertools.product(("cuMemCreate", "cuMemMap", "cuMemSetAccess"), range(4), (0, 2))
        if not (call == "cuMemCreate" and after >= 4 - pooled)  # creates happen only for unpooled chunks
    ],
)
def test_failed_grow_rolls_back_at_every_driver_call(driver, call, after, pooled):
    with Arena(driver, 32 * MiB, 2 * MiB, keep_handles=pooled) as arena:
        arena.grow(2)
        if pooled:
            arena.grow(pooled)
            arena.unmap_chunks(range(2, 2 + pooled))
        held, mapped, pool = arena.held_bytes, arena.mapped_indices(), arena.pooled_handles
        driver_state = resources(driver)
        driver.inject(call, "CUDA_ERROR_UNKNOWN", after=after)
        with pytest.raises(DriverError) as err:
            arena.map_chunks([2, 3, 4, 5])
        assert err.value.call == call
        assert arena.held_bytes == held and arena.mapped_indices() == mapped and arena.pooled_handles == pool
        assert resources(driver) == driver_state
        assert arena.calls.failures == 1
        arena.map_chunks([2, 3, 4, 5])  # and the arena works afterwards


def test_failed_undo_leaves_a_stuck_chunk_that_close_cleans_up(driver):
    arena = Arena(driver, 16 * MiB, 2 * MiB)
    driver.inject("cuMemSetAccess", "CUDA_ERROR_UNKNOWN", after=1)
    driver.inject("cuMemUnmap", "CUDA_ERROR_UNKNOWN")  # the undo of chunk 1 fails
    with pytest.raises(DriverError) as err:
        arena.map_chunks([0, 1, 2])
    assert err.value.call == "cuMemSetAccess"
    assert any("stuck" in note for note in getattr(err.value, "__notes__", [])) or not hasattr(err.value, "add_note")
    assert arena.stuck_chunks == 1 and arena.mapped_chunks == 0 and arena.held_bytes == 2 * MiB
    assert not arena.is_mapped(1)
    arena.map_chunks([1])  # mapping a stuck chunk retries its unmap first
    assert arena.stuck_chunks == 0 and arena.mapped_indices() == [1]
    arena.close()


def test_close_retries_after_a_failure(driver):
    arena = Arena(driver, 16 * MiB, 2 * MiB)
    arena.grow(3)
    driver.inject("cuMemUnmap", "CUDA_ERROR_UNKNOWN")
    with pytest.raises(DriverError):
        arena.close()
    assert not arena.closed and arena.mapped_chunks == 1
    arena.close()
    assert arena.closed
    arena.close()  # idempotent
    with pytest.raises(AllocError, match="closed"):
        arena.grow(1)


def test_unmap_failure_stops_and_keeps_state_true(driver):
    with Arena(driver, 16 * MiB, 2 * MiB, keep_handles=0) as arena:
        arena.grow(4)
        driver.inject("cuMemUnmap", "CUDA_ERROR_UNKNOWN", after=1)
        with pytest.raises(DriverError):
            arena.unmap_chunks([3, 2, 1])
        assert arena.mapped_indices() == [0, 1, 2]
        driver.inject("cuMemRelease", "CUDA_ERROR_UNKNOWN")
        with pytest.raises(DriverError):
            arena.unmap_chunks([2])
        assert arena.mapped_indices() == [0, 1] and arena.pooled_handles == 1  # kept, to release at close


def test_host_out_of_memory_mid_grow_rolls_back():
    from kvpolicy.alloc import HostDriver

    with HostDriver(capacity=10 * MiB) as d, Arena(d, 64 * MiB, 4 * MiB) as arena:
        arena.grow(1)
        with pytest.raises(DeviceOutOfMemory):
            arena.grow(2)  # the second chunk does not fit
        assert arena.mapped_indices() == [0] and d.in_use == 4 * MiB
        arena.grow(1)
        assert d.mem_info() == (2 * MiB, 10 * MiB)
