"""ChunkGrid, where blocks fall on chunks, against a brute-force walk over every byte; and growth planning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.alloc.layout import ChunkGrid
from kvpolicy.alloc.mapping import plan_growth

# Small strides and chunks, so that walking every byte is cheap, in every relation:
# dividing, straddling, blocks larger than a chunk.
grids = st.builds(ChunkGrid, block_stride=st.integers(1, 48), chunk=st.integers(1, 48), num_blocks=st.integers(1, 40))


def byte_chunks(grid: ChunkGrid, block: int) -> list[int]:
    """The chunks of block ``block``, from its bytes one by one."""
    s = grid.block_stride
    return sorted({byte // grid.chunk for byte in range(block * s, (block + 1) * s)})


@settings(max_examples=400, deadline=None)
@given(grids)
def test_chunks_and_blocks_agree_with_the_bytes(grid: ChunkGrid) -> None:
    nb, s, c = grid.num_blocks, grid.block_stride, grid.chunk
    chunks = {b: byte_chunks(grid, b) for b in range(nb)}
    assert grid.num_chunks == max(ci for cs in chunks.values() for ci in cs) + 1
    for b in range(nb):
        assert list(grid.chunks_of(b)) == chunks[b]
        assert grid.homes[b] == chunks[b][0]
        assert grid.spans[b] == len(chunks[b]) - 1
    for ci in range(grid.num_chunks):
        assert list(grid.blocks_touching(ci)) == [b for b in range(nb) if ci in chunks[b]]
        assert list(grid.blocks_homed_in(ci)) == [b for b in range(nb) if chunks[b][0] == ci]
    for ci in range(grid.num_chunks + 1):
        assert grid.first_homed[ci] == min((b for b in range(nb) if chunks[b][0] >= ci), default=nb)
    assert len(grid.homes) == len(grid.spans) == nb
    straddles = any(len(cs) > 1 for cs in chunks.values())
    if grid.blocks_per_chunk:
        assert c % s == 0 and grid.blocks_per_chunk == c // s and not straddles
    else:
        assert c % s != 0


@settings(max_examples=300, deadline=None)
@given(grids, st.data())
def test_completed_by_is_the_blocks_mapping_made_whole(grid: ChunkGrid, data: st.DataObject) -> None:
    before = data.draw(st.lists(st.booleans(), min_size=grid.num_chunks, max_size=grid.num_chunks))
    new = data.draw(st.sets(st.sampled_from([c for c in range(grid.num_chunks) if not before[c]] or [None])))
    new.discard(None)
    mapped = bytearray(before[c] or c in new for c in range(grid.num_chunks))
    whole_before = {b for b in range(grid.num_blocks) if all(before[c] for c in byte_chunks(grid, b))}
    whole_after = {b for b in range(grid.num_blocks) if all(mapped[c] for c in byte_chunks(grid, b))}
    assert grid.completed_by(sorted(new), mapped) == sorted(whole_after - whole_before)


# Grids where the stride divides the chunk (no block straddles): plan_growth's own path for them.
whole_block_grids = st.builds(
    lambda stride, per_chunk, num_blocks: ChunkGrid(stride, stride * per_chunk, num_blocks),
    st.integers(1, 8),
    st.integers(1, 6),
    st.integers(1, 40),
)


@settings(max_examples=300, deadline=None)
@given(grids, st.data())
def test_plan_growth_takes_the_fewest_lowest_chunks(grid: ChunkGrid, data: st.DataObject) -> None:
    check_plan_growth(grid, data)


@settings(max_examples=300, deadline=None)
@given(whole_block_grids, st.data())
def test_plan_growth_without_straddling_blocks(grid: ChunkGrid, data: st.DataObject) -> None:
    check_plan_growth(grid, data)


def check_plan_growth(grid: ChunkGrid, data: st.DataObject) -> None:
    """plan_growth against a brute-force count of the blocks each prefix of the unmapped chunks makes whole."""
    mapped = bytearray(data.draw(st.lists(st.booleans(), min_size=grid.num_chunks, max_size=grid.num_chunks)))
    missing = data.draw(st.integers(1, grid.num_blocks))
    at_least = data.draw(st.integers(1, 3))
    room = data.draw(st.integers(0, 4))  # chunks that fit under the limit
    unmapped = [c for c in range(grid.num_chunks) if not mapped[c]]
    # The callers start at their lowest unmapped chunk (every chunk below it is mapped), or lower.
    start = data.draw(st.integers(0, unmapped[0] if unmapped else grid.num_chunks))
    chosen, gained = plan_growth(
        grid, mapped, missing, start=start, at_least=at_least, fits=lambda count: count <= room
    )
    assert chosen == unmapped[: len(chosen)]  # the lowest unmapped chunks, in order

    def whole(prefix: int) -> int:
        on = set(unmapped[:prefix])
        return sum(1 for b in range(grid.num_blocks) if all(mapped[c] or c in on for c in byte_chunks(grid, b))) - sum(
            1 for b in range(grid.num_blocks) if all(mapped[c] for c in byte_chunks(grid, b))
        )

    assert gained == whole(len(chosen))
    enough = next((k for k in range(len(unmapped) + 1) if whole(k) >= missing), None)
    if enough is None:
        assert chosen == unmapped and gained < missing  # the capacity ran out
    else:
        # The fewest that are enough, then more while below at_least and under the limit.
        assert len(chosen) == max(enough, min(at_least, room, len(unmapped)))


def test_a_dsv4_block_straddles_2_mib_chunks() -> None:
    grid = ChunkGrid(block_stride=1_002_240, chunk=2 << 20, num_blocks=100)
    assert grid.blocks_per_chunk == 0 and grid.chunks_of(2) == range(2) and grid.homes[2] == 0
    assert grid.blocks_homed_in(1) == range(3, 5) and grid.blocks_touching(1) == range(2, 5)


@pytest.mark.parametrize("field", ["block_stride", "chunk", "num_blocks"])
def test_a_grid_needs_positive_sizes(field: str) -> None:
    sizes = {"block_stride": 4, "chunk": 8, "num_blocks": 2, field: 0}
    with pytest.raises(ValueError, match="must be positive"):
        ChunkGrid(**sizes)
