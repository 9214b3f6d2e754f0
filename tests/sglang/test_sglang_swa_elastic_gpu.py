"""On a CUDA GPU (the H200): the elastic SWA pool's scheduler loop over the cuda-python driver.

The same synthetic scheduler as the CPU tests, with SGLang's pools, allocator and index
tensors on the GPU and the SWA tensors over CUDA virtual memory: every page handed out
is mapped, the data written through the views survives, the limit holds, and at the end
cuMemGetInfo is back to what it was before the pool existed (the compressed pools freed
by torch's caching allocator, the SWA chunks unmapped and released). Two ways in: the
pool built directly (a ``StaticLimit``), and the start-up wiring — the real hooks, the
real ledger, SGLang's ``_init_pools`` on ``cuda`` (the hooks open the CUDA driver
themselves). For the memcheck, run this file under ``compute-sanitizer --tool memcheck``.
"""

from __future__ import annotations

import gc
import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sglang.test_sglang_swa_elastic import GROUP, OPS, STEPS, allocator_over, build, run_scheduler
from tests.sglang.test_sglang_swa_wiring import engine, serve_then_idle  # noqa: F401 - engine is a fixture

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("cuda") is None:
        return False
    import torch

    return torch.cuda.is_available()


_warmed_up = False
WARM_UP_OPS = [("admit", 700), ("decode", 300), ("limit", 0), ("finish", 0, True), ("admit", 256), ("limit", 3),
               ("admit", 600), ("decode", 40), ("finish", 1, False), ("finish", 0, False)]
"""Every kind of step the examples take (growth, decode past the window, a lowered and a raised limit,
a radix-cache hit, give-back), so that every kernel they launch is loaded before a baseline is taken."""


def warm_up(sglang_env) -> None:
    """Run the loop once before any baseline is taken: the first run on a process loads CUDA modules and
    kernels lazily, which hold device memory for good and would read as a leak of the first example."""
    global _warmed_up
    if _warmed_up:
        return
    import torch

    from kvpolicy.alloc import open_driver

    with open_driver("cuda", device=torch.cuda.current_device()) as driver:
        b = build(sglang_env, GROUP, device="cuda", driver=driver)
        run_scheduler(b, allocator_over(b, device="cuda"), WARM_UP_OPS, device="cuda")
        torch.cuda.synchronize()
        b.swa.close()
    _warmed_up = True


def released(driver) -> None:
    """Everything the pool took from ``driver`` is given back (the driver's own counts), then the driver
    closes (its zeroing stream too, which holds device memory of its own)."""
    assert (driver.live_handles, driver.mapped_bytes, driver.reserved_bytes) == (0, 0, 0)
    driver.close()


def free_bytes() -> int:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and cuda-python")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=STEPS), first_limit=st.integers(0, 3))
def test_the_scheduler_loop_on_cuda_virtual_memory(sglang_env, ops, first_limit):
    import torch

    from kvpolicy.alloc import open_driver

    warm_up(sglang_env)
    baseline = free_bytes()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    driver = open_driver("cuda", device=torch.cuda.current_device())
    b = build(sglang_env, (1 + first_limit) * GROUP, device="cuda", driver=driver)
    assert b.pool.swa_kv_pool.kv_buffer[0].is_cuda
    assert b.swa.held_bytes == GROUP  # idle: the pinned chunk group only
    outer = allocator_over(b, device="cuda")
    run_scheduler(b, outer, ops, device="cuda")
    torch.cuda.synchronize()
    b.swa.close()
    released(driver)
    del outer, b
    after = free_bytes()
    assert after == baseline, (
        f"free {baseline} -> {after}; torch allocated {allocated} -> {torch.cuda.memory_allocated()}, "
        f"reserved {reserved} -> {torch.cuda.memory_reserved()}"
    )


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and cuda-python")
def test_the_start_up_wiring_on_cuda_virtual_memory(sglang_env, engine, ledger_dir):  # noqa: F811 - fixtures
    import torch

    warm_up(sglang_env)
    baseline, reserved = free_bytes(), torch.cuda.memory_reserved()
    state, pools = serve_then_idle(engine, ledger_dir, device="cuda")
    (pool, swa), = state.elastic_pools
    assert swa.driver.kind == "cuda" and pool.swa_kv_pool.kv_buffer[0].is_cuda
    torch.cuda.synchronize()
    swa.close()
    released(swa.driver)
    state.elastic_pools.clear()
    del pool, pools, swa
    # The fixture keeps SGLang's allocator (small index tensors, torch's) alive until its teardown: what
    # torch's caching allocator still holds for live tensors is torch's, the rest must be back.
    after = free_bytes()
    torch_held = torch.cuda.memory_reserved() - reserved
    assert after + torch_held == baseline, f"free {baseline} -> {after}; torch holds {torch_held} B more than before"
