"""A pool's arenas mapped chunk by chunk under the limit in force: the memory side of an elastic pool.

Chunk index ``c`` means chunk ``c`` of every arena of the pool, mapped and unmapped
together (a *chunk group*, ``chunk × arenas`` bytes). ``ChunkMapping`` maps groups
under the limit (admit once per batch, map in every arena, commit; all or nothing),
unmaps groups that no live block touches, applies each new limit revision (shrinking
at once, or deferring while live blocks pin the chunks above the limit), and keeps the
limit source's books exact. It holds no block ids: whoever hands them out — a
``BlockPool``'s free-block index, or an engine's own scheduler through ``LiveBlocks``
— counts in ``users`` the live blocks touching each chunk, and a chunk with users is
never unmapped. ``grid`` says which blocks a chunk completes, so growth can be asked
for in blocks.

The arenas are separate reservations, or (``contiguous``) chunk-aligned regions of one
reservation laid end to end — what an engine needs that views one buffer with a fixed
stride between layers (vLLM's layer-outermost layouts): a block then touches chunk ``c``
of every region, one map call each.

Invariants (the tests check them after every step):
- bytes held (mapped chunks, pooled handles, stuck chunks) never exceed the limit,
  except while a lowered limit is *deferred* because live blocks pin the chunks
  above it; then every chunk that empties is released until the limit holds;
- the limit source has exactly the bytes held committed, with nothing pending.

Limit protocol (``limits.LimitSource``): ``read()`` on every growth and limit check;
``admit()`` once per growth for the bytes of the whole batch, then ``commit()`` what
was mapped and ``rollback()`` the rest; ``release()`` after unmapping;
``report(used, held, waiting)`` after every change of mapped memory (``waiting``: the growth
refused in the current period, ``refused_bytes``, which the owner's tick ends with
``new_period``); ``acknowledge(revision,
"applied" | "deferred")`` for every new revision, and ``"applied"`` again when a
deferral completes.

Not thread-safe: its owner serialises calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kvpolicy.alloc.arena import Arena, MapResult, note, raise_first
from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.errors import DeviceOutOfMemory, DriverError, OutOfBlocks
from kvpolicy.alloc.layout import ChunkGrid
from kvpolicy.alloc.limits import LimitReading, LimitSource
from kvpolicy.units import format_bytes

if TYPE_CHECKING:
    from kvpolicy.alloc.driver import Driver


def plan_growth(
    grid: ChunkGrid,
    mapped: bytearray,
    missing: int,
    *,
    start: int = 0,
    at_least: int = 1,
    fits: Callable[[int], bool],
) -> tuple[list[int], int]:
    """The fewest lowest unmapped chunks (from ``start``) whose mapping completes ``missing`` more blocks.

    Takes at least ``at_least`` chunks while there are any, extra ones only while
    ``fits(count)`` says ``count`` chunks stay under the limit. Returns the chunks and
    the blocks they complete (fewer than ``missing`` when the capacity runs out).
    """
    if grid.blocks_per_chunk:
        return _plan_whole_blocks(grid, mapped, missing, start, at_least, fits)
    chosen: list[int] = []
    chosen_set: set[int] = set()
    counted: set[int] = set()
    gained = 0
    for ci in range(start, grid.num_chunks):
        if mapped[ci]:
            continue
        if gained >= missing and (len(chosen) >= at_least or not fits(len(chosen) + 1)):
            break
        chosen.append(ci)
        chosen_set.add(ci)
        for b in grid.blocks_touching(ci):
            if b not in counted and all(mapped[x] or x in chosen_set for x in grid.chunks_of(b)):
                counted.add(b)
                gained += 1
    return chosen, gained


def _plan_whole_blocks(
    grid: ChunkGrid, mapped: bytearray, missing: int, start: int, at_least: int, fits: Callable[[int], bool]
) -> tuple[list[int], int]:
    """``plan_growth`` where no block straddles: an unmapped chunk completes exactly the blocks it holds.

    The growth of every request that does not fit in free blocks plans here, refused or not,
    so it finds the unmapped chunks with ``bytearray.find`` instead of testing every block's
    chunks (a prefill of 512 blocks: one pass over 128 chunks, not 512 ``all()`` calls).
    """
    per_chunk, num_blocks = grid.blocks_per_chunk, grid.num_blocks
    chosen: list[int] = []
    gained = 0
    ci = mapped.find(0, start)
    while ci != -1:
        if gained >= missing and (len(chosen) >= at_least or not fits(len(chosen) + 1)):
            break
        chosen.append(ci)
        gained += min(per_chunk, num_blocks - ci * per_chunk)  # the last chunk may hold fewer
        ci = mapped.find(0, ci + 1)
    return chosen, gained


class ChunkMapping:
    """The ``num_arenas`` arenas of one pool, each reserved for ``grid``'s blocks and mapped chunk group by chunk group."""

    def __init__(
        self,
        driver: Driver,
        grid: ChunkGrid,
        *,
        limit: LimitSource,
        num_arenas: int = 1,
        name: str = "kv",
        before_unmap: Callable[[list[int]], None] | None = None,
        zero_new_chunks: bool = False,
        used_bytes: Callable[[], int] = lambda: 0,
        contiguous: bool = False,
    ) -> None:
        """``before_unmap(chunks)`` runs before mapped chunk indices are unmapped (the owner of the
        ids takes their blocks out of circulation, and may wait for kernels in flight); if it
        raises, nothing is unmapped. ``zero_new_chunks`` fills every newly mapped chunk with
        zeros before the mapping returns. ``used_bytes()`` gives the bytes of live blocks for
        the limit source's reports (the owner of the ids knows them).

        ``contiguous`` places the arenas one after another in **one** reservation, each a
        chunk-aligned region of ``region_bytes`` (an engine that makes its own strided views
        over one buffer, e.g. vLLM's layer-outermost layouts, needs one base address);
        otherwise each arena is its own reservation."""
        self.grid = grid
        self.driver = driver
        self.name = name
        self.chunk = chunk = grid.chunk
        self.arenas: list[Arena] = []
        self.region_bytes = region = -(-grid.num_blocks * grid.block_stride // chunk) * chunk
        """Each arena's reserved bytes: the grid's blocks, rounded up to whole chunks."""
        self.contiguous = contiguous
        self.va: int | None = None
        """With ``contiguous``, the one reservation's base (arena ``a`` is at ``va + a × region_bytes``)."""
        if contiguous:
            driver.activate()
            self.va = driver.reserve(region * num_arenas)
        try:
            for a in range(num_arenas):
                at = None if self.va is None else self.va + a * region
                self.arenas.append(Arena(driver, region, chunk, name=f"{name}[{a}]", va=at))
        except BaseException:
            for arena in self.arenas:
                arena.close()
            if self.va is not None:
                driver.free_address(self.va, region * num_arenas)
            raise
        self.num_chunks = n = self.arenas[0].num_chunks
        self.group_bytes = chunk * num_arenas
        self.limit = limit
        self.users = [0] * n
        """Live blocks touching each chunk, counted by the owner of the ids; a chunk with users stays mapped."""
        self.mapped = bytearray(n)
        """1 for each chunk index mapped in every arena (read-only outside this class)."""
        self.mapped_chunks = 0
        self.low_unmapped = 0
        """Every chunk below it is mapped: where growth starts looking."""
        self.admission_refusals = 0
        """How many times the limit source refused to admit a growth (cumulative)."""
        self.refused_bytes = 0
        """The largest growth refused (at the limit or by the limit source) in the current period: what the
        owner's work waiting for memory needs. Every report carries it; the owner's tick reports, then starts
        the next period (``new_period``), so a report between ticks never hides a refusal of the period."""
        self.last_error: DriverError | None = None
        """The driver error ``chunks_emptied`` swallowed while completing a deferred limit, if any."""
        self.revision: int | None = None
        """The limit revision last applied (or deferred); None before the first reading."""
        self.deferred = False
        """Whether a lowered limit waits for live blocks to be freed."""
        self.groups_mapped = 0
        """Chunk groups mapped (cumulative): the driver work growth cost."""
        self.groups_unmapped = 0
        """Chunk groups unmapped (cumulative)."""
        self.regrowths = 0
        """Give-back/regrow cycles: growths that followed a give-back (cumulative). A pool that
        gives memory back and soon maps it again pays both for nothing."""
        self._gave_back = False  # memory went back since the last growth
        self._orphans: set[int] = set()  # unmapped for the pool, still mapped in some arena (a failed unmap)
        self._before_unmap = before_unmap
        self._zero_new = zero_new_chunks
        self._used = used_bytes
        self.closed = False
        self.reading = limit.read()
        """The reading last taken (``stats`` show its limit and target)."""
        self.apply(self.reading)

    # -- state -------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Device memory held: mapped chunks, pooled handles and stuck chunks, over all arenas."""
        return sum(a.held_bytes for a in self.arenas)

    @property
    def calls(self) -> CallCounts:
        """Driver calls over all the arenas (a new object; each arena keeps its own)."""
        return sum((arena.calls for arena in self.arenas), CallCounts())

    def is_mapped(self, index: int) -> bool:
        """Whether chunk ``index`` is mapped in every arena."""
        return self.mapped[index] == 1

    def fully_free_chunks(self) -> list[int]:
        """Mapped chunk indices that no live block touches: what a shrink may release."""
        users, mapped = self.users, self.mapped
        return [c for c in range(self.num_chunks) if mapped[c] and not users[c]]

    def fits(self, count: int) -> bool:
        """Whether mapping ``count`` more chunk indices keeps the bytes held within the limit last read."""
        return self.held_bytes + self._creation_bytes(count) <= self.reading.limit

    # -- the limit -----------------------------------------------------------------------
    def read(self) -> LimitReading:
        """Read the limit source and keep the reading, without applying a new revision."""
        self.reading = self.limit.read()
        return self.reading

    def refresh(self) -> LimitReading:
        """Read the limit source and apply a new revision (see ``apply``)."""
        reading = self.read()
        self.apply(reading)
        return reading

    def read_applied(self, *, requested: int, free: int) -> LimitReading:
        """Read the limit source for an owner that shrinks only where it chooses: ``OutOfBlocks``
        (reason ``"revision"``) while it holds a revision not applied yet, with nothing changed.

        ``requested`` and ``free`` are the owner's block counts, for the error.
        """
        reading = self.limit.read()
        if reading.revision != self.revision:
            raise OutOfBlocks(
                requested, free, "revision", held=self.held_bytes, limit=reading.limit,
                hint=f"limit revision {reading.revision} is not applied yet; call sync() first",
            )
        self.reading = reading
        return reading

    def apply(self, reading: LimitReading) -> None:
        """Apply a new revision of the limit: shrink to it, or defer while live blocks pin the chunks above it."""
        if reading.revision == self.revision:
            return
        self.revision = reading.revision
        try:
            if self.held_bytes > reading.limit:
                self.release_down_to(reading.limit)
        finally:
            self.deferred = self.held_bytes > reading.limit
            self.limit.acknowledge(reading.revision, "deferred" if self.deferred else "applied")

    def continue_deferred(self, emptied: Iterable[int] | None) -> None:
        """Release what became free (``emptied``, or anything when None) toward a deferred limit."""
        limit = self.reading.limit
        self.release_down_to(limit, emptied)
        if self.held_bytes <= limit:
            self.deferred = False
            self.limit.acknowledge(self.reading.revision, "applied")
        self.report()

    def chunks_emptied(self, emptied: list[int]) -> None:
        """The owner's frees left ``emptied`` with no users: while a limit is deferred, release them toward it.

        A driver failure here does not fail the free (the engine would free the same ids
        again): it is kept in ``last_error``, and the next free or sync tries again.
        """
        if self.deferred and emptied:
            try:
                self.continue_deferred(emptied)
            except DriverError as exc:
                self.last_error = exc

    def report(self) -> None:
        """Tell the limit source the bytes in live blocks, the bytes held now and the growth refused in the
        current period."""
        self.limit.report(self._used(), self.held_bytes, self.refused_bytes)

    def new_period(self) -> None:
        """The owner's tick, after its report: refusals from now on are the next period's. An engine retries
        waiting work every step, so work still waiting is refused again before the next tick."""
        self.refused_bytes = 0

    def note_refused(self, nbytes: int) -> None:
        """A growth of ``nbytes`` was refused — here, or by whoever keeps this pool's books (the engine
        core of a tensor-parallel engine): work waits for that much memory (``refused_bytes``)."""
        self.refused_bytes = max(self.refused_bytes, nbytes)

    # -- growth --------------------------------------------------------------------------
    def map_growth(self, missing: int, *, at_least: int, requested: int, free: int) -> list[int]:
        """Map the fewest lowest unmapped chunks that complete ``missing`` more blocks of ``grid``
        (at least ``at_least`` chunks, extra ones only while under the limit last read); returns them.

        ``requested`` and ``free`` are the owner's block counts, for the ``OutOfBlocks`` it
        raises (``capacity``, or see ``map``).
        """
        self._refuse_if_certain(missing, requested=requested, free=free)
        chosen, gained = plan_growth(
            self.grid, self.mapped, missing, start=self.low_unmapped, at_least=at_least, fits=self.fits
        )
        if gained < missing:
            raise OutOfBlocks(
                missing + free,
                free,
                "capacity",
                held=self.held_bytes,
                limit=self.reading.limit,
                hint=f"the pool's virtual capacity is {self.grid.num_blocks} blocks; create it with more",
            )
        self.map(chosen, requested=requested, free=free)
        return chosen

    def _refuse_if_certain(self, missing: int, *, requested: int, free: int) -> None:
        """Refuse a growth the limit source would refuse for certain, before planning it.

        Under full contention most growths are refused (one a step per busy engine), and planning
        one and asking the ledger cost far more than the step's other allocation work. Where no
        block straddles chunks, a growth of ``missing`` blocks maps at least ``ceil(missing / k)``
        chunks (``k`` blocks each): if the limit in force allows that many and the limit source is
        sure to refuse them (``LimitSource.certain_refusal``), it refuses what the plan would ask.
        """
        per_chunk = self.grid.blocks_per_chunk
        if not per_chunk or self._orphans:
            return
        fewest = self._creation_bytes(-(-missing // per_chunk))
        held = self.held_bytes
        if fewest and held + fewest <= self.reading.limit and self.limit.certain_refusal(fewest):
            self.admission_refusals += 1
            self.note_refused(fewest)
            raise OutOfBlocks(requested, free, "admission", held=held, limit=self.reading.limit, needed=fewest)

    def grow(self, missing: int, *, at_least: int, requested: int, free: int) -> list[int]:
        """``map_growth`` for an owner that shrinks only where it chooses (``read_applied``), then report."""
        self.read_applied(requested=requested, free=free)
        chosen = self.map_growth(missing, at_least=at_least, requested=requested, free=free)
        self.report()
        return chosen

    def map_missing(self, blocks: Iterable[int], *, requested: int, free: int) -> list[int]:
        """Map the chunks of ``blocks`` that are not mapped yet, under the limit read now; returns them, ascending."""
        chunks_of, mapped = self.grid.chunks_of, self.mapped
        need = sorted({ci for b in blocks for ci in chunks_of(b) if not mapped[ci]})
        if need:
            self.refresh()
            self.map(need, requested=requested, free=free)
        return need

    def map(self, indices: list[int], *, requested: int, free: int) -> None:
        """Map chunk ``indices`` in every arena under the limit last read, all or nothing.

        Raises ``OutOfBlocks`` with reason ``limit`` (before admitting), ``admission`` (the
        limit source said no) or ``device`` (the GPU is full), or the ``DriverError`` of
        another failure; then nothing more is held and the limit source's books are as
        before. ``requested`` and ``free`` are the owner's block counts, for the error.
        """
        reading = self.reading
        todo = [[i for i in indices if not a.is_mapped(i)] for a in self.arenas]
        creating = sum(max(0, len(t) - a.pooled_handles) for a, t in zip(self.arenas, todo, strict=True)) * self.chunk
        held = self.held_bytes
        if held + creating > reading.limit:
            self.note_refused(creating)
            raise OutOfBlocks(
                requested,
                free,
                "limit",
                held=held,
                limit=reading.limit,
                needed=creating,
                hint="free blocks, or raise the limit" if not self.deferred else "a lowered limit is still deferred",
            )
        if creating and not self.limit.admit(creating):
            self.admission_refusals += 1
            self.note_refused(creating)
            raise OutOfBlocks(requested, free, "admission", held=held, limit=reading.limit, needed=creating)
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
                    note(exc, f"while undoing the grow of pool {self.name!r}: {err}")
            self._settle(held, creating)
            if isinstance(exc, DeviceOutOfMemory):
                raise OutOfBlocks(
                    requested, free, "device", held=self.held_bytes, limit=reading.limit, needed=creating
                ) from exc
            raise
        self._settle(held, creating)
        mapped = self.mapped
        for ci in indices:
            mapped[ci] = 1
            self._orphans.discard(ci)
        self.mapped_chunks += len(indices)
        self.groups_mapped += len(indices)
        if self._gave_back and indices:
            self.regrowths += 1
            self._gave_back = False
        low, n = self.low_unmapped, self.num_chunks
        while low < n and mapped[low]:
            low += 1
        self.low_unmapped = low

    def _creation_bytes(self, count: int) -> int:
        """Bytes that mapping ``count`` more chunk indices would create (pooled handles are already held)."""
        return sum(max(0, count - a.pooled_handles) for a in self.arenas) * self.chunk

    def _settle(self, before: int, admitted: int) -> None:
        """Tell the limit source what a grow really changed: commit what is held now, roll back the rest."""
        after = self.held_bytes
        grown = after - before
        if grown >= 0:
            assert grown <= admitted, f"pool {self.name!r} grew {grown} bytes with only {admitted} admitted"
            if grown:
                self.limit.commit(grown)
            if admitted - grown:
                self.limit.rollback(admitted - grown)
        else:  # retried stuck chunks were released on the way
            if admitted:
                self.limit.rollback(admitted)
            self.limit.release(-grown)

    # -- shrinking -----------------------------------------------------------------------
    def release_down_to(self, to: int, candidates: Iterable[int] | None = None) -> None:
        """Release pooled handles, then fully free chunks (highest first; only ``candidates`` when
        given), while more than ``to`` bytes are held. Never touches a chunk with users."""
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
            self._unmap(sorted(self._orphans, reverse=True))
            excess = self.held_bytes - to
            if excess <= 0:
                return
        users, mapped = self.users, self.mapped
        if candidates is None:
            pool = [ci for ci in range(self.num_chunks - 1, -1, -1) if mapped[ci] and not users[ci]]
        else:
            pool = sorted({ci for ci in candidates if mapped[ci] and not users[ci]}, reverse=True)
        victims = pool[: -(-excess // self.group_bytes)]
        if victims:
            self._unmap(victims)

    def _unmap(self, indices: list[int]) -> None:
        """Unmap chunk indices no live block touches in every arena, and release their handles."""
        if self._before_unmap is not None:
            going = [ci for ci in indices if self.mapped[ci]]
            if going:
                self._before_unmap(going)
        for ci in indices:
            assert self.users[ci] == 0, f"pool {self.name!r} tried to unmap chunk {ci} with live blocks"
            self._orphans.add(ci)
            if not self.mapped[ci]:
                continue  # an orphan already: only the arenas still mapping it are left to do
            self.mapped[ci] = 0
            self.mapped_chunks -= 1
            self.groups_unmapped += 1
            self._gave_back = True
            self.low_unmapped = min(self.low_unmapped, ci)
        before = self.held_bytes
        try:
            for arena in self.arenas:
                todo = [i for i in indices if arena.is_mapped(i)]
                if todo:
                    arena.unmap_chunks(todo, keep_handles=False)
        finally:
            self._released(before)
            self._orphans.difference_update([i for i in indices if not any(a.is_mapped(i) for a in self.arenas)])
            self.report()

    def _released(self, before: int) -> None:
        gone = before - self.held_bytes
        if gone > 0:
            self.limit.release(gone)

    # -- closing -------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and release everything (live blocks included) and return the bytes to the limit source.

        Tries every arena; on a failure raises the first one and stays open (close again).
        """
        if self.closed:
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
            self.limit.release(released)
        if not errors and self.va is not None:
            try:
                self.driver.free_address(self.va, self.region_bytes * len(self.arenas))
            except DriverError as exc:
                errors.append(exc)
            else:
                self.va = None
        raise_first(errors, f"pool {self.name!r}")
        self.closed = True
        self.mapped[:] = bytes(self.num_chunks)
        self.mapped_chunks = 0
        self.limit.report(0, 0)

    def __repr__(self) -> str:
        return (
            f"ChunkMapping({self.name!r}, {len(self.arenas)} arenas × {self.num_chunks} chunks of "
            f"{format_bytes(self.chunk)}, {self.mapped_chunks} mapped, {format_bytes(self.held_bytes)} held)"
        )
