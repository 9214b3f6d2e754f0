"""The block pool: alloc/free, growth under the limit, shrink, deferred limits, rollback, placement."""

from __future__ import annotations

import pytest
from tests.alloc.alloc_support import RecordingLimit, check_pool, resources

from kvpolicy.alloc import BlockError, BlockPool, BlockSpec, DriverError, HostDriver, KVCacheLayout, OutOfBlocks
from kvpolicy.units import GiB, MiB

CHUNK = 2 * MiB
QUARTER = BlockSpec(block_stride=CHUNK // 4)  # 4 blocks per chunk, one arena


def make_pool(driver, geometry=QUARTER, num_blocks=64, limit=None, **kw):
    limit = limit or RecordingLimit(1 * GiB)
    return BlockPool(driver, geometry, num_blocks, chunk=kw.pop("chunk", CHUNK), limit=limit, **kw), limit


def test_alloc_grows_on_demand_and_free_returns(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    assert pool.held_bytes == 0 and pool.free_blocks == 0
    ids = pool.alloc(6)
    assert sorted(ids) == list(range(6))
    assert pool.stats().mapped_chunks == 2 and pool.held_bytes == 2 * CHUNK
    assert limit.calls("admit") == [2 * CHUNK] and limit.calls("commit") == [2 * CHUNK]
    assert limit.reported == (6 * QUARTER.block_stride, 2 * CHUNK)
    check_pool(pool, limit, driver, base)
    pool.free(ids[:3])
    assert pool.live_blocks == 3 and pool.free_blocks == 5
    check_pool(pool, limit, driver, base)
    again = pool.alloc(5)  # no growth: reuses the mapped chunks
    assert len(limit.calls("admit")) == 1 and set(again).isdisjoint(ids[3:])
    check_pool(pool, limit, driver, base)
    pool.close()
    assert limit.mapped == 0 and limit.reported == (0, 0)


def test_alloc_zero_and_negative(driver):
    pool, _ = make_pool(driver)
    with pool:
        assert pool.alloc(0) == []
        with pytest.raises(ValueError):
            pool.alloc(-1)


def test_bad_frees_change_nothing(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        ids = pool.alloc(4)
        pool.free([ids[0]])
        with pytest.raises(BlockError, match="not live"):
            pool.free([ids[1], ids[0]])  # ids[0] is already free: neither is freed
        assert pool.is_live(ids[1])
        with pytest.raises(BlockError, match="out of range"):
            pool.free([ids[2], 64])
        with pytest.raises(BlockError, match="out of range"):
            pool.free([-1])
        assert pool.live_blocks == 3
        check_pool(pool, limit, driver, base)


def test_limit_refuses_growth_with_numbers(driver):
    base = resources(driver)
    limit = RecordingLimit(3 * CHUNK)
    pool, _ = make_pool(driver, limit=limit)
    with pool:
        pool.alloc(12)
        with pytest.raises(OutOfBlocks) as err:
            pool.alloc(1)
        e = err.value
        assert e.reason == "limit" and e.held == 3 * CHUNK and e.limit == 3 * CHUNK and e.needed == CHUNK
        assert "over its limit of 6 MiB" in str(e)
        assert limit.calls("admit") == [3 * CHUNK]  # the refusal came before admit
        check_pool(pool, limit, driver, base)


def test_admission_refusal_maps_nothing(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        limit.refuse = True
        with pytest.raises(OutOfBlocks) as err:
            pool.alloc(3)
        assert err.value.reason == "admission" and pool.held_bytes == 0
        assert resources(driver)[:2] == base[:2]
        limit.refuse = False
        pool.alloc(3)
        check_pool(pool, limit, driver, base)


def test_virtual_capacity_is_a_hard_end(driver):
    pool, _ = make_pool(driver, num_blocks=10)
    with pool:
        assert pool.num_chunks == 3
        pool.alloc(10)
        with pytest.raises(OutOfBlocks) as err:
            pool.alloc(1)
        assert err.value.reason == "capacity"


def test_device_out_of_memory_is_out_of_blocks_and_rolls_back():
    d = HostDriver(capacity=3 * CHUNK)
    pool, limit = make_pool(d)
    base = (0, 0, 0)
    pool.alloc(8)
    with pytest.raises(OutOfBlocks) as err:
        pool.alloc(8)  # needs 2 more chunks, the device has 1
    assert err.value.reason == "device" and isinstance(err.value.__cause__, DriverError)
    assert pool.held_bytes == 2 * CHUNK and limit.pending == 0
    check_pool(pool, limit, d, base)
    pool.close()
    d.close()


def test_grow_batches_chunks_and_admits_once(driver):
    base = resources(driver)
    pool, limit = make_pool(driver, grow_chunks=4)
    with pool:
        pool.alloc(1)
        assert pool.stats().mapped_chunks == 4 and limit.calls("admit") == [4 * CHUNK]
        assert limit.calls("commit") == [4 * CHUNK]
        pool.alloc(15)  # fits in the batch: no more growth
        assert len(limit.calls("admit")) == 1
        check_pool(pool, limit, driver, base)


def test_grow_batch_is_trimmed_to_the_limit(driver):
    base = resources(driver)
    limit = RecordingLimit(6 * CHUNK)
    pool, _ = make_pool(driver, limit=limit, grow_chunks=4)
    with pool:
        pool.alloc(1)
        pool.alloc(16)  # needs chunks 4..; the batch of 4 would pass the limit, 2 more fit
        assert pool.stats().mapped_chunks == 6 and limit.calls("admit") == [4 * CHUNK, 2 * CHUNK]
        check_pool(pool, limit, driver, base)


def test_placement_fills_low_chunks_so_free_high_chunks_can_go(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        ids = pool.alloc(16)  # chunks 0..3 full
        pool.free([b for b in ids if b % 4 != 0])  # each chunk keeps one live block
        pool.free([8, 12])  # chunks 2 and 3 are now fully free
        assert pool.fully_free_chunks() == [2, 3]
        new = pool.alloc(6)  # fills the lower chunks 0 and 1 before touching 2 and 3
        assert {pool.chunks_of_block(b)[0] for b in new} == {0, 1}
        assert pool.fully_free_chunks() == [2, 3]
        assert pool.shrink(0) == 2 * CHUNK  # only the fully free chunks can go
        assert pool.stats().mapped_chunks == 2
        check_pool(pool, limit, driver, base)


def test_placement_takes_the_lowest_chunk_with_a_free_block_even_a_fully_free_one(driver):
    """A fully free chunk below a partly used one is filled first: live blocks gather low, and the
    higher chunk, no longer topped up, empties and can go back (a give-back takes the highest)."""
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        pool.alloc(16)  # chunks 0..3 full
        pool.free([0, 1, 2, 3, 13])  # chunk 0 fully free, chunk 3 partly used
        def chunks(blocks):
            return sorted(pool.chunks_of_block(b)[0] for b in blocks)

        assert chunks(pool.alloc(2)) == [0, 0]  # not chunk 3's hole
        assert pool.fully_free_chunks() == []
        pool.free([12, 14, 15])
        assert pool.fully_free_chunks() == [3]
        assert chunks(pool.alloc(3)) == [0, 0, 3]  # chunk 0's last two, then chunk 3
        check_pool(pool, limit, driver, base)


def test_shrink_to_target_releases_highest_chunks_first(driver):
    base = resources(driver)
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK))
    with pool:
        ids = pool.alloc(20)
        pool.free(ids[4:])
        assert pool.shrink(3 * CHUNK) == 2 * CHUNK
        assert [pool.is_chunk_mapped(c) for c in range(5)] == [True, True, True, False, False]
        stats = pool.sync()  # gives back what is above the target
        assert stats.held_bytes == 2 * CHUNK == stats.target
        pool.alloc(8)  # 4 free in chunk 1, then growth at the lowest unmapped chunk
        assert [pool.is_chunk_mapped(c) for c in range(5)] == [True, True, True, False, False]
        check_pool(pool, limit, driver, base)


def test_a_give_back_delay_returns_only_what_stayed_free_above_the_target_for_a_period(driver):
    base = resources(driver)
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK), give_back_delay_s=1.0,
                            clock=lambda: now[0])
    with pool:
        ids = pool.alloc(40)  # 10 chunks, the target is 2
        pool.free(ids[8:])  # chunks 2..9 free: 8 chunks above the target
        assert pool.sync().held_bytes == 10 * CHUNK  # free for less than a period: kept
        now[0] = 0.5
        again = pool.alloc(12)  # the next request takes 3 of them back, without mapping
        assert limit.calls("admit") == [10 * CHUNK]
        assert pool.sync().held_bytes == 10 * CHUNK
        now[0] = 1.0
        # The period ends: the least free above the target at any sync was 5 chunks; they go.
        assert pool.sync().held_bytes == 5 * CHUNK
        assert [pool.is_chunk_mapped(c) for c in range(6)] == [True] * 5 + [False]
        pool.free(again)
        now[0] = 1.5
        assert pool.sync().held_bytes == 5 * CHUNK  # free since 1.0 only
        now[0] = 2.0
        assert pool.sync().held_bytes == 2 * CHUNK == pool.stats().target
        # Pressure is not delayed: another instance was refused, the free memory goes at once.
        pool.free(ids[:8])
        limit.press()
        assert pool.sync().held_bytes == 1 * CHUNK  # one growth step kept; now[0] has not moved
        check_pool(pool, limit, driver, base)


def test_lowered_limit_defers_while_blocks_are_live_then_completes(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        ids = pool.alloc(16)  # 4 chunks
        live_chunk3 = [b for b in ids if b >= 12]
        pool.free([b for b in ids if 4 <= b < 12])  # chunks 1, 2 free
        limit.set(1 * CHUNK)
        stats = pool.sync()
        assert stats.deferred and stats.held_bytes == 2 * CHUNK  # chunks 0 and 3 pinned by live blocks
        assert limit.calls("ack")[-1] == (2, "deferred")
        check_pool(pool, limit, driver, base)
        with pytest.raises(OutOfBlocks) as err:
            pool.alloc(5)  # no growth while over the limit
        assert err.value.reason == "limit"
        pool.free(live_chunk3[:2])
        assert pool.deferred and pool.is_chunk_mapped(3)  # still a live block in chunk 3
        pool.free(live_chunk3[2:])  # the last one: chunk 3 goes and the limit holds
        assert not pool.deferred and not pool.is_chunk_mapped(3)
        assert pool.held_bytes == CHUNK and limit.calls("ack")[-1] == (2, "applied")
        check_pool(pool, limit, driver, base)


def test_raised_limit_is_acknowledged_applied(driver):
    pool, limit = make_pool(driver, limit=RecordingLimit(2 * CHUNK))
    with pool:
        assert limit.calls("ack") == [(1, "applied")]
        limit.set(4 * CHUNK)
        pool.alloc(16)  # growth reads the new limit
        assert limit.calls("ack")[-1] == (2, "applied") and pool.held_bytes == 4 * CHUNK


def test_limit_lowered_under_free_chunks_applies_at_once(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        pool.free(pool.alloc(16))
        limit.set(CHUNK + 1)  # rounds down to whole chunks
        pool.sync()
        assert pool.held_bytes == CHUNK and not pool.deferred and limit.acked == (2, "applied")
        check_pool(pool, limit, driver, base)


@pytest.mark.parametrize("call", ["cuMemCreate", "cuMemMap", "cuMemSetAccess"])
@pytest.mark.parametrize("after", range(6))
def test_failed_pool_grow_rolls_back_across_arenas(driver, call, after):
    """Three arenas, two chunks each: a failure at the n-th call of any kind leaves nothing behind."""
    base = resources(driver)
    layout = KVCacheLayout(num_layers=3, block_size=16, num_heads=4, head_dim=128, dtype="bfloat16", latent=True)
    pool, limit = make_pool(driver, geometry=layout, num_blocks=512)
    with pool:
        first = pool.alloc(1)  # chunk 0 in all three arenas
        held = pool.held_bytes
        per_chunk = CHUNK // layout.block_stride
        driver.inject(call, "CUDA_ERROR_UNKNOWN", after=after)
        with pytest.raises(DriverError) as err:
            pool.alloc(2 * per_chunk)  # needs chunks 1 and 2: six of each call
        assert err.value.call == call and driver.pending_faults() == 0
        assert pool.held_bytes == held and pool.live_blocks == 1 and pool.free_blocks == per_chunk - 1
        assert limit.calls("rollback")[-1] == 6 * CHUNK
        check_pool(pool, limit, driver, base)
        ids = pool.alloc(2 * per_chunk)  # works afterwards
        pool.free(ids + first)
        check_pool(pool, limit, driver, base)


def test_unmap_failure_during_shrink_is_retried(driver):
    base = resources(driver)
    layout = BlockSpec(block_stride=CHUNK // 2, num_arenas=2)
    pool, limit = make_pool(driver, geometry=layout)
    with pool:
        pool.free(pool.alloc(8))
        assert pool.calls.map == pool.calls.create == 8  # 4 chunks in each of the 2 arenas
        driver.inject("cuMemUnmap", "CUDA_ERROR_UNKNOWN", after=1)
        with pytest.raises(DriverError):
            pool.shrink(0)
        check_pool(pool, limit, driver, base)  # half-unmapped chunks are held and accounted
        assert pool.shrink(0) > 0 and pool.held_bytes == 0
        check_pool(pool, limit, driver, base)


def test_deferred_completion_survives_a_driver_failure_in_free(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        ids = pool.alloc(8)
        limit.set(CHUNK)
        pool.sync()
        assert pool.deferred
        driver.inject("cuMemUnmap", "CUDA_ERROR_UNKNOWN")
        pool.free(ids[4:])  # chunk 1 becomes free; its unmap fails, the free does not
        assert pool.last_error is not None and pool.deferred
        assert not any(pool.is_live(b) for b in ids[4:])
        check_pool(pool, limit, driver, base)
        pool.sync()  # tries again
        assert not pool.deferred and pool.held_bytes == CHUNK
        check_pool(pool, limit, driver, base)


@pytest.mark.parametrize(
    ("stride", "arenas"),
    [(CHUNK * 3 // 4, 1), (CHUNK * 5 // 2, 1), (1_002_240, 2), (CHUNK, 1), (CHUNK * 2, 2)],
    ids=["3/4-chunk", "2.5-chunks", "dsv4-block", "one-chunk", "two-chunks"],
)
def test_straddling_blocks_need_all_their_chunks(driver, stride, arenas):
    base = resources(driver)
    pool, limit = make_pool(driver, geometry=BlockSpec(stride, arenas), num_blocks=40)
    with pool:
        for b in range(pool.num_blocks):
            chunks = pool.chunks_of_block(b)
            assert chunks[0] == b * stride // CHUNK and chunks[-1] == ((b + 1) * stride - 1) // CHUNK
            assert all(b in pool.blocks_of_chunk(c) for c in chunks)
        ids = pool.alloc(7)
        check_pool(pool, limit, driver, base)
        pool.free(ids[::2])
        check_pool(pool, limit, driver, base)
        more = pool.alloc(9)
        check_pool(pool, limit, driver, base)
        pool.free(ids[1::2] + more)
        pool.shrink(0)
        assert pool.held_bytes == 0
        check_pool(pool, limit, driver, base)


def test_claim_and_ensure_mapped_for_engines_that_pick_ids(driver):
    base = resources(driver)
    pool, limit = make_pool(driver)
    with pool:
        assert pool.ensure_mapped([9, 10]) == [2]
        assert pool.is_chunk_mapped(2) and pool.free_blocks == 4 and pool.live_blocks == 0
        assert pool.ensure_mapped([8]) == []
        pool.claim([9, 30])  # 30 is in chunk 7: mapped now
        assert pool.is_live(9) and pool.is_live(30) and pool.is_chunk_mapped(7)
        with pytest.raises(BlockError, match="already live"):
            pool.claim([30])
        with pytest.raises(BlockError, match="repeat"):
            pool.claim([1, 1])
        check_pool(pool, limit, driver, base)
        assert pool.fully_free_chunks() == []
        pool.free([30])
        assert pool.fully_free_chunks() == [7]
        new = pool.alloc(3)
        assert set(new) == {8, 10, 11}  # the partly used chunk first
        check_pool(pool, limit, driver, base)


def test_geometry_of_kv_layouts():
    lm = KVCacheLayout(num_layers=32, block_size=16, num_heads=8, head_dim=128, dtype="bfloat16")
    assert lm.page_bytes == 32 * 1024 and lm.num_arenas == 64 and lm.block_stride == lm.page_bytes
    assert lm.placement(3, "v") == (7, 0)
    bm = KVCacheLayout(num_layers=32, block_size=16, num_heads=8, head_dim=128, order="block_major")
    assert bm.num_arenas == 1 and bm.block_stride == 64 * 32 * 1024 and bm.placement(3, "v") == (0, 7 * 32 * 1024)
    mla = KVCacheLayout(num_layers=2, block_size=64, num_heads=1, head_dim=656, dtype="uint8", latent=True)
    assert mla.parts == ("latent",) and mla.block_bytes == 2 * 64 * 656
    with pytest.raises(ValueError, match="unknown dtype"):
        KVCacheLayout(num_layers=1, block_size=1, num_heads=1, head_dim=1, dtype="float64")
    with pytest.raises(ValueError, match="part"):
        lm.placement(0, "latent")


def test_pool_close_is_final(driver):
    pool, limit = make_pool(driver)
    ids = pool.alloc(3)
    pool.close()
    pool.close()
    assert limit.mapped == 0 and pool.held_bytes == 0
    with pytest.raises(Exception, match="closed"):
        pool.free(ids)


def test_pressure_gives_back_free_memory_beyond_use_and_one_growth_step(driver):
    base = resources(driver)
    pool, limit = make_pool(driver, grow_chunks=2)
    with pool:
        ids = pool.alloc(40)  # 10 chunks
        pool.free(ids[6:])  # 6 live blocks: chunks 0 and 1 (half)
        assert pool.sync().held_bytes == 10 * CHUNK  # under the target: kept, a warm cache
        assert not pool.pressed
        limit.press()  # another instance was refused memory for the GPU's budget
        assert pool.pressed
        stats = pool.sync()
        assert not pool.pressed
        # What is in use (2 chunks) plus one growth step (2 chunks) stays; the free rest goes.
        assert stats.held_bytes == 4 * CHUNK and pool.released_under_pressure == 6 * CHUNK
        assert [pool.is_chunk_mapped(c) for c in range(5)] == [True, True, True, True, False]
        assert pool.sync().held_bytes == 4 * CHUNK  # one refusal, one give-back
        assert pool.alloc(10)  # live blocks untouched, and growth works again
        check_pool(pool, limit, driver, base)


def test_pressure_never_goes_below_the_guarantee_nor_gives_back_a_starved_pool(driver):
    base = resources(driver)
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, guarantee=6 * CHUNK))
    with pool:
        pool.free(pool.alloc(40))
        limit.press()
        assert pool.sync().held_bytes == 6 * CHUNK  # nobody else could take the guarantee
        # Its own admission refused (the GPU is full): this pool is the one short of memory.
        limit.refuse = True
        with pytest.raises(OutOfBlocks):
            pool.alloc(30)
        limit.press()
        assert pool.sync().held_bytes == 6 * CHUNK and pool.released_under_pressure == 4 * CHUNK
        limit.refuse = False
        check_pool(pool, limit, driver, base)


def test_pressure_is_ignored_when_turned_off_or_while_a_limit_is_deferred(driver):
    off, off_limit = make_pool(driver, give_back_under_pressure=False)
    with off:
        off.free(off.alloc(40))
        off_limit.press()
        assert not off.pressed
        assert off.sync().held_bytes == 10 * CHUNK
    pool, limit = make_pool(driver)
    with pool:
        ids = pool.alloc(40)
        pool.free(ids[4:36])  # chunks 0 and 9 stay live
        limit.set(CHUNK)  # deferred: chunk 9 pins it
        limit.press()
        stats = pool.sync()
        assert stats.deferred and pool.released_under_pressure == 0  # the deferral does the shrinking
        assert stats.held_bytes == 2 * CHUNK  # chunks 1..8 went for the limit, not for the pressure


def test_with_a_hold_pressure_takes_below_the_target_only_memory_free_through_a_whole_hold(driver):
    base = resources(driver)
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=8 * CHUNK), give_back_hold_s=2.0,
                            clock=lambda: now[0])
    with pool:
        ids = pool.alloc(32)  # 8 chunks, all under the target
        pool.free(ids[8:])  # 2 chunks live, 6 free
        assert pool.sync().held_bytes == 8 * CHUNK
        limit.press()  # free for less than a hold: a busy engine's blocks, taken again soon
        assert pool.sync().held_bytes == 8 * CHUNK and pool.released_under_pressure == 0
        for t in (1.0, 2.0, 3.0, 4.0):  # two hold periods pass with the 6 chunks free throughout
            now[0] = t
            pool.sync()
        limit.press()
        stats = pool.sync()  # free through a whole hold: they go, down to use plus one growth step
        assert stats.held_bytes == 3 * CHUNK and pool.released_under_pressure == 5 * CHUNK
        # A second refusal: chunk 2 (the growth step kept) stayed free all along and goes;
        # chunk 1, freed just now, is not idle through a hold and stays.
        pool.free(ids[4:8])
        limit.press()
        assert pool.sync().held_bytes == 2 * CHUNK
        assert pool.is_chunk_mapped(1) and not pool.is_chunk_mapped(2)
        check_pool(pool, limit, driver, base)


def test_with_a_hold_memory_above_the_target_goes_under_pressure_at_once(driver):
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK), give_back_hold_s=5.0,
                            give_back_delay_s=10.0, clock=lambda: now[0])
    with pool:
        ids = pool.alloc(40)  # 10 chunks, target 2
        pool.free(ids[4:])  # 1 chunk live
        limit.press()
        assert pool.sync().held_bytes == 2 * CHUNK  # down to the target (use + one step is below it)


def test_top_up_maps_a_reserve_ahead_within_the_limit_and_waits_after_a_refusal(driver):
    base = resources(driver)
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(4 * CHUNK), reserve_blocks=6, give_back_hold_s=1.0,
                            clock=lambda: now[0])
    with pool:
        assert pool.top_up() == [0, 1]  # 6 free blocks need 2 chunks of 4
        assert pool.free_blocks == 8 and limit.calls("admit") == [2 * CHUNK]
        assert pool.top_up() == []  # the reserve is there
        ids = pool.alloc(5)  # taken from mapped memory: no growth inside alloc
        assert len(limit.calls("admit")) == 1
        assert pool.top_up() == [2] and pool.free_blocks == 7  # 3 were free: one chunk more makes the 6
        more = pool.alloc(7)
        assert pool.top_up() == [] and pool.held_bytes == 3 * CHUNK  # 2 chunks would pass the limit: refused
        limit.set(8 * CHUNK)
        pool.sync()
        assert pool.top_up() == []  # within a hold of the refusal
        now[0] = 1.0
        assert pool.top_up() == [3, 4] and pool.free_blocks == 8
        pool.free(more)
        pool.free(ids)
        check_pool(pool, limit, driver, base)


def test_top_up_does_not_refill_while_another_instance_is_short_of_memory(driver):
    now = [0.0]
    pool, limit = make_pool(driver, reserve_blocks=4, give_back_hold_s=1.0, clock=lambda: now[0])
    with pool:
        pool.alloc(8)
        limit.press()
        assert pool.top_up() == []  # pressed: the reserve would be taken from the instance refused
        pool.sync()
        assert pool.top_up() == [2]
    plain, _ = make_pool(driver)
    with plain:
        plain.alloc(1)
        assert plain.top_up() == []  # no reserve: never maps ahead


def test_a_give_back_above_the_target_keeps_the_reserve(driver):
    pool, _limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK), reserve_blocks=8)
    with pool:
        ids = pool.alloc(40)
        pool.free(ids[16:])  # 4 chunks live, 6 free, all above the target
        assert pool.sync().held_bytes == 6 * CHUNK  # use + the reserve's 2 chunks stay


def test_regrowths_count_growths_that_follow_a_give_back(driver):
    pool, _limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=0))
    with pool:
        ids = pool.alloc(8)
        assert pool.stats().regrowths == 0 and pool.stats().groups_mapped == 2
        pool.free(ids)
        pool.sync()  # above the target: given back
        s = pool.stats()
        assert (s.groups_unmapped, s.regrowths) == (2, 0)
        pool.alloc(4)
        pool.alloc(4)  # two growths, one cycle
        s = pool.stats()
        assert (s.groups_mapped, s.groups_unmapped, s.regrowths) == (4, 2, 1)


