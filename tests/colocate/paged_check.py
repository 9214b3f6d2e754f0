"""Checks of the co-location tenants' paged decode kernel against the paged gather + SDPA it replaced.

Both read a real block pool's per-layer views (block-major: a block's layers side by side).
Imported by ``test_paged_attention`` for the GPU, and run as a script under the Triton
interpreter for the CPU (``TRITON_INTERPRET=1`` must be set before Triton is first
imported, so the CPU checks run in a process of their own): it prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "colocate"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from kvwork import KVWork  # noqa: E402 - after the benchmark's folder is on sys.path

from kvpolicy.alloc import BlockPool, StaticLimit, open_driver  # noqa: E402 - after the benchmark's folder is on sys.path
from kvpolicy.alloc.layout import KVCacheLayout  # noqa: E402 - after the benchmark's folder is on sys.path

LAYOUT = KVCacheLayout(num_layers=3, block_size=16, num_heads=8, head_dim=128, dtype="bfloat16", order="block_major")
BLOCKS = 96
CONTEXTS = [1, 16, 17, 64, 200, 333]
"""One token; a block exactly; one past it; several of the kernel's 64-token steps, ragged."""


def make_pool(kind: str) -> BlockPool:
    driver = open_driver(kind, device=0) if kind == "cuda" else open_driver("host", host_capacity=512 << 20)
    return BlockPool(driver, LAYOUT, BLOCKS, chunk=2 << 20, limit=StaticLimit(BLOCKS * LAYOUT.block_bytes), name="attn")


def fill_batch(work: KVWork, contexts: list[int], seed: int) -> list[np.ndarray]:
    """Random KV in every block the batch uses; each request's own blocks, in a shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    bt = LAYOUT.block_size
    need = [-(-c // bt) for c in contexts]
    ids = work.pool.alloc(sum(need))
    ids = [ids[i] for i in torch.randperm(len(ids), generator=gen).tolist()]
    for k_view, v_view in work.layers:
        for view in (k_view, v_view):
            view[ids] = torch.randn((len(ids), *view.shape[1:]), generator=gen).to(view.device, view.dtype)
    tables, start = [], 0
    for n in need:
        tables.append(np.array(ids[start : start + n], dtype=np.int64))
        start += n
    return tables


def reference(work: KVWork, layer: int, tables: list[np.ndarray], contexts: list[int]) -> torch.Tensor:
    """Per request: its attended blocks (all, or the last ``work.window``) gathered, cut to its
    tokens, SDPA in float32 — written out here, not through ``KVWork``'s own block table."""
    k_view, v_view = work.layers[layer]
    q = work.queries(len(tables))
    bt = LAYOUT.block_size
    out = []
    for i, (blocks, context) in enumerate(zip(tables, contexts)):
        skipped = max(0, len(blocks) - work.window) if work.window else 0
        ids = torch.from_numpy(blocks[skipped:]).to(work.device)
        n = context - skipped * bt
        k = k_view[ids].flatten(0, 1)[:n].float().transpose(0, 1)  # [heads, tokens, dim]
        v = v_view[ids].flatten(0, 1)[:n].float().transpose(0, 1)
        out.append(torch.nn.functional.scaled_dot_product_attention(q[i].float()[:, None, :], k, v)[:, 0])
    return torch.stack(out)


def worst_error(work: KVWork, contexts: list[int], seed: int) -> float:
    """The largest difference, over the batch and ``work``'s layers, between the kernel and the reference."""
    tables = fill_batch(work, contexts, seed)
    outputs = work.paged_outputs(tables, contexts)
    worst = max((got - reference(work, layer, tables, contexts)).abs().max().item() for layer, got in enumerate(outputs))
    work.pool.free([int(b) for t in tables for b in t])
    return worst


def changed_by_poison(work: KVWork) -> list[float]:
    """Per request of three, how much its output moves when one token of request 1's V changes."""
    contexts = [40, 40, 40]
    tables = fill_batch(work, contexts, seed=2)
    (before,) = work.paged_outputs(tables, contexts)
    work.layers[0][1][int(tables[1][1]), 3] += 50.0  # token 19 of request 1, every head
    (after,) = work.paged_outputs(tables, contexts)
    work.pool.free([int(b) for t in tables for b in t])
    return (after - before).abs().amax(dim=(1, 2)).tolist()


def far_blocks_only(kind: str) -> float:
    """The kernel on blocks of the pool's last chunks, its first chunk never mapped (an elastic pool's
    memory comes and goes): the worst difference from the reference."""
    pool = make_pool(kind)
    try:
        per_chunk = max(1, (2 << 20) // LAYOUT.block_bytes)
        ids = list(range(BLOCKS - 4 * per_chunk, BLOCKS))
        pool.ensure_mapped(ids)
        assert not pool.is_chunk_mapped(0), "block 0 should lie in an unmapped chunk"
        pool.claim(ids)
        pool.free(ids)
        work = KVWork(pool, attn_layers=1, max_batch=8, window=0, attention="paged")
        # alloc hands out the lowest free blocks that are mapped: the far ones.
        worst = worst_error(work, [40, 70, 9], seed=6)
        del work
        return worst
    finally:
        pool.close()


def run(kind: str) -> dict[str, object]:
    pool = make_pool(kind)
    if kind == "host":
        # Triton's interpreter copies a tensor's whole storage, here the pool's reservation: all of it
        # must be readable. (The compiled kernel reads only the blocks in the tables.)
        pool.ensure_mapped(range(pool.num_blocks))
    try:
        results: dict[str, object] = {}
        for window in (0, 2):
            work = KVWork(pool, attn_layers=2, max_batch=8, window=window, attention="paged")
            results[f"window={window}"] = worst_error(work, CONTEXTS, seed=1 + window)
            del work
        work = KVWork(pool, attn_layers=1, max_batch=8, window=0, attention="paged")
        results["poisoned"] = changed_by_poison(work)
        del work
        return results
    finally:
        pool.close()


if __name__ == "__main__":
    print(json.dumps(run("host")))
