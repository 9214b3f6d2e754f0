"""Which KV cache layout an elastic vLLM cache runs in, and where one block's bytes lie in its buffer.

Pure: imports neither torch nor vllm (vLLM's ``KVCacheConfig`` is read by attribute and
copied with ``dataclasses.replace``). vLLM places layer ``l``'s page of block ``b`` at
``offset + l × layer_stride + b × block_stride`` of one backing buffer
(``KVCacheTensor``). Two families of layouts can be elastic:

- **block-outermost** (``BLHNC``, ``BLNHC``, ``BHLNC``): ``block_stride`` is the whole
  block (every layer's page), so block ``b`` is the one byte range
  ``[b × bytes_per_block, (b + 1) × bytes_per_block)``: one region, and a block touches
  ``ceil(bytes_per_block / chunk)`` chunks (or two when it straddles).
- **layer-outermost, block-compact** (``LBHNC``, ``LBNHC``): each layer owns a region of
  ``num_blocks × page`` bytes, and block ``b`` is one page at ``b × page`` in *every*
  region. vLLM puts the regions end to end; their size is rarely a whole number of
  chunks, so the adapter widens vLLM's ``layer_stride`` to ``region_bytes`` (the region
  rounded up to a chunk) in the worker's copy of the config, and the buffer becomes one
  reservation of chunk-aligned regions (``ChunkMapping(contiguous=True)``). Chunk index
  ``c`` then means chunk ``c`` of every region: mapping a block maps one chunk per layer.

``LHBNC`` (heads outside blocks) scatters a block over every head's run and cannot be
elastic. ``choose_layout`` picks what the adapter asks vLLM for: ``BLHNC`` where the
attention backends accept it (it is cheaper: see docs/vllm.md, "Layouts"), else the
first layout of the backends' own order that the elastic pool can back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.alloc.layout import ChunkGrid

BLOCK_OUTERMOST_LAYOUTS = ("BLHNC", "BLNHC", "BHLNC")
"""vLLM layouts whose block dimension is outermost: block ``b`` is one byte range of the buffer."""
LAYER_OUTERMOST_LAYOUTS = ("LBHNC", "LBNHC")
"""vLLM layouts with one region per layer and block ``b`` one page of each (block-compact)."""
ELASTIC_LAYOUTS = BLOCK_OUTERMOST_LAYOUTS + LAYER_OUTERMOST_LAYOUTS
PREFERRED_LAYOUT = "BLHNC"
"""The layout asked for where the backends accept it."""


def choose_layout(supported: Sequence[str] | None) -> str | None:
    """The elastic layout to ask vLLM for, from the layouts every attention backend supports (most
    preferred first; None: unknown, so ``BLHNC`` as before vLLM declared layouts): ``BLHNC`` if it is
    among them, else the first block-outermost, else the first layer-outermost one; None if none fits."""
    if supported is None:
        return PREFERRED_LAYOUT
    names = [str(getattr(s, "name", s)) for s in supported]
    if PREFERRED_LAYOUT in names:
        return PREFERRED_LAYOUT
    for family in (BLOCK_OUTERMOST_LAYOUTS, LAYER_OUTERMOST_LAYOUTS):
        for name in names:
            if name in family:
                return name
    return None


@dataclass(frozen=True)
class BufferGeometry:
    """Where block ``b``'s bytes lie in one rank's elastic buffer: ``regions`` regions of
    ``block_stride`` bytes per block each (1 region of the whole block when block-outermost)."""

    layout: str
    num_blocks: int
    bytes_per_block: int
    """vLLM's bytes per block: every layer's page (``KVCacheTensor.size // num_blocks``)."""
    regions: int = 1
    block_stride: int = 0
    """Bytes of one block in each region (``bytes_per_block`` when block-outermost)."""

    def __post_init__(self) -> None:
        if not self.block_stride:
            object.__setattr__(self, "block_stride", self.bytes_per_block)

    @property
    def layer_outermost(self) -> bool:
        return self.layout in LAYER_OUTERMOST_LAYOUTS

    @classmethod
    def of(cls, kv_cache_config: Any, layout: str) -> BufferGeometry:
        """The geometry of a real ``KVCacheConfig`` planned in ``layout``; AdapterError if it cannot be elastic."""
        if layout not in ELASTIC_LAYOUTS:
            raise AdapterError(
                f"kvpolicy: the KV cache layout is {layout}; an elastic pool needs a block-outermost layout "
                f"({', '.join(BLOCK_OUTERMOST_LAYOUTS)}) or a layer-outermost one whose blocks are one page per "
                f"layer ({', '.join(LAYER_OUTERMOST_LAYOUTS)}). Set VLLM_KV_CACHE_LAYOUT to one the attention "
                "backend accepts (the adapter picks one when the engine core starts, unless another was asked for)."
            )
        tensors = kv_cache_config.kv_cache_tensors
        num_blocks = kv_cache_config.num_blocks
        size = tensors[0].size
        if layout in BLOCK_OUTERMOST_LAYOUTS:
            return cls(layout, num_blocks, size // num_blocks)
        strides = {(t.block_stride, t.layer_stride) for t in tensors}
        if len(strides) != 1:
            raise AdapterError(
                f"kvpolicy: in {layout} this model's KV cache tensors have different strides {sorted(strides)} "
                "(mixed page sizes); an elastic layer-outermost cache needs one page size. Use a block-outermost "
                "layout (VLLM_KV_CACHE_LAYOUT=BLHNC) where the attention backend accepts it."
            )
        ((page, layer_stride),) = strides
        regions = size // layer_stride if layer_stride else 0
        if layer_stride != num_blocks * page or regions * layer_stride != size or any(
            t.offset % layer_stride for t in tensors
        ):
            raise AdapterError(
                f"kvpolicy: vLLM's {layout} placement (size {size}, layer stride {layer_stride}, page {page}, "
                f"{num_blocks} blocks) is not one region of whole pages per layer; it cannot be elastic"
            )
        return cls(layout, num_blocks, size // num_blocks, regions, page)

    def region_bytes(self, chunk: int) -> int:
        """One region's bytes in the elastic buffer: its blocks, rounded up to whole chunks."""
        return -(-self.num_blocks * self.block_stride // chunk) * chunk

    def buffer_bytes(self, chunk: int) -> int:
        """The buffer vLLM is asked to allocate: its own size when block-outermost, else the widened regions."""
        if not self.layer_outermost:
            return self.num_blocks * self.bytes_per_block
        return self.regions * self.region_bytes(chunk)

    def pinned_chunks(self, chunk: int) -> int:
        """Chunks that hold block 0 (the null block), over every region: mapped for the buffer's life."""
        return len(ChunkGrid(self.block_stride, chunk, 1).chunks_of(0)) * self.regions

    def widened(self, kv_cache_config: Any, chunk: int) -> Any:
        """A copy of ``kv_cache_config`` whose layer regions start on chunks (the worker's; the scheduler
        keeps vLLM's). Block-outermost configs come back as they are."""
        if not self.layer_outermost:
            return kv_cache_config
        region = self.region_bytes(chunk)
        size = self.regions * region
        tensors = [
            dataclasses.replace(t, size=size, layer_stride=region, offset=t.offset // t.layer_stride * region)
            for t in kv_cache_config.kv_cache_tensors
        ]
        return dataclasses.replace(kv_cache_config, kv_cache_tensors=tensors)
