"""The real GPU: the host simulation checked against it, no leak over many cycles, out of memory.

Run with ``pytest -m gpu tests/alloc`` on a machine with a CUDA GPU; skipped elsewhere.
(The leak test also runs on the host driver, with fewer cycles.)
"""

from __future__ import annotations

import pytest
from tests.alloc.alloc_support import check_pool, cuda_driver, make_driver, resources

from kvpolicy.alloc import BlockPool, BlockSpec, DriverError, HostDriver, OutOfBlocks, StaticLimit
from kvpolicy.units import GiB, MiB, format_bytes

CHUNK = 2 * MiB


def observe_semantics(d) -> dict[str, object]:
    """What a driver does in a fixed script of legal and illegal calls: 'ok' or the CUDA error name."""

    def outcome(fn) -> str:
        try:
            fn()
        except DriverError as exc:
            return exc.error
        return "ok"

    g = d.granularity
    free0, total = d.mem_info()
    seen: dict[str, object] = {"granularity": g}
    va = d.reserve(4 * g)
    h1, h2 = d.create(g), d.create(g)
    seen["map"] = outcome(lambda: d.map(va, g, h1))
    seen["map over a mapped range"] = outcome(lambda: d.map(va, g, h2))
    seen["map at an address off the granularity"] = outcome(lambda: d.map(va + g + g // 2, g, h2))
    seen["set access"] = outcome(lambda: d.set_access(va, g))
    seen["set access on an unmapped range"] = outcome(lambda: d.set_access(va + g, g))
    seen["unmap an unmapped range"] = outcome(lambda: d.unmap(va + 2 * g, g))
    seen["create half a granule"] = outcome(lambda: d.release(d.create(g // 2)))
    over = (total // g + 1) * g
    seen["create more than the device has"] = outcome(lambda: d.release(d.create(over)))
    seen["release while mapped"] = outcome(lambda: d.release(h1))
    seen["unmap"] = outcome(lambda: d.unmap(va, g))
    seen["unmap twice"] = outcome(lambda: d.unmap(va, g))
    d.release(h2)
    d.free_address(va, 4 * g)
    free1, _ = d.mem_info()
    seen["memory back after all"] = free1 >= free0 - g // 2
    return seen


@pytest.mark.gpu
def test_host_driver_matches_the_cuda_driver():
    cuda = cuda_driver()
    _, total = cuda.mem_info()
    before = resources(cuda)
    real = observe_semantics(cuda)
    assert resources(cuda) == before
    with HostDriver(capacity=total, granularity=cuda.granularity) as host:
        simulated = observe_semantics(host)
    print(f"CUDA driver on {cuda.name}: {real}")
    assert simulated == real, f"host simulation differs from {cuda.name}:\n host: {simulated}\n cuda: {real}"


@pytest.mark.parametrize(("kind", "cycles"), [("host", 2_000), pytest.param("cuda", 10_000, marks=pytest.mark.gpu)])
def test_no_leak_after_many_grow_shrink_cycles(kind, cycles):
    d = make_driver(kind)
    base = resources(d)
    limit = StaticLimit(1 * GiB)
    pool = BlockPool(d, BlockSpec(CHUNK // 8, num_arenas=2), 4096, chunk=CHUNK, limit=limit)
    pool.free(pool.alloc(8))  # warm up: first-touch costs (page tables) are not leaks
    pool.shrink(0)
    free0, _ = d.mem_info()
    for i in range(cycles):
        ids = pool.alloc(8 + i % 3 * 8)  # 1 to 3 chunk groups
        pool.free(ids)
        assert pool.shrink(0) > 0
    free1, _ = d.mem_info()
    calls = pool.arenas[0].calls
    assert calls.create == calls.release and calls.map == calls.unmap >= cycles
    pool.close()
    assert resources(d) == base and limit.mapped == 0
    # A leaked handle would cost at least one chunk; allow less than that for driver bookkeeping.
    assert free1 >= free0 - CHUNK // 2, f"free memory fell by {format_bytes(free0 - free1)} over {cycles} cycles"
    if kind == "host":
        d.close()


@pytest.mark.gpu
def test_real_out_of_memory_is_rolled_back():
    d = cuda_driver()
    base = resources(d)
    free0, total = d.mem_info()
    chunk = 2 * GiB
    limit = StaticLimit(4 * total)
    pool = BlockPool(d, BlockSpec(chunk), total // chunk + 4, chunk=chunk, limit=limit)
    grown = 0
    with pytest.raises(OutOfBlocks) as err:
        while True:
            pool.alloc(1)
            grown += 1
    assert err.value.reason == "device", err.value
    assert 0 < grown * chunk <= free0 and pool.held_bytes == grown * chunk
    check_pool(pool, limit, d, base)
    pool.close()
    free1, _ = d.mem_info()
    assert resources(d) == base and free1 >= free0 - CHUNK, f"{format_bytes(free0 - free1)} not returned"
