"""The scheduler's side of an elastic vLLM KV cache: vLLM's own ``BlockPool``, whose free queue holds only mapped blocks.

vLLM 0.33's scheduler plans with the virtual block count (the policy's ``max``) and
hands out block ids from one ``BlockPool`` (``vllm/v1/core/block_pool.py``). This
module makes that pool elastic without changing its class: ``ElasticPool.adopt``
puts an ``ElasticPool`` beside the pool the scheduler built (``pool._kvpolicy``),
replaces its free queue and shadows two of its methods (``get_usage``,
``reset_prefix_cache``; ``free_blocks`` too, only while a lowered limit drains).
vLLM's code runs as is, on an object CPython still specialises for: swapping the
pool's class to a subclass made vLLM's own ``get_new_blocks``/``free_blocks`` 30%
slower (its instance attributes no longer matched the class's shared keys), and
the elastic state lives in this separate object for the same reason (a pool with
more than 30 instance attributes loses the shared-keys layout too). The
bookkeeping around vLLM's code:

- **vLLM's free queue holds exactly the free blocks whose chunks are mapped.** Blocks
  in unmapped chunks are out of the queue (``_OUT``), so ``get_num_free_blocks()`` —
  what the scheduler checks before it allocates — is exact, and every block
  ``get_new_blocks`` can ever return lies in a mapped chunk.
- **Map before handing out.** Inside ``KVCacheManager.allocate_slots`` the scheduler
  asks the coordinator how many blocks a request needs and compares that with the
  free count; the adapter hooks that question (instance-level, at the scheduler's
  construction, ``bind_scheduler``) and first *makes room*: it asks the allocator's
  mapping (``ChunkMapping.grow``, no block ids: the scheduler owns them) to map the
  chunks that complete the blocks needed — one
  elastic admission in the ledger for the batch, then cuMemCreate/Map/SetAccess and
  a zero fill — and puts the new blocks at the head of the free queue. If the limit,
  the GPU's budget or the device says no, nothing changes and vLLM sees an ordinary
  allocation miss: the request waits, or vLLM preempts (it never sees an error).
- **Mirror.** The allocator's mapping unmaps only chunks none of whose blocks is live, so
  before anything that may unmap (a new limit, giving back, a deferral) ``flush``
  sets its live set (``LiveBlocks``) to vLLM's truth (``ref_cnt > 0``) in one scan. vLLM's hot path
  (``get_new_blocks``, ``free_blocks``, ``touch``) runs unchanged: nothing is recorded
  per block. Growth needs no mirror (new chunks hold no live block), and the bytes in
  use reported to the ledger come from vLLM's own count (blocks handed out).
- **Give back** (``on_step``, between scheduler steps, never inside one — a prefix
  hit looked up in ``schedule()`` must still be in the queue when it is touched): a
  new limit revision is applied at once (``GiveBack.sync``: fully free chunks are
  unmapped from the highest down; their cached blocks are evicted from the prefix
  cache first, and the device is synchronised before the unmap); memory above the
  target, and — when the ledger's pressure counter says another instance was
  refused memory — free memory beyond what is in use plus one growth step, is given
  back the same way at most every ``give_back_interval`` seconds; with the buffer's ``give_back_chunks``
  at most that many chunks at a time (in whole chunk groups), the rest at the next steps (a
  lowered limit is applied whole), so no step waits for a whole large give-back.
  When live blocks pin chunks above a lowered limit, the revision is acknowledged
  ``deferred``: the highest chunks needed are *doomed* — their free blocks are taken
  out of the queue (``_PARKED``) so vLLM stops reusing them — and each one is
  unmapped when its last block is freed; then ``applied``.
- **Yield above the target** (``yield_above_target`` seconds, off at 0): for that long after a
  step that saw the pressure counter move, a request the scheduler has not started gets
  blocks only up to the target (``new_work_cap``; ``bind_scheduler`` hooks ``allocate_slots``),
  so the blocks running requests free between two give-backs stay free for the next.

Everything runs on the scheduler's thread (vLLM's block pool is not thread-safe).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.alloc import DriverError, OutOfBlocks
from kvpolicy.alloc.giveback import ContentionWindow

from .buffer import ElasticKVBuffer

logger = logging.getLogger(__name__)

_OUT, _IN, _PARKED = 0, 1, 2
_NEVER = 1 << 62


def elastic_of(pool: Any) -> ElasticPool | None:
    """The ``ElasticPool`` beside vLLM block pool ``pool``, or None for a stock one."""
    return getattr(pool, "_kvpolicy", None)


class ElasticPool:
    """What makes one vLLM ``BlockPool`` elastic over an ``ElasticKVBuffer``; built only by ``adopt``."""

    # -- construction --------------------------------------------------------------------
    @classmethod
    def adopt(
        cls,
        pool: BlockPool,
        buffer: ElasticKVBuffer,
        *,
        give_back_interval: float = 1.0,
        report_interval: float = 0.5,
        on_activity: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        yield_above_target: float = 0.0,
    ) -> ElasticPool:
        """Make the fresh block pool vLLM's scheduler built elastic over ``buffer``.

        The pool stays the object (and the class) every group manager holds.
        """
        if type(pool) is not BlockPool:
            raise AdapterError(f"kvpolicy: the scheduler's block pool is a {type(pool).__name__}, not vLLM's BlockPool")
        if elastic_of(pool) is not None:
            raise AdapterError("kvpolicy: the scheduler's block pool is elastic already")
        if pool.num_gpu_blocks != buffer.num_blocks:
            raise AdapterError(
                f"kvpolicy: the scheduler plans {pool.num_gpu_blocks} blocks but the elastic buffer has "
                f"{buffer.num_blocks}: they come from different KV cache configs"
            )
        if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:
            raise AdapterError("kvpolicy: the scheduler's block pool is already in use; it must be adopted fresh")
        return cls(pool, buffer, give_back_interval, report_interval, on_activity, clock, yield_above_target)

    def __init__(
        self,
        pool: BlockPool,
        buffer: ElasticKVBuffer,
        give_back_interval: float,
        report_interval: float,
        on_activity: Callable[[], None] | None,
        clock: Callable[[], float],
        yield_above_target: float,
    ) -> None:
        kv, grid = buffer.mapping, buffer.grid
        self.vllm = pool
        """vLLM's block pool: the scheduler's, still a plain ``BlockPool``."""
        self.blocks = pool.blocks
        self._buffer = buffer
        self._kv = kv
        self._grid = grid
        self._live = buffer.live
        self._give_back = buffer.give_back
        self._limit = buffer.limit
        self._bpb = buffer.bytes_per_block
        self._group_bytes = buffer.mapping.group_bytes  # one chunk index: a chunk in every region
        self._pinned_chunks = frozenset(grid.chunks_of(0))
        self._state = bytearray(pool.num_gpu_blocks)
        self._state[0] = _IN  # the null block: mapped for good, never in the queue
        self._n_in = 0  # blocks (null block excluded) in vLLM's hands: queued or handed out
        self._parked: set[int] = set()
        self._doomed: frozenset[int] | None = None
        self._growing = False
        self._refused_from = _NEVER
        self._give_back_interval = give_back_interval
        self._on_activity = on_activity
        self._clock = clock
        self._last_give_back = clock()
        self._contention = ContentionWindow(yield_above_target, buffer.limit.pressure(), clock)
        self._report_interval = report_interval
        self._last_report = float("-inf")
        self._reported: tuple[int, int] = (-1, 0)
        """(handed-out blocks, refused bytes) at the last report."""
        buffer.limit.used_bytes = lambda: self.handed_out_blocks * self._bpb
        self.refusals: Counter[str] = Counter()
        """Growth refusals by reason (``limit``, ``admission``, ``device``, ``capacity``, ``revision``, ``error``)."""
        self.last_refusal: Exception | None = None
        self.grown_blocks = 0
        self.unmapped_chunks = 0
        # Only blocks whose chunks are mapped (at start: those sharing the null block's chunks).
        usable: list[KVCacheBlock] = []
        for block in pool.blocks:
            block.prev_free_block = block.next_free_block = None
        mapped = [c for c in range(kv.num_chunks) if kv.is_mapped(c)]
        for b in sorted({b for c in mapped for b in grid.blocks_touching(c)} - {0}):
            if all(kv.is_mapped(c) for c in grid.chunks_of(b)) and not self._live.is_live(b):
                usable.append(pool.blocks[b])
                self._state[b] = _IN
        pool.free_block_queue = FreeKVCacheBlockQueue(usable)
        self._n_in = len(usable)
        # Instance attributes on vLLM's pool: a handful, so its attribute layout stays fast.
        pool._kvpolicy = self
        pool.get_usage = self.get_usage
        pool.reset_prefix_cache = self.reset_prefix_cache
        buffer.set_listener(self._on_unmap)
        buffer.bound = True

    # -- vLLM's hot path: unchanged, but for draining ---------------------------------------
    def _free_blocks_draining(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """vLLM's ``free_blocks`` while a lowered limit drains: freed blocks of doomed chunks stay out of the queue."""
        blocks = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        BlockPool.free_blocks(self.vllm, blocks)
        self._park([b for b in blocks if b.ref_cnt == 0 and not b.is_null])

    def _set_doomed(self, chunks: frozenset[int] | None) -> None:
        """Start (chunks) or end (None) draining; vLLM's own ``free_blocks`` runs whenever nothing drains."""
        self._doomed = chunks
        draining = "free_blocks" in vars(self.vllm)
        if chunks is not None and not draining:
            self.vllm.free_blocks = self._free_blocks_draining
        elif chunks is None and draining:
            del self.vllm.free_blocks

    @property
    def buffer(self) -> ElasticKVBuffer:
        """The buffer this pool maps (with the ``mp`` executor: the engine core's books of the ranks')."""
        return self._buffer

    @property
    def handed_out_blocks(self) -> int:
        """Blocks vLLM holds now (the null block excluded), from its own free count."""
        return self._n_in - self.vllm.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """vLLM's ``get_usage``: blocks handed out, as a share of what the current limit allows (mapped or mappable)."""
        free = self.vllm.free_block_queue.num_free_blocks
        used = self._n_in - free
        reading = self._limit.read()
        growable = max(0, reading.limit - self._kv.held_bytes) // self._bpb
        total = used + free + growable
        return used / total if total else 0.0

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``, counting the blocks out of the queue (unmapped or parked) as free."""
        pool = self.vllm
        if self._n_in - pool.free_block_queue.num_free_blocks == 0:
            pool.get_num_free_blocks = lambda: pool.num_gpu_blocks - 1
            try:
                return BlockPool.reset_prefix_cache(pool)
            finally:
                del pool.get_num_free_blocks
        return BlockPool.reset_prefix_cache(pool)

    # -- growth (inside schedule(): only adds blocks) -----------------------------------
    def make_room(self, n: int) -> bool:
        """Map chunks until ``n`` free blocks are in the queue, if the limit and budget allow; True if there are.

        A refusal changes nothing (vLLM then treats the request as an allocation miss) and
        is not retried for ``n`` or more blocks until the next step.
        """
        queue = self.vllm.free_block_queue
        free = queue.num_free_blocks
        if n <= free:
            return True
        if n >= self._refused_from or self._kv.deferred:
            return False
        self._growing = True
        try:  # no mirror needed: the chunks it maps hold no block vLLM uses
            kv = self._kv
            chunks = kv.grow(n - free, at_least=self._buffer.grow_chunks, requested=n - free, free=free)
        except OutOfBlocks as exc:
            self._refuse(n, exc.reason, exc)
            return False
        except DriverError as exc:  # a driver failure other than out-of-memory: the engine goes on
            self._refuse(n, "error", exc)
            logger.error("kvpolicy: growing the elastic KV cache failed (the request waits): %s", exc)
            return False
        finally:
            self._growing = False
        blocks = []
        state = self._state
        for b in self._grid.completed_by(chunks, kv.mapped):
            assert state[b] == _OUT, f"block {b} became allocatable twice (state {state[b]})"
            state[b] = _IN
            blocks.append(self.blocks[b])
        queue.prepend_n(blocks)
        self._n_in += len(blocks)
        self.grown_blocks += len(blocks)
        return n <= queue.num_free_blocks

    def _refuse(self, n: int, reason: str, exc: Exception) -> None:
        self._refused_from = min(self._refused_from, n)
        self.refusals[reason] += 1
        self.last_refusal = exc

    def new_work_cap(self) -> int | None:
        """Blocks a request the scheduler has not started may take now; None: as many as it can get.

        While the GPU's budget refused another instance within ``yield_above_target`` seconds, new
        requests take the cache only up to its target, so a busy engine above its target drains
        to it as its running requests finish and the give-back under pressure finds the memory
        they free (otherwise every freed block goes to the next waiting request). Running
        requests still grow.
        """
        if not self._contention.is_open():
            return None
        return max(0, self._limit.read().target // self._bpb - self.handed_out_blocks)

    # -- between steps ----------------------------------------------------------------------
    def on_step(self, active: bool) -> None:
        """Once per scheduler step, after it: mirror, apply a new limit, give back above the target, report.

        Reports activity (``idle_seconds``) and, at most every ``report_interval`` seconds,
        the bytes in use (the ledger's elastic ``used``).

        ``active``: the scheduler has requests (the instance is not idle).
        """
        self._refused_from = _NEVER
        if active and self._on_activity is not None:
            self._on_activity()
        kv, lim = self._kv, self._limit
        reading = lim.read()
        now = self._clock()
        pressure = lim.pressure()
        self._contention.note(pressure)
        held = lim.elastic_held + lim.pinned_held  # what the pool holds, without asking it
        new_revision = reading.revision != kv.revision
        # A give-back the bound held back goes on at the next step, not an interval later.
        due = now - self._last_give_back >= self._give_back_interval or self._give_back.held_back
        give_back = due and (held > reading.target or self._give_back.pressed(pressure))
        if new_revision or give_back:
            self.flush()
            try:  # apply: shrink to the limit (or defer); give back down to the target
                self._give_back.sync(kv, self._live.used_bytes)
            except DriverError as exc:  # the pool stays true to the driver; the next step retries
                logger.error("kvpolicy: giving elastic KV memory back failed (retried next step): %s", exc)
            self._last_give_back = now
            if new_revision:
                self._set_doomed(None)
        if kv.deferred:
            if self._doomed is None:
                self._doom()
            self._drain()
        elif self._doomed is not None or self._parked:
            self._unpark()
        if now - self._last_report >= self._report_interval:
            # Elastic `used` and `waiting` for the ledger's facts (PinnedFirst asks handed_out_blocks).
            figures = (self.handed_out_blocks, kv.refused_bytes)
            if figures != self._reported:
                kv.report()
                self._reported = figures
            kv.new_period()
            self._last_report = now

    def flush(self) -> None:
        """Set the allocator's live set to vLLM's: the blocks with ``ref_cnt > 0``, and the null block.

        One scan of vLLM's blocks; run before anything that may unmap (sync, draining).
        """
        live = {b.block_id for b in self.blocks if b.ref_cnt}
        live.add(0)  # the null block: vLLM does not count its references; it stays pinned
        self._live.reconcile(live, None)

    def _drain(self) -> None:
        """While deferred: mirror the doomed chunks' blocks, so that each chunk that empties is unmapped.

        A block larger than a chunk, or one straddling a chunk boundary, also touches chunks
        that are not doomed; freeing it may empty one of those. So the live set is made true
        for every block of every chunk the doomed blocks touch (one step out): a chunk can
        only empty where vLLM holds none of its blocks.
        """
        grid, blocks = self._grid, self.blocks
        ids = {b for c in self._doomed or () for b in grid.blocks_touching(c)}
        touched = {c for b in ids for c in grid.chunks_of(b)}
        around = {b for c in touched for b in grid.blocks_touching(c)}
        live = {b for b in around if blocks[b].ref_cnt}
        live.add(0)  # the null block stays pinned (vLLM does not count its references)
        self._live.reconcile(live, ids - live)

    # -- shrinking ------------------------------------------------------------------------
    def _on_unmap(self, chunks: list[int]) -> None:
        """The allocator is about to unmap ``chunks``: take their blocks out of vLLM's circulation."""
        assert not self._growing, "kvpolicy: growth unmapped a chunk; only on_step may shrink (inside schedule() a prefix hit may still be pending)"
        grid, state, blocks = self._grid, self._state, self.blocks
        ids = sorted({b for c in chunks for b in grid.blocks_touching(c)} - {0})
        for b in ids:
            if state[b] == _IN and blocks[b].ref_cnt:
                raise AssertionError(
                    f"kvpolicy: chunk(s) {chunks} are being unmapped while vLLM holds block {b}: the allocator's "
                    "live set is stale (every allocator call that may unmap must follow a flush)"
                )
        queue = self.vllm.free_block_queue
        evict = self.vllm._maybe_evict_cached_block  # vLLM's own eviction of a block's hash: no public method
        for b in ids:
            st = state[b]
            if st == _IN:
                block = blocks[b]
                evict(block)
                queue.remove(block)
                self._n_in -= 1
            elif st == _PARKED:
                self._parked.discard(b)
            state[b] = _OUT
        self.unmapped_chunks += len(chunks)

    def _doom(self) -> None:
        """A lowered limit is deferred: pick the highest chunks to drain and park their free blocks."""
        if self._parked:
            self._unpark()  # a new revision: the blocks to drain may be others now
        kv = self._kv
        reading = self._limit.read()
        excess = kv.held_bytes - reading.limit
        if excess <= 0:
            return
        count = math.ceil(excess / self._group_bytes)
        mapped = [c for c in range(kv.num_chunks - 1, -1, -1) if kv.is_mapped(c) and c not in self._pinned_chunks]
        doomed = frozenset(mapped[:count])
        self._set_doomed(doomed)
        self._park([self.blocks[b] for c in doomed for b in self._grid.blocks_touching(c)])

    def _park(self, candidates: list[KVCacheBlock]) -> None:
        doomed, grid, state, queue = self._doomed, self._grid, self._state, self.vllm.free_block_queue
        if not doomed:
            return
        evict = self.vllm._maybe_evict_cached_block  # vLLM's own eviction of a block's hash: no public method
        for block in candidates:
            b = block.block_id
            if state[b] != _IN or block.ref_cnt or b == 0:
                continue
            if not any(c in doomed for c in grid.chunks_of(b)):
                continue
            evict(block)  # a parked block can never be a prefix hit
            queue.remove(block)
            state[b] = _PARKED
            self._parked.add(b)
            self._n_in -= 1

    def _unpark(self) -> None:
        """The deferral is over: parked blocks still mapped go back to the queue."""
        self._set_doomed(None)
        back = sorted(self._parked)
        self._parked.clear()
        for b in back:
            self._state[b] = _IN
        self.vllm.free_block_queue.prepend_n([self.blocks[b] for b in back])
        self._n_in += len(back)

    # -- facts ----------------------------------------------------------------------------
    def elastic_stats(self) -> dict[str, Any]:
        """What the elastic pool holds now, in blocks and bytes (for logs, tests and benchmarks)."""
        kv = self._kv
        free = self.vllm.free_block_queue.num_free_blocks
        return {
            "queued_free_blocks": free,
            "handed_out_blocks": self.handed_out_blocks,
            "parked_blocks": len(self._parked),
            "held_bytes": kv.held_bytes,
            "elastic_bytes": self._limit.elastic_held,
            "pinned_bytes": self._limit.pinned_held,
            "deferred": kv.deferred,
            "grown_blocks": self.grown_blocks,
            "unmapped_chunks": self.unmapped_chunks,
            "refusals": dict(self.refusals),
        }

    def check_consistent(self) -> None:
        """Assert the invariants (tests call it after every step): every block vLLM can hand out or
        holds is in a mapped chunk, and the queue holds exactly the free ``_IN`` blocks."""
        kv, grid, state, queue = self._kv, self._grid, self._state, self.vllm.free_block_queue
        queued = {b.block_id for b in queue.get_all_free_blocks()}
        assert len(queued) == queue.num_free_blocks, "the free queue's count is off"
        assert ("free_blocks" in vars(self.vllm)) == (self._doomed is not None), "free_blocks is shadowed iff draining"
        n_in = 0
        for block in self.blocks[1:]:
            b = block.block_id
            st = state[b]
            mapped = all(kv.is_mapped(c) for c in grid.chunks_of(b))
            if block.ref_cnt:
                assert st == _IN and mapped, f"block {b} is in use but its chunk is not mapped (state {st})"
            if b in queued:
                assert st == _IN and mapped and not block.ref_cnt, f"block {b} is queued but state {st}, mapped {mapped}"
            elif st == _IN:
                assert block.ref_cnt, f"block {b} is neither queued nor in use"
            if st == _PARKED:
                assert mapped and b in self._parked
            if st == _IN:
                n_in += 1
        assert n_in == self._n_in, f"{n_in} blocks in vLLM's hands, counted {self._n_in}"


def bind_scheduler(manager: Any, buffer: ElasticKVBuffer, **options: Any) -> ElasticPool:
    """Make the block pool of a vLLM ``KVCacheManager`` elastic over ``buffer`` and hook its allocation check.

    ``KVCacheManager.allocate_slots`` asks the coordinator how many blocks a request needs
    (``get_num_blocks_to_allocate``) and compares that, plus its watermark, with
    ``get_num_free_blocks()``. The hook — an instance attribute on this one coordinator —
    makes room for that many first. (The scheduler's only other caller of the count
    reserves blocks for asynchronous KV-connector loads, which an elastic engine refuses.)

    With ``yield_above_target``, ``allocate_slots`` (an instance attribute on this manager too)
    notes whether the request is new — not running: waiting, or preempted — and the pool's cap
    on new work (``ElasticPool.new_work_cap``); a new request that needs more blocks than the cap
    is answered more blocks than the pool has, so vLLM sees its own allocation miss and the
    request waits.
    """
    coordinator = manager.coordinator
    shared = coordinator.block_pool
    for m in coordinator.single_type_managers:
        if m.block_pool is not shared:
            raise AdapterError("kvpolicy: a KV cache group has its own block pool (host-resident?); it cannot be elastic")
    if manager.block_pool is not shared:
        raise AdapterError("kvpolicy: vLLM's KVCacheManager and its coordinator hold different block pools")
    pool = ElasticPool.adopt(shared, buffer, **options)
    count = coordinator.get_num_blocks_to_allocate
    cap: list[int | None] = [None]  # the cap on the blocks of the allocation in progress (a new request's)

    def get_num_blocks_to_allocate(*args: Any, **kwargs: Any) -> int:
        n = count(*args, **kwargs)
        if cap[0] is not None and n > cap[0]:
            return shared.num_gpu_blocks  # more than are ever free: vLLM's own allocation miss
        need = n + manager.watermark_blocks
        if need > shared.free_block_queue.num_free_blocks:
            pool.make_room(need)
        return n

    coordinator.get_num_blocks_to_allocate = get_num_blocks_to_allocate
    if options.get("yield_above_target"):
        from vllm.v1.request import RequestStatus

        allocate, running = manager.allocate_slots, RequestStatus.RUNNING

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            cap[0] = None if request.status == running else pool.new_work_cap()
            try:
                return allocate(request, *args, **kwargs)
            finally:
                cap[0] = None

        manager.allocate_slots = allocate_slots
    return pool
