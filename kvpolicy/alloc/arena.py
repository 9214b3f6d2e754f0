"""One virtual address reservation, backed by physical memory chunk by chunk.

The arena reserves its whole virtual capacity once, so addresses (and any tensor
views over them) never move; growing maps physical chunks into it and shrinking
unmaps them. Facts that shape it (measured on an H200, docs/allocator.md):
cuMemCreate is ~30% of the cost of growing a chunk, so unmapped handles can be kept
in a small pool and mapped again without it; cuMemSetAccess costs the same over one
chunk or many, so it is called once per newly mapped chunk.

Grows are all-or-nothing: each step registers its undo as it succeeds, and a failure
half-way undoes them in reverse, so the arena holds exactly what it held before. An
undo step that itself fails (cuMemUnmap refusing) leaves that chunk *stuck*: still
mapped in the driver, never handed out, counted as held, and retried later.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.driver import Driver, Handle
from kvpolicy.alloc.errors import AllocError, DriverError
from kvpolicy.units import format_bytes


@dataclass(frozen=True)
class MapResult:
    """What one ``map_chunks`` did: the chunks mapped, and which got a newly created handle."""

    indices: tuple[int, ...]
    fresh: tuple[bool, ...]

    @property
    def created(self) -> int:
        """Handles created by cuMemCreate (the rest came from the handle pool)."""
        return sum(self.fresh)


def note(exc: BaseException, text: str) -> None:
    """Add ``text`` to the notes of ``exc`` (what else failed while handling it)."""
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(text)


def raise_first(errors: list[DriverError], closing: str) -> None:
    """Raise the first of ``errors`` (when there are any), each other one noted on it, after a close that tried every step."""
    if errors:
        first = errors[0]
        for other in errors[1:]:
            note(first, f"also failed while closing {closing}: {other}")
        raise first


class Arena:
    """A VA reservation of ``capacity`` bytes, mapped in chunks of ``chunk`` bytes.

    ``keep_handles`` is the handle pool's high-water mark: at most that many
    unmapped physical handles are kept for reuse (they still hold device memory).
    Not thread-safe: the block pool serialises calls.
    """

    def __init__(
        self,
        driver: Driver,
        capacity: int,
        chunk: int,
        *,
        keep_handles: int = 0,
        name: str = "arena",
        va: int | None = None,
    ) -> None:
        """``va``: an address range of ``capacity`` bytes (rounded up to whole chunks) that the caller
        reserved and will free (one region of a larger reservation); the arena then neither reserves
        nor frees address space."""
        g = driver.granularity
        if chunk <= 0 or chunk % g:
            raise ValueError(
                f"chunk {format_bytes(chunk)} must be a positive multiple of the driver's granularity {format_bytes(g)}"
            )
        if capacity <= 0:
            raise ValueError(f"arena capacity must be positive, got {capacity}")
        if keep_handles < 0:
            raise ValueError(f"keep_handles must be >= 0, got {keep_handles}")
        self.driver = driver
        self.name = name
        self.chunk = chunk
        self.num_chunks = -(-capacity // chunk)
        self.capacity = self.num_chunks * chunk
        self.keep_handles = keep_handles
        self.calls = CallCounts()
        self.owns_va = va is None
        if va is None:
            self.calls.address_reserve += 1
            driver.activate()
            va = driver.reserve(self.capacity)
        elif va % chunk:
            raise ValueError(f"region address {va:#x} is not a multiple of the chunk {format_bytes(chunk)}")
        self.va = va
        self._handles: list[Handle | None] = [None] * self.num_chunks
        self._pool: list[Handle] = []
        self._stuck: dict[int, Handle] = {}
        self._mapped = 0
        self._closed = False

    # -- state -------------------------------------------------------------------------
    @property
    def mapped_chunks(self) -> int:
        return self._mapped

    @property
    def pooled_handles(self) -> int:
        return len(self._pool)

    @property
    def stuck_chunks(self) -> int:
        """Chunks an undo could not unmap: mapped in the driver but not usable."""
        return len(self._stuck)

    @property
    def mapped_bytes(self) -> int:
        return self._mapped * self.chunk

    @property
    def held_bytes(self) -> int:
        """Device memory this arena holds: mapped chunks, pooled handles and stuck chunks."""
        return (self._mapped + len(self._pool) + len(self._stuck)) * self.chunk

    def is_mapped(self, index: int) -> bool:
        """Whether chunk ``index`` is mapped and accessible."""
        return self._handles[index] is not None

    def mapped_indices(self) -> list[int]:
        return [i for i, h in enumerate(self._handles) if h is not None]

    def chunk_address(self, index: int) -> int:
        return self.va + index * self.chunk

    # -- growing -----------------------------------------------------------------------
    def map_chunks(self, indices: Sequence[int]) -> MapResult:
        """Map chunks ``indices`` (create or reuse a handle, map, set access), all or nothing.

        Raises ``DriverError`` (``DeviceOutOfMemory`` when the device is full) after
        undoing every chunk this call mapped; ``ValueError`` for a chunk out of range
        or already mapped.
        """
        self._check_open()
        indices = list(indices)
        self._validate(indices, want_mapped=False)
        for i in indices:
            if i in self._stuck:
                self._retry_stuck(i)
        drv = self.driver
        drv.activate()
        calls, pool, handles, chunk, base = self.calls, self._pool, self._handles, self.chunk, self.va
        fresh: list[bool] = []
        done: list[int] = []
        try:
            for i in indices:
                va = base + i * chunk
                if pool:
                    handle, new = pool.pop(), False
                else:
                    calls.create += 1
                    handle, new = drv.create(chunk), True
                try:
                    calls.map += 1
                    drv.map(va, chunk, handle)
                except DriverError as exc:
                    self._discard_noting(handle, new, exc)
                    raise
                try:
                    calls.set_access += 1
                    drv.set_access(va, chunk)
                except DriverError as exc:
                    self._unmap_or_stick(i, handle, new, exc)
                    raise
                handles[i] = handle
                self._mapped += 1
                done.append(i)
                fresh.append(new)
        except DriverError as exc:
            calls.failures += 1
            for err in self._undo(done, fresh):
                note(exc, f"while undoing the grow of arena {self.name!r}: {err}")
            raise
        return MapResult(tuple(done), tuple(fresh))

    def undo_map(self, result: MapResult) -> list[DriverError]:
        """Unmap what ``result`` mapped and give its handles back where they came from.

        Afterwards the arena holds what it held before that ``map_chunks`` (for a
        rollback across several arenas). Returns the undo steps that failed (their
        chunks are left stuck); it never raises for them.
        """
        return self._undo(list(result.indices), list(result.fresh))

    def grow(self, n: int) -> MapResult:
        """Map the ``n`` lowest unmapped chunks, all or nothing."""
        free = [i for i, h in enumerate(self._handles) if h is None and i not in self._stuck][:n]
        if len(free) < n:
            raise AllocError(f"arena {self.name!r} has {len(free)} unmapped chunks, {n} requested")
        return self.map_chunks(free)

    def zero_chunks(self, indices: Iterable[int]) -> None:
        """Fill mapped chunks ``indices`` with zeros, one driver call per run of consecutive chunks."""
        self._check_open()
        indices = sorted(indices)
        self._validate(indices, want_mapped=True)
        drv, chunk, base = self.driver, self.chunk, self.va
        i = 0
        while i < len(indices):
            j = i
            while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
                j += 1
            self.calls.zero += 1
            try:
                drv.zero(base + indices[i] * chunk, (j - i + 1) * chunk)
            except DriverError:
                self.calls.failures += 1
                raise
            i = j + 1

    # -- shrinking ---------------------------------------------------------------------
    def unmap_chunks(self, indices: Iterable[int], *, keep_handles: bool = True) -> None:
        """Unmap chunks ``indices``; their handles go to the pool up to ``keep_handles``, the rest are released.

        Stops at the first failing driver call and raises it: chunks before it are
        unmapped, that one and the rest are as they were (a handle whose release
        failed stays pooled, to be released at close).
        """
        self._check_open()
        indices = list(indices)
        self._validate(indices, want_mapped=True)
        drv = self.driver
        drv.activate()
        calls, handles, chunk, base = self.calls, self._handles, self.chunk, self.va
        for i in indices:
            handle = handles[i]
            calls.unmap += 1
            try:
                drv.unmap(base + i * chunk, chunk)
            except DriverError:
                calls.failures += 1
                raise
            handles[i] = None
            self._mapped -= 1
            if keep_handles and len(self._pool) < self.keep_handles:
                self._pool.append(handle)
            else:
                self._release_or_pool(handle)

    def shrink(self, n: int, *, keep_handles: bool = True) -> list[int]:
        """Unmap the ``n`` highest mapped chunks; returns their indices."""
        mapped = [i for i in reversed(range(self.num_chunks)) if self._handles[i] is not None][:n]
        if len(mapped) < n:
            raise AllocError(f"arena {self.name!r} has {len(mapped)} mapped chunks, {n} requested")
        self.unmap_chunks(mapped, keep_handles=keep_handles)
        return mapped

    def release_pooled(self, count: int | None = None) -> int:
        """Release up to ``count`` pooled handles (all when None); returns how many were released."""
        self._check_open()
        n = len(self._pool) if count is None else min(count, len(self._pool))
        drv = self.driver
        if n:
            drv.activate()
        for _ in range(n):
            handle = self._pool[-1]
            self.calls.release += 1
            try:
                drv.release(handle)
            except DriverError:
                self.calls.failures += 1
                raise
            self._pool.pop()
        return n

    # -- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """Unmap everything, release every handle and free the reservation; views over it become invalid.

        Tries every step even when some fail, then raises the first failure (the
        arena stays open, so ``close`` can be called again).
        """
        if self._closed:
            return
        drv = self.driver
        drv.activate()
        errors: list[DriverError] = []
        for i in list(self._stuck):
            try:
                self._retry_stuck(i)
            except DriverError as exc:
                errors.append(exc)
        for i in self.mapped_indices():
            try:
                self.unmap_chunks([i], keep_handles=False)
            except DriverError as exc:
                errors.append(exc)
        try:
            self.release_pooled()
        except DriverError as exc:
            errors.append(exc)
        if not errors and self.owns_va:
            self.calls.address_free += 1
            try:
                drv.free_address(self.va, self.capacity)
            except DriverError as exc:
                self.calls.failures += 1
                errors.append(exc)
        raise_first(errors, f"arena {self.name!r}")
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Arena({self.name!r}, {format_bytes(self.capacity)} at {self.va:#x}, chunk {format_bytes(self.chunk)}, "
            f"{self._mapped} mapped, {len(self._pool)} pooled)"
        )

    # -- internals ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise AllocError(f"arena {self.name!r} is closed")

    def _validate(self, indices: list[int], *, want_mapped: bool) -> None:
        n = self.num_chunks
        for i in indices:
            if not 0 <= i < n:
                raise ValueError(f"chunk {i} is out of range: arena {self.name!r} has {n} chunks")
            if (self._handles[i] is not None) != want_mapped:
                state = "not mapped" if want_mapped else "already mapped"
                raise ValueError(f"chunk {i} of arena {self.name!r} is {state}")
        if len(set(indices)) != len(indices):
            raise ValueError(f"chunk indices repeat: {sorted(indices)}")

    def _discard(self, handle: Handle, new: bool) -> None:
        """Give back a handle that did not end up mapped: released if created now, else pooled again."""
        if new:
            self._release_or_pool(handle)
        else:
            self._pool.append(handle)

    def _release_or_pool(self, handle: Handle) -> None:
        self.calls.release += 1
        try:
            self.driver.release(handle)
        except DriverError:
            self.calls.failures += 1
            self._pool.append(handle)  # still ours: close() releases it
            raise

    def _unmap_or_stick(self, index: int, handle: Handle, new: bool, cause: DriverError) -> None:
        self.calls.unmap += 1
        try:
            self.driver.unmap(self.va + index * self.chunk, self.chunk)
        except DriverError as err:
            self.calls.failures += 1
            self._stuck[index] = handle
            note(cause, f"chunk {index} of arena {self.name!r} could not be unmapped and is stuck: {err}")
            return
        self._discard_noting(handle, new, cause)

    def _discard_noting(self, handle: Handle, new: bool, cause: DriverError) -> None:
        try:
            self._discard(handle, new)
        except DriverError as err:
            note(cause, f"a handle of arena {self.name!r} could not be released (kept for close): {err}")

    def _undo(self, done: list[int], fresh: list[bool]) -> list[DriverError]:
        failures: list[DriverError] = []
        for i, new in zip(reversed(done), reversed(fresh), strict=True):
            handle = self._handles[i]
            self._handles[i] = None
            self._mapped -= 1
            self.calls.unmap += 1
            try:
                self.driver.unmap(self.va + i * self.chunk, self.chunk)
            except DriverError as err:
                self.calls.failures += 1
                self._stuck[i] = handle
                failures.append(err)
                continue
            try:
                self._discard(handle, new)
            except DriverError as err:
                failures.append(err)
        return failures

    def _retry_stuck(self, index: int) -> None:
        handle = self._stuck[index]
        self.calls.unmap += 1
        try:
            self.driver.unmap(self.va + index * self.chunk, self.chunk)
        except DriverError:
            self.calls.failures += 1
            raise
        del self._stuck[index]
        self._release_or_pool(handle)
