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

With ``build = "sglang"`` and a policy that marks the V4 model's ``pool swa { owner elastic }``
the pools are built through the adapter's hooks as SGLang's start-up builds them, allocator
included: the SWA pool is an ``ElasticSWA`` under the engine's elastic ledger session, the
other pools runtime-owned in the reserve. Given a ``[dsv4.trace]`` it then serves that trace
through SGLang's own ``SWATokenToKVPoolAllocator`` (``dsv4_serve.py``) and reports what it
served and what the SWA pool mapped (``"serve"`` in the result). The ``plan`` stand-in has no
allocator: it holds the runtime-owned plan whatever the policy says of the SWA pool.

Protocol with the driver: ``ready {json}`` on stdout once the pools exist and are in the
ledger (the instance id and the SWA pool's owner in it); ``go T`` starts the trace at
wall-clock time ``T`` if it serves one (``served {json}`` when done, idle rounds included);
it holds the pools until ``stop`` (or end of input) and writes its result JSON. A ``stop``
during the trace ends it on the wall clock; on the steps clock the trace is served to its
end first, so that a slow machine serves the same trace.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
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
    from kvpolicy.policy.resolve import model_settings

    settings = model_settings(load_policy(policy), params.dsv4.model)
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
    from kvpolicy.adapters.sglang_dsv4.ports import default_connector, policy_reserve as reserve_of

    reserve, line = policy_reserve(params, policy)
    env = replace(AdapterEnv.from_environ(), ledger_dir=Path(ledger_dir), policy=policy)
    elastic = reserve_of(env)(params.dsv4.model).swa_elastic  # `pool swa { owner elastic }`
    cuda = device == "cuda"
    if cuda:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    d = params.dsv4
    flags: dict[str, Any] = {"max_running_requests": d.max_running_requests}
    if d.swa_ratio is not None:
        flags.update(swa_full_tokens_ratio=d.swa_ratio, _swa_full_tokens_ratio_explicitly_set=True)  # as --swa-full-tokens-ratio
    parallel = get_parallel().override(world_group=NS(cpu_group=None))
    parallel.__enter__()
    args = get_context().override_server_args(
        page_size=d.page_size, kv_cache_dtype="fp8_e4m3", device=device, mem_fraction_static=0.9,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.DISABLED), prefill=PhaseConfig(backend=Backend.DISABLED)),
        **flags,
    )
    server_args = args.install()
    state = hooks.AdapterState(
        reserve_source=reserve_of(env) if elastic else
        lambda model: Reserve(bytes=reserve, model=model, file=str(policy), line=line),
        connect=default_connector(env),
        model_name=d.model,
    )
    hooks.install(state)
    try:
        kvc = kv_cache_configurator(geometry(params), server_args)
        kvc.device = device
        started = time.perf_counter()
        pre_gb = 140.0 if cuda else 80.0
        if elastic:  # as KVCacheConfigurator.configure does, through _init_pools: the allocator hook binds the pool
            config = kvc._resolve_memory_pool_config(pre_gb)
            sizes = kvc._derive_pool_sizes(config=config)
            pools = kvc._init_pools(sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)
            pool = pools.token_to_kv_pool
        else:
            config, sizes, pool = build_pool_through_sglang(kvc, pre_model_load_memory_gb=pre_gb)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    except BaseException:
        for _pool, swa in state.elastic_pools:
            swa.close()
        for entry in state.admitted.values():  # a half-built engine leaves the ledger
            entry.session.close()
        raise
    m = state.measurements[-1]
    entry = state.admitted[kvc.gpu_id]
    served: dict[str, Any] = {}
    if elastic:
        ((_pool, swa),) = state.elastic_pools
        assert entry.elastic is not None
        served = {"_serve": (pools.token_to_kv_pool_allocator, swa, kvc.sliding_window_size),
                  "swa_elastic": {k: v.model_dump() for k, v in swa.facts().items()},
                  "elastic_plan": entry.elastic.model_dump()}

    def release() -> None:
        for _pool, swa in state.elastic_pools:
            swa.close()  # unmaps what it holds (its driver's memory)
        entry.session.close()

    return {
        **served,
        "instance": entry.identity.instance_id,
        "swa_owner": "elastic" if elastic else "runtime",
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
        "_release": release,
    }


