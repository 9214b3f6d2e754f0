"""The tenant's GPU work over its block pool, through zero-copy torch views of the pool's arenas.

- ``write(blocks, keys)``: fill each block, in every arena (every layer's K and V), with a
  pattern derived from its key (request and position in the request). Engines write a
  block's KV when they prefill or decode into it; this writes the whole block at once.
- ``check(blocks, keys)``: read the blocks back through the same views and count, per
  block, the elements that differ from the pattern: a block that was unmapped, remapped,
  handed to another request or overwritten shows up here.
- ``attend(table, lens)``: one decode step's attention for a batch over the first
  ``attn_layers`` layers, one query token per request. ``attention="paged"`` reads each
  request's keys and values in place through its block table (``paged_attention``, a Triton
  kernel, as engines' decode kernels do); ``"gather"`` copies each request's blocks out
  (a paged gather) and runs torch SDPA with a mask over the padding — the reference, and
  what a CPU runs.

The pattern's 16-bit words are ``0x3C00 | ((j × m + k) & 0x3FF)`` for word ``j`` of a
block with key ``k`` and odd slope ``m`` (from the key), XOR a per-arena constant
below 0x400: as bfloat16 these are finite numbers in [2⁻⁷, 2), so attention over them
is ordinary arithmetic; a block of another key matches with probability about 2⁻²⁰.
It repeats every 1,024 words, which is what makes writing and checking it cheap
(``PERIOD``); a block that is wrong anywhere, even in one word, is still caught.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from kvpolicy.alloc.blocks import BlockPool
from kvpolicy.alloc.tensors import block_bytes, kv_view

KEY_BITS = 20
PERIOD = 1024
"""The pattern repeats every 1,024 words: ``j × m mod 2¹⁰`` depends on ``j mod 2¹⁰`` only. So a pass
makes each block's 1,024-word period and broadcasts it over the block, and the GPU's traffic is the
write (or the read) of the KV itself, not the arithmetic of a pattern as large as the blocks."""
PASS_BYTES = 256 << 20
"""Bytes of blocks per check pass: its read-back copy is about that size (a check of every live
block at once once asked the GPU for 39 GiB next to the pools)."""


def block_key(request_key: int, ordinal: int) -> int:
    """The pattern key of a request's ``ordinal``-th block (the same after a preemption and recompute)."""
    return ((request_key * 2654435761) ^ (ordinal * 40503 + 0x5BD1)) & ((1 << KEY_BITS) - 1)


