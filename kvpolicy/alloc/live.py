"""Which block ids are live, as a ``ChunkMapping`` must know them: a chunk with a live block stays mapped.

``LiveBlocks`` is that bookkeeping for an engine whose own scheduler hands out the ids
(vLLM's): the engine says which ids are live (``claim``, ``release``, or ``reconcile``
with its own books before anything may unmap), and the mapping's ``users`` count, per
chunk, the live blocks touching it. A ``BlockPool`` keeps the same counts in its
free-block index, which also hands the ids out. The checks on ids both use are here.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvpolicy.alloc.errors import BlockError
from kvpolicy.alloc.mapping import ChunkMapping


def check_block(block: int, num_blocks: int, name: str) -> None:
    if not 0 <= block < num_blocks:
        raise BlockError(f"block {block} is out of range: pool {name!r} has {num_blocks} blocks")


def check_claim(ids: list[int], live: set[int], num_blocks: int, name: str) -> None:
    """``ids`` may become live: distinct, in range, and not live already (else ``BlockError``)."""
    if len(set(ids)) != len(ids):
        raise BlockError(f"block ids repeat in claim: {sorted(ids)}")
    for b in ids:
        check_block(b, num_blocks, name)
        if b in live:
            raise BlockError(f"cannot claim block {b}: it is already live")


def refuse_free(live: set[int], ids: list[int], num_blocks: int, name: str) -> None:
    """Raise the ``BlockError`` for freeing ``ids``: one is not live, or one repeats.

    Callers check first, inline, with two set operations (the hot path of ``free``):
    ``live.issuperset(ids)``, then that removing ``ids`` removed ``len(ids)`` of them
    (after putting them back).
    """
    if not live.issuperset(ids):
        bad = next(b for b in ids if b not in live)
        why = "out of range" if not 0 <= bad < num_blocks else "not live (double free?)"
        raise BlockError(f"cannot free block {bad}: {why}; pool {name!r} has {num_blocks} blocks")
    raise BlockError(f"block ids repeat in free: {sorted(ids)}")


def reconcile_plan(current: set[int], live: Iterable[int], free: Iterable[int] | None) -> tuple[list[int], list[int]]:
    """(ids to claim, ids to release), ascending, so that ``live`` is live and ``free`` is free
    (``free=None``: every other id); ids already so are left alone."""
    wanted = set(live)
    claim = sorted(wanted - current)
    release = sorted(current - wanted if free is None else set(free) & current)
    return claim, release


class LiveBlocks:
    """The live ids of ``mapping``'s blocks, for an engine that hands them out itself. Not thread-safe."""

    def __init__(self, mapping: ChunkMapping) -> None:
        self.mapping = mapping
        self._live: set[int] = set()
        self._block_bytes = mapping.grid.block_stride * len(mapping.arenas)

    @property
    def count(self) -> int:
        return len(self._live)

    @property
    def used_bytes(self) -> int:
        """Bytes of the live blocks, over all arenas."""
        return len(self._live) * self._block_bytes

    def is_live(self, block: int) -> bool:
        return block in self._live

    def claim(self, blocks: Iterable[int]) -> None:
        """Make ``blocks`` live, mapping their chunks first if needed (under the limit; ``OutOfBlocks`` maps nothing)."""
        ids = list(blocks)
        m = self.mapping
        check_claim(ids, self._live, m.grid.num_blocks, m.name)
        m.map_missing(ids, requested=len(ids), free=0)
        users, chunks_of = m.users, m.grid.chunks_of
        for b in ids:
            for ci in chunks_of(b):
                users[ci] += 1
        self._live.update(ids)
        m.report()

    def release(self, blocks: Iterable[int]) -> None:
        """Make live ``blocks`` free (all or nothing); chunks they leave empty complete a deferred limit."""
        ids = list(blocks)
        m = self.mapping
        live = self._live
        if not live.issuperset(ids) or len(set(ids)) != len(ids):
            refuse_free(live, ids, m.grid.num_blocks, m.name)
        live.difference_update(ids)
        users, chunks_of = m.users, m.grid.chunks_of
        emptied: list[int] = []
        for b in ids:
            for ci in chunks_of(b):
                users[ci] -= 1
                if not users[ci]:
                    emptied.append(ci)
        m.chunks_emptied(emptied)

    def reconcile(self, live: Iterable[int], free: Iterable[int] | None) -> None:
        """Afterwards the ids in ``live`` are live and those in ``free`` free (``free=None``: every other id).

        Claims go first, so that no chunk ever looks empty while the engine holds one of
        its blocks; the releases may then complete a deferred limit (unmapping chunks).
        """
        claim, release = reconcile_plan(self._live, live, free)
        if claim:
            self.claim(claim)
        if release:
            self.release(release)