def offer_figures(params: Params, ledger_dir: str, capacity: int, headroom: int) -> Any:
    """On a CPU there is no GPU for SGLang's pools to measure: an instance holding nothing offers the driver's
    provisional figures (``--capacity``, ``--headroom``), as the stand-in's own attach does."""
    import kvpolicy

    return kvpolicy.attach(
        model=f"{params.dsv4.model}-figures", gpu=params.device.ledger_id, id=f"{params.dsv4.model}-figures/0",
        ledger_dir=ledger_dir, capacity=capacity, headroom=headroom, other_used=0, handle_signals=False,
    )


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


def _stdin_lines() -> queue.Queue[str]:
    """The driver's commands (``go T``, ``stop``), read in a thread so that a serving loop can watch for ``stop``;
    the end of input is a ``stop``."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            lines.put(line.strip())
        lines.put("stop")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _serve(params: Params, serve: tuple[Any, Any, int], t0: float, commands: queue.Queue[str], device: str,
           slot_now: Any) -> dict[str, Any]:
    """Serve ``[dsv4] trace`` on the elastic SWA pool from ``t0`` (``dsv4_serve``); the ledger's view at the end."""
    from dsv4_serve import V4Server

    outer, swa, window = serve
    asked = False
    wall = params.engine.clock == "wall"

    def stop() -> bool:
        """On the wall clock a ``stop`` ends the trace (the run's time is up); on the steps clock the trace is
        served to its end first, however slowly this machine serves it (then the ``stop`` is obeyed)."""
        nonlocal asked
        while not asked and not commands.empty():
            asked = commands.get() == "stop"
        return asked and wall

    out = V4Server(params, outer, swa, window, device).serve(t0, stop)
    stopped = stop()
    slot = slot_now()
    out["ledger"] = {"mapped": slot.mapped, "used": slot.used, "limit": slot.limit, "target": slot.target,
                     "guarantee": slot.guarantee, "pool_elastic": swa.elastic_bytes, "pool_used": swa.used_bytes}
    out["stopped"], out["stop_asked"] = stopped, asked
    return out


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
    figures = None
    if device == "cpu" and params.dsv4.sglang_on_cpu and params.dsv4.build != "plan":
        figures = offer_figures(params, args.ledger_dir, args.capacity, args.headroom)
    if params.dsv4.build in ("sglang", "auto") and (device == "cuda" or args.sglang_on_cpu or figures is not None):
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
    serve = built.pop("_serve", None)
    slot = slot_now()
    built["ledger_runtime_reserved"] = slot.runtime_reserved
    built["setup_s"] = round(time.time() - started, 3)
    print("ready " + json.dumps({"runtime_reserved": slot.runtime_reserved, "build": built["build"],
                                 "instance": built.get("instance"), "swa_owner": built.get("swa_owner", "runtime")}),
          flush=True)
    if params.dsv4.trace is not None and serve is None:
        built["serve_note"] = "not served: only a real SGLang pool with `pool swa { owner elastic }` serves the trace"
    commands = _stdin_lines()
    while (line := commands.get()) != "stop":
        if line.startswith("go ") and serve is not None and params.dsv4.trace is not None:
            built["serve"] = _serve(params, serve, float(line.split()[1]), commands, device, slot_now)
            print("served " + json.dumps({k: built["serve"][k] for k in ("requests_done", "unfinished", "refusals")}),
                  flush=True)
            if built["serve"]["stop_asked"]:
                break
    built["ledger_runtime_reserved_at_end"] = slot_now().runtime_reserved
    Path(args.out).write_text(json.dumps(built))
    del keep
    release()
    if figures is not None:
        figures.detach()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
