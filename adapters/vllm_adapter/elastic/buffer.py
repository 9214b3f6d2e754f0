"""The worker's side of an elastic vLLM KV cache: vLLM's one backing buffer as reserved address space.

vLLM 0.33 allocates a rank's whole KV cache as one ``torch.zeros(size, int8)``
buffer inside ``allocate_kv_cache`` and makes every layer's view over it
(``create_kv_cache_views``). Here that buffer is a tensor over an allocator arena
(``kvpolicy.alloc``): the address space for vLLM's whole (virtual) block count is
reserved once, so the views vLLM makes stay valid while chunks are mapped and
unmapped under them. Nothing of vLLM's allocation code is copied: it runs as is,
inside an allocation context (the hook vLLM offers for KV memory pools) that
answers its one ``torch.zeros`` call with the arena tensor.

**Zero fill.** vLLM zero-fills the buffer it allocates. Filling reserved address
space would touch unmapped memory (a fault on the GPU), so the arena tensor is
returned unfilled; instead each chunk is zeroed once, right after it is mapped and
before any of its blocks is handed out (``ChunkMapping(zero_new_chunks=True)``: one
cuMemsetD8Async on a private stream, waited on). So every block vLLM ever sees has
been zero at least once, as with the stock buffer, and nothing unmapped is touched.
(A shared read-only zero page over the unused space would also do, but would cost a
mapping per unused chunk and a remap on every growth.)

**Null block.** Block 0 is vLLM's null block, which kernels may read at any time;
the chunks holding it are mapped at start and never released (``kvpolicy.alloc.pinned``).

**Unmapping** waits for the device first (``Driver.synchronize``): cuMemUnmap does not
wait for kernels in flight, and with async scheduling a step may still be reading
blocks the scheduler has already freed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvpolicy.adapters.errors import AdapterError

from kvpolicy.alloc import ChunkGrid, ChunkMapping, Driver, GiveBack, LimitSource, LiveBlocks, groups_within
from kvpolicy.alloc.pinned import PinnedFirst
from kvpolicy.units import format_bytes

if TYPE_CHECKING:
    import torch

UnmapListener = Callable[[list[int]], None]


def pinned_chunks(block_stride: int, chunk: int, regions: int = 1) -> int:
    """Chunks that hold block 0 (the null block) in every region, mapped for the buffer's whole life."""
    return len(ChunkGrid(block_stride, chunk, 1).chunks_of(0)) * regions


class ElasticKVBuffer:
    """One rank's KV backing buffer: ``num_blocks × bytes_per_block`` bytes of reserved address space,
    in one region (block-outermost layouts) or ``regions`` chunk-aligned regions of ``block_stride``
    bytes per block each (layer-outermost: one region per layer, ``layouts``).

    ``limit`` is the ledger's (elastic) LimitSource; ``pinned`` the bytes already
    admitted statically for the null block's chunks. vLLM's scheduler hands out the
    block ids and drives the allocator's parts through ``pool.ElasticPool``:
    ``mapping`` (the arena, mapped chunk by chunk under the limit), ``live`` (the block
    ids the scheduler holds, as the mapping must know them), ``give_back`` (when memory
    goes back) and ``grid`` (which chunks a block's bytes touch).
    """

    live: LiveBlocks

    def __init__(
        self,
        driver: Driver,
        *,
        num_blocks: int,
        bytes_per_block: int,
        chunk: int,
        limit: LimitSource,
        pinned: int,
        grow_chunks: int = 1,
        name: str = "vllm-kv",
        regions: int = 1,
        block_stride: int | None = None,
        mapping: Callable[..., ChunkMapping] = ChunkMapping,
        give_back_chunks: int | None = None,
    ) -> None:
        """``mapping`` makes the chunk mapping (``ChunkMapping``'s arguments; the engine core of a
        tensor-parallel engine passes its books of the ranks' mappings, ``group.GroupMapping``).
        ``give_back_chunks``: one give-back unmaps at most this many chunks (whole chunk groups, one
        chunk in every region: at least one group), the rest at the next steps (None: no bound)."""
        stride = bytes_per_block if block_stride is None else block_stride
        if regions < 1 or stride * regions != bytes_per_block:
            raise ValueError(f"{regions} region(s) of {stride} bytes per block do not make {bytes_per_block}-byte blocks")
        need = pinned_chunks(stride, chunk, regions) * chunk
        if pinned != need:
            raise ValueError(f"the null block needs {need} pinned bytes, {pinned} were admitted")
        self.driver = driver
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block
        self.regions = regions
        self.chunk = chunk
        self.pinned = pinned
        self.limit = PinnedFirst(limit, pinned, pinned_used=bytes_per_block)
        self._listener: UnmapListener | None = None
        self._tensor: torch.Tensor | None = None
        self.grow_chunks = grow_chunks
        self.grid = ChunkGrid(stride, chunk, num_blocks)
        """Where a block falls in each region (chunk ``c`` is mapped in every region at once)."""
        self.give_back = GiveBack(
            group_bytes=chunk * regions,
            grow_chunks=grow_chunks,
            pressure=self.limit.pressure(),
            release_chunks=groups_within(give_back_chunks, regions),
        )
        self.mapping = mapping(
            driver,
            self.grid,
            limit=self.limit,
            num_arenas=regions,
            name=name,
            before_unmap=self._before_unmap,
            zero_new_chunks=True,
            used_bytes=lambda: self.live.used_bytes,
            contiguous=regions > 1,
        )
        self.size = num_blocks * bytes_per_block if regions == 1 else regions * self.mapping.region_bytes
        """The bytes vLLM allocates: its own size in one region, else every widened region."""
        self.live = LiveBlocks(self.mapping)
        try:
            self.live.claim([0])  # the null block: its chunks map now, from the static allowance
        except BaseException:
            self.mapping.close()
            raise
        self.bound = False
        """Whether a scheduler's block pool drives this buffer (``pool.ElasticPool.adopt``)."""

    @property
    def va(self) -> int:
        va = self.mapping.va
        return self.mapping.arenas[0].va if va is None else va

    def tensor(self) -> torch.Tensor:
        """The int8 buffer vLLM asked for, over the reservation (made once; never moves)."""
        if self._tensor is None:
            import torch

            from kvpolicy.alloc.tensors import arena_bytes, mapping_bytes

            whole = mapping_bytes(self.mapping) if self.regions > 1 else arena_bytes(self.mapping.arenas[0])
            self._tensor = whole[: self.size].view(torch.int8)
        return self._tensor

    def set_listener(self, listener: UnmapListener | None) -> None:
        """Who takes the blocks of chunks about to be unmapped out of circulation (the scheduler's pool)."""
        self._listener = listener

    def _before_unmap(self, chunks: list[int]) -> None:
        if self._listener is not None:
            self._listener(chunks)
        self.driver.synchronize()  # kernels still reading these chunks finish first

    def close(self) -> None:
        """Unmap and release everything; the tensor and vLLM's views become invalid."""
        self._tensor = None
        self.mapping.close()

    def __repr__(self) -> str:
        return (
            f"ElasticKVBuffer({self.num_blocks} blocks × {format_bytes(self.bytes_per_block)} in {self.regions} "
            f"region(s), "
            f"{format_bytes(self.size)} reserved at {self.va:#x}, {format_bytes(self.mapping.held_bytes)} held)"
        )


