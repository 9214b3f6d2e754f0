"""A block pool's ids: which are live, and the free ones grouped by chunk, for page-aware placement.

Placement takes the lowest mapped chunk that has a free block, whether it holds live
blocks or not; so live blocks gather at low addresses and whole chunks at high ones
become free and can go back to the GPU (a give-back takes the highest first). A pool
draining to a lower target thus refills the holes in its low chunks while the high
ones empty; preferring any partly used chunk would put new blocks in a high one that
was about to go back. Every free block that ``take`` can hand
out lies wholly in mapped chunks (``add_mapped`` adds a chunk's blocks once all their
chunks are mapped, ``drop`` takes them out before a chunk is unmapped). The index
counts, in its mapping's ``users``, the live blocks touching each chunk.

This is the allocator's hot path: ``take`` and ``free`` work on whole batches with
C-level set and list operations and the grid's tables, never the driver.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heappop, heappush
from itertools import compress, groupby, islice

from kvpolicy.alloc.live import check_claim, refuse_free
from kvpolicy.alloc.mapping import ChunkMapping


class FreeBlockIndex:
    """The live set and the free lists of ``mapping``'s blocks. Not thread-safe: the block pool serialises calls."""

    def __init__(self, mapping: ChunkMapping) -> None:
        grid = mapping.grid
        self.grid = grid
        self.name = mapping.name
        self.num_blocks = grid.num_blocks
        self._homes = grid.homes
        self._first_homed = grid.first_homed
        self._spans = grid.spans  # chunks beyond the home: nonzero only for blocks that straddle
        self._straddling = not grid.blocks_per_chunk
        self._one_per_chunk = grid.blocks_per_chunk == 1  # block b is chunk b: no chunk is ever partly used
        self._users = mapping.users  # live blocks touching each chunk (the mapping's own counts)
        self._mapped = mapping.mapped
        n = mapping.num_chunks
        # Live block ids. A set, not a per-block flag array: checking, adding and removing
        # a batch of ids are then single C-level calls, which is most of alloc/free's cost.
        self.live: set[int] = set()
        """The live ids (read-only outside this class)."""
        self._free_in: list[list[int]] = [[] for _ in range(n)]  # allocatable free blocks by home chunk
        self._with_free: list[int] = []  # heap of home chunks with free blocks (lazy: may hold emptied ones)
        self._queued = bytearray(n)  # whether a home chunk is in _with_free
        self.num_free = 0
        """Free blocks in mapped chunks: what ``take`` can hand out."""
        self.num_live = 0

    # -- the hot path --------------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """``n`` free ids (``0 < n <= num_free``), now live."""
        if self._one_per_chunk:
            return self._take_whole_chunks(n)
        free_in, users, heap = self._free_in, self._users, self._with_free
        out: list[int] | None = None
        need = n
        while need:
            # The usual case without a call: the heap's top still has free blocks (stale
            # entries, chunks emptied since they were pushed, are _pick_home's to clear).
            h = heap[0] if heap and free_in[heap[0]] else self._pick_home()
            assert h >= 0, f"pool {self.name!r} counted {self.num_free} free blocks but found none"
            lst = free_in[h]
            k = len(lst)
            if k <= need:
                taken = lst
                free_in[h] = []
            else:  # h keeps free blocks and stays on the heap
                k = need
                cut = len(lst) - k
                taken = lst[cut:]
                del lst[cut:]
            self.live.update(taken)
            users[h] += k
            if self._straddling:
                self._count_straddlers(taken, h)
            if out is None:
                out = taken
            else:
                out += taken
            need -= k
        self.num_free -= n
        self.num_live += n
        assert out is not None
        return out

    def _take_whole_chunks(self, n: int) -> list[int]:
        """``take`` when each block is a whole chunk: the lowest free ones, off the heap."""
        heap, free_in, users, queued = self._with_free, self._free_in, self._users, self._queued
        out: list[int] = []
        while len(out) < n:
            h = heappop(heap)
            queued[h] = 0
            if free_in[h]:  # else a stale entry (its block was dropped or claimed)
                out.append(h)
                free_in[h] = []
                users[h] = 1
        self.live.update(out)
        self.num_free -= n
        self.num_live += n
        return out

    def free(self, ids: list[int]) -> list[int]:
        """Make live ``ids`` free, all or nothing (``BlockError``); returns the chunks they left with no live block."""
        live = self.live
        if not live.issuperset(ids):
            refuse_free(live, ids, self.num_blocks, self.name)
        before = len(live)
        live.difference_update(ids)
        n = len(ids)
        if len(live) != before - n:  # a duplicate id
            live.update(ids)
            refuse_free(live, ids, self.num_blocks, self.name)
        if self._one_per_chunk:  # each id is its own chunk, now empty
            free_in, users, heap, queued = self._free_in, self._users, self._with_free, self._queued
            for b in ids:
                free_in[b] = [b]
                users[b] = 0
                if not queued[b]:
                    heappush(heap, b)
                    queued[b] = 1
            self.num_free += n
            self.num_live -= n
            return list(ids)
        free_in, users, homes = self._free_in, self._users, self._homes
        ordered = sorted(ids)
        h = homes[ordered[0]]
        if homes[ordered[-1]] == h:  # all in one home chunk: the usual case
            free_in[h] += ordered
            left = users[h] - n
            users[h] = left
            if not self._straddling:  # then h is all they touched
                if not self._queued[h]:
                    heappush(self._with_free, h)
                    self._queued[h] = 1
                self.num_free += n
                self.num_live -= n
                return [] if left else [h]
            touched = [h]
        else:
            touched = []
            i = 0
            while i < n:  # one pass per home chunk, not per block
                h = homes[ordered[i]]
                j = bisect_left(ordered, self._first_homed[h + 1], i)  # the first block of a later home
                free_in[h].extend(ordered[i:j])
                users[h] -= j - i
                touched.append(h)
                i = j
        if self._straddling:
            spans = self._spans
            for b in compress(ordered, map(spans.__getitem__, ordered)):
                h = homes[b]
                for ci in range(h + 1, h + 1 + spans[b]):
                    users[ci] -= 1
                    touched.append(ci)
        emptied = []
        for ci in touched:
            if free_in[ci]:
                self._queue(ci)
            if not users[ci]:
                emptied.append(ci)
        self.num_free += n
        self.num_live -= n
        return emptied

    def _count_straddlers(self, taken: list[int], home: int) -> None:
        users, spans = self._users, self._spans
        for b in compress(taken, map(spans.__getitem__, taken)):
            for ci in range(home + 1, home + 1 + spans[b]):
                users[ci] += 1

    def _pick_home(self) -> int:
        """The home chunk to allocate from: the lowest with a free block (-1: none), stale entries cleared."""
        free_in, heap = self._free_in, self._with_free
        while heap:
            h = heap[0]
            if free_in[h]:
                return h
            heappop(heap)
            self._queued[h] = 0
        return -1

    def _queue(self, h: int) -> None:
        """Home chunk ``h`` has free blocks: make sure the heap holds it."""
        if not self._queued[h]:
            heappush(self._with_free, h)
            self._queued[h] = 1

    def free_below(self, bound: int) -> int:
        """Free blocks whose home chunk lies below chunk index ``bound`` (what placement hands out first).
        Not the hot path: one C-level pass over ``bound`` lists, about 20 µs at 1,280 chunks."""
        return sum(map(len, islice(self._free_in, max(0, bound))))

    # -- ids the engine picks ------------------------------------------------------------
    def check_claim(self, ids: list[int]) -> None:
        """``ids`` may be claimed: distinct, in range, not live (else ``BlockError``)."""
        check_claim(ids, self.live, self.num_blocks, self.name)

    def claim(self, ids: list[int]) -> None:
        """Make free ids live; their chunks must be mapped (``check_claim`` first, then map)."""
        homes, spans, users, free_in = self._homes, self._spans, self._users, self._free_in
        for b in ids:
            h = homes[b]
            free_in[h].remove(b)
            self.live.add(b)
            for ci in range(h, h + 1 + spans[b]):
                users[ci] += 1
        self.num_free -= len(ids)
        self.num_live += len(ids)

    # -- the mapping changes -------------------------------------------------------------
    def add_mapped(self, chunks: list[int]) -> list[int]:
        """``chunks`` were just mapped: their blocks whose chunks are all mapped become allocatable (returned, ascending)."""
        added = self.grid.completed_by(chunks, self._mapped)
        free_in = self._free_in
        for home, group in groupby(added, self._homes.__getitem__):
            blocks = list(group)
            free_in[home].extend(reversed(blocks))  # lowest id is popped first
            self.num_free += len(blocks)
            self._queue(home)
        return added

    def drop(self, chunks: list[int]) -> None:
        """``chunks`` are about to be unmapped: their blocks (and those straddling into them) stop being allocatable."""
        free_in, homes, blocks_touching = self._free_in, self._homes, self.grid.blocks_touching
        for ci in chunks:
            touching = blocks_touching(ci)
            first, last = touching[0], touching[-1]
            for home in range(homes[first], homes[last] + 1):
                lst = free_in[home]
                if lst:
                    kept = [b for b in lst if not first <= b <= last]
                    self.num_free -= len(lst) - len(kept)
                    lst[:] = kept
            assert not any(b in self.live for b in touching), "a live block in a chunk being unmapped"

    def close(self) -> None:
        """The pool closed: nothing is allocatable any more."""
        self.num_free = 0
