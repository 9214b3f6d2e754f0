"""cuda-python's real driver module with its calls landing on the host simulation.

This lets the CudaDriver code run on a machine without a GPU: every call is first
handed to the real binding, which checks the argument types against the installed
cuda-python and only then fails to find the driver library — so a wrong argument
raises TypeError here exactly as it would on a GPU — and then the host driver carries
it out, its errors returned as the real CUresult values. Enums and structs are the
real ones. Used only where no CUDA driver exists (on a GPU the real driver runs).
"""

from __future__ import annotations

import ctypes
from typing import Any

from kvpolicy.alloc import DriverError, HostDriver

_MISSING_LIBRARY = ("DynamicLibNotFoundError", "RuntimeError", "OSError")


class SimulatedBindings:
    def __init__(self, real: Any, host: HostDriver) -> None:
        self._real = real
        self._host = host
        self._ok = real.CUresult.CUDA_SUCCESS
        self._primary = real.CUcontext(0x5EED000)
        self._current = real.CUcontext(0)
        self.checked: set[str] = set()

    def __getattr__(self, name: str) -> Any:  # enums, structs and anything not simulated
        return getattr(self._real, name)

    def _check(self, name: str, *args: Any) -> None:
        try:
            getattr(self._real, name)(*args)
        except (TypeError, ValueError, OverflowError):
            raise  # the real binding refused these arguments
        except Exception as exc:
            if type(exc).__name__ not in _MISSING_LIBRARY:
                raise
        else:
            raise AssertionError(f"{name} reached a real CUDA driver: the simulation must not run on a GPU")
        self.checked.add(name)

    def _call(self, name: str, args: tuple[Any, ...], fn: Any, outputs: int) -> tuple[Any, ...]:
        self._check(name, *args)
        try:
            result = fn()
        except DriverError as exc:
            return (getattr(self._real.CUresult, exc.error), *([None] * outputs))
        if outputs == 0:
            return (self._ok,)
        return (self._ok, *(result if outputs > 1 else (result,)))

    # -- setup -------------------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple[Any, ...]:
        return self._call("cuInit", (flags,), lambda: None, 0)

    def cuDeviceGetCount(self) -> tuple[Any, ...]:
        return self._call("cuDeviceGetCount", (), lambda: 1, 1)

    def cuDeviceGet(self, ordinal: int) -> tuple[Any, ...]:
        return self._call("cuDeviceGet", (ordinal,), lambda: self._real.CUdevice(ordinal), 1)

    def cuDeviceGetAttribute(self, attrib: Any, dev: Any) -> tuple[Any, ...]:
        return self._call("cuDeviceGetAttribute", (attrib, dev), lambda: 1, 1)

    def cuDeviceGetName(self, length: int, dev: Any) -> tuple[Any, ...]:
        return self._call("cuDeviceGetName", (length, dev), lambda: b"Simulated GPU".ljust(length, b"\0"), 1)

    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:
        return self._call("cuDevicePrimaryCtxRetain", (dev,), lambda: self._primary, 1)

    def cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple[Any, ...]:
        return self._call("cuDevicePrimaryCtxRelease", (dev,), lambda: None, 0)

    def cuCtxGetCurrent(self) -> tuple[Any, ...]:
        return self._call("cuCtxGetCurrent", (), lambda: self._current, 1)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:
        def set_current() -> None:
            self._current = ctx

        return self._call("cuCtxSetCurrent", (ctx,), set_current, 0)

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple[Any, ...]:
        assert prop.type == self._real.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        assert prop.location.type == self._real.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        return self._call("cuMemGetAllocationGranularity", (prop, option), lambda: self._host.granularity, 1)

    # -- virtual memory ----------------------------------------------------------------
    def cuMemAddressReserve(self, size: int, alignment: int, addr: int, flags: int) -> tuple[Any, ...]:
        return self._call(
            "cuMemAddressReserve",
            (size, alignment, addr, flags),
            lambda: self._real.CUdeviceptr(self._host._reserve(size)),
            1,
        )

    def cuMemAddressFree(self, ptr: Any, size: int) -> tuple[Any, ...]:
        return self._call("cuMemAddressFree", (ptr, size), lambda: self._host._free_address(int(ptr), size), 0)

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[Any, ...]:
        make = lambda: self._real.CUmemGenericAllocationHandle(self._host._create(size))  # noqa: E731 - run by _call, after its argument checks
        return self._call("cuMemCreate", (size, prop, flags), make, 1)

    def cuMemRelease(self, handle: Any) -> tuple[Any, ...]:
        return self._call("cuMemRelease", (handle,), lambda: self._host._release(int(handle)), 0)

    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: Any, flags: int) -> tuple[Any, ...]:
        assert offset == 0 and flags == 0
        do = lambda: self._host._map(int(ptr), size, int(handle))  # noqa: E731 - run by _call, after its argument checks
        return self._call("cuMemMap", (ptr, size, offset, handle, flags), do, 0)

    def cuMemUnmap(self, ptr: Any, size: int) -> tuple[Any, ...]:
        return self._call("cuMemUnmap", (ptr, size), lambda: self._host._unmap(int(ptr), size), 0)

    def cuMemSetAccess(self, ptr: Any, size: int, desc: Any, count: int) -> tuple[Any, ...]:
        assert count == len(desc) == 1
        assert desc[0].flags == self._real.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return self._call("cuMemSetAccess", (ptr, size, desc, count), lambda: self._host._set_access(int(ptr), size), 0)

    def cuMemGetInfo(self) -> tuple[Any, ...]:
        return self._call("cuMemGetInfo", (), self._host._mem_info, 2)

    def cuMemcpyHtoD(self, dst: Any, src: Any, size: int) -> tuple[Any, ...]:
        def copy() -> None:
            self._host.write(int(dst), ctypes.string_at(src, size))

        return self._call("cuMemcpyHtoD", (dst, src, size), copy, 0)

    def cuMemcpyDtoH(self, dst: Any, src: Any, size: int) -> tuple[Any, ...]:
        def copy() -> None:
            ctypes.memmove(dst, self._host.read(int(src), size), size)

        return self._call("cuMemcpyDtoH", (dst, src, size), copy, 0)


def simulated_cuda_driver(capacity: int) -> Any:
    """A CudaDriver over SimulatedBindings, or None when cuda-python is missing or a real driver exists."""
    from kvpolicy.alloc import CudaDriver, DriverUnavailable
    from kvpolicy.alloc.driver import import_cuda_bindings

    try:
        real = import_cuda_bindings()
    except DriverUnavailable:
        return None
    try:
        CudaDriver(0).close()
        return None  # a real driver is here: the real tests run instead
    except DriverUnavailable:
        pass
    host = HostDriver(capacity=capacity)
    driver = CudaDriver(0, bindings=SimulatedBindings(real, host))
    driver.simulation = host  # type: ignore[attr-defined]
    return driver
