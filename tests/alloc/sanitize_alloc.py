"""A small grow / use / shrink program to run under compute-sanitizer; exits 0 when all is well.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/alloc/sanitize_alloc.py

It maps chunks into a block pool, writes and reads every allocated block through
torch views (kernels touching only mapped memory), frees most of them, releases the freed
chunks, checks the survivors, and closes. Memcheck reports any kernel access to an
unmapped chunk and any driver-API error. ``--driver host`` runs the same on the CPU
(a smoke test of the program itself).
"""

from __future__ import annotations

import argparse
import sys

import torch

from kvpolicy.alloc import BlockPool, KVCacheLayout, StaticLimit, open_driver
from kvpolicy.alloc.tensors import kv_views
from kvpolicy.units import GiB, MiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=["cuda", "host"], default="cuda")
    args = parser.parse_args(argv)
    driver = open_driver(args.driver, host_capacity=4 * GiB)
    cuda = driver.kind == "cuda"
    layout = KVCacheLayout(num_layers=4, block_size=16, num_heads=8, head_dim=128, dtype="bfloat16")
    pool = BlockPool(driver, layout, 4096, chunk=2 * MiB, limit=StaticLimit(1 * GiB))
    views = kv_views(pool)
    device = views[0]["k"].device
    kept: dict[int, float] = {}
    for round_ in range(3):
        ids = pool.alloc(300)  # grows: ~5 chunks in each of the 8 arenas
        index = torch.tensor(ids, device=device)
        for layer, parts in enumerate(views):
            for j, part in enumerate(layout.parts):
                parts[part][index] = float(round_ * 100 + layer * 2 + j)
        if cuda:
            torch.cuda.synchronize()
        for layer, parts in enumerate(views):
            for j, part in enumerate(layout.parts):
                if not torch.all(parts[part][index] == round_ * 100 + layer * 2 + j):
                    print(f"round {round_}: layer {layer} {part} does not read back what was written")
                    return 1
        pool.free(ids[100:])  # the chunks holding only these become fully free...
        released = pool.shrink(0)  # ...and go back to the GPU
        kept.update({b: float(round_ * 100) for b in ids[:100]})
        print(f"round {round_}: {pool.stats().mapped_chunks} chunks mapped, released {released // MiB} MiB")
    survivors = torch.tensor(sorted(kept), device=device)
    expected = torch.tensor([kept[b] for b in sorted(kept)], device=device, dtype=torch.bfloat16)
    got = views[0]["k"][survivors][:, 0, 0, 0]
    if cuda:
        torch.cuda.synchronize()
    if not torch.equal(got, expected):
        print("blocks kept across shrinks lost their data")
        return 1
    del views, survivors, expected, got, index
    pool.free(sorted(kept))
    pool.close()
    driver.close()
    print("ok: grow, use and shrink clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
