"""A driver that maps no memory: the engine core's books of what its ranks have mapped.

With tensor parallel > 1 the scheduler's block pool is in the engine core and the KV
tensors are in the ranks' processes. The core keeps a ``ChunkMapping`` of the same shape
as each rank's, so that vLLM's pool, the live mirror and the give-back run there as in
one process; its driver is this one. Addresses are numbers, handles are counters, and
nothing is allocated, so the core holds no device or host memory for the KV cache.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from kvpolicy.alloc import Driver


class BookDriver(Driver):
    """``Driver`` whose reservations, handles and mappings are only counted."""

    kind: ClassVar[str] = "books"

    def __init__(self, granularity: int, capacity: int) -> None:
        super().__init__()
        self.device = 0
        self.granularity = granularity
        self.name = "books"
        self._capacity = capacity
        self._next_va = granularity  # never 0: an address of 0 reads as "none"
        self._handles = itertools.count(1)

    def _reserve(self, size: int) -> int:
        va = self._next_va
        self._next_va += -(-size // self.granularity) * self.granularity
        return va

    def _free_address(self, va: int, size: int) -> None:
        return None

    def _create(self, size: int) -> int:
        return next(self._handles)

    def _release(self, handle: object) -> None:
        return None

    def _map(self, va: int, size: int, handle: object) -> None:
        return None

    def _unmap(self, va: int, size: int) -> None:
        return None

    def _set_access(self, va: int, size: int) -> None:
        return None

    def _zero(self, va: int, size: int) -> None:
        return None

    def _mem_info(self) -> tuple[int, int]:
        return self._capacity - self.mapped_bytes, self._capacity
