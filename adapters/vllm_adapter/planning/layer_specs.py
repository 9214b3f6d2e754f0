"""Per-layer KV cache specs as vLLM 0.33 sizes them, as pure data (no torch, no vllm).

Mirrors the spec classes of ``vllm/v1/kv_cache_interface.py`` that the models
``kvpolicy plan`` knows produce: ``FullAttentionSpec``, ``MLAAttentionSpec``,
``SlidingWindowSpec`` and ``SlidingWindowMLASpec``. Each formula is a property, so
tests can set the figures beside vLLM's own spec objects built from the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as ``vllm.utils.math_utils.cdiv``."""
    return -(a // -b)


def round_up(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y``."""
    return cdiv(x, y) * y


class SpecKind(str, Enum):
    """The spec classes, named by the pool vocabulary of standard models (see pools.py)."""

    FULL = "full"  # FullAttentionSpec
    MLA = "mla"  # MLAAttentionSpec
    SLIDING_WINDOW = "sliding_window"  # SlidingWindowSpec
    SLIDING_WINDOW_MLA = "sliding_window_mla"  # SlidingWindowMLASpec

    @property
    def is_full_type(self) -> bool:
        """vLLM registers MLA with ``uniform_type_base_spec=FullAttentionSpec``."""
        return self in (SpecKind.FULL, SpecKind.MLA)

    @property
    def is_sliding(self) -> bool:
        return self in (SpecKind.SLIDING_WINDOW, SpecKind.SLIDING_WINDOW_MLA)

    @property
    def is_mla(self) -> bool:
        return self in (SpecKind.MLA, SpecKind.SLIDING_WINDOW_MLA)


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV cache format; equality (as in vLLM) decides which layers share a group.

    ``pool`` (and ``part``) say which kvpolicy pool the layer's bytes belong to; they
    are not part of vLLM's spec, so they take no part in equality.
    """

    kind: SpecKind
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int
    head_size_v: int = 0
    """Defaults to 0 (MLA keeps one latent vector); standard attention sets it."""
    state_content_bytes: int | None = None
    """Packed bytes per stored state (DeepSeek-V4's fp8_ds_mla: 584); None: dense K+V."""
    tokens_per_state: int = 1
    alignment: int | None = None
    """MLA page padding (DeepSeek-V4: 576 or 512); None: no padding."""
    sliding_window: int | None = None
    model_version: str | None = None
    cache_dtype: str | None = None
    page_size_padded: int | None = None
    pool: str = field(default="", compare=False)
    part: str = field(default="", compare=False)
    """Breakdown inside the pool (DeepSeek-V4 compressor state: ``c4``, ``c128``, ``indexer``)."""

    @property
    def num_states(self) -> int:
        return self.block_size // self.tokens_per_state if self.tokens_per_state > 0 else 1

    @property
    def state_content_size_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * self.dtype_bytes

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_kv_heads * self.num_states * self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block of this layer takes (``KVCacheSpec.page_size_bytes``)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        if self.kind.is_mla and self.alignment is not None:
            return round_up(self.unpadded_page_size_bytes, self.alignment)
        return self.unpadded_page_size_bytes

    def with_block_size(self, block_size: int) -> LayerSpec:
        return replace(self, block_size=block_size)

    def with_padded_page(self, page_size: int) -> LayerSpec:
        if page_size < self.unpadded_page_size_bytes:
            raise AssertionError(f"padded page {page_size} below the page {self.unpadded_page_size_bytes}")
        return replace(self, page_size_padded=page_size)

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request at ``max_model_len`` holds in this layer's group, at most.

        Full attention holds every token; a sliding window holds its window plus the
        tokens in flight, plus one block because the window may start mid-block
        (``SlidingWindowSpec.max_admission_blocks_per_request``).
        """
        if self.kind.is_sliding:
            assert self.sliding_window is not None, "a sliding-window spec without a window"
            tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            return cdiv(tokens, self.block_size) + 1
        return cdiv(max_model_len, self.block_size)

    def is_uniform_with(self, others: list[LayerSpec]) -> bool:
        """``KVCacheSpec.is_uniform_with_collection`` for the spec kinds above."""
        if self.kind is SpecKind.SLIDING_WINDOW_MLA:
            return all(o.kind is SpecKind.SLIDING_WINDOW_MLA and o.sliding_window == self.sliding_window for o in others)
        if self.kind is SpecKind.SLIDING_WINDOW:
            # SlidingWindowMLASpec subclasses SlidingWindowSpec, so it passes isinstance.
            return all(o.kind.is_sliding and o.sliding_window == self.sliding_window for o in others)
        return all(o.kind.is_full_type for o in others)


def is_uniform_type(specs: list[LayerSpec]) -> bool:
    """``UniformTypeKVCacheSpecs.is_uniform_type``: one block size and one type of cache."""
    if len({s.block_size for s in specs}) > 1:
        return False
    return specs[0].is_uniform_with(specs)
