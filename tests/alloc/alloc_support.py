"""Shared pieces of the allocator tests: drivers, a limit source that records, and a full consistency check."""

from __future__ import annotations

import pytest

from kvpolicy.alloc import BlockPool, CudaDriver, Driver, DriverUnavailable, HostDriver, StaticLimit
from kvpolicy.alloc.limits import AckStatus
from kvpolicy.units import GiB

# Every test that takes a driver runs on the host simulation; on a machine without a
# GPU also through the CudaDriver code over simulated bindings ("simcuda", see
# simulated_cuda.py); and on the real GPU when there is one (``pytest -m gpu`` runs
# only the GPU part).
DRIVER_KINDS = ["host", "simcuda", pytest.param("cuda", marks=pytest.mark.gpu)]

_cuda: CudaDriver | None = None
_cuda_missing: str | None = None


def cuda_driver() -> CudaDriver:
    """The process's one CudaDriver on device 0, or a skip saying why there is none."""
    global _cuda, _cuda_missing
    if _cuda is None and _cuda_missing is None:
        try:
            _cuda = CudaDriver(0)
        except DriverUnavailable as exc:
            _cuda_missing = str(exc)
    if _cuda is None:
        pytest.skip(f"no usable CUDA GPU: {_cuda_missing}")
    return _cuda


def make_driver(kind: str, host_capacity: int = 4 * GiB) -> Driver:
    """A fresh host driver, a fresh CudaDriver over simulated bindings, or the process's real CudaDriver."""
    if kind == "host":
        return HostDriver(capacity=host_capacity)
    if kind == "simcuda":
        from tests.alloc.simulated_cuda import simulated_cuda_driver

        d = simulated_cuda_driver(host_capacity)
        if d is None:
            pytest.skip("cuda-python is missing, or a real CUDA driver is here (the real tests run)")
        return d
    return cuda_driver()


def close_driver(driver: Driver) -> None:
    """Close a driver made by make_driver for one test (the real GPU's driver stays for the session)."""
    if isinstance(driver, HostDriver):
        driver.close()
    elif hasattr(driver, "simulation"):
        driver.close()
        driver.simulation.close()


def resources(driver: Driver) -> tuple[int, int, int]:
    """What the driver holds now: live handles, mapped bytes, reserved bytes."""
    return driver.live_handles, driver.mapped_bytes, driver.reserved_bytes


class RecordingLimit(StaticLimit):
    """A StaticLimit that logs every protocol call, and can be told to refuse admission."""

    def __init__(self, limit: int, target: int | None = None, guarantee: int = 0) -> None:
        super().__init__(limit, target, guarantee)
        self.log: list[tuple[str, object]] = []
        self.refuse = False

    def read(self):  # type: ignore[no-untyped-def]
        self.log.append(("read", None))
        return super().read()

    def admit(self, nbytes: int) -> bool:
        self.log.append(("admit", nbytes))
        if self.refuse:
            return False
        return super().admit(nbytes)

    def commit(self, nbytes: int) -> None:
        self.log.append(("commit", nbytes))
        super().commit(nbytes)

    def rollback(self, nbytes: int) -> None:
        self.log.append(("rollback", nbytes))
        super().rollback(nbytes)

    def release(self, nbytes: int) -> None:
        self.log.append(("release", nbytes))
        super().release(nbytes)

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        self.log.append(("report", (used, mapped)))
        super().report(used, mapped, waiting)
        self.reported = (used, mapped)

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        self.log.append(("ack", (revision, status)))
        super().acknowledge(revision, status)

    def calls(self, name: str) -> list[object]:
        return [arg for call, arg in self.log if call == name]


def check_pool(
    pool: BlockPool, limit: StaticLimit, driver: Driver, base: tuple[int, int, int], *, after_failure: bool = False
) -> None:
    """Recompute everything the pool keeps incrementally, from scratch, and compare.

    ``after_failure``: a driver call failed since the last successful ``sync``, so a
    deferral may still have memory it could not give back (a handle whose release
    failed); everything else must hold regardless.
    """
    nb, nc = pool.num_blocks, pool.num_chunks
    live = [b for b in range(nb) if pool.is_live(b)]
    assert pool.live_blocks == len(live)
    touching = [0] * nc
    for b in live:
        for c in pool.chunks_of_block(b):
            touching[c] += 1
            assert pool.is_chunk_mapped(c), f"live block {b} is in unmapped chunk {c}"
            for arena in pool.arenas:
                assert arena.is_mapped(c), f"live block {b} is in chunk {c}, unmapped in arena {arena.name}"
    for c in range(nc):
        if pool.is_chunk_mapped(c):
            assert all(a.is_mapped(c) for a in pool.arenas), f"chunk {c} is mapped for the pool but not in every arena"
    allocatable = sum(
        1 for b in range(nb) if not pool.is_live(b) and all(pool.is_chunk_mapped(c) for c in pool.chunks_of_block(b))
    )
    assert pool.free_blocks == allocatable
    assert all(pool.is_chunk_mapped(c) for c in range(pool.mapping.low_unmapped)), "growth would skip an unmapped chunk"
    fully_free = [c for c in range(nc) if pool.is_chunk_mapped(c) and touching[c] == 0]
    assert pool.fully_free_chunks() == fully_free
    held = pool.held_bytes
    assert held == sum((a.mapped_chunks + a.pooled_handles + a.stuck_chunks) * a.chunk for a in pool.arenas)
    assert limit.pending == 0, f"{limit.pending} bytes admitted and never committed or rolled back"
    assert limit.mapped == held, f"the limit source counts {limit.mapped} bytes, the pool holds {held}"
    in_force = pool.stats().limit  # the limit the pool has read; a newer one applies at the next sync or grow
    if held > in_force:
        assert pool.deferred, f"{held} bytes held over the limit {in_force} without a deferral"
        if not after_failure:
            pooled = sum(a.pooled_handles for a in pool.arenas)
            assert not fully_free and not pooled, "deferred with memory to give back"
    handles = sum(a.mapped_chunks + a.pooled_handles + a.stuck_chunks for a in pool.arenas)
    assert driver.live_handles - base[0] == handles
    assert driver.mapped_bytes - base[1] == sum((a.mapped_chunks + a.stuck_chunks) * a.chunk for a in pool.arenas)


def poke(driver: Driver, va: int, data: bytes) -> None:
    """Write bytes to mapped device memory (host memcpy, or cuMemcpyHtoD on the GPU)."""
    if isinstance(driver, HostDriver):
        driver.write(va, data)
        return
    import ctypes

    assert isinstance(driver, CudaDriver)
    driver.activate()
    buf = ctypes.create_string_buffer(data, len(data))
    (err,) = driver.bindings.cuMemcpyHtoD(va, ctypes.addressof(buf), len(data))
    assert not err, f"cuMemcpyHtoD failed: {err}"


def peek(driver: Driver, va: int, size: int) -> bytes:
    """Read bytes from mapped device memory (host memcpy, or cuMemcpyDtoH on the GPU)."""
    if isinstance(driver, HostDriver):
        return driver.read(va, size)
    import ctypes

    assert isinstance(driver, CudaDriver)
    driver.activate()
    buf = ctypes.create_string_buffer(size)
    (err,) = driver.bindings.cuMemcpyDtoH(ctypes.addressof(buf), va, size)
    assert not err, f"cuMemcpyDtoH failed: {err}"
    return buf.raw
