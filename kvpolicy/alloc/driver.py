"""Drivers behind one interface: CUDA virtual memory through cuda-python, or a host simulation.

A driver does the six things an elastic allocator needs — reserve address space,
create physical memory, map it, grant access, unmap it, release it — and nothing
more. ``CudaDriver`` calls the CUDA driver API (cuMemAddressReserve, cuMemCreate,
cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree, cuMemGetInfo);
``HostDriver`` (``kvpolicy.alloc.host``) simulates the same semantics in host
memory for CPU machines and CI. Both raise the same typed exceptions
(``kvpolicy.alloc.errors``) naming the CUDA call and the CUDA error, and both accept
injected failures (``Driver.inject``) so every rollback path can be tested — on the
real driver too.

cuda-python is imported only when a ``CudaDriver`` is constructed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from kvpolicy.alloc.errors import (
    OUT_OF_MEMORY,
    DriverError,
    DriverUnavailable,
    driver_error,
)
from kvpolicy.units import format_bytes

Handle = Any
"""A physical allocation: a CUmemGenericAllocationHandle on CUDA, an int on the host."""

DRIVER_CALLS = (
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetInfo",
    "cuMemsetD8Async",
    "cuCtxSynchronize",
)


@dataclass
class _Fault:
    error: str
    after: int
    times: int


class Driver(ABC):
    """The virtual-memory operations an arena uses, with failure injection and live counts.

    Sizes and addresses are multiples of ``granularity``. A handle may be released
    while mapped (its memory is freed when the last mapping goes), as in CUDA.
    ``live_handles``, ``mapped_bytes`` and ``reserved_bytes`` count what this driver
    object has created and not yet given back, so tests can prove nothing leaked.
    """

    kind: ClassVar[str]
    device: int
    granularity: int
    """Minimum granularity of sizes and addresses (2 MiB on an H200)."""
    name: str

    def __init__(self) -> None:
        self._faults: dict[str, list[_Fault]] = {}
        self.live_handles = 0
        self.mapped_bytes = 0
        self.reserved_bytes = 0
        self._mappings: dict[int, int] = {}
        """start → size of every mapping made through ``map``: checked by ``unmap``, because
        the real driver accepts an unmap of memory that is not mapped (seen on an H200,
        driver 580) and the counters would then go wrong."""

    # -- failure injection -------------------------------------------------------------
    def inject(self, call: str, error: str = OUT_OF_MEMORY, *, after: int = 0, times: int = 1) -> None:
        """Make ``call`` fail with ``error`` (a CUDA error name) after ``after`` more successes, ``times`` times.

        An injected failure has no effect on the driver's state, exactly like a
        CUDA call that returns an error.
        """
        if call not in DRIVER_CALLS:
            raise ValueError(f"unknown driver call {call!r}; expected one of {', '.join(DRIVER_CALLS)}")
        if after < 0 or times < 1:
            raise ValueError(f"inject needs after >= 0 and times >= 1, got after={after}, times={times}")
        self._faults.setdefault(call, []).append(_Fault(error, after, times))

    def clear_faults(self) -> None:
        """Forget every pending injected failure."""
        self._faults.clear()

    def pending_faults(self) -> int:
        """How many injected failures have not fired yet."""
        return sum(f.times for faults in self._faults.values() for f in faults)

    def _fault(self, call: str) -> None:
        faults = self._faults.get(call)
        if not faults:
            return
        fault = faults[0]
        if fault.after > 0:
            fault.after -= 1
            return
        fault.times -= 1
        if fault.times == 0:
            faults.pop(0)
            if not faults:
                del self._faults[call]
        raise driver_error(call, fault.error, detail="injected failure")

    # -- the interface -----------------------------------------------------------------
    def reserve(self, size: int) -> int:
        """Reserve ``size`` bytes of address space (no memory behind it); returns its address."""
        if self._faults:
            self._fault("cuMemAddressReserve")
        va = self._reserve(size)
        self.reserved_bytes += size
        return va

    def free_address(self, va: int, size: int) -> None:
        """Give back a reservation made by ``reserve`` (nothing may be mapped in it)."""
        if self._faults:
            self._fault("cuMemAddressFree")
        self._free_address(va, size)
        self.reserved_bytes -= size

    def create(self, size: int) -> Handle:
        """Create ``size`` bytes of physical memory on the device; raises DeviceOutOfMemory when none is left."""
        if self._faults:
            self._fault("cuMemCreate")
        handle = self._create(size)
        self.live_handles += 1
        return handle

    def release(self, handle: Handle) -> None:
        """Release a handle from ``create``; its memory goes when its last mapping does."""
        if self._faults:
            self._fault("cuMemRelease")
        self._release(handle)
        self.live_handles -= 1

    def map(self, va: int, size: int, handle: Handle) -> None:
        """Map ``handle`` (from offset 0) at ``va``; the range must be reserved and unmapped."""
        if self._faults:
            self._fault("cuMemMap")
        self._map(va, size, handle)
        self._mappings[va] = size
        self.mapped_bytes += size

    def unmap(self, va: int, size: int) -> None:
        """Unmap whole mappings covering exactly ``[va, va + size)``."""
        if self._faults:
            self._fault("cuMemUnmap")
        starts = self._mappings_covering(va, size)
        self._unmap(va, size)
        for start in starts:
            del self._mappings[start]
        self.mapped_bytes -= size

    def _mappings_covering(self, va: int, size: int) -> list[int]:
        """The starts of the mappings that tile ``[va, va + size)`` exactly, or a DriverError."""
        if self._mappings.get(va) == size:
            return [va]
        inside = sorted(s for s in self._mappings if va <= s < va + size)
        covered = sum(self._mappings[s] for s in inside)
        straddles = inside and inside[-1] + self._mappings[inside[-1]] > va + size
        if covered != size or straddles or (inside and inside[0] != va):
            raise driver_error(
                "cuMemUnmap", "CUDA_ERROR_INVALID_VALUE",
                detail=f"{size:#x} bytes at {va:#x} are not exactly covered by mappings made with map()",
            )
        return inside

    def set_access(self, va: int, size: int) -> None:
        """Grant this device read-write access to a mapped range (needed after every map)."""
        if self._faults:
            self._fault("cuMemSetAccess")
        self._set_access(va, size)

    def zero(self, va: int, size: int) -> None:
        """Fill ``[va, va + size)`` (mapped, accessible) with zeros; done when this returns.

        For memory just mapped: its contents are undefined until written, and an engine
        whose kernels read a block's unused tail must not find NaN bit patterns there.
        """
        if self._faults:
            self._fault("cuMemsetD8Async")
        self._zero(va, size)

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done (before unmapping memory kernels may still read).

        cuMemUnmap does not wait for kernels in flight (PyTorch's expandable segments
        synchronise before unmapping for the same reason).
        """
        if self._faults:
            self._fault("cuCtxSynchronize")
        self._synchronize()

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory, as cuMemGetInfo reports them."""
        if self._faults:
            self._fault("cuMemGetInfo")
        return self._mem_info()

    def activate(self) -> None:  # noqa: B027 - a no-op unless the driver has a context to make current
        """Make this driver's device current on the calling thread (cheap when it already is)."""

    def close(self) -> None:  # noqa: B027 - a no-op unless the driver holds resources of its own
        """Let go of the driver's own resources (not the caller's handles or reservations)."""

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _reserve(self, size: int) -> int: ...
    @abstractmethod
    def _free_address(self, va: int, size: int) -> None: ...
    @abstractmethod
    def _create(self, size: int) -> Handle: ...
    @abstractmethod
    def _release(self, handle: Handle) -> None: ...
    @abstractmethod
    def _map(self, va: int, size: int, handle: Handle) -> None: ...
    @abstractmethod
    def _unmap(self, va: int, size: int) -> None: ...
    @abstractmethod
    def _set_access(self, va: int, size: int) -> None: ...
    @abstractmethod
    def _mem_info(self) -> tuple[int, int]: ...
    @abstractmethod
    def _zero(self, va: int, size: int) -> None: ...
    def _synchronize(self) -> None:  # noqa: B027 - nothing runs asynchronously unless the driver has a device
        """Wait for the device's queued work (a no-op where nothing runs asynchronously)."""


