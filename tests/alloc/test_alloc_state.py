"""Property tests: a hypothesis state machine drives a block pool through any sequence of
alloc, free, claim, limit changes, syncs, shrinks and injected driver failures, and checks
after every step that
- the bytes held never exceed the limit (unless a deferral is pending with nothing left to give back),
- no live block is ever in an unmapped chunk, and its data (a tag written at alloc) is intact,
- the pool's incremental bookkeeping equals a recount from scratch, and the limit source agrees,
and at the end that closing the pool released every handle and reservation it created.
"""

from __future__ import annotations

import pytest
from tests.alloc.alloc_support import RecordingLimit, check_pool, close_driver, make_driver, peek, poke, resources
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvpolicy.alloc import BlockError, BlockPool, BlockSpec, DriverError, OutOfBlocks
from kvpolicy.units import MiB

CHUNK = 2 * MiB
GEOMETRIES = [
    BlockSpec(CHUNK // 4),  # 4 blocks per chunk: the fast path
    BlockSpec(CHUNK),  # one block per chunk (block-major KV): the whole-chunk path
    BlockSpec(CHUNK * 3 // 4),  # blocks straddle chunk boundaries
    BlockSpec(CHUNK * 5 // 2),  # every block spans 3 chunks
    BlockSpec(CHUNK // 2, num_arenas=2),  # a chunk index maps in two arenas
]
FAULT_CALLS = ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"]


class PoolMachine(RuleBasedStateMachine):
    kind = "host"

    def __init__(self) -> None:
        super().__init__()
        self.pool: BlockPool | None = None

    @initialize(
        geometry=st.sampled_from(GEOMETRIES),
        chunks=st.integers(6, 16),
        limit_groups=st.integers(0, 14),
        grow=st.integers(1, 3),
        device_chunks=st.integers(3, 30),
    )
    def setup(self, geometry: BlockSpec, chunks: int, limit_groups: int, grow: int, device_chunks: int) -> None:
        if self.kind == "cuda":
            self.driver = make_driver("cuda")
        else:  # a small simulated device, so running out of device memory happens too
            self.driver = make_driver(self.kind, host_capacity=device_chunks * CHUNK)
        self.base = resources(self.driver)
        self.group = CHUNK * geometry.num_arenas
        self.limit = RecordingLimit(limit_groups * self.group)
        num_blocks = chunks * CHUNK // geometry.block_stride
        self.pool = BlockPool(self.driver, geometry, num_blocks, chunk=CHUNK, limit=self.limit, grow_chunks=grow)
        self.live: set[int] = set()
        self.failed = False  # a driver call failed since the last clean sync

    def _tag(self, block: int) -> tuple[int, bytes]:
        arena = self.pool.arenas[-1]
        return arena.va + block * self.pool.block_stride, block.to_bytes(8, "little") + b"kvpolicy"

    def _took(self, ids: list[int]) -> None:
        assert len(set(ids)) == len(ids) and not self.live & set(ids)
        self.live |= set(ids)
        for b in ids:
            poke(self.driver, *self._tag(b))

    @rule(data=st.data())
    def alloc(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, max(2, self.pool.num_blocks // 3)), label="n")
        held = self.pool.held_bytes
        try:
            ids = self.pool.alloc(n)
        except OutOfBlocks:
            assert self.pool.held_bytes <= held  # nothing stays mapped for a refused alloc
            return
        assert len(ids) == n
        self._took(ids)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if not self.live:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=12, unique=True))
        self.pool.free(ids)
        self.live -= set(ids)

    @rule(data=st.data())
    def bad_free(self, data: st.DataObject) -> None:
        bad = data.draw(st.integers(-2, self.pool.num_blocks + 1).filter(lambda b: b not in self.live))
        good = sorted(self.live)[:3]
        with pytest.raises(BlockError):
            self.pool.free([*good, bad])
        assert all(self.pool.is_live(b) for b in good)

    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        free = [b for b in range(self.pool.num_blocks) if b not in self.live]
        if not free:
            return
        ids = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=4, unique=True))
        try:
            self.pool.claim(ids)
        except OutOfBlocks:
            assert not any(self.pool.is_live(b) for b in ids)
            return
        self._took(ids)

    @rule(data=st.data())
    def ensure_mapped(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.pool.num_blocks - 1), min_size=1, max_size=4))
        try:
            self.pool.ensure_mapped(ids)
        except OutOfBlocks:
            return
        assert all(self.pool.is_chunk_mapped(c) for b in ids for c in self.pool.chunks_of_block(b))

    @rule(groups=st.integers(0, 14), extra=st.integers(0, CHUNK - 1), target_groups=st.integers(0, 14))
    def set_limit(self, groups: int, extra: int, target_groups: int) -> None:
        limit = groups * self.group + extra
        self.limit.set(limit, min(limit, target_groups * self.group))

    @rule()
    def sync(self) -> None:
        stats = self.pool.sync()  # retries whatever a failure left behind
        self.failed = False
        assert stats.revision == self.limit.read().revision
        assert self.limit.acked is not None and self.limit.acked[0] == stats.revision
        assert self.limit.acked[1] == ("deferred" if stats.deferred else "applied")
        assert stats.held_bytes <= stats.target or not self.pool.fully_free_chunks()  # gave back what it could

    @rule()
    def pressure(self) -> None:
        """Another instance is refused memory: the next sync gives back all but use + one growth step."""
        self.limit.press()
        starved = self.pool.starved
        stats = self.pool.sync()
        self.failed = False
        g = self.group
        keep = -(-stats.used_bytes // g) * g + self.pool.grow_chunks * g
        if not (starved or stats.deferred):
            assert stats.held_bytes <= keep or not self.pool.fully_free_chunks()

    @rule(groups=st.integers(0, 14))
    def shrink(self, groups: int) -> None:
        before = self.pool.held_bytes
        released = self.pool.shrink(groups * self.group)
        assert released == before - self.pool.held_bytes >= 0

    @rule(call=st.sampled_from(FAULT_CALLS), after=st.integers(0, 5), data=st.data(), shrink=st.booleans())
    def fault(self, call: str, after: int, data: st.DataObject, shrink: bool) -> None:
        n = data.draw(st.integers(1, max(2, self.pool.num_blocks // 3)), label="n")
        self.driver.inject(call, "CUDA_ERROR_UNKNOWN", after=after)
        swallowed = self.pool.last_error
        try:
            if shrink:
                self.pool.free(sorted(self.live)[: n // 2])
                self.live -= set(sorted(self.live)[: n // 2])
                self.pool.shrink(0)
            else:
                self._took(self.pool.alloc(n))
        except DriverError:
            self.failed = True  # the invariants below say whether the failure left the pool whole
        except OutOfBlocks as exc:
            if isinstance(exc.__cause__, DriverError):
                self.failed = True
        finally:
            self.driver.clear_faults()
            if self.pool.last_error is not swallowed:  # free() completing a deferral hit the fault
                self.failed = True

    @invariant()
    def consistent(self) -> None:
        if self.pool is None:
            return
        assert {b for b in range(self.pool.num_blocks) if self.pool.is_live(b)} == self.live
        check_pool(self.pool, self.limit, self.driver, self.base, after_failure=self.failed)
        for b in self.live:
            va, tag = self._tag(b)
            assert peek(self.driver, va, len(tag)) == tag, f"block {b} lost its data"

    def teardown(self) -> None:
        if self.pool is None:
            return
        self.pool.close()
        assert resources(self.driver) == self.base, "closing the pool left handles, mappings or reservations"
        assert self.limit.mapped == 0 and self.limit.pending == 0
        close_driver(self.driver)


@pytest.mark.parametrize("kind", ["host", "simcuda", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pool_state_machine(kind: str) -> None:
    if kind != "host":
        close_driver(make_driver(kind))  # skips when that driver is not here

    class Machine(PoolMachine):
        pass

    Machine.kind = kind
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples={"host": 250, "simcuda": 60, "cuda": 40}[kind],
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