@pytest.mark.parametrize("keeps", [False, True], ids=["old-floor", "keeps-reserve"])
def test_pressure_keeps_the_reserve_when_asked_to(driver, keeps):
    """Under pressure a pool keeps use + one growth step (the old floor), or with
    ``pressure_keeps_reserve`` use + its reserve: a busy pool's next steps' blocks stay mapped."""
    base = resources(driver)
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=0), reserve_blocks=8,
                            pressure_keeps_reserve=keeps, give_back_delay_s=100.0)
    with pool:
        ids = pool.alloc(40)  # 10 chunks
        pool.free(ids[4:])  # 1 chunk live, 9 free (the delay keeps them from going above the target)
        assert pool.sync().held_bytes == 10 * CHUNK
        limit.press()
        held = pool.sync().held_bytes
        assert held == (3 if keeps else 2) * CHUNK  # use + the reserve's 2 chunks, or use + one growth step
        assert pool.released_under_pressure == (10 * CHUNK - held)
        pool.free(ids[:4])
        check_pool(pool, limit, driver, base)


def test_admission_room_bounds_new_work_by_a_deferred_limit_and_under_contention_by_the_target(driver):
    """``admission_room``: None while nothing bounds new work but the limit; under a deferred lower
    limit what the limit leaves over the live blocks; with ``yield_above_target_s``, for that long
    after a sync saw another instance refused memory, what the target leaves (never below zero)."""
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=4 * CHUNK), yield_above_target_s=2.0,
                            give_back_delay_s=100.0, clock=lambda: now[0])
    with pool:
        ids = pool.alloc(24)  # 6 chunks, above the target of 4
        pool.sync()
        assert pool.admission_room() is None  # nobody waits: the pool may use what the limit allows
        limit.press()
        pool.sync()
        assert pool.admission_room() == 0  # contended, and its live blocks are above the target
        pool.free(ids[12:])
        assert pool.admission_room() == 4 * CHUNK - 12 * QUARTER.block_stride  # back under it: the rest
        now[0] = 1.9
        pool.sync()
        assert pool.admission_room() == 4 * CHUNK - 12 * QUARTER.block_stride  # still within 2 s of the news
        now[0] = 2.0
        assert pool.admission_room() is None  # no refusal for 2 s: the pool takes what it can again
        pool.free(ids[1:11])  # live: block 0 (chunk 0) and block 11 (chunk 2)
        limit.set(CHUNK)  # below the two chunks they pin: deferred
        pool.sync()
        assert pool.deferred and pool.admission_room() == CHUNK - 2 * QUARTER.block_stride
        pool.free([ids[11]])  # chunk 2 empties and goes: the limit holds
        assert not pool.deferred and pool.admission_room() is None
    off, off_limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=0))
    with off:
        off.alloc(8)
        off_limit.press()
        off.sync()
        assert off.admission_room() is None  # the setting is off by default: the old behaviour


