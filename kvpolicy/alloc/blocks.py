"""The KV block pool: block ids handed out over arenas that grow and shrink under a limit.

Blocks and chunks. Block ``b`` occupies ``[b * stride, (b + 1) * stride)`` of every
arena of the pool (``layout.BlockGeometry``); chunk index ``c`` is chunk ``c`` of
every arena, mapped and unmapped together, costing ``chunk × arenas`` bytes (a
*chunk group*). A block may straddle two chunks when the stride does not divide the
chunk; it is usable only when all its chunks are mapped.

Invariants (checked by the tests after every step):
- a live block's chunks are all mapped — a chunk is unmapped only when no live block
  touches it;
- bytes held (mapped chunks + stuck ones) never exceed the limit, except while a
  lowered limit is *deferred* because live blocks pin the chunks above it; then
  every chunk that becomes free is released until the limit holds again;
- the limit source has exactly the bytes held committed, with nothing pending.

Placement prefers chunks that already hold live blocks, lowest index first, then
free mapped chunks, then growth at the lowest unmapped index; shrinking releases
fully free chunks from the highest index down. So live blocks gather at low
addresses and freed memory at high ones can go back to the GPU.

Pressure. When another instance's elastic admission is refused for the GPU's budget,
the limit source's ``pressure()`` counter moves; the next ``sync()`` of every other
pool then gives back the fully free chunks it holds beyond what it uses plus one
growth step (``grow_chunks`` chunk groups), never below its guarantee (memory no one
else could take). Memory below the target is otherwise kept mapped, as a warm cache;
under pressure it goes where it is needed. A pool whose own admission was refused
since its last ``sync()`` is the one short of memory and gives nothing back.

Above the target. ``sync()`` gives back the fully free chunks held above the target:
at once by default, or with ``give_back_delay_s`` only the memory that stayed free
above the target through a whole period of that many seconds (the least seen at any
``sync()`` of the period). A busy engine above its target frees a finished request's
blocks and takes them again for the next one within a step or two: the delay keeps
those chunks mapped instead of unmapping and mapping them again. Pressure and a
lowered limit are not delayed.

Limit protocol (``limits.LimitSource``): ``read()`` on every growth and ``sync()``;
``admit()`` once per growth for the bytes of the whole batch, then ``commit()`` what
was mapped and ``rollback()`` the rest; ``release()`` after unmapping;
``report(used, held)`` after every change of mapped memory and on ``sync()``;
``acknowledge(revision, "applied" | "deferred")`` for every new revision, and
``"applied"`` again when a deferral completes.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import compress

from kvpolicy.alloc.arena import Arena, MapResult, _note
from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.driver import Driver
from kvpolicy.alloc.errors import (
    AllocError,
    BlockError,
    DeviceOutOfMemory,
    DriverError,
    OutOfBlocks,
)
from kvpolicy.alloc.layout import BlockGeometry
from kvpolicy.alloc.limits import LimitReading, LimitSource
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``before_unmap(chunks)`` runs (under the pool's lock) before fully free chunk indices
        are unmapped, so an engine that keeps its own free lists can take their blocks out
        first (and wait for kernels in flight); if it raises, nothing is unmapped.
        ``zero_new_chunks`` fills every newly mapped chunk with zeros before its blocks
        can be handed out. ``give_back_under_pressure``: see "Pressure" above;
        ``give_back_delay_s``: see "Above the target" (``clock`` measures it)."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if grow_chunks < 1:
            raise ValueError(f"grow_chunks must be >= 1, got {grow_chunks}")
        if give_back_delay_s < 0:
            raise ValueError(f"give_back_delay_s must be >= 0, got {give_back_delay_s}")
        stride, n_arenas = geometry.block_stride, geometry.num_arenas
        self.geometry = geometry
        self.name = name
        self.num_blocks = num_blocks
        self.block_stride = stride
        self.chunk = chunk
        self.grow_chunks = grow_chunks
        self.arenas: list[Arena] = []
        try:
            for a in range(n_arenas):
                self.arenas.append(Arena(driver, num_blocks * stride, chunk, name=f"{name}[{a}]"))
        except BaseException:
            for arena in self.arenas:
                arena.close()
            raise
        self.driver = driver
        self.num_chunks = self.arenas[0].num_chunks
        self.group_bytes = chunk * n_arenas
        self.block_bytes = stride * n_arenas
        # Blocks per chunk when no block straddles a chunk boundary (the fast path), else 0.
        self._bpc = chunk // stride if chunk % stride == 0 else 0
        # Live block ids. A set, not a per-block flag array: checking, adding and removing
        # a batch of ids are then single C-level calls, which is most of alloc/free's cost.
        self._live: set[int] = set()
        # 1 for the blocks that span more than one chunk (their neighbours' counts need care).
        self._straddles = (
            bytearray(0 if b * stride // chunk == ((b + 1) * stride - 1) // chunk else 1 for b in range(num_blocks))
            if not self._bpc
            else bytearray(num_blocks)
        )
        self._live_in = [0] * self.num_chunks  # live blocks touching each chunk
        self._free_in: list[list[int]] = [[] for _ in range(self.num_chunks)]  # allocatable free blocks by home chunk
        self._mapped = bytearray(self.num_chunks)  # 1 = mapped in every arena
        self._low_unmapped = 0  # every chunk below it is mapped: where growth starts looking
        self._partial: list[int] = []  # heap of home chunks with free blocks and live ones (lazy)
        self._empty: list[int] = []  # heap of home chunks with free blocks and no live ones (lazy)
        self._in_partial = bytearray(self.num_chunks)
        self._in_empty = bytearray(self.num_chunks)
        self._n_free = 0
        self._n_live = 0
        self._n_mapped = 0
        self._limit = limit
        self._lock = threading.Lock()
        self._closed = False
        self._orphans: set[int] = set()  # unmapped for the pool, still mapped in some arena (a failed unmap)
        self._before_unmap = before_unmap
        self._zero_new = zero_new_chunks
        self.last_error: DriverError | None = None
        """The driver error a ``free`` swallowed while completing a deferred limit, if any."""
        self._revision: int | None = None
        self._deferred = False
        self._under_pressure = give_back_under_pressure
        self._pressure_seen = limit.pressure()
        self._starved = False  # its own admission was refused since the last sync()
        self.released_under_pressure = 0
        """Bytes given back because another instance was short of memory (cumulative)."""
        self._delay = give_back_delay_s
        self._clock = clock
        self._period_start = clock()
        self._idle_above: int | None = None  # the least free memory above the target seen this period
        self._reading = limit.read()
        self._observe(self._reading)

    # -- geometry ----------------------------------------------------------------------
    def chunks_of_block(self, block: int) -> range:
        """Chunk indices block ``block`` occupies (more than one when it straddles)."""
        self._check_block(block)
        s, c = self.block_stride, self.chunk
        return range(block * s // c, ((block + 1) * s - 1) // c + 1)

    def blocks_of_chunk(self, index: int) -> range:
        """Block ids that touch chunk ``index`` (in part or whole)."""
        if not 0 <= index < self.num_chunks:
            raise ValueError(f"chunk {index} is out of range: the pool has {self.num_chunks} chunks")
        s, c = self.block_stride, self.chunk
        return range(index * c // s, min(self.num_blocks, ((index + 1) * c - 1) // s + 1))

    # -- state -------------------------------------------------------------------------
    @property
    def calls(self) -> CallCounts:
        """Driver calls over all the pool's arenas (a new object; each arena keeps its own)."""
        return sum((arena.calls for arena in self.arenas), CallCounts())

    @property
    def held_bytes(self) -> int:
        return sum(a.held_bytes for a in self.arenas)

    @property
    def used_bytes(self) -> int:
        return self._n_live * self.block_bytes

    @property
    def live_blocks(self) -> int:
        return self._n_live

    @property
    def free_blocks(self) -> int:
        """Free blocks in mapped chunks: what ``alloc`` can hand out without growing."""
        return self._n_free

    @property
    def revision(self) -> int | None:
        """The limit revision last applied (or deferred); None before the first reading."""
        return self._revision

    @property
    def deferred(self) -> bool:
        """Whether a lowered limit waits for live blocks to be freed."""
        return self._deferred

    @property
    def pressed(self) -> bool:
        """Whether another instance was refused memory since this pool last looked: its next
        ``sync()`` gives back under pressure (never, with ``give_back_under_pressure=False``)."""
        return self._under_pressure and self._limit.pressure() != self._pressure_seen

    def is_live(self, block: int) -> bool:
        self._check_block(block)
        return block in self._live

    def is_chunk_mapped(self, index: int) -> bool:
        return self._mapped[index] == 1

    def fully_free_chunks(self) -> list[int]:
        """Mapped chunk indices that no live block touches: what a shrink may release."""
        live, mapped = self._live_in, self._mapped
        return [c for c in range(self.num_chunks) if mapped[c] and not live[c]]

    def stats(self) -> PoolStats:
        with self._lock:
            r = self._reading
            return PoolStats(
                num_blocks=self.num_blocks,
                live_blocks=self._n_live,
                free_blocks=self._n_free,
                mapped_chunks=self._n_mapped,
                num_chunks=self.num_chunks,
                used_bytes=self.used_bytes,
                held_bytes=self.held_bytes,
                limit=r.limit,
                target=r.target,
                revision=r.revision,
                deferred=self._deferred,
            )

    # -- the hot path ------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """``n`` distinct free block ids, now live, mapping more chunks if needed and the limit allows.

        Raises ``OutOfBlocks`` (with the numbers and the reason) when the blocks
        cannot be had; then nothing was allocated and nothing stays mapped for it.
        """
        with self._lock:
            if 0 < n <= self._n_free and not self._closed:
                return self._take(n)
            self._check_open()
            if n <= 0:
                if n == 0:
                    return []
                raise ValueError(f"cannot allocate {n} blocks")
            self._grow_for(n)
            out = self._take(n)
            self._report()
            return out

    def free(self, blocks: Iterable[int]) -> None:
        """Return live blocks to the pool; all or nothing (a bad id raises BlockError and frees none)."""
        ids = blocks if type(blocks) is list else list(blocks)
        if not ids:
            return
        with self._lock:
            if self._closed:
                self._check_open()  # raises, saying why
            live = self._live
            if not live.issuperset(ids):
                bad = next(b for b in ids if b not in live)
                nb = self.num_blocks
                why = "out of range" if not 0 <= bad < nb else "not live (double free?)"
                raise BlockError(f"cannot free block {bad}: {why}; pool {self.name!r} has {nb} blocks")
            before = len(live)
            live.difference_update(ids)
            if len(live) != before - len(ids):
                live.update(ids)
                raise BlockError(f"block ids repeat in free: {sorted(ids)}")
            emptied = self._return(ids)
            if self._deferred and emptied:
                try:
                    self._continue_deferred(emptied)
                except DriverError as exc:
                    # The blocks are free either way; the deferral stays pending and the
                    # next free() or sync() tries again. The engine must not see its
                    # free fail (it would free the same ids again).
                    self.last_error = exc

    def claim(self, blocks: Sequence[int]) -> None:
        """Make the given free block ids live (mapping their chunks if needed), for an engine that picks ids itself."""
        ids = list(blocks)
        with self._lock:
            self._check_open()
            if len(set(ids)) != len(ids):
                raise BlockError(f"block ids repeat in claim: {sorted(ids)}")
            for b in ids:
                self._check_block(b)
                if b in self._live:
                    raise BlockError(f"cannot claim block {b}: it is already live")
            self._ensure_chunks(self._chunks_for(ids), requested=len(ids))
            s, c = self.block_stride, self.chunk
            live, free_in = self._live_in, self._free_in
            for b in ids:
                h = b * s // c
                free_in[h].remove(b)
                self._live.add(b)
                for ci in range(h, ((b + 1) * s - 1) // c + 1):
                    live[ci] += 1
                    if free_in[ci]:
                        self._ensure_partial(ci)
            self._n_free -= len(ids)
            self._n_live += len(ids)
            self._report()

    def reconcile(self, live: Iterable[int], free: Iterable[int] | None) -> None:
        """For an engine that tracks which blocks it holds: afterwards the ids in ``live`` are live and
        those in ``free`` are free (ids already so are left alone); ``free=None``: every other id.

        Claims go first, so that no chunk ever looks empty while the engine holds one of
        its blocks; the frees may then complete a deferred limit (releasing chunks).
        """
        with self._lock:
            current = self._live
            wanted = set(live)
            claim = sorted(wanted - current)
            release = sorted(current - wanted if free is None else set(free) & current)
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
                self._check_block(b)
            mapped = self._ensure_chunks(self._chunks_for(ids), requested=len(ids))
            if mapped:
                self._report()
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
            reading = self._limit.read()
            if reading.revision != self._revision:
                raise OutOfBlocks(
                    n, self._n_free, "revision", held=self.held_bytes, limit=reading.limit,
                    hint=f"limit revision {reading.revision} is not applied yet; call sync() first",
                )
            self._reading = reading
            added = self._map_indices(self._choose_growth(n, reading), requested=n)
            self._report()
            return sorted(added)

    def report(self) -> None:
        """Tell the limit source the bytes in live blocks and held now (``free`` alone does not)."""
        with self._lock:
            self._check_open()
            self._report()

    # -- limits ------------------------------------------------------------------------
    def sync(self) -> PoolStats:
        """Read the limit source, apply a new limit (or defer it), give back memory above the target, report.

        Call it periodically (e.g. once per scheduler step): ``free`` does not read the
        limit source, only ``alloc`` when it must grow does.
        """
        with self._lock:
            self._check_open()
            reading = self._limit.read()
            self._reading = reading
            self._observe(reading)
            if self._deferred:
                self._continue_deferred(None)
            self._give_back_above_target(reading.target)
            if self._under_pressure:
                self._give_back_under_pressure(reading)
            self._report()
        return self.stats()

    def _give_back_above_target(self, target: int) -> None:
        """Release free memory above ``target``: all of it, or what stayed free through a delay period."""
        if not self._delay:
            if self.held_bytes > target:
                self._release_down_to(target)
            return
        above = max(0, self.held_bytes - max(target, self.used_bytes))
        self._idle_above = above if self._idle_above is None else min(self._idle_above, above)
        now = self._clock()
        if now - self._period_start < self._delay:
            return
        if self._idle_above:
            self._release_down_to(max(target, self.held_bytes - self._idle_above))
        self._period_start, self._idle_above = now, None

    def _give_back_under_pressure(self, reading: LimitReading) -> None:
        """If another instance was refused memory since the last look, give back what this pool holds unused."""
        pressure = self._limit.pressure()
        starved, self._starved = self._starved, False
        if pressure == self._pressure_seen:
            return
        self._pressure_seen = pressure
        if starved or self._deferred:
            return
        g = self.group_bytes
        in_use = -(-self.used_bytes // g) * g  # whole chunk groups
        keep = max(reading.guarantee, in_use + self.grow_chunks * g)
        before = self.held_bytes
        self._release_down_to(keep)
        self.released_under_pressure += before - self.held_bytes

    def shrink(self, to: int | None = None) -> int:
        """Release fully free chunks until at most ``to`` bytes are held (default: the target); returns bytes released.

        Never touches a chunk with a live block, so it may stop above ``to``.
        """
        with self._lock:
            self._check_open()
            if to is None:
                self._reading = self._limit.read()
                to = self._reading.target
            before = self.held_bytes
            self._release_down_to(to)
            self._report()
            return before - self.held_bytes

    # -- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and release everything (live blocks included) and return the bytes to the limit source."""
        with self._lock:
            if self._closed:
                return
            before = self.held_bytes
            errors: list[DriverError] = []
            for arena in self.arenas:
                try:
                    arena.close()
                except DriverError as exc:
                    errors.append(exc)
            released = before - self.held_bytes
            if released:
                self._limit.release(released)
            if errors:
                first = errors[0]
                for other in errors[1:]:
                    _note(first, f"also failed while closing pool {self.name!r}: {other}")
                raise first
            self._closed = True
            self._mapped[:] = bytes(self.num_chunks)
            self._n_mapped = self._n_free = 0
            self._limit.report(0, 0)

    def __enter__(self) -> BlockPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"BlockPool({self.name!r}, {self.num_blocks} blocks × {format_bytes(self.block_bytes)}, "
            f"{len(self.arenas)} arenas, chunk {format_bytes(self.chunk)}, {self._n_live} live, "
            f"{format_bytes(self.held_bytes)} held)"
        )

    # -- allocation internals ----------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        free_in, live_in = self._free_in, self._live_in
        out: list[int] | None = None
        need = n
        while need:
            partial = self._partial
            if partial and free_in[partial[0]] and live_in[partial[0]]:
                h = partial[0]  # the usual case, without a call
            else:
                h = self._pick_home()
                assert h >= 0, f"pool {self.name!r} counted {self._n_free} free blocks but found none"
            lst = free_in[h]
            k = len(lst)
            if k <= need:
                taken = lst
                free_in[h] = []
            else:
                k = need
                cut = len(lst) - k
                taken = lst[cut:]
                del lst[cut:]
                if not self._in_partial[h]:
                    heappush(partial, h)
                    self._in_partial[h] = 1
            self._live.update(taken)
            live_in[h] += k
            if not self._bpc:
                self._count_straddlers(taken, h)
            if out is None:
                out = taken
            else:
                out += taken
            need -= k
        self._n_free -= n
        self._n_live += n
        assert out is not None
        return out

    def _return(self, ids: list[int]) -> list[int]:
        """Put freed blocks back in their home chunks' lists; returns the chunks that became fully free."""
        free_in, live_in = self._free_in, self._live_in
        stride, chunk = self.block_stride, self.chunk
        ordered = sorted(ids)
        n = len(ordered)
        h = ordered[0] * stride // chunk
        if ordered[-1] * stride // chunk == h:  # all in one home chunk: the usual case
            free_in[h].extend(ordered)
            live_in[h] -= n
            touched = [h]
        else:
            touched = []
            i = 0
            while i < n:  # one pass per home chunk, not per block
                h = ordered[i] * stride // chunk
                j = bisect_left(ordered, -(-(h + 1) * chunk // stride), i)  # first block of the next chunk
                free_in[h].extend(ordered[i:j])
                live_in[h] -= j - i
                touched.append(h)
                i = j
        if not self._bpc:
            for b in compress(ordered, map(self._straddles.__getitem__, ordered)):
                for ci in range(b * stride // chunk + 1, ((b + 1) * stride - 1) // chunk + 1):
                    live_in[ci] -= 1
                    touched.append(ci)
        emptied: list[int] = []
        for ci in touched:
            if live_in[ci]:
                if free_in[ci] and not self._in_partial[ci]:
                    heappush(self._partial, ci)
                    self._in_partial[ci] = 1
            else:
                emptied.append(ci)
                if free_in[ci] and not self._in_empty[ci]:
                    heappush(self._empty, ci)
                    self._in_empty[ci] = 1
        self._n_free += n
        self._n_live -= n
        return emptied

    def _count_straddlers(self, taken: list[int], home: int) -> None:
        stride, chunk, live_in, free_in = self.block_stride, self.chunk, self._live_in, self._free_in
        for b in compress(taken, map(self._straddles.__getitem__, taken)):
            for ci in range(home + 1, ((b + 1) * stride - 1) // chunk + 1):
                live_in[ci] += 1
                if free_in[ci]:
                    self._ensure_partial(ci)

    def _pick_home(self) -> int:
        """The home chunk to allocate from: partly used first, then fully free; lowest index first."""
        free_in, live = self._free_in, self._live_in
        partial = self._partial
        while partial:
            h = partial[0]
            if free_in[h] and live[h]:
                return h
            heappop(partial)
            self._in_partial[h] = 0
            if free_in[h]:
                self._ensure_empty(h)
        empty = self._empty
        while empty:
            h = empty[0]
            if free_in[h]:
                return h
            heappop(empty)
            self._in_empty[h] = 0
        return -1

    def _ensure_partial(self, h: int) -> None:
        if not self._in_partial[h]:
            heappush(self._partial, h)
            self._in_partial[h] = 1

    def _ensure_empty(self, h: int) -> None:
        if not self._in_empty[h]:
            heappush(self._empty, h)
            self._in_empty[h] = 1

    # -- growth ------------------------------------------------------------------------
    def _grow_for(self, n: int) -> None:
        """Map the fewest lowest unmapped chunks that give ``n - free`` more blocks (at least ``grow_chunks``)."""
        reading = self._limit.read()
        self._reading = reading
        self._observe(reading)  # may release free chunks (a lowered limit): count what is missing after
        missing = n - self._n_free
        if missing <= 0:
            return
        self._map_indices(self._choose_growth(missing, reading), requested=n)

    def _choose_growth(self, missing: int, reading: LimitReading) -> list[int]:
        """The fewest lowest unmapped chunks whose mapping makes ``missing`` more blocks allocatable."""
        s, c, nb, mapped = self.block_stride, self.chunk, self.num_blocks, self._mapped
        chosen: list[int] = []
        chosen_set: set[int] = set()
        counted: set[int] = set()
        gained = 0
        for ci in range(self._low_unmapped, self.num_chunks):
            if mapped[ci]:
                continue
            if gained >= missing and len(chosen) >= self.grow_chunks:
                break
            if gained >= missing:
                # Batch extra chunks only while they fit under the limit.
                if self.held_bytes + self._creation_bytes(len(chosen) + 1) > reading.limit:
                    break
            chosen.append(ci)
            chosen_set.add(ci)
            for b in range(ci * c // s, min(nb, ((ci + 1) * c - 1) // s + 1)):
                if b in counted or b in self._live:
                    continue
                if all(mapped[x] or x in chosen_set for x in range(b * s // c, ((b + 1) * s - 1) // c + 1)):
                    counted.add(b)
                    gained += 1
        if gained < missing:
            raise OutOfBlocks(
                missing + self._n_free,
                self._n_free,
                "capacity",
                held=self.held_bytes,
                limit=reading.limit,
                hint=f"the pool's virtual capacity is {self.num_blocks} blocks; create it with more",
            )
        return chosen

    def _creation_bytes(self, count: int) -> int:
        """Bytes that mapping ``count`` more chunk indices would create (pooled handles are already held)."""
        return sum(max(0, count - a.pooled_handles) for a in self.arenas) * self.chunk

    def _chunks_for(self, ids: list[int]) -> list[int]:
        s, c, mapped = self.block_stride, self.chunk, self._mapped
        need: set[int] = set()
        for b in ids:
            for ci in range(b * s // c, ((b + 1) * s - 1) // c + 1):
                if not mapped[ci]:
                    need.add(ci)
        return sorted(need)

    def _ensure_chunks(self, indices: list[int], *, requested: int) -> list[int]:
        if indices:
            reading = self._limit.read()
            self._reading = reading
            self._observe(reading)
            self._map_indices(indices, requested=requested)
        return indices

    def _map_indices(self, indices: list[int], *, requested: int) -> list[int]:
        """Map chunk ``indices`` in every arena under the limit, all or nothing, then make their blocks allocatable (returned)."""
        reading = self._reading
        todo = [[i for i in indices if not a.is_mapped(i)] for a in self.arenas]
        creating = sum(max(0, len(t) - a.pooled_handles) for a, t in zip(self.arenas, todo, strict=True)) * self.chunk
        held = self.held_bytes
        if held + creating > reading.limit:
            raise OutOfBlocks(
                requested,
                self._n_free,
                "limit",
                held=held,
                limit=reading.limit,
                needed=creating,
                hint="free blocks, or raise the limit" if not self._deferred else "a lowered limit is still deferred",
            )
        if creating and not self._limit.admit(creating):
            self._starved = True
            raise OutOfBlocks(requested, self._n_free, "admission", held=held, limit=reading.limit, needed=creating)
        done: list[tuple[Arena, MapResult]] = []
        try:
            for arena, t in zip(self.arenas, todo, strict=True):
                if t:
                    done.append((arena, arena.map_chunks(t)))
            if self._zero_new:
                for arena, result in done:
                    arena.zero_chunks(result.indices)
        except DriverError as exc:
            for arena, result in reversed(done):
                for err in arena.undo_map(result):
                    _note(exc, f"while undoing the grow of pool {self.name!r}: {err}")
            self._settle(held, creating)
            if isinstance(exc, DeviceOutOfMemory):
                raise OutOfBlocks(
                    requested, self._n_free, "device", held=self.held_bytes, limit=reading.limit, needed=creating
                ) from exc
            raise
        self._settle(held, creating)
        return self._add_mapped(indices)

    def _settle(self, before: int, admitted: int) -> None:
        """Tell the limit source what a grow really changed: commit what is held now, roll back the rest."""
        after = self.held_bytes
        grown = after - before
        if grown >= 0:
            assert grown <= admitted, f"pool {self.name!r} grew {grown} bytes with only {admitted} admitted"
            if grown:
                self._limit.commit(grown)
            if admitted - grown:
                self._limit.rollback(admitted - grown)
        else:  # retried stuck chunks were released on the way
            if admitted:
                self._limit.rollback(admitted)
            self._limit.release(-grown)

    def _add_mapped(self, indices: list[int]) -> list[int]:
        s, c, nb = self.block_stride, self.chunk, self.num_blocks
        live, mapped, free_in = self._live, self._mapped, self._free_in
        for ci in indices:
            mapped[ci] = 1
            self._orphans.discard(ci)
        self._n_mapped += len(indices)
        low = self._low_unmapped
        while low < self.num_chunks and mapped[low]:
            low += 1
        self._low_unmapped = low
        added: dict[int, list[int]] = {}
        seen: set[int] = set()
        for ci in indices:
            for b in range(ci * c // s, min(nb, ((ci + 1) * c - 1) // s + 1)):
                if b in seen or b in live:
                    continue
                seen.add(b)
                home, last = b * s // c, ((b + 1) * s - 1) // c
                if all(mapped[x] for x in range(home, last + 1)):
                    added.setdefault(home, []).append(b)
        for home, blocks in added.items():
            free_in[home].extend(reversed(blocks))  # lowest id is popped first
            self._n_free += len(blocks)
            if self._live_in[home]:
                self._ensure_partial(home)
            else:
                self._ensure_empty(home)
        return [b for blocks in added.values() for b in blocks]

    # -- shrinking ---------------------------------------------------------------------
    def _release_down_to(self, to: int, candidates: Iterable[int] | None = None) -> None:
        """Release pooled handles, then fully free chunks (highest first), while more than ``to`` bytes are held."""
        excess = self.held_bytes - to
        if excess <= 0:
            return
        for arena in sorted(self.arenas, key=lambda a: -a.pooled_handles):
            if excess <= 0:
                break
            want = min(arena.pooled_handles, -(-excess // self.chunk))
            if want:
                before = self.held_bytes
                try:
                    arena.release_pooled(want)
                finally:
                    self._released(before)
                excess = self.held_bytes - to
        if excess <= 0:
            return
        if self._orphans:
            self._unmap_indices(sorted(self._orphans, reverse=True))
            excess = self.held_bytes - to
            if excess <= 0:
                return
        live, mapped = self._live_in, self._mapped
        if candidates is None:
            pool = [ci for ci in range(self.num_chunks - 1, -1, -1) if mapped[ci] and not live[ci]]
        else:
            pool = sorted({ci for ci in candidates if mapped[ci] and not live[ci]}, reverse=True)
        victims = pool[: -(-excess // self.group_bytes)]
        if victims:
            self._unmap_indices(victims)

    def _unmap_indices(self, indices: list[int]) -> None:
        """Unmap fully free chunk indices in every arena and release their handles."""
        s, c, nb, free_in = self.block_stride, self.chunk, self.num_blocks, self._free_in
        if self._before_unmap is not None:
            going = [ci for ci in indices if self._mapped[ci]]
            if going:
                self._before_unmap(going)
        for ci in indices:
            assert self._live_in[ci] == 0, f"pool {self.name!r} tried to unmap chunk {ci} with live blocks"
            self._orphans.add(ci)
            if not self._mapped[ci]:
                continue  # an orphan already: only the arenas still mapping it are left to do
            first, last = ci * c // s, min(nb, ((ci + 1) * c - 1) // s + 1) - 1
            # Its blocks (and neighbours straddling into it) stop being allocatable.
            for home in range(first * s // c, (last * s + s - 1) // c + 1):
                lst = free_in[home]
                if lst:
                    kept = [b for b in lst if not first <= b <= last]
                    self._n_free -= len(lst) - len(kept)
                    lst[:] = kept
            assert not any(b in self._live for b in range(first, last + 1)), "a live block in a chunk being unmapped"
            self._mapped[ci] = 0
            self._n_mapped -= 1
            self._low_unmapped = min(self._low_unmapped, ci)
        before = self.held_bytes
        try:
            for arena in self.arenas:
                todo = [i for i in indices if arena.is_mapped(i)]
                if todo:
                    arena.unmap_chunks(todo, keep_handles=False)
        finally:
            self._released(before)
            self._orphans.difference_update([i for i in indices if not any(a.is_mapped(i) for a in self.arenas)])
            self._report()

    def _released(self, before: int) -> None:
        gone = before - self.held_bytes
        if gone > 0:
            self._limit.release(gone)

    def _observe(self, reading: LimitReading) -> None:
        """Apply a new revision of the limit: shrink to it, or defer while live blocks pin the chunks above it."""
        if reading.revision == self._revision:
            return
        self._revision = reading.revision
        try:
            if self.held_bytes > reading.limit:
                self._release_down_to(reading.limit)
        finally:
            self._deferred = self.held_bytes > reading.limit
            self._limit.acknowledge(reading.revision, "deferred" if self._deferred else "applied")

    def _continue_deferred(self, emptied: list[int] | None) -> None:
        """Release what became free (``emptied``, or anything when None) toward a deferred limit."""
        limit = self._reading.limit
        self._release_down_to(limit, emptied)
        if self.held_bytes <= limit:
            self._deferred = False
            self._limit.acknowledge(self._reading.revision, "applied")
        self._report()

    def _report(self) -> None:
        self._limit.report(self.used_bytes, self.held_bytes)

    # -- checks ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise AllocError(f"block pool {self.name!r} is closed")

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise BlockError(f"block {block} is out of range: pool {self.name!r} has {self.num_blocks} blocks")
