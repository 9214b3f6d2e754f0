"""The KV block pool: block ids handed out over arenas that grow and shrink under a limit.

Block ``b`` occupies ``[b * stride, (b + 1) * stride)`` of every arena of the pool
(``layout.BlockGeometry``; ``layout.ChunkGrid`` says which chunks that is); chunk
index ``c`` is chunk ``c`` of every arena, mapped and unmapped together. A block that
straddles chunks is usable only when all of them are mapped.

``BlockPool`` composes three parts and serialises them under one lock:

- ``mapping`` (``mapping.ChunkMapping``): the arenas, mapped chunk by chunk under the
  limit in force, with the limit source's admit/commit protocol, deferred limits and
  unmapping — no block ids;
- ``index`` (``free_blocks.FreeBlockIndex``): the live ids and the free ones by chunk,
  for page-aware placement (the hot path of ``alloc`` and ``free``);
- ``give_back`` (``giveback.GiveBack``): how much ``sync()`` gives back above the
  target (optionally after a delay) and when another instance is short of memory.

Invariants (checked by the tests after every step):
- a live block's chunks are all mapped — a chunk is unmapped only when no live block
  touches it;
- bytes held (mapped chunks + stuck ones) never exceed the limit, except while a
  lowered limit is *deferred* because live blocks pin the chunks above it; then
  every chunk that becomes free is released until the limit holds again;
- the limit source has exactly the bytes held committed, with nothing pending.

Growth maps the fewest lowest unmapped chunks that give enough blocks (at least
``grow_chunks``); shrinking releases fully free chunks from the highest index down.
So live blocks gather at low addresses and freed memory at high ones can go back to
the GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvpolicy.alloc.arena import Arena
from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.driver import Driver
from kvpolicy.alloc.errors import AllocError, DriverError, OutOfBlocks
from kvpolicy.alloc.free_blocks import FreeBlockIndex
from kvpolicy.alloc.giveback import GiveBack
from kvpolicy.alloc.layout import BlockGeometry, ChunkGrid
from kvpolicy.alloc.limits import LimitSource
from kvpolicy.alloc.live import check_block, reconcile_plan
from kvpolicy.alloc.mapping import ChunkMapping
from kvpolicy.units import format_bytes


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a block pool, in blocks and bytes."""

    num_blocks: int
    live_blocks: int
    free_blocks: int
    """Free blocks in mapped chunks (allocatable without growing)."""
    mapped_chunks: int
    """Chunk indices mapped in every arena."""
    num_chunks: int
    used_bytes: int
    """Bytes of live blocks, over all arenas."""
    held_bytes: int
    """Device memory held: mapped chunks (and any stuck ones), over all arenas."""
    limit: int
    target: int
    revision: int
    deferred: bool
    groups_mapped: int = 0
    """Chunk groups mapped since the pool was made (cumulative)."""
    groups_unmapped: int = 0
    regrowths: int = 0
    """Give-back/regrow cycles: growths that followed a give-back (cumulative)."""


class BlockPool:
    """Fixed-size KV blocks over ``geometry.num_arenas`` arenas of virtual capacity ``num_blocks`` blocks.

    Thread-safe: every public method takes the pool's lock.
    """

    def __init__(
        self,
        driver: Driver,
        geometry: BlockGeometry,
        num_blocks: int,
        *,
        chunk: int,
        limit: LimitSource,
        grow_chunks: int = 1,
        name: str = "kv",
        before_unmap: Callable[[list[int]], None] | None = None,
        zero_new_chunks: bool = False,
        give_back_under_pressure: bool = True,
        give_back_delay_s: float = 0.0,
        give_back_hold_s: float = 0.0,
        reserve_blocks: int = 0,
        pressure_keeps_reserve: bool = False,
        yield_above_target_s: float = 0.0,
        give_back_chunks_per_sync: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``before_unmap(chunks)`` runs (under the pool's lock) before fully free chunk indices
        are unmapped, so an engine that keeps its own free lists can take their blocks out
        first (and wait for kernels in flight); if it raises, nothing is unmapped.
        ``zero_new_chunks`` fills every newly mapped chunk with zeros before its blocks
        can be handed out. ``give_back_under_pressure`` and ``give_back_delay_s`` (measured
        by ``clock``): see ``giveback``. ``give_back_hold_s``: under pressure, memory below the
        target goes back only once it stayed free this long. ``reserve_blocks``: free blocks
        ``top_up()`` keeps mapped ahead of demand (0: none, growth only inside ``alloc``).
        ``yield_above_target_s``: see ``admission_room``. ``give_back_chunks_per_sync``: at most this
        many chunk groups go back at one ``sync()`` for the target or for pressure, so the driver's
        time between two steps stays bounded (None: no bound; a lowered limit is never held back)."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if reserve_blocks < 0:
            raise ValueError(f"reserve_blocks must be >= 0, got {reserve_blocks}")
        stride, n_arenas = geometry.block_stride, geometry.num_arenas
        group = chunk * n_arenas
        self.reserve_blocks = reserve_blocks
        self.give_back = GiveBack(
            hold_s=give_back_hold_s,
            reserve_bytes=-(-reserve_blocks * stride * n_arenas // group) * group,
            group_bytes=chunk * n_arenas,
            grow_chunks=grow_chunks,
            delay_s=give_back_delay_s,
            under_pressure=give_back_under_pressure,
            clock=clock,
            pressure=limit.pressure(),
            pressure_keeps_reserve=pressure_keeps_reserve,
            yield_above_target_s=yield_above_target_s,
            release_chunks=give_back_chunks_per_sync,
        )
        self.geometry = geometry
        self.name = name
        self.num_blocks = num_blocks
        self.block_stride = stride
        self.chunk = chunk
        self.grow_chunks = grow_chunks
        self.grid = ChunkGrid(stride, chunk, num_blocks)
        self.block_bytes = stride * n_arenas
        self._before_unmap = before_unmap
        self.mapping = ChunkMapping(
            driver,
            self.grid,
            limit=limit,
            num_arenas=n_arenas,
            name=name,
            before_unmap=self._unmapping,
            zero_new_chunks=zero_new_chunks,
            used_bytes=lambda: self.used_bytes,
        )
        self.index = FreeBlockIndex(self.mapping)
        self.driver = driver
        self.arenas: list[Arena] = self.mapping.arenas
        self.num_chunks = self.mapping.num_chunks
        self.group_bytes = self.mapping.group_bytes
        self._lock = threading.Lock()
        self._closed = False

    def _unmapping(self, chunks: list[int]) -> None:
        """The mapping is about to unmap ``chunks``: the engine's hook first, then their blocks leave the free lists."""
        if self._before_unmap is not None:
            self._before_unmap(chunks)
        self.index.drop(chunks)

    # -- geometry ----------------------------------------------------------------------
    def chunks_of_block(self, block: int) -> range:
        """Chunk indices block ``block`` occupies (more than one when it straddles)."""
        check_block(block, self.num_blocks, self.name)
        return self.grid.chunks_of(block)

    def blocks_of_chunk(self, index: int) -> range:
        """Block ids that touch chunk ``index`` (in part or whole)."""
        if not 0 <= index < self.num_chunks:
            raise ValueError(f"chunk {index} is out of range: the pool has {self.num_chunks} chunks")
        return self.grid.blocks_touching(index)

    # -- state -------------------------------------------------------------------------
    @property
    def calls(self) -> CallCounts:
        """Driver calls over all the pool's arenas (a new object; each arena keeps its own)."""
        return self.mapping.calls

    @property
    def held_bytes(self) -> int:
        return self.mapping.held_bytes

    @property
    def used_bytes(self) -> int:
        return self.index.num_live * self.block_bytes

    @property
    def live_blocks(self) -> int:
        return self.index.num_live

    @property
    def free_blocks(self) -> int:
        """Free blocks in mapped chunks: what ``alloc`` can hand out without growing."""
        return self.index.num_free

    @property
    def revision(self) -> int | None:
        """The limit revision last applied (or deferred); None before the first reading."""
        return self.mapping.revision

    @property
    def deferred(self) -> bool:
        """Whether a lowered limit waits for live blocks to be freed."""
        return self.mapping.deferred

    @property
    def pressed(self) -> bool:
        """Whether another instance was refused memory since this pool last looked: its next
        ``sync()`` gives back under pressure (never, with ``give_back_under_pressure=False``)."""
        return self.give_back.pressed(self.mapping.limit.pressure())

    @property
    def starved(self) -> bool:
        """Whether this pool's own admission was refused since its last ``sync()`` (then pressure takes nothing from it)."""
        return self.give_back.starved(self.mapping.admission_refusals)

    def admission_room(self) -> int | None:
        """Bytes that new work (a request the engine has not started) may take beyond the live blocks
        now; None: as much as the limit allows. The running requests' growth is not bound by it.

        - Under a lowered limit that live blocks defer: ``limit - used``. The free blocks of the held
          chunks are not for new work: the running requests finish and their chunks go back.
        - While the GPU's budget is contended (``yield_above_target_s``: an instance was refused
          memory within that many seconds): ``target - used``; above the target, only the free
          blocks in the pool's lowest chunks up to its target. A busy pool above its target would
          otherwise refill every block it frees with new work, never drain to its target, and the
          refused instance below its own would wait for ever: the targets would not be shares.
          The lowest target's worth of chunks the pool keeps either way (a give-back takes the
          highest first) and placement fills them first, so the chunks above still empty and go
          back while new work uses blocks that would otherwise sit idle in kept chunks.
        """
        with self._lock:
            m, used = self.mapping, self.used_bytes
            if m.deferred:
                return max(0, m.reading.limit - used)
            if self.give_back.contended():
                target = m.reading.target
                if used <= target:
                    return target - used
                return self.index.free_below(target // m.group_bytes) * self.block_bytes
            return None

    @property
    def released_under_pressure(self) -> int:
        """Bytes given back because another instance was short of memory (cumulative)."""
        return self.give_back.released_under_pressure

    @property
    def last_error(self) -> DriverError | None:
        """The driver error a ``free`` swallowed while completing a deferred limit, if any."""
        return self.mapping.last_error

    def is_live(self, block: int) -> bool:
        check_block(block, self.num_blocks, self.name)
        return block in self.index.live

    def is_chunk_mapped(self, index: int) -> bool:
        return self.mapping.is_mapped(index)

    def fully_free_chunks(self) -> list[int]:
        """Mapped chunk indices that no live block touches: what a shrink may release."""
        return self.mapping.fully_free_chunks()

    def stats(self) -> PoolStats:
        with self._lock:
            m, r = self.mapping, self.mapping.reading
            return PoolStats(
                num_blocks=self.num_blocks,
                live_blocks=self.index.num_live,
                free_blocks=self.index.num_free,
                mapped_chunks=m.mapped_chunks,
                num_chunks=self.num_chunks,
                used_bytes=self.used_bytes,
                held_bytes=m.held_bytes,
                limit=r.limit,
                target=r.target,
                revision=r.revision,
                deferred=m.deferred,
                groups_mapped=m.groups_mapped,
                groups_unmapped=m.groups_unmapped,
                regrowths=m.regrowths,
            )

    # -- the hot path ------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """``n`` distinct free block ids, now live, mapping more chunks if needed and the limit allows.

        Raises ``OutOfBlocks`` (with the numbers and the reason) when the blocks
        cannot be had; then nothing was allocated and nothing stays mapped for it.
        """
        with self._lock:
            index = self.index
            if 0 < n <= index.num_free and not self._closed:
                return index.take(n)
            self._check_open()
            if n <= 0:
                if n == 0:
                    return []
                raise ValueError(f"cannot allocate {n} blocks")
            self._grow_for(n)
            out = index.take(n)
            self.mapping.report()
            return out

    def free(self, blocks: Iterable[int]) -> None:
        """Return live blocks to the pool; all or nothing (a bad id raises BlockError and frees none)."""
        ids = blocks if type(blocks) is list else list(blocks)
        if not ids:
            return
        with self._lock:
            if self._closed:
                self._check_open()  # raises, saying why
            emptied = self.index.free(ids)
            if emptied and self.mapping.deferred:
                self.mapping.chunks_emptied(emptied)

    def claim(self, blocks: Sequence[int]) -> None:
        """Make the given free block ids live (mapping their chunks if needed), for an engine that picks ids itself."""
        ids = list(blocks)
        with self._lock:
            self._check_open()
            self.index.check_claim(ids)
            self._map_missing(ids, requested=len(ids))
            self.index.claim(ids)
            self.mapping.report()

    def reconcile(self, live: Iterable[int], free: Iterable[int] | None) -> None:
        """For an engine that tracks which blocks it holds: afterwards the ids in ``live`` are live and
        those in ``free`` are free (ids already so are left alone); ``free=None``: every other id.

        Claims go first, so that no chunk ever looks empty while the engine holds one of
        its blocks; the frees may then complete a deferred limit (releasing chunks).
        """
        with self._lock:
            claim, release = reconcile_plan(self.index.live, live, free)
        if claim:
            self.claim(claim)
        if release:
            self.free(release)

    def ensure_mapped(self, blocks: Iterable[int]) -> list[int]:
        """Map the chunks holding ``blocks`` that are not mapped yet (under the limit); returns those chunk indices.

        The blocks stay free: this is for an engine whose own scheduler hands out ids.
        """
        ids = list(blocks)
        with self._lock:
            self._check_open()
            for b in ids:
                check_block(b, self.num_blocks, self.name)
            mapped = self._map_missing(ids, requested=len(ids))
            if mapped:
                self.mapping.report()
            return mapped

    def grow(self, n: int) -> list[int]:
        """Map the fewest lowest unmapped chunks that make at least ``n`` more blocks allocatable; returns those ids, ascending.

        For an engine whose own scheduler hands out ids: the new blocks stay free. It never
        gives memory back: while the limit source has a revision that ``sync()`` has not
        applied, growth is refused (``OutOfBlocks`` reason ``"revision"``), so memory is
        released only where the caller calls ``sync()``. A refusal maps nothing.
        """
        if n <= 0:
            if n == 0:
                return []
            raise ValueError(f"cannot grow by {n} blocks")
        with self._lock:
            self._check_open()
            free = self.index.num_free
            chunks = self.mapping.grow(n, at_least=self.grow_chunks, requested=n, free=free)
            return self.index.add_mapped(chunks)

    def report(self) -> None:
        """Tell the limit source the bytes in live blocks and held now (``free`` alone does not)."""
        with self._lock:
            self._check_open()
            self.mapping.report()

    def top_up(self) -> list[int]:
        """Map ahead of demand, between steps: when fewer than ``reserve_blocks`` free blocks are
        mapped, map the lowest unmapped chunks that make ``reserve_blocks`` (within the limit
        last read and the limit source's admission); returns the chunk indices mapped.

        It never raises ``OutOfBlocks``: a refusal maps nothing and the next top-up waits a
        hold time, as it does after a give-back under pressure and while another instance is
        short of memory (``GiveBack.may_top_up``): a reserve is not worth a tug of war.
        """
        with self._lock:
            self._check_open()
            missing = self.reserve_blocks - self.index.num_free
            if missing <= 0 or self.mapping.deferred or not self.give_back.may_top_up(self.mapping.limit.pressure()):
                return []
            free = self.index.num_free
            try:
                chunks = self.mapping.map_growth(missing, at_least=1, requested=self.reserve_blocks, free=free)
            except OutOfBlocks:
                self.give_back.top_up_refused()
                return []
            self.index.add_mapped(chunks)
            self.mapping.report()
            return chunks

    # -- growth ------------------------------------------------------------------------
    def _grow_for(self, n: int) -> None:
        """Map the fewest lowest unmapped chunks that give ``n - free`` more blocks (at least ``grow_chunks``)."""
        self.mapping.refresh()  # may release free chunks (a lowered limit): count what is missing after
        free = self.index.num_free
        if n - free <= 0:
            return
        chunks = self.mapping.map_growth(n - free, at_least=self.grow_chunks, requested=n, free=free)
        self.index.add_mapped(chunks)

    def _map_missing(self, ids: list[int], *, requested: int) -> list[int]:
        chunks = self.mapping.map_missing(ids, requested=requested, free=self.index.num_free)
        if chunks:
            self.index.add_mapped(chunks)
        return chunks

    # -- limits ------------------------------------------------------------------------
    def sync(self) -> PoolStats:
        """Read the limit source, apply a new limit (or defer it), give back memory above the target, report.

        Call it periodically (e.g. once per scheduler step): ``free`` does not read the
        limit source, only ``alloc`` when it must grow does.
        """
        with self._lock:
            self._check_open()
            self.give_back.sync(self.mapping, self.used_bytes)
            self.mapping.new_period()  # a sync is the pool's tick: what waits is reported once a period
        return self.stats()

    def shrink(self, to: int | None = None) -> int:
        """Release fully free chunks until at most ``to`` bytes are held (default: the target); returns bytes released.

        Never touches a chunk with a live block, so it may stop above ``to``.
        """
        with self._lock:
            self._check_open()
            m = self.mapping
            if to is None:
                to = m.read().target
            before = m.held_bytes
            m.release_down_to(to)
            m.report()
            return before - m.held_bytes

    # -- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and release everything (live blocks included) and return the bytes to the limit source."""
        with self._lock:
            if self._closed:
                return
            self.mapping.close()
            self.index.close()
            self._closed = True

    def __enter__(self) -> BlockPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"BlockPool({self.name!r}, {self.num_blocks} blocks × {format_bytes(self.block_bytes)}, "
            f"{len(self.arenas)} arenas, chunk {format_bytes(self.chunk)}, {self.index.num_live} live, "
            f"{format_bytes(self.held_bytes)} held)"
        )

    # -- checks ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise AllocError(f"block pool {self.name!r} is closed")
