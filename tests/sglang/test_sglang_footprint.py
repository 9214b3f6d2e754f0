"""The caching-allocator footprint model: PyTorch's documented size classes, as a pure function."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4 import footprint as fp
from kvpolicy.units import MiB


def test_requests_round_up_to_512_bytes_and_empty_tensors_cost_nothing():
    assert fp.rounded_request(0) == 0
    assert fp.rounded_request(1) == 512
    assert fp.rounded_request(512) == 512
    assert fp.rounded_request(513) == 1024


def test_segment_size_classes():
    assert fp.segment_size(512) == 2 * MiB  # small pool
    assert fp.segment_size(1 * MiB) == 2 * MiB
    assert fp.segment_size(1 * MiB + 512) == 20 * MiB  # (1 MiB, 10 MiB): one 20 MiB segment
    assert fp.segment_size(10 * MiB - 512) == 20 * MiB
    assert fp.segment_size(10 * MiB) == 10 * MiB  # from 10 MiB: rounded up to 2 MiB
    assert fp.segment_size(10 * MiB + 1) == 12 * MiB


def test_small_tensors_share_a_2_mib_segment_and_the_opener_is_charged():
    charges = fp.footprints([1000, 1000, MiB])  # all three in the small pool
    assert charges == [2 * MiB, 0, 0]
    assert fp.footprint([1000] * 2049) == 2 * 2 * MiB  # 2048 blocks of 1024 B fill one segment


def test_mid_sized_tensors_reuse_the_tail_of_a_20_mib_segment():
    # 3 × 6 MiB: the first opens 20 MiB, the second takes 6 of the 14 left, the third
    # fits the remaining 8 MiB; a fourth needs a new segment.
    assert fp.footprints([6 * MiB] * 4) == [20 * MiB, 0, 0, 20 * MiB]


def test_a_tail_of_one_mib_or_less_is_not_kept_in_the_large_pool():
    # 19.5 MiB leaves 0.5 MiB of its 20 MiB segment: not split off, so 1.5 MiB needs a new one.
    assert fp.footprints([19 * MiB + 512 * 1024, int(1.5 * MiB)]) == [20 * MiB, 20 * MiB]


def test_large_tensors_each_get_their_own_segment():
    assert fp.footprints([10 * MiB + 1, 100 * MiB]) == [12 * MiB, 100 * MiB]


@settings(deadline=None)  # a loaded machine may stall any example: no time limit
@given(st.lists(st.integers(min_value=0, max_value=64 * MiB), max_size=60))
def test_reserved_is_at_least_the_tensors_and_charges_add_up(sizes):
    model = fp.CachingAllocatorModel()
    charges = [model.allocate(n) for n in sizes]
    assert sum(charges) == model.reserved
    assert model.reserved >= sum(fp.rounded_request(n) for n in sizes)
    assert all(c % (2 * MiB) == 0 for c in charges)
