"""The mapping part on its own, as an engine that hands out its own block ids uses it (vLLM's scheduler):
ChunkMapping with LiveBlocks and GiveBack, no BlockPool. A hypothesis state machine drives it through
grows, claims, releases, limit changes, pressure and syncs and checks the invariants after every step."""

from __future__ import annotations

import pytest
from tests.alloc.alloc_support import RecordingLimit, resources
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvpolicy.alloc import ChunkGrid, ChunkMapping, GiveBack, HostDriver, LiveBlocks, OutOfBlocks
from kvpolicy.units import GiB, MiB

CHUNK = 2 * MiB


def make(driver, stride=CHUNK * 3 // 4, num_blocks=32, limit=None, **kw):
    limit = limit or RecordingLimit(1 * GiB)
    grid = ChunkGrid(stride, CHUNK, num_blocks)
    holder: dict[str, LiveBlocks] = {}
    mapping = ChunkMapping(driver, grid, limit=limit, used_bytes=lambda: holder["live"].used_bytes, **kw)
    holder["live"] = live = LiveBlocks(mapping)
    return mapping, live, limit


def test_growth_is_asked_in_blocks_and_maps_the_lowest_chunks(driver) -> None:
    base = resources(driver)
    mapping, live, limit = make(driver)  # 3/4-chunk blocks: every other block straddles
    try:
        chunks = mapping.grow(3, at_least=1, requested=3, free=0)
        assert chunks == [0, 1, 2] and mapping.grid.completed_by(chunks, mapping.mapped) == [0, 1, 2, 3]
        assert limit.calls("admit") == [3 * CHUNK] and limit.calls("commit") == [3 * CHUNK]
        assert limit.reported == (0, 3 * CHUNK) and mapping.low_unmapped == 3
        live.claim([1, 3])  # block 1 touches chunks 0 and 1, block 3 chunk 2
        assert mapping.users == [1, 1, 1] + [0] * (mapping.num_chunks - 3)
        assert limit.reported == (2 * CHUNK * 3 // 4, 3 * CHUNK)
        mapping.release_down_to(0)  # every chunk holds a live block: nothing can go
        assert mapping.held_bytes == 3 * CHUNK
        live.release([3])
        mapping.release_down_to(0)
        assert mapping.fully_free_chunks() == [] and mapping.held_bytes == 2 * CHUNK
    finally:
        mapping.close()
    assert resources(driver) == base and limit.mapped == 0 and limit.reported == (0, 0)


def test_growth_never_applies_a_new_revision_and_refusals_map_nothing(driver) -> None:
    mapping, live, limit = make(driver, limit=RecordingLimit(4 * CHUNK))
    try:
        assert mapping.grow(4, at_least=1, requested=4, free=0) == [0, 1, 2]
        limit.set(2 * CHUNK)
        with pytest.raises(OutOfBlocks) as err:
            mapping.grow(1, at_least=1, requested=1, free=0)
        assert err.value.reason == "revision" and mapping.held_bytes == 3 * CHUNK and mapping.revision == 1
        GiveBack(group_bytes=CHUNK).sync(mapping, live.used_bytes)  # where the owner chooses
        assert mapping.held_bytes == 2 * CHUNK and limit.acked == (2, "applied")
        with pytest.raises(OutOfBlocks) as err:
            mapping.grow(4, at_least=1, requested=4, free=0)
        assert err.value.reason == "limit" and mapping.held_bytes == 2 * CHUNK
        limit.set(64 * CHUNK)
        mapping.refresh()
        limit.refuse = True
        with pytest.raises(OutOfBlocks) as err:
            mapping.grow(4, at_least=1, requested=4, free=0)
        assert err.value.reason == "admission" and mapping.admission_refusals == 1
        limit.refuse = False
        with pytest.raises(OutOfBlocks) as err:
            mapping.grow(100, at_least=1, requested=100, free=0)
        assert err.value.reason == "capacity" and mapping.held_bytes == 2 * CHUNK and limit.pending == 0
    finally:
        mapping.close()


def test_before_unmap_sees_the_chunks_first_and_can_stop_it(driver) -> None:
    seen: list[list[int]] = []
    stop = [True]

    def before(chunks: list[int]) -> None:
        seen.append(chunks)
        if stop[0]:
            raise RuntimeError("not now")

    mapping, _, limit = make(driver, stride=CHUNK // 2, before_unmap=before)
    try:
        mapping.grow(8, at_least=1, requested=8, free=0)
        with pytest.raises(RuntimeError, match="not now"):
            mapping.release_down_to(0)
        assert mapping.held_bytes == 4 * CHUNK and seen == [[3, 2, 1, 0]] and limit.mapped == 4 * CHUNK
        stop[0] = False
        mapping.release_down_to(CHUNK)
        assert seen[-1] == [3, 2, 1] and mapping.held_bytes == CHUNK == limit.mapped
    finally:
        mapping.close()


def test_new_chunks_are_zeroed_and_a_failed_zero_undoes_the_growth() -> None:
    driver = HostDriver(capacity=1 * GiB)
    mapping, _, limit = make(driver, stride=CHUNK, num_blocks=8, zero_new_chunks=True)
    try:
        va = mapping.arenas[0].va
        mapping.grow(2, at_least=1, requested=2, free=0)
        driver.write(va, b"\xff" * 64)
        mapping.release_down_to(0)
        driver.inject("cuMemsetD8Async", "CUDA_ERROR_INVALID_VALUE")
        with pytest.raises(Exception, match="cuMemsetD8Async"):
            mapping.grow(1, at_least=1, requested=1, free=0)
        assert mapping.held_bytes == 0 and limit.mapped == 0 and limit.pending == 0
        mapping.grow(1, at_least=1, requested=1, free=0)
        assert driver.read(va, 64) == bytes(64)
    finally:
        mapping.close()
        driver.close()


def test_a_lowered_limit_defers_until_the_engine_releases_the_blocks_pinning_it(driver) -> None:
    mapping, live, limit = make(driver, stride=CHUNK // 2)
    give_back = GiveBack(group_bytes=CHUNK)
    try:
        mapping.grow(8, at_least=1, requested=8, free=0)  # 4 chunks
        live.claim([0, 7])  # chunks 0 and 3
        limit.set(CHUNK)
        give_back.sync(mapping, live.used_bytes)
        assert mapping.deferred and mapping.held_bytes == 2 * CHUNK and limit.acked == (2, "deferred")
        live.reconcile([0, 6], None)  # the engine moved on: 7 is free, 6 is live (same chunk)
        assert mapping.deferred and mapping.is_mapped(3)
        live.reconcile([0], None)
        assert not mapping.deferred and not mapping.is_mapped(3) and limit.acked == (2, "applied")
        assert mapping.held_bytes == CHUNK == limit.mapped
    finally:
        mapping.close()


class MappingMachine(RuleBasedStateMachine):
    """The engine's ids live outside the allocator: claims and releases of any id whose chunks are mapped."""

    def __init__(self) -> None:
        super().__init__()
        self.mapping: ChunkMapping | None = None

    @initialize(
        stride=st.sampled_from([CHUNK // 4, CHUNK * 3 // 4, CHUNK * 5 // 2, 1_002_240]),
        blocks=st.integers(4, 24),
        limit_chunks=st.integers(0, 12),
        device_chunks=st.integers(3, 30),
    )
    def setup(self, stride: int, blocks: int, limit_chunks: int, device_chunks: int) -> None:
        self.driver = HostDriver(capacity=device_chunks * CHUNK)
        self.mapping, self.live, self.limit = make(
            self.driver, stride=stride, num_blocks=blocks, limit=RecordingLimit(limit_chunks * CHUNK)
        )
        self.give_back = GiveBack(group_bytes=CHUNK, pressure=self.limit.pressure())
        self.engine: set[int] = set()  # what the engine holds (the truth the mirror follows)

    def _usable(self) -> list[int]:
        grid, m = self.mapping.grid, self.mapping
        return [b for b in range(grid.num_blocks) if all(m.is_mapped(c) for c in grid.chunks_of(b))]

    @rule(n=st.integers(1, 8))
    def grow(self, n: int) -> None:
        held = self.mapping.held_bytes
        try:
            self.mapping.grow(n, at_least=1, requested=n, free=0)
        except OutOfBlocks:
            assert self.mapping.held_bytes <= held

    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        free = [b for b in self._usable() if b not in self.engine]
        if free:
            self.engine |= set(data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=4, unique=True)))

    @rule(data=st.data())
    def give(self, data: st.DataObject) -> None:
        if self.engine:
            self.engine -= set(data.draw(st.lists(st.sampled_from(sorted(self.engine)), min_size=1, max_size=4)))

    @rule()
    def flush(self) -> None:
        self.live.reconcile(self.engine, None)

    @rule(chunks=st.integers(0, 12), target_chunks=st.integers(0, 12))
    def set_limit(self, chunks: int, target_chunks: int) -> None:
        self.limit.set(chunks * CHUNK, min(chunks, target_chunks) * CHUNK)

    @rule(press=st.booleans())
    def sync(self, press: bool) -> None:
        if press:
            self.limit.press()
        self.live.reconcile(self.engine, None)  # the mirror is made true before anything may unmap
        self.give_back.sync(self.mapping, self.live.used_bytes)
        reading = self.limit.read()
        assert self.mapping.revision == reading.revision and self.limit.acked[0] == reading.revision
        assert self.mapping.held_bytes <= reading.target or not self.mapping.fully_free_chunks()

    @invariant()
    def consistent(self) -> None:
        if self.mapping is None:
            return
        m, grid = self.mapping, self.mapping.grid
        live = [b for b in range(grid.num_blocks) if self.live.is_live(b)]
        users = [0] * m.num_chunks
        for b in live:
            for c in grid.chunks_of(b):
                users[c] += 1
                assert m.is_mapped(c), f"live block {b} is in unmapped chunk {c}"
        assert m.users == users and self.live.used_bytes == len(live) * grid.block_stride
        assert all(m.is_mapped(c) for c in range(m.low_unmapped))
        assert m.mapped_chunks == sum(m.mapped)
        assert self.limit.pending == 0 and self.limit.mapped == m.held_bytes
        if m.held_bytes > m.reading.limit:
            assert m.deferred and not m.fully_free_chunks()

    def teardown(self) -> None:
        if self.mapping is not None:
            self.mapping.close()
            assert self.limit.mapped == 0 and self.driver.live_handles == 0
            self.driver.close()


def test_mapping_state_machine() -> None:
    run_state_machine_as_test(
        MappingMachine,
        settings=settings(
            max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )
