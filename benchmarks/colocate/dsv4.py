"""The DeepSeek-V4 tenant: an engine whose runtime-owned KV pools are reserved for the whole run.

Two ways to build it (``[dsv4] build`` in the parameters):

- ``sglang``: a real SGLang 0.5.23 DeepSeek-V4 pool on the GPU, built the way
  ``tests/sglang/gpu_footprint.py`` builds it — the real ``KVCacheConfigurator`` with the
  kvpolicy adapter's hooks installed, so the pool is sized from the policy's ``reserve``,
  the reserve is admitted in the ledger (the adapter's own session, engine ``sglang``) and the
  measured per-pool bytes are reported there. No model weights: only the KV pools.
- ``plan``: a stand-in holding the same per-pool bytes ``kvpolicy plan`` gives for the
  reserve (``budget_for_reserve``): it attaches with engine ``sglang``, admits the reserve,
  allocates that many bytes on its device and reports the plan's pools. For machines
  without SGLang or a GPU (CI); the result says ``"build": "plan"``.

``auto`` tries ``sglang`` and falls back to ``plan``, saying why in the result.

Protocol with the driver: ``ready {json}`` on stdout once the pools exist and are in the
ledger; it then holds them until ``stop`` (or end of input) and writes its result JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from params import Params, load_params

REPO = Path(__file__).resolve().parents[2]
TINY_RATIOS = (0, 0, 4, 128, 4, 128, 4, 0)  # 7 target layers + 1 MTP layer, V4-shaped (as tests/sglang)


def geometry(params: Params):
    from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry, load_geometry

    if params.dsv4.geometry == "tiny":
        return ModelGeometry(num_hidden_layers=7, compress_ratios=TINY_RATIOS, max_position_embeddings=65536)
    return load_geometry(params.dsv4.geometry)


def plan_settings(params: Params):
    from kvpolicy.adapters.sglang_dsv4.plan import PlanSettings

    d = params.dsv4
    return PlanSettings(page_size=d.page_size, max_running_requests=d.max_running_requests, swa_ratio=d.swa_ratio)


def policy_reserve(params: Params, policy: Path) -> tuple[int, int]:
    """(reserve bytes, line) of the V4 model in the policy."""
    from kvpolicy.lint.load import load_policy

    settings = load_policy(policy).model_settings(params.dsv4.model)
    if not settings.reserve:
        raise SystemExit(f"dsv4: model {params.dsv4.model!r} has no `reserve` in {policy}")
    return settings.reserve, settings.line


def planned(params: Params, reserve: int):
    """What ``kvpolicy plan`` says SGLang builds for this reserve (closed forms)."""
    from kvpolicy.adapters.sglang_dsv4.plan import budget_for_reserve

    return budget_for_reserve(geometry(params), plan_settings(params), reserve)


def build_sglang(params: Params, policy: Path, ledger_dir: str, device: str = "cuda") -> dict[str, Any]:
    """A real SGLang V4 pool on cuda:0 with the adapter active, admitted and reported through the ledger.

    ``device="cpu"`` builds the same pool in host memory (SGLang's CPU path, as the
    adapter's CPU tests do): it checks this code path where there is no GPU.
    """
    sys.path.append(str(REPO / "tests" / "sglang"))
    import sglang_standins

    sglang_standins.install()
    from types import SimpleNamespace as NS

    import sglang
    import torch
    from kvpolicy.adapters.sglang_dsv4 import hooks
    from kvpolicy.adapters.sglang_dsv4.ports import Reserve
    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        CudaGraphConfig,
        PhaseConfig,
    )
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang_support import build_pool_through_sglang, kv_cache_configurator

    from dataclasses import replace

    from kvpolicy.adapters.settings import AdapterEnv
    from kvpolicy.adapters.sglang_dsv4.ports import default_connector

    reserve, line = policy_reserve(params, policy)
    cuda = device == "cuda"
    if cuda:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    d = params.dsv4
    flags: dict[str, Any] = {"max_running_requests": d.max_running_requests}
    if d.swa_ratio is not None:
        flags["swa_full_tokens_ratio"] = d.swa_ratio
    parallel = get_parallel().override(world_group=NS(cpu_group=None))
    parallel.__enter__()
    args = get_context().override_server_args(
        page_size=d.page_size, kv_cache_dtype="fp8_e4m3", device=device, mem_fraction_static=0.9,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.DISABLED), prefill=PhaseConfig(backend=Backend.DISABLED)),
        **flags,
    )
    server_args = args.install()
    state = hooks.AdapterState(
        reserve_source=lambda model: Reserve(bytes=reserve, model=model, file=str(policy), line=line),
        connect=default_connector(replace(AdapterEnv.from_environ(), ledger_dir=Path(ledger_dir))),
        model_name=d.model,
    )
    hooks.install(state)
    try:
        kvc = kv_cache_configurator(geometry(params), server_args)
        kvc.device = device
        started = time.perf_counter()
        config, sizes, pool = build_pool_through_sglang(kvc, pre_model_load_memory_gb=140.0 if cuda else 80.0)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    except BaseException:
        for entry in state.admitted.values():  # a half-built engine leaves the ledger
            entry.session.close()
        raise
    m = state.measurements[-1]
    entry = state.admitted[kvc.gpu_id]
    return {
        "build": "sglang",
        "sglang": getattr(sglang, "__version__", "unknown"),
        "build_seconds": round(seconds, 3),
        "reserve": reserve,
        "admitted": entry.admitted,
        "pools": {k: {"bytes": f.bytes, "tensor_bytes": f.tensor_bytes} for k, f in m.facts.items()},
        "footprint": m.footprint,
        "tensor_bytes": m.tensor_bytes,
        "cross_check_ok": m.cross_check_ok,
        "_keep": (pool, config, sizes, state, parallel, args),
        "_slot": entry.session.snapshot,
        "_release": entry.session.close,
    }


def build_plan(params: Params, policy: Path, ledger_dir: str, capacity: int, headroom: int, note: str | None) -> dict[str, Any]:
    """Hold the per-pool bytes the closed forms give for the reserve, admitted and reported like the real pool."""
    import torch

    import kvpolicy
    from kvpolicy.facts import PoolFacts

    reserve, _line = policy_reserve(params, policy)
    plan = planned(params, reserve)
    inst = kvpolicy.attach(
        model=params.dsv4.model, gpu=params.device.ledger_id, engine="sglang", id=f"{params.dsv4.model}/0",
        ledger_dir=ledger_dir, capacity=capacity, headroom=headroom, other_used=0,
    )
    admitted = inst.admit_static(plan.total_footprint, reserve=reserve)
    device = "cuda" if params.device.driver == "cuda" else "cpu"
    held = {}
    for name, pool in plan.pools.items():
        if pool.bytes:
            t = torch.empty(pool.bytes, dtype=torch.uint8, device=device)
            t.fill_(1)  # touch it: the bytes are really held
            held[name] = t
    inst.report_pools({
        name: PoolFacts(owner="runtime", bytes=pool.footprint, tensor_bytes=pool.bytes)
        for name, pool in plan.pools.items() if pool.bytes
    })
    return {
        "build": "plan",
        "note": note or "stand-in: holds the per-pool bytes of `kvpolicy plan` for the reserve (no SGLang pool)",
        "reserve": reserve,
        "admitted": admitted,
        "pools": {k: {"bytes": p.footprint, "tensor_bytes": p.bytes} for k, p in plan.pools.items() if p.bytes},
        "footprint": plan.total_footprint,
        "tensor_bytes": plan.total_bytes,
        "_keep": held,
        "_slot": inst.snapshot,
        "_release": inst.detach,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--ledger-dir", required=True)
    ap.add_argument("--capacity", type=int, required=True, help="provisional GPU capacity for the stand-in's admission")
    ap.add_argument("--headroom", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sglang-on-cpu", action="store_true", help="build the real SGLang pool in host memory (tests)")
    args = ap.parse_args()
    params = load_params(args.params)
    policy = Path(args.policy)
    started = time.time()
    built: dict[str, Any]
    device = "cuda" if params.device.driver == "cuda" else "cpu"
    if params.dsv4.build in ("sglang", "auto") and (device == "cuda" or args.sglang_on_cpu):
        try:
            built = build_sglang(params, policy, args.ledger_dir, device)
        except Exception as exc:
            if params.dsv4.build == "sglang":
                raise
            traceback.print_exc()
            why = f"stand-in: the real SGLang pool could not be built here ({type(exc).__name__}: {exc})"
            built = build_plan(params, policy, args.ledger_dir, args.capacity, args.headroom, why[:500])
    elif params.dsv4.build == "sglang":
        raise SystemExit("dsv4: build = 'sglang' needs the cuda driver (a GPU), or --sglang-on-cpu")
    else:
        built = build_plan(params, policy, args.ledger_dir, args.capacity, args.headroom, None)
    slot_now, release = built.pop("_slot"), built.pop("_release")
    keep = built.pop("_keep")
    plan = planned(params, built["reserve"])
    built["plan"] = {"footprint": plan.total_footprint, "tensor_bytes": plan.total_bytes, "tokens": plan.tokens.model_dump()}
    slot = slot_now()
    built["ledger_runtime_reserved"] = slot.runtime_reserved
    built["setup_s"] = round(time.time() - started, 3)
    print("ready " + json.dumps({"runtime_reserved": slot.runtime_reserved, "build": built["build"]}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    built["ledger_runtime_reserved_at_end"] = slot_now().runtime_reserved
    Path(args.out).write_text(json.dumps(built))
    del keep
    release()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