def test_above_the_target_new_work_takes_only_free_blocks_of_the_chunks_the_target_keeps(driver):
    """Contended and above its target, a pool admits new work into the free blocks of its lowest
    target's worth of chunks, which it keeps either way, and not into the chunks above: placement
    fills the low ones, so the chunks above empty and go back."""
    base = resources(driver)
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=4 * CHUNK), yield_above_target_s=2.0,
                            clock=lambda: now[0])
    block = QUARTER.block_stride
    with pool:
        pool.alloc(24)  # chunks 0..5, 4 blocks each; a target of 4 chunks keeps 0..3
        limit.press()
        pool.sync()
        assert pool.admission_room() == 0  # every block of chunks 0..3 is live
        pool.free([5, 6, 21])  # two blocks of chunk 1, one of chunk 5
        assert pool.used_bytes > 4 * CHUNK  # still above the target
        assert pool.admission_room() == 2 * block  # chunk 1's; chunk 5's hole is not the target's
        assert sorted(pool.alloc(2)) == [5, 6]
        assert pool.admission_room() == 0
        pool.free([20, 22, 23])  # chunk 5's last live blocks
        pool.sync()  # above the target: its fully free chunk goes back
        assert not pool.is_chunk_mapped(5) and pool.held_bytes == 5 * CHUNK
        pool.free(list(range(16, 20)))  # chunk 4 empties too: the pool is at its target
        pool.sync()
        assert pool.held_bytes == 4 * CHUNK and pool.used_bytes == 4 * CHUNK
        pool.free([0])
        assert pool.admission_room() == block  # at or below the target: what the target leaves, as before
        check_pool(pool, limit, driver, base)


