"""Build real DeepSeek-V4 pools on a CUDA GPU with the adapter active; compare footprints.

For each case: the adapter's reported footprint (the caching-allocator model over
the live pool's tensors) against what the GPU lost — the ``cuMemGetInfo`` drop —
and against ``torch.cuda.memory_reserved()``. Writes ``sglang_gpu.json`` under
``$OUT`` (or the current directory) and exits 1 if a figure is off.

Run from the repository root on a GPU host (see docs/sglang.md):
    python tests/sglang/gpu_footprint.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script: the repository root, for the tests package; appended, so that where kvpolicy is installed
# (the GPU machine installs it from a wheel, adapters inside) the source tree's kvpolicy/ (no adapters/) does not shadow it.
if str(HERE.parents[1]) not in sys.path:
    sys.path.append(str(HERE.parents[1]))

from tests.sglang import sglang_standins  # noqa: E402 - after the repository root is on sys.path

SEGMENT = 2 << 20


def free_bytes() -> int:
    """Free device memory from the driver (cuMemGetInfo), falling back to torch's cudaMemGetInfo."""
    try:
        from cuda.bindings import driver

        err, free, _total = driver.cuMemGetInfo()
        if int(err) == 0:
            return int(free)
    except ImportError:
        pass
    import torch

    return int(torch.cuda.mem_get_info()[0])


def run_cases() -> list[dict]:
    sglang_standins.install()
    import torch
    from types import SimpleNamespace as NS

    from kvpolicy.adapters.sglang_dsv4 import hooks
    from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry, load_geometry
    from kvpolicy.adapters.sglang_dsv4.ports import Reserve
    from kvpolicy.units import GiB, MiB
    from kvpolicy.runtime.gpus import gpu_id
    from tests.support.ledgers import SharedLedger
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context, get_parallel
    from tests.sglang.sglang_support import MODELS, TINY_RATIOS, build_pool_through_sglang, kv_cache_configurator

    torch.zeros(1, device="cuda")  # the CUDA context and allocator exist before any baseline
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    tiny = ModelGeometry(num_hidden_layers=7, compress_ratios=TINY_RATIOS, max_position_embeddings=65536)
    flash = load_geometry(MODELS / "deepseek-v4-flash.json")
    cases = [
        ("tiny", tiny, 64 * MiB, dict(max_running_requests=8)),
        ("flash-8GiB", flash, 8 * GiB, dict(max_running_requests=64, swa_full_tokens_ratio=0.1)),
        ("flash-32GiB", flash, 32 * GiB, dict(max_running_requests=256, swa_full_tokens_ratio=0.1)),
    ]
    results = []
    parallel = get_parallel().override(world_group=NS(cpu_group=None))
    parallel.__enter__()
    try:
        for name, geometry, reserve, flags in cases:
            args = get_context().override_server_args(
                page_size=256, kv_cache_dtype="fp8_e4m3", device="cuda", mem_fraction_static=0.9,
                cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.DISABLED),
                                                  prefill=PhaseConfig(backend=Backend.DISABLED)),
                **flags,
            )
            server_args = args.install()
            gpu = gpu_id(0)  # the ledger's key for cuda:0, as the hook names it: its UUID where NVML is
            ledger = SharedLedger(Path(tempfile.mkdtemp(prefix="kvpolicy-footprint-")), {gpu: 120 * GiB})
            state = hooks.AdapterState(
                reserve_source=lambda model, r=reserve: Reserve(bytes=r, model=model, file="gpu", line=1),
                connect=ledger.connect, model_name=name,
            )
            hooks.install(state)
            try:
                kvc = kv_cache_configurator(geometry, server_args)
                kvc.device = "cuda"
                torch.cuda.synchronize()
                free0, reserved0 = free_bytes(), torch.cuda.memory_reserved()
                t0 = time.perf_counter()
                _config, _sizes, pool = build_pool_through_sglang(kvc, pre_model_load_memory_gb=140.0)
                torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
                free1, reserved1 = free_bytes(), torch.cuda.memory_reserved()
                m = state.measurements[-1]
                # The measurement covers the request-to-token table build_pool_through_sglang
                # allocates first (as SGLang does) and the V4 pool.
                results.append({
                    "case": name,
                    "reserve": reserve,
                    "tensors": len(m.tensors),
                    "tensor_bytes": m.tensor_bytes,
                    "footprint": m.footprint,
                    "per_pool": {k: {"bytes": f.tensor_bytes, "footprint": f.bytes} for k, f in m.facts.items()},
                    "cuMemGetInfo_drop": free0 - free1,
                    "torch_reserved_delta": reserved1 - reserved0,
                    "build_seconds": round(seconds, 3),
                    "cross_check_ok": m.cross_check_ok,
                    "ledger_held": ledger.held(gpu),
                })
                del pool, _config, _sizes
                state.measurements.clear()
            finally:
                hooks.uninstall()
                args.restore()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    finally:
        parallel.__exit__(None, None, None)
    return results


def problems(result: dict) -> list[str]:
    """What is off in one case: the model must match the allocator within one small segment."""
    out = []
    fp, reserved, drop = result["footprint"], result["torch_reserved_delta"], result["cuMemGetInfo_drop"]
    if not 0 <= reserved - fp <= SEGMENT:
        out.append(f"torch reserved grew by {reserved}, the adapter's footprint is {fp}")
    if abs(drop - reserved) > SEGMENT:
        out.append(f"cuMemGetInfo dropped by {drop}, torch reserved grew by {reserved}")
    if fp > result["reserve"]:
        out.append(f"footprint {fp} exceeds the reserve {result['reserve']}")
    if not result["cross_check_ok"]:
        out.append("the pool's own enumerations disagree with the adapter's tensor bytes")
    return out


def main() -> int:
    results = run_cases()
    out_dir = Path(os.environ.get("OUT") or ".")
    (out_dir / "sglang_gpu.json").write_text(json.dumps(results, indent=2))
    bad = 0
    for r in results:
        issues = problems(r)
        bad += bool(issues)
        print(
            f"{r['case']:<12} tensors {r['tensor_bytes']:>15,}  footprint {r['footprint']:>15,}  "
            f"reserved Δ {r['torch_reserved_delta']:>15,}  cuMemGetInfo Δ {r['cuMemGetInfo_drop']:>15,}  "
            f"{r['build_seconds']}s  {'OK' if not issues else '; '.join(issues)}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
