"""What the GPU loses to a sequence of tensors: PyTorch's CUDA caching allocator, as a pure function.

A tensor of ``n`` bytes costs more than ``n``: the caching allocator rounds the
request up to 512 bytes and carves it out of a *segment* it gets from
``cudaMalloc``, and a segment is never smaller than the request's size class:

- requests up to 1 MiB come from 2 MiB segments shared by many small tensors;
- requests above 1 MiB and below 10 MiB get a 20 MiB segment, whose tail later
  requests above 1 MiB may reuse (best fit, smallest free block that fits);
- requests of 10 MiB or more get a segment rounded up to a multiple of 2 MiB.

These are the allocator's documented defaults (``c10/cuda/CUDACachingAllocator.cpp``:
kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB,
kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB; no ``max_split_size_mb``, no
``roundup_power2_divisions``, no ``expandable_segments``). With nothing freed in
between — as while SGLang builds its KV pools — the reserved memory is the sum of
the segments; each new segment is charged to the tensor that made the allocator
ask for it, so per-pool figures add up to the total.

Nothing here imports torch: ``kvpolicy plan`` uses it on a lean install, and the
GPU test checks it against ``torch.cuda.memory_reserved()`` and ``cuMemGetInfo``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20  # for requests in (1 MiB, 10 MiB)
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def rounded_request(nbytes: int) -> int:
    """The block size the allocator hands out for an ``nbytes`` request (0 for an empty tensor)."""
    if nbytes <= 0:
        return 0
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(block: int) -> int:
    """The size of the fresh segment the allocator reserves for a ``block``-byte request."""
    if block <= SMALL_SIZE:
        return SMALL_SEGMENT
    if block < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-block // ROUND_LARGE) * ROUND_LARGE


@dataclass
class CachingAllocatorModel:
    """The allocator's reserved memory after a run of allocations with no frees.

    Invariant: ``reserved`` equals the sum of every segment opened so far, and the
    free lists hold exactly the unsplit tails of those segments.
    """

    reserved: int = 0
    _small_free: list[int] = field(default_factory=list)  # sorted free block sizes
    _large_free: list[int] = field(default_factory=list)

    def allocate(self, nbytes: int) -> int:
        """Allocate ``nbytes``; returns the bytes of new segment this request opened (often 0 or more than asked)."""
        block = rounded_request(nbytes)
        if block == 0:
            return 0
        small = block <= SMALL_SIZE
        free = self._small_free if small else self._large_free
        i = bisect_left(free, block)
        if i < len(free):  # best fit: the smallest cached block that is large enough
            cached = free.pop(i)
            self._split(free, cached - block, small)
            return 0
        seg = segment_size(block)
        self.reserved += seg
        self._split(free, seg - block, small)
        return seg

    @staticmethod
    def _split(free: list[int], remaining: int, small: bool) -> None:
        # The allocator keeps a tail as a free block only when it is worth it:
        # any tail in the small pool, a tail above 1 MiB in the large pool.
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            insort(free, remaining)


def footprints(sizes: Iterable[int]) -> list[int]:
    """Per tensor, in allocation order: the bytes of GPU memory its allocation reserved."""
    model = CachingAllocatorModel()
    return [model.allocate(n) for n in sizes]


def footprint(sizes: Iterable[int]) -> int:
    """Total bytes reserved by allocating ``sizes`` in order on an empty caching allocator."""
    return sum(footprints(sizes))