def test_refused_growth_is_reported_as_waiting_until_a_tick_without_one(driver):
    """What waits for memory: the largest growth refused (at the limit, or by the limit source) since
    the pool's last ``sync()`` is reported with it; a sync with no refusal since the one before reports
    0. The engine retries waiting work every step, so it stays > 0 while the work waits."""
    base = resources(driver)
    limit = RecordingLimit(3 * CHUNK)
    pool, _ = make_pool(driver, limit=limit)
    with pool:
        ids = pool.alloc(12)
        assert limit.waiting == 0
        with pytest.raises(OutOfBlocks, match="limit"):
            pool.alloc(9)  # 3 chunks over the limit
        with pytest.raises(OutOfBlocks, match="limit"):
            pool.alloc(1)  # a smaller ask in the same period: the largest is what waits
        pool.sync()
        assert limit.waiting == 3 * CHUNK
        pool.free(ids[:1])
        with pytest.raises(OutOfBlocks, match="limit"):
            pool.alloc(6)  # still waiting, for less: one block is free, five more take 2 chunks
        pool.sync()
        assert limit.waiting == 2 * CHUNK
        pool.sync()  # no refusal since the last sync: nothing waits
        assert limit.waiting == 0
        limit.set(8 * CHUNK)
        limit.refuse = True  # now the limit source (the GPU's budget) says no, within the limit
        pool.sync()
        with pytest.raises(OutOfBlocks) as err:
            pool.alloc(20)  # 19 more blocks: 5 chunks
        assert err.value.reason == "admission"
        pool.shrink(2 * CHUNK)  # a report between ticks carries the period's refusal too
        assert limit.waiting == 5 * CHUNK
        limit.refuse = False
        pool.alloc(20)
        pool.sync()
        assert limit.waiting == 5 * CHUNK  # refused earlier in this period: reported at its tick
        pool.sync()
        assert limit.waiting == 0
        check_pool(pool, limit, driver, base)