# ---------------------------------------------------------------- vLLM's allocation, redirected


@functools.cache
def _zeros_mode() -> type:
    """A TorchFunctionMode class (built on first use, so this module imports torch lazily)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class ZerosToArena(TorchFunctionMode):
        """Answers vLLM's ``torch.zeros(size, dtype=torch.int8, device=...)`` with the arena tensor, once;
        every other call passes through."""

        def __init__(self, buffer: ElasticKVBuffer, device: Any) -> None:
            super().__init__()
            self.buffer = buffer
            self.device_type = torch.device(device).type
            self.served = 0

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.zeros and not self.served and self._is_kv_buffer(args, kwargs):
                self.served += 1
                return self.buffer.tensor()
            return func(*args, **kwargs)

        def _is_kv_buffer(self, args: tuple, kwargs: dict) -> bool:
            size: Any = args[0] if len(args) == 1 else (args or kwargs.get("size"))
            if isinstance(size, (tuple, list, torch.Size)):
                size = size[0] if len(size) == 1 else None
            device = kwargs.get("device")
            return (
                isinstance(size, int)
                and size == self.buffer.size
                and kwargs.get("dtype") is torch.int8
                and device is not None
                and torch.device(device).type == self.device_type
            )

    return ZerosToArena


def allocation_context(buffer: ElasticKVBuffer, device: Any) -> Any:
    """The ``kv_cache_allocation_context`` under which vLLM's ``allocate_kv_cache`` builds its views over
    ``buffer`` (its ``served`` says whether vLLM's allocation was answered)."""
    return _zeros_mode()(buffer, device)


# ---------------------------------------------------------------- this process's buffers

_lock = threading.Lock()
_unbound: list[ElasticKVBuffer] = []


def publish(buffer: ElasticKVBuffer) -> None:
    """Offer ``buffer`` to the scheduler that will be built in this process."""
    with _lock:
        _unbound.append(buffer)


def take_unbound(num_blocks: int, bytes_per_block: int) -> ElasticKVBuffer | None:
    """The buffer allocated in this process for a KV cache of this shape (the latest), or None."""
    with _lock:
        for i in range(len(_unbound) - 1, -1, -1):
            b = _unbound[i]
            if b.num_blocks == num_blocks and b.bytes_per_block == bytes_per_block:
                return _unbound.pop(i)
    return None


def has_unbound() -> bool:
    """Whether a buffer of this process waits for its scheduler (one read: called every engine step)."""
    return bool(_unbound)


def unbound() -> list[ElasticKVBuffer]:
    """Buffers no scheduler adopted (the engine core refuses to step with one: its blocks would go unmapped)."""
    with _lock:
        return list(_unbound)


def check_views(buffer: ElasticKVBuffer, kv_caches: dict[str, Any]) -> None:
    """Every KV view vLLM made lies inside ``buffer`` (else vLLM allocated elsewhere, and the budget would lie)."""
    lo, hi = buffer.va, buffer.va + buffer.size
    for name, view in kv_caches.items():
        ptr = view.data_ptr()
        if not lo <= ptr < hi:
            raise AdapterError(
                f"kvpolicy: vLLM's KV cache view {name!r} is at {ptr:#x}, outside the elastic buffer "
                f"[{lo:#x}, {hi:#x}): vLLM did not allocate through the elastic allocation context. "
                "This vLLM differs from the validated one; unset the elastic pools."
            )