class KVWork:
    def __init__(
        self, pool: BlockPool, *, attn_layers: int, max_batch: int, window: int, max_tokens: int = 1 << 18, seed: int = 0,
        attention: Literal["paged", "gather"] = "gather",
    ) -> None:
        layout = pool.geometry
        self.pool = pool
        self.device = torch.device("cuda", pool.driver.device) if pool.driver.kind == "cuda" else torch.device("cpu")
        width = pool.block_stride // 2
        self.period = PERIOD if width % PERIOD == 0 else width
        # Each arena's blocks as [blocks, repeats, period] 16-bit words: a period broadcasts over a block.
        self.words = [block_bytes(pool, a).view(torch.int16).view(-1, width // self.period, self.period)
                      for a in range(len(pool.arenas))]
        self.blocks_per_pass = max(1, PASS_BYTES // pool.block_stride)
        self.arena_xor = [(a * 37 + 1) & 0x3FF for a in range(len(pool.arenas))]
        self._xor = torch.tensor(self.arena_xor, dtype=torch.int16, device=self.device)[:, None, None]
        self._j = torch.arange(self.period, dtype=torch.int32, device=self.device)
        self.layers = [(kv_view(pool, layer, "k"), kv_view(pool, layer, "v")) for layer in range(min(attn_layers, layout.num_layers))]
        self.block_tokens = layout.block_size
        self.window = window
        self.max_tokens = max_tokens
        """Tokens gathered per SDPA call (padded): bounds the step's temporary GPU memory, which
        the caching allocator keeps, so the tenants' own work never crowds the KV pools out."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dtype = getattr(torch, layout.dtype)
        self._q = torch.randn(max_batch, layout.num_heads, 1, layout.head_dim, generator=gen).to(self.device, dtype)
        self.sink = torch.zeros((), dtype=torch.float32, device=self.device)
        """Accumulates a number from every attention output, so no step's work can be skipped."""
        self.attention = attention
        if attention == "paged":
            from paged_attention import paged_decode  # Triton: only where the paged kernel is asked for

            self._paged_decode = paged_decode

    # -- the pattern ----------------------------------------------------------------------
    def _expected(self, keys: list[int]) -> torch.Tensor:
        """Every arena's pattern period for each key: ``[arenas, blocks, 1, period]``, broadcast over a block."""
        k = torch.tensor(keys, dtype=torch.int32).to(self.device)
        slope = (k >> 10) | 1
        period = ((self._j[None, :] * slope[:, None] + k[:, None]) & 0x3FF | 0x3C00).to(torch.int16)
        return (period[None] ^ self._xor)[:, :, None, :]

    def write(self, blocks: list[int], keys: list[int]) -> None:
        """Fill ``blocks`` (every arena) with the patterns of ``keys``."""
        if not blocks:
            return
        idx = torch.tensor(blocks, dtype=torch.int64).to(self.device)
        for words, expected in zip(self.words, self._expected(keys)):
            words[idx] = expected

    def check(self, blocks: list[int], keys: list[int]) -> list[int]:
        """Per block, how many 16-bit words differ from its pattern (0 everywhere: intact)."""
        bad: list[int] = []
        step = self.blocks_per_pass
        for start in range(0, len(blocks), step):
            bad += self._check(blocks[start : start + step], keys[start : start + step])
        return bad

    def _check(self, blocks: list[int], keys: list[int]) -> list[int]:
        if not blocks:
            return []
        idx = torch.tensor(blocks, dtype=torch.int64).to(self.device)
        bad = torch.zeros(len(blocks), dtype=torch.int64, device=self.device)
        for words, expected in zip(self.words, self._expected(keys)):
            bad += (words[idx] != expected).sum(dim=(1, 2))
        return bad.tolist()

    # -- attention ------------------------------------------------------------------------
    def attend(self, tables: list[np.ndarray], contexts: list[int]) -> None:
        """One decode step over the batch: ``tables[i]`` is request i's block ids, ``contexts[i]`` its tokens.

        With the gather, the batch is attended in slices of at most ``max_tokens`` gathered
        (padded) tokens.
        """
        if not self.layers or not tables:
            return
        if self.attention == "paged":
            for out in self.paged_outputs(tables, contexts):
                self.sink += out[:, :, 0].sum()
            return
        bt = self.block_tokens
        widths = self._widths(tables)
        start, width = 0, 0
        for i, w in enumerate(widths):
            if i > start and (i - start + 1) * max(width, w) * bt > self.max_tokens:
                self._attend(tables[start:i], contexts[start:i], widths[start:i])
                start, width = i, 0
            width = max(width, w)
        self._attend(tables[start:], contexts[start:], widths[start:])

    def queries(self, batch: int) -> torch.Tensor:
        """The step's query tokens: ``[batch, heads, head_dim]``, one per request."""
        return self._q[:batch, :, 0, :]

    def paged_outputs(self, tables: list[np.ndarray], contexts: list[int]) -> list[torch.Tensor]:
        """Per attended layer, the paged kernel's ``[batch, heads, head_dim]`` float32 output (``attend``'s work)."""
        table, lens = self._table(tables, contexts, self._widths(tables))
        idx = torch.from_numpy(table).to(self.device)
        n = torch.from_numpy(lens.astype(np.int32)).to(self.device)
        q = self.queries(len(tables))
        anchor = int(table[0, 0])
        return [self._paged_decode(q, k, v, idx, n, anchor=anchor) for k, v in self.layers]

    def _widths(self, tables: list[np.ndarray]) -> list[int]:
        """Blocks attended per request: all of them, or the last ``window``."""
        return [len(t) if not self.window else min(self.window, len(t)) for t in tables]

    def _table(self, tables: list[np.ndarray], contexts: list[int], widths: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The batch's block table (each row the blocks attended, padded) and each row's tokens."""
        bt = self.block_tokens
        table = np.empty((len(tables), max(widths)), dtype=np.int64)
        lens = np.empty(len(tables), dtype=np.int64)
        for i, (blocks, w, ctx) in enumerate(zip(tables, widths, contexts)):
            table[i, :w] = blocks[len(blocks) - w:]
            table[i, w:] = blocks[-1]  # padding points at a live block of the request; never attended
            lens[i] = ctx - (len(blocks) - w) * bt
        return table, lens

    def _attend(self, tables: list[np.ndarray], contexts: list[int], widths: list[int]) -> None:
        bt = self.block_tokens
        table, lens = self._table(tables, contexts, widths)
        width = table.shape[1]
        idx = torch.from_numpy(table).to(self.device)
        n_tokens = width * bt
        valid = torch.arange(n_tokens, device=self.device)[None, :] < torch.from_numpy(lens).to(self.device)[:, None]
        mask = valid[:, None, None, :]
        q = self._q[: len(tables)]
        # A CPU has no fast bfloat16 attention (the host driver's runs): it computes in float32.
        compute = torch.float32 if self.device.type == "cpu" else q.dtype
        q = q.to(compute)
        for k_view, v_view in self.layers:
            k = k_view[idx].flatten(1, 2).transpose(1, 2).to(compute)  # [B, heads, tokens, dim]
            v = v_view[idx].flatten(1, 2).transpose(1, 2).to(compute)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            self.sink += out[:, :, 0, 0].float().sum()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def describe_device(device: Any) -> dict[str, Any]:
    """What the run ran on: the GPU's name, memory and UUID, or the CPU; and the host's name."""
    import os
    import platform

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
                            "host": platform.node()}
    if getattr(device, "type", "cpu") == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory=props.total_memory, cuda=torch.version.cuda)
        if getattr(props, "uuid", None) is not None:  # which card: --combine pairs only modes run on one
            uuid = str(props.uuid)
            info["gpu_uuid"] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"  # as nvidia-smi names it
        try:
            import pynvml
        except ImportError:
            info["driver"] = "unknown (no nvidia-ml-py)"
        else:
            try:
                pynvml.nvmlInit()
                info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            except pynvml.NVMLError as exc:  # the figure is informative only
                info["driver"] = f"unknown ({exc})"
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return info
