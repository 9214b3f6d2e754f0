"""The elastic SWA pool's scheduler loop on the GPU, to run under compute-sanitizer; exits 0 when all is well.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 -P tests/sglang/sanitize_swa.py

``--driver host`` runs the same on the CPU (a smoke test of the program itself).

Seeded scheduler runs (admissions with radix-cache reuse, decode past the window, finishes, the limit
moved) on SGLang 0.5.23's real V4 pool with its SWA tensors over CUDA virtual memory, through SGLang's own
SWA allocator: the writes and reads of every page through the views are kernels, so memcheck sees any
access to an unmapped or released chunk. ``run_scheduler`` checks every invariant after each step (pages
mapped, data kept, the limit). Unlike the pytest file, no cuMemGetInfo baseline: the sanitizer's own
device allocations move it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=["cuda", "host"], default="cuda", help="host: a smoke test on the CPU")
    parser.add_argument("--seeds", type=int, default=3, help="seeded runs (default 3)")
    parser.add_argument("--steps", type=int, default=300, help="scheduler steps per run (default 300)")
    args = parser.parse_args(argv)
    sys.path.append(str(ROOT))  # for the tests package, after the installed kvpolicy (python3 -P)
    import torch

    from kvpolicy.alloc import open_driver
    from tests.sglang import sglang_standins
    from tests.sglang.test_sglang_swa_elastic import GROUP, allocator_over, build, run_scheduler, seeded_ops

    sglang_standins.install()
    import sglang.srt.mem_cache.kv_cache_configurator  # noqa: F401  (SGLang's import, before any pool)
    from sglang.version import __version__

    # Markers in the output place whatever the sanitizer reports: at import, or in a run.
    print(f"imported SGLang {__version__}", flush=True)
    refused = unmapped = 0

    device = "cuda" if args.driver == "cuda" else "cpu"
    for seed in range(args.seeds):
        opened = open_driver("cuda", device=torch.cuda.current_device()) if device == "cuda" else None
        with opened or open_driver("host", host_capacity=1 << 30) as driver:
            b = build(__version__, 2 * GROUP, device=device, driver=driver)
            s = run_scheduler(b, allocator_over(b, device=device), seeded_ops(seed, args.steps, limit_every=10),
                              device=device)
            if device == "cuda":
                torch.cuda.synchronize()
            b.swa.close()
            refused, unmapped = refused + s.refused, unmapped + b.swa.mapping.groups_unmapped
            held = (driver.live_handles, driver.mapped_bytes, driver.reserved_bytes)
            print(f"seed {seed} done: {args.steps} steps, {s.refused} refused, "
                  f"{b.swa.mapping.groups_unmapped} chunk groups unmapped; driver after close {held}")
            if held != (0, 0, 0):
                print(f"seed {seed}: the pool left {held} (handles, mapped, reserved bytes) with the driver")
                return 1
    if not (refused and unmapped):
        print("the runs never reached the limit or never gave memory back: they exercised too little")
        return 1
    print(f"ok: {args.seeds} seeded runs of the SWA scheduler loop ({refused} refused, {unmapped} chunk groups unmapped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
