"""Driver semantics, the same on the host simulation and the real GPU."""

from __future__ import annotations

import pytest

from kvpolicy.alloc import DeviceOutOfMemory, DriverError, DriverUnavailable, HostDriver, open_driver
from kvpolicy.alloc.driver import DRIVER_CALLS, CudaDriver
from kvpolicy.units import GiB, MiB


def test_granularity_is_2_mib(driver):
    assert driver.granularity == 2 * MiB


def test_full_cycle_counts_what_is_live(driver):
    g = driver.granularity
    va = driver.reserve(4 * g)
    assert va % g == 0 and driver.reserved_bytes >= 4 * g
    h = driver.create(g)
    driver.map(va + g, g, h)
    driver.set_access(va + g, g)
    assert driver.mapped_bytes >= g
    driver.unmap(va + g, g)
    driver.release(h)
    driver.free_address(va, 4 * g)


def test_double_map_is_an_error_that_names_the_call(driver):
    g = driver.granularity
    va = driver.reserve(2 * g)
    h1, h2 = driver.create(g), driver.create(g)
    driver.map(va, g, h1)
    with pytest.raises(DriverError) as err:
        driver.map(va, g, h2)
    assert err.value.call == "cuMemMap" and err.value.error.startswith("CUDA_ERROR_")
    assert "cuMemMap failed: CUDA_ERROR_" in str(err.value)
    driver.unmap(va, g)
    with pytest.raises(DriverError) as err:
        driver.unmap(va, g)  # double unmap
    assert err.value.call == "cuMemUnmap"
    for h in (h1, h2):
        driver.release(h)
    driver.free_address(va, 2 * g)


def test_set_access_on_unmapped_range_is_an_error(driver):
    g = driver.granularity
    va = driver.reserve(g)
    with pytest.raises(DriverError) as err:
        driver.set_access(va, g)
    assert err.value.call == "cuMemSetAccess"
    driver.free_address(va, g)


