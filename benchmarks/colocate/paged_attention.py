"""Decode attention read in place from the paged KV, as serving engines' decode kernels do.

One query token per request and head; the request's keys and values are read where they
lie, block by block through its block table: no gathered copy of the context, no padding
to the batch's longest request. ``kvwork.KVWork`` uses it on a GPU (``[kv] attention``);
its torch alternative, a paged gather then SDPA, is the reference the tests compare with.

The kernel is flash-decoding without the split: a program per (request, head) walks the
request's tokens ``TOKENS`` at a time with an online softmax, in float32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["anchor"])  # one compiled kernel, whatever the block
def _decode(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, anchor,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_tb, stride_ob, stride_oh,
    scale,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, TOKENS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(lens_ptr + b)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, TOKENS)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d).to(tl.float32)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, n, TOKENS):
        tok = start + t
        valid = tok < n
        block = tl.load(table_ptr + b * stride_tb + tok // BLOCK, mask=valid, other=anchor).to(tl.int64) - anchor
        row = block * stride_kb + (tok % BLOCK) * stride_kt + h * stride_kh
        k = tl.load(k_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        total = total * alpha + tl.sum(p, 0)
        m = m_new
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, acc / total)


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                 *, anchor: int, tokens_per_iteration: int = 64) -> torch.Tensor:
    """Attention of ``q`` ``[batch, heads, head_dim]`` over each request's first ``lens[i]`` tokens.

    ``k``, ``v``: ``[num_blocks, block_size, heads, head_dim]`` views with the same strides and
    a contiguous last dimension (``kvpolicy.alloc.tensors.kv_view``); ``table``: ``[batch,
    width]`` block ids, row ``i`` holding request ``i``'s blocks in order; ``lens`` ≥ 1.
    ``anchor``: a block in the table (so mapped). The kernel's K and V arguments point at
    it, not at block 0: Triton refuses a pointer argument the driver does not know as
    device memory, and an elastic pool's first chunk may be unmapped.
    Returns ``[batch, heads, head_dim]`` float32.
    """
    batch, heads, head_dim = q.shape
    if k.stride() != v.stride() or k.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError(f"K {k.stride()} and V {v.stride()} need the same strides and a contiguous head dimension")
    if k.shape[2] != heads or k.shape[3] != head_dim:
        raise ValueError(f"q has {heads} heads of {head_dim}, the KV {k.shape[2]} of {k.shape[3]}")
    block = k.shape[1]
    out = torch.empty((batch, heads, head_dim), dtype=torch.float32, device=q.device)
    _decode[(batch, heads)](
        q, k[anchor], v[anchor], table, lens, out, anchor,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        table.stride(0), out.stride(0), out.stride(1),
        1.0 / math.sqrt(head_dim),
        BLOCK=block, HEAD_DIM=head_dim, TOKENS=max(tokens_per_iteration, block),
    )
    return out


__all__ = ["paged_decode"]