def test_a_bound_per_sync_spreads_a_give_back_over_syncs_but_never_holds_back_a_lowered_limit(driver):
    """``give_back_chunks_per_sync``: above the target and under pressure, at most that many chunk
    groups go back at one ``sync()`` (the driver's time between two steps stays bounded) and the
    rest at the next ones; a lowered limit is applied whole."""
    base = resources(driver)
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK), give_back_chunks_per_sync=3)
    with pool:
        ids = pool.alloc(40)  # 10 chunks, the target is 2
        pool.free(ids[8:])  # 8 chunks free above the target
        held = [pool.sync().held_bytes // CHUNK for _ in range(4)]
        assert held == [7, 4, 2, 2]
        assert pool.stats().groups_unmapped == 8
        limit.set(2 * GiB, target=1 * GiB)  # room above the target again: refill, then pressure
        more = pool.alloc(32)  # 8 chunks more: 10 mapped, 2 of them live
        pool.free(more)
        limit.press()
        assert pool.sync().held_bytes == 7 * CHUNK  # use + one growth step is 3 chunks: 3 go of the 7
        limit.press()
        assert pool.sync().held_bytes == 4 * CHUNK
        limit.press()
        assert pool.sync().held_bytes == 3 * CHUNK
        limit.set(1 * CHUNK)  # a lowered limit: everything it can release at once, bound or not
        pool.free(ids[4:8])
        stats = pool.sync()
        assert stats.held_bytes == 1 * CHUNK and not stats.deferred
        check_pool(pool, limit, driver, base)


def test_a_bounded_give_back_after_a_delay_period_goes_on_at_the_next_syncs(driver):
    """With a give-back delay, the memory idle through a period that the bound held back goes at the
    next syncs, without waiting a period more; a block taken in between is not given back."""
    base = resources(driver)
    now = [0.0]
    pool, limit = make_pool(driver, limit=RecordingLimit(1 * GiB, target=2 * CHUNK), give_back_delay_s=1.0,
                            give_back_chunks_per_sync=3, clock=lambda: now[0])
    with pool:
        ids = pool.alloc(40)
        pool.free(ids[8:])  # 8 chunks free above the target
        assert pool.sync().held_bytes == 10 * CHUNK  # the period has just begun
        now[0] = 1.0
        assert pool.sync().held_bytes == 7 * CHUNK  # idle through the period: 8 chunks, 3 go now
        now[0] = 1.01
        taken = pool.alloc(4)  # a request takes a chunk's blocks from those left
        assert pool.sync().held_bytes == 4 * CHUNK  # 3 more, no new period
        now[0] = 1.02
        assert pool.sync().held_bytes == 3 * CHUNK  # the rest that stayed idle; the taken chunk stays
        assert pool.live_blocks == 12 and set(taken).isdisjoint(ids[:8])
        now[0] = 1.03
        assert pool.sync().held_bytes == 3 * CHUNK  # a new period
        check_pool(pool, limit, driver, base)


def test_a_bound_per_sync_must_be_positive(driver):
    with pytest.raises(ValueError, match="release_chunks"):
        make_pool(driver, give_back_chunks_per_sync=0)