def test_sizes_off_the_granularity_are_invalid(driver):
    with pytest.raises(DriverError) as err:
        driver.create(driver.granularity // 2)
    assert err.value.call == "cuMemCreate" and err.value.error == "CUDA_ERROR_INVALID_VALUE"


def test_release_while_mapped_frees_memory_at_unmap(driver):
    g = driver.granularity
    free0, _ = driver.mem_info()
    va = driver.reserve(g)
    h = driver.create(g)
    driver.map(va, g, h)
    driver.set_access(va, g)
    driver.release(h)  # allowed while mapped, as in CUDA
    driver.unmap(va, g)
    driver.free_address(va, g)
    free1, _ = driver.mem_info()
    assert free1 >= free0 - g // 2  # the handle's memory came back


@pytest.mark.parametrize("call", ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"])
def test_injected_failure_fires_once_after_n_and_changes_nothing(driver, call):
    g = driver.granularity
    va = driver.reserve(2 * g)
    driver.inject(call, "CUDA_ERROR_UNKNOWN", after=1)
    handles, failed = [], 0
    for i in range(2):
        for _attempt in range(2):
            try:
                h = driver.create(g)
            except DriverError as exc:
                assert exc.detail == "injected failure"
                failed += 1
                continue
            break
        try:
            driver.map(va + i * g, g, h)
        except DriverError:
            failed += 1
            driver.map(va + i * g, g, h)  # the failed call had no effect: it can be repeated
        try:
            driver.set_access(va + i * g, g)
        except DriverError:
            failed += 1
            driver.set_access(va + i * g, g)
        handles.append(h)
    for i, h in enumerate(handles):
        try:
            driver.unmap(va + i * g, g)
        except DriverError:
            failed += 1
            driver.unmap(va + i * g, g)
        try:
            driver.release(h)
        except DriverError:
            failed += 1
            driver.release(h)
    driver.free_address(va, 2 * g)
    assert failed == 1 and driver.pending_faults() == 0


def test_injected_out_of_memory_is_typed(driver):
    driver.inject("cuMemCreate")
    with pytest.raises(DeviceOutOfMemory) as err:
        driver.create(driver.granularity)
    assert err.value.error == "CUDA_ERROR_OUT_OF_MEMORY" and err.value.code == 2


def test_inject_rejects_unknown_calls(driver):
    with pytest.raises(ValueError, match="unknown driver call"):
        driver.inject("cuMemAlloc")
    assert set(DRIVER_CALLS) >= {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"}


def test_host_out_of_memory_at_capacity():
    with HostDriver(capacity=6 * MiB) as d:
        hs = [d.create(2 * MiB) for _ in range(3)]
        assert d.mem_info() == (0, 6 * MiB)
        with pytest.raises(DeviceOutOfMemory, match="cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"):
            d.create(2 * MiB)
        d.release(hs[0])
        d.release(d.create(2 * MiB))  # the freed memory is usable again
        for h in hs[1:]:
            d.release(h)
        assert d.mem_info() == (6 * MiB, 6 * MiB)


def test_host_memory_is_real_and_survives_remap():
    with HostDriver(capacity=64 * MiB) as d:
        g = d.granularity
        va = d.reserve(2 * g)
        h = d.create(g)
        d.map(va, g, h)
        assert not d.is_accessible(va, 8)  # mapped but no access yet, as on a GPU
        with pytest.raises(DriverError):
            d.write(va, b"x")
        d.set_access(va, g)
        d.write(va + 100, b"kvpolicy")
        d.unmap(va, g)
        with pytest.raises(DriverError):
            d.read(va + 100, 8)
        d.map(va + g, g, h)  # the same physical memory at another address
        d.set_access(va + g, g)
        assert d.read(va + g + 100, 8) == b"kvpolicy"
        d.unmap(va + g, g)
        d.release(h)
        d.free_address(va, 2 * g)


def test_host_checks_reservations_and_handles():
    with HostDriver(capacity=64 * MiB) as d:
        g = d.granularity
        va = d.reserve(g)
        h = d.create(g)
        with pytest.raises(DriverError, match="not inside a reservation"):
            d.map(va + g, g, h)
        with pytest.raises(DriverError, match="more than the handle"):
            d.map(va, 2 * g, h)
        d.release(h)
        with pytest.raises(DriverError, match="released handle"):
            d.map(va, g, h)
        with pytest.raises(DriverError, match="already released"):
            d.release(h)
        d.free_address(va, g)
        with pytest.raises(DriverError, match="no reservation"):
            d.free_address(va, g)
    with pytest.raises(DriverError, match="closed"):
        d.create(g)


def test_open_driver_falls_back_to_host_without_a_gpu():
    try:
        CudaDriver(0).close()
        has_gpu = True
    except DriverUnavailable as exc:
        has_gpu = False
        assert str(exc)  # says why
        with pytest.raises(DriverUnavailable):
            open_driver("cuda")
    d = open_driver("auto", host_capacity=GiB)
    try:
        assert d.kind == ("cuda" if has_gpu else "host")
    finally:
        d.close()
    with pytest.raises(ValueError, match="unknown driver kind"):
        open_driver("rocm")


def test_driver_error_pickles():
    import pickle

    err = pickle.loads(pickle.dumps(DeviceOutOfMemory("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", 2, "2 MiB")))
    assert isinstance(err, DeviceOutOfMemory) and err.call == "cuMemCreate" and err.code == 2


def test_cuda_driver_calls_fit_the_installed_bindings():
    """The CudaDriver code, over bindings that check every argument with the real cuda-python."""
    from tests.alloc.alloc_support import close_driver, make_driver

    from kvpolicy.alloc import Arena

    d = make_driver("simcuda", host_capacity=8 * MiB)
    try:
        assert d.kind == "cuda" and d.name == "Simulated GPU" and d.granularity == 2 * MiB
        with Arena(d, 16 * MiB, 2 * MiB, keep_handles=1) as arena:
            arena.grow(3)
            arena.shrink(2)
            with pytest.raises(DeviceOutOfMemory) as err:
                arena.grow(4)  # 8 MiB device: one pooled + one mapped + two more fit, not three
            assert err.value.error == "CUDA_ERROR_OUT_OF_MEMORY" and err.value.code == 2
            assert "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)" in str(err.value)
            assert d.mem_info() == (4 * MiB, 8 * MiB)
        with pytest.raises(DriverError) as err:
            d.unmap(0x200000, 2 * MiB)
        assert (err.value.call, err.value.error, err.value.code) == ("cuMemUnmap", "CUDA_ERROR_INVALID_VALUE", 1)
        checked = d.bindings.checked
        assert {
            "cuInit",
            "cuDeviceGet",
            "cuDevicePrimaryCtxRetain",
            "cuCtxGetCurrent",
            "cuCtxSetCurrent",
            "cuMemGetAllocationGranularity",
            "cuMemAddressReserve",
            "cuMemCreate",
            "cuMemMap",
            "cuMemSetAccess",
            "cuMemUnmap",
            "cuMemRelease",
            "cuMemAddressFree",
            "cuMemGetInfo",
        } <= checked
    finally:
        close_driver(d)
