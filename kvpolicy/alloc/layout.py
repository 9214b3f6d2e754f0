"""Where a KV block's bytes live: frozen specs with their formulas as properties.

A block pool needs two numbers: how many arenas it spans, and the stride of one
block in each (block ``b`` occupies ``[b * block_stride, (b + 1) * block_stride)``
of every arena). ``ChunkGrid`` says which chunks those bytes fall in — the one
place that does that arithmetic. ``KVCacheLayout`` derives the two numbers from an
engine's KV geometry in the two layouts engines use:

- ``layer_major``: one contiguous tensor per layer and part (K, V, or an MLA
  latent), ``[num_blocks, block_size, num_heads, head_dim]`` — one arena each, so
  growing one chunk index maps a chunk in every layer's arena (SGLang-like).
- ``block_major``: one backing buffer, each block holding every layer's pages
  back to back — a single arena, with per-layer strided views (vLLM's
  block-outermost layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, Protocol

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}

Order = Literal["layer_major", "block_major"]


class BlockGeometry(Protocol):
    @property
    def block_stride(self) -> int:
        """Bytes one block occupies in each arena."""
        ...

    @property
    def num_arenas(self) -> int:
        """Arenas a block spans (each holds ``block_stride`` bytes of it)."""
        ...


@dataclass(frozen=True)
class BlockSpec:
    """A plain geometry: ``num_arenas`` arenas, ``block_stride`` bytes of each per block."""

    block_stride: int
    num_arenas: int = 1

    def __post_init__(self) -> None:
        if self.block_stride <= 0 or self.num_arenas <= 0:
            raise ValueError(
                f"block_stride and num_arenas must be positive, got {self.block_stride}, {self.num_arenas}"
            )


@dataclass(frozen=True)
class KVCacheLayout:
    """The KV cache of one engine rank: layers × (K, V | latent) × blocks of ``block_size`` tokens."""

    num_layers: int
    block_size: int
    """Tokens per block."""
    num_heads: int
    """KV heads per layer on this rank (1 for an MLA latent)."""
    head_dim: int
    """Elements per head and token (for MLA, the latent width, e.g. 576)."""
    dtype: str = "bfloat16"
    latent: bool = False
    """One latent tensor per layer (MLA) instead of separate K and V."""
    order: Order = "layer_major"

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_size", "num_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
        if self.order not in ("layer_major", "block_major"):
            raise ValueError(f"order must be 'layer_major' or 'block_major', got {self.order!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def parts(self) -> tuple[str, ...]:
        """The tensors per layer: ``("k", "v")``, or ``("latent",)`` for MLA."""
        return ("latent",) if self.latent else ("k", "v")

    @property
    def page_bytes(self) -> int:
        """One block of one layer's K (or V, or latent)."""
        return self.block_size * self.num_heads * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        """All the bytes of one block: every layer and part."""
        return self.page_bytes * self.num_layers * len(self.parts)

    @property
    def num_arenas(self) -> int:
        return self.num_layers * len(self.parts) if self.order == "layer_major" else 1

    @property
    def block_stride(self) -> int:
        return self.page_bytes if self.order == "layer_major" else self.block_bytes

    def placement(self, layer: int, part: str) -> tuple[int, int]:
        """``(arena index, byte offset inside each block's stride)`` of ``layer``'s ``part``."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is out of range: the layout has {self.num_layers} layers")
        if part not in self.parts:
            raise ValueError(f"part {part!r} is not in this layout; expected one of {self.parts}")
        slot = layer * len(self.parts) + self.parts.index(part)
        if self.order == "layer_major":
            return slot, 0
        return 0, slot * self.page_bytes


@dataclass(frozen=True)
class ChunkGrid:
    """How ``num_blocks`` blocks of ``block_stride`` bytes fall on chunks of ``chunk`` bytes, in each arena.

    Block ``b`` is bytes ``[b * block_stride, (b + 1) * block_stride)``, chunk ``c``
    bytes ``[c * chunk, (c + 1) * chunk)``. A block whose stride does not divide the
    chunk may *straddle*: it touches two or more chunks and is usable only when all of
    them are mapped. The first chunk a block touches is its *home*.
    """

    block_stride: int
    chunk: int
    num_blocks: int

    def __post_init__(self) -> None:
        if self.block_stride <= 0 or self.chunk <= 0 or self.num_blocks <= 0:
            raise ValueError(
                f"block_stride, chunk and num_blocks must be positive, got "
                f"{self.block_stride}, {self.chunk}, {self.num_blocks}"
            )

    def chunks_of(self, block: int) -> range:
        """The chunks block ``block``'s bytes touch, its home first."""
        s, c = self.block_stride, self.chunk
        return range(block * s // c, ((block + 1) * s - 1) // c + 1)

    def blocks_touching(self, index: int) -> range:
        """The blocks with bytes in chunk ``index`` (those straddling into it included)."""
        s, c = self.block_stride, self.chunk
        return range(index * c // s, min(self.num_blocks, ((index + 1) * c - 1) // s + 1))

    def blocks_homed_in(self, index: int) -> range:
        """The blocks whose first byte is in chunk ``index`` (empty where a block spans the whole chunk)."""
        s, c = self.block_stride, self.chunk
        return range(min(self.num_blocks, -(-index * c // s)), min(self.num_blocks, -(-(index + 1) * c // s)))

    @property
    def num_chunks(self) -> int:
        """Chunks that hold the blocks: an arena's chunk count."""
        return -(-self.num_blocks * self.block_stride // self.chunk)

    @property
    def blocks_per_chunk(self) -> int:
        """Blocks per chunk when the stride divides the chunk (no block straddles), else 0."""
        return self.chunk // self.block_stride if self.chunk % self.block_stride == 0 else 0

    @cached_property
    def homes(self) -> list[int]:
        """Each block's home chunk, as a table: the allocator's hot path indexes it instead of dividing."""
        table: list[int] = []
        for c in range(self.num_chunks):
            table += [c] * len(self.blocks_homed_in(c))  # one int object per chunk, shared by its blocks
        return table

    @cached_property
    def first_homed(self) -> list[int]:
        """For each chunk ``c`` and one past the last: the first block whose home is ``c`` or later."""
        return [self.blocks_homed_in(c).start for c in range(self.num_chunks)] + [self.num_blocks]

    @cached_property
    def spans(self) -> Sequence[int]:
        """Each block's chunks beyond its home (0 unless it straddles), as a table."""
        if self.blocks_per_chunk:
            return bytes(self.num_blocks)
        extra = [len(self.chunks_of(b)) - 1 for b in range(self.num_blocks)]
        return bytes(extra) if max(extra) < 256 else extra

    def completed_by(self, indices: Iterable[int], mapped: Sequence[int]) -> list[int]:
        """The blocks touching chunks ``indices`` whose chunks are all mapped (``mapped[c]`` true), ascending.

        Called with the chunks just mapped, these are the blocks that mapping made usable.
        """
        done: set[int] = set()
        for ci in indices:
            for b in self.blocks_touching(ci):
                if b not in done and all(mapped[x] for x in self.chunks_of(b)):
                    done.add(b)
        return sorted(done)