def import_cuda_bindings() -> Any:
    """The cuda-python driver module: ``cuda.bindings.driver`` (12.6+, 13.x), else the older ``cuda.cuda``."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # cuda-python before the cuda.bindings layout
        except ImportError as exc:
            raise DriverUnavailable(
                "cuda-python is not installed; install it with: pip install 'cuda-python>=12.6'"
            ) from exc
    return cu


class CudaDriver(Driver):
    """CUDA virtual memory management through cuda-python, on one device's primary context.

    The primary context is the one PyTorch uses, so tensors over mapped memory work
    in the same process. Every failing call raises ``DriverError`` (or
    ``DeviceOutOfMemory``) naming the call and the CUDA error.
    """

    kind = "cuda"

    def __init__(self, device: int = 0, *, bindings: Any = None) -> None:
        """Start on CUDA device ``device``; ``bindings`` replaces the imported cuda-python module (tests)."""
        super().__init__()
        cu = import_cuda_bindings() if bindings is None else bindings
        self._cu = cu
        try:
            (err,) = cu.cuInit(0)
        except Exception as exc:  # the bindings raise their own loader errors when libcuda is absent
            raise DriverUnavailable(f"cannot load the CUDA driver library ({type(exc).__name__}: {exc})") from exc
        if err:
            raise DriverUnavailable(f"cuInit failed: {_name(err)}; is there a GPU and a working NVIDIA driver?")
        err, count = cu.cuDeviceGetCount()
        self._check("cuDeviceGetCount", err)
        if not 0 <= device < count:
            raise DriverUnavailable(f"no CUDA device {device}: {count} device(s) visible (check CUDA_VISIBLE_DEVICES)")
        err, dev = cu.cuDeviceGet(device)
        self._check("cuDeviceGet", err)
        err, supported = cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev
        )
        self._check("cuDeviceGetAttribute", err)
        if not supported:
            raise DriverUnavailable(f"CUDA device {device} does not support virtual memory management")
        err, raw_name = cu.cuDeviceGetName(256, dev)
        self._check("cuDeviceGetName", err)
        text = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
        self.name = text.split("\0", 1)[0].strip() or f"CUDA device {device}"
        err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        self._check("cuDevicePrimaryCtxRetain", err)
        self.device = device
        self._dev = dev
        self._ctx = ctx
        self._ctx_ptr = int(ctx)
        self._closed = False
        self._stream: Any = None  # made on the first zero()
        self.activate()

        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        self._prop = prop
        flags = cu.CUmemAllocationGranularity_flags
        err, gran = cu.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        self._check("cuMemGetAllocationGranularity", err)
        self.granularity = int(gran)
        err, rec = cu.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        self._check("cuMemGetAllocationGranularity", err)
        self.recommended_granularity = int(rec)

        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = device
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = [desc]
        # Bound once: these are the calls on the growth path.
        self._cuMemCreate = cu.cuMemCreate
        self._cuMemMap = cu.cuMemMap
        self._cuMemSetAccess = cu.cuMemSetAccess
        self._cuMemUnmap = cu.cuMemUnmap
        self._cuMemRelease = cu.cuMemRelease

    @property
    def bindings(self) -> Any:
        """The cuda-python driver module in use (for callers that need a call this class does not wrap)."""
        return self._cu

    @property
    def allocation_prop(self) -> Any:
        """The CUmemAllocationProp every cuMemCreate uses (pinned device memory on ``device``)."""
        return self._prop

    @property
    def access_descriptors(self) -> list[Any]:
        """The CUmemAccessDesc list every cuMemSetAccess uses (read-write for ``device``)."""
        return self._access

    def _check(self, call: str, err: Any, detail: str = "") -> None:
        if err:
            raise driver_error(call, _name(err), int(err), detail)

    def activate(self) -> None:
        err, current = self._cu.cuCtxGetCurrent()
        self._check("cuCtxGetCurrent", err)
        if int(current) != self._ctx_ptr:
            (err,) = self._cu.cuCtxSetCurrent(self._ctx)
            self._check("cuCtxSetCurrent", err)

    def _reserve(self, size: int) -> int:
        err, ptr = self._cu.cuMemAddressReserve(size, self.granularity, 0, 0)
        if err:
            raise driver_error("cuMemAddressReserve", _name(err), int(err), f"{format_bytes(size)} of address space")
        return int(ptr)

    def _free_address(self, va: int, size: int) -> None:
        (err,) = self._cu.cuMemAddressFree(va, size)
        if err:
            raise driver_error("cuMemAddressFree", _name(err), int(err), f"{format_bytes(size)} at {va:#x}")

    def _create(self, size: int) -> Handle:
        err, handle = self._cuMemCreate(size, self._prop, 0)
        if err:
            raise driver_error("cuMemCreate", _name(err), int(err), f"{format_bytes(size)} on device {self.device}")
        return handle

    def _release(self, handle: Handle) -> None:
        (err,) = self._cuMemRelease(handle)
        if err:
            raise driver_error("cuMemRelease", _name(err), int(err))

    def _map(self, va: int, size: int, handle: Handle) -> None:
        (err,) = self._cuMemMap(va, size, 0, handle, 0)
        if err:
            raise driver_error("cuMemMap", _name(err), int(err), f"{format_bytes(size)} at {va:#x}")

    def _unmap(self, va: int, size: int) -> None:
        (err,) = self._cuMemUnmap(va, size)
        if err:
            raise driver_error("cuMemUnmap", _name(err), int(err), f"{format_bytes(size)} at {va:#x}")

    def _set_access(self, va: int, size: int) -> None:
        (err,) = self._cuMemSetAccess(va, size, self._access, 1)
        if err:
            raise driver_error("cuMemSetAccess", _name(err), int(err), f"{format_bytes(size)} at {va:#x}")

    def _zero(self, va: int, size: int) -> None:
        # A private non-blocking stream, waited on at once: the zeros are in place before
        # the caller hands the memory out, whatever stream the engine's kernels use.
        self.activate()
        cu = self._cu
        if self._stream is None:
            err, stream = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
            self._check("cuStreamCreate", err)
            self._stream = stream
        (err,) = cu.cuMemsetD8Async(va, 0, size, self._stream)
        if err:
            raise driver_error("cuMemsetD8Async", _name(err), int(err), f"{format_bytes(size)} at {va:#x}")
        (err,) = cu.cuStreamSynchronize(self._stream)
        if err:
            raise driver_error("cuStreamSynchronize", _name(err), int(err), f"after zeroing {format_bytes(size)} at {va:#x}")

    def _synchronize(self) -> None:
        self.activate()
        (err,) = self._cu.cuCtxSynchronize()
        if err:
            raise driver_error("cuCtxSynchronize", _name(err), int(err))

    def _mem_info(self) -> tuple[int, int]:
        self.activate()
        err, free, total = self._cu.cuMemGetInfo()
        if err:
            raise driver_error("cuMemGetInfo", _name(err), int(err))
        return int(free), int(total)

    def close(self) -> None:
        """Drop this driver's reference on the primary context (PyTorch keeps its own)."""
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self.activate()
            (err,) = self._cu.cuStreamDestroy(self._stream)
            self._stream = None
            self._check("cuStreamDestroy", err)
        (err,) = self._cu.cuDevicePrimaryCtxRelease(self._dev)
        self._check("cuDevicePrimaryCtxRelease", err)

    def __repr__(self) -> str:
        return f"CudaDriver(device={self.device}, name={self.name!r}, granularity={format_bytes(self.granularity)})"


def _name(err: Any) -> str:
    return getattr(err, "name", None) or f"CUresult {int(err)}"


__all__ = [
    "DRIVER_CALLS",
    "CudaDriver",
    "Driver",
    "DriverError",
    "DriverUnavailable",
    "Handle",
    "import_cuda_bindings",
]
