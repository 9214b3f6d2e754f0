"""A driver that simulates CUDA virtual memory in host memory, for CPU machines and CI.

It is not a mock: address space is really reserved (an inaccessible ``mmap``),
physical allocations are real pages of one shared-memory file, mapping puts those
pages at the requested address, and memory is readable and writable only after
``set_access`` — as on a GPU. So data written through one view is visible through
every other view of the same bytes, and survives unmap/remap of the same handle.

What it checks, with the error a CUDA driver returns (see ``tests/alloc``: the GPU
suite compares both drivers on the same cases):
- sizes and addresses not multiples of the granularity → CUDA_ERROR_INVALID_VALUE;
- mapping over a mapped range, unmapping or granting access to an unmapped range,
  using an unknown or released handle, ranges outside a reservation → CUDA_ERROR_INVALID_VALUE;
- creating more than ``capacity`` bytes in all → CUDA_ERROR_OUT_OF_MEMORY.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any

from kvpolicy.alloc.driver import Driver
from kvpolicy.alloc.errors import INVALID_VALUE, OUT_OF_MEMORY, driver_error
from kvpolicy.units import GiB, MiB, format_bytes

_PROT_NONE = 0
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10  # same value on Linux and macOS; the mmap module does not export it
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0)
_MAP_ANON = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0x20))
_RESERVE_FLAGS = mmap.MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE
_FALLOC_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (Linux)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _load_libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if hasattr(libc, "fallocate"):
        libc.fallocate.restype = ctypes.c_int
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return libc


@dataclass
class _Physical:
    offset: int
    size: int
    mappings: int = 0
    released: bool = False


@dataclass
class _Mapping:
    start: int
    size: int
    handle: int
    accessible: bool = False


def _cleanup(libc: Any, fd: int, keep_file: object, reservations: dict[int, int]) -> None:
    for va, size in list(reservations.items()):
        libc.munmap(va, size)
    reservations.clear()
    if keep_file is None:
        os.close(fd)
    else:
        keep_file.close()  # type: ignore[attr-defined]


class HostDriver(Driver):
    """CUDA VMM semantics over host memory: ``capacity`` bytes of simulated device memory.

    Handles are ints. ``read``/``write`` access mapped, accessible memory safely (a
    stray access to unmapped memory would fault the process, as it would on a GPU).
    """

    kind = "host"

    def __init__(self, capacity: int = 16 * GiB, *, granularity: int = 2 * MiB, device: int = 0) -> None:
        super().__init__()
        if granularity <= 0 or granularity % mmap.PAGESIZE:
            raise ValueError(
                f"granularity must be a positive multiple of the page size {mmap.PAGESIZE}, got {granularity}"
            )
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.granularity = granularity
        self.device = device
        self.name = f"host simulation ({format_bytes(capacity)})"
        self._libc = _load_libc()
        if hasattr(os, "memfd_create"):
            self._fd = os.memfd_create("kvpolicy-host-device-memory", os.MFD_CLOEXEC)
            keep_file: object = None
        else:  # no memfd (macOS): an unlinked temporary file serves as the physical memory
            keep_file = tempfile.TemporaryFile()  # noqa: SIM115 - the driver's memory: open until close()
            self._fd = keep_file.fileno()  # type: ignore[attr-defined]
        self._punch_holes = hasattr(self._libc, "fallocate")
        self._file_size = 0
        self._bump = 0
        self._free_offsets: dict[int, list[int]] = {}
        self._handles: dict[int, _Physical] = {}
        self._next_handle = 1
        self._in_use = 0
        self._reservations: dict[int, int] = {}
        self._granules: dict[int, _Mapping] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, _cleanup, self._libc, self._fd, keep_file, self._reservations)

    # -- helpers -----------------------------------------------------------------------
    def _invalid(self, call: str, detail: str) -> Exception:
        return driver_error(call, INVALID_VALUE, detail=detail)

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise driver_error(call, "CUDA_ERROR_NOT_INITIALIZED", detail="the host driver is closed")

    def _check_aligned(self, call: str, va: int, size: int) -> None:
        g = self.granularity
        if size <= 0 or size % g or va % g:
            raise self._invalid(
                call, f"address {va:#x} and size {size} must be positive multiples of the granularity {format_bytes(g)}"
            )

    def _os_error(self, call: str, what: str) -> Exception:
        errno = ctypes.get_errno()
        error = OUT_OF_MEMORY if errno == 12 else "CUDA_ERROR_UNKNOWN"
        return driver_error(call, error, detail=f"{what} failed: {os.strerror(errno)}")

    def _mmap(self, call: str, va: int | None, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
        addr = self._libc.mmap(va, size, prot, flags, fd, offset)
        if addr in (None, _MAP_FAILED) or (va is not None and addr != va):
            raise self._os_error(call, "mmap")
        return int(addr)

    def _reservation_of(self, va: int, size: int) -> int | None:
        for start, length in self._reservations.items():
            if start <= va and va + size <= start + length:
                return start
        return None

    def _granules_of(self, va: int, size: int) -> range:
        return range(va, va + size, self.granularity)

    def _free_physical(self, handle: int, phys: _Physical) -> None:
        del self._handles[handle]
        self._in_use -= phys.size
        if self._punch_holes and self._libc.fallocate(self._fd, _FALLOC_PUNCH_HOLE, phys.offset, phys.size) != 0:
            self._punch_holes = False  # not supported here: freed pages stay resident, content is irrelevant
        self._free_offsets.setdefault(phys.size, []).append(phys.offset)

    # -- the driver interface ----------------------------------------------------------
    def _reserve(self, size: int) -> int:
        self._check_open("cuMemAddressReserve")
        self._check_aligned("cuMemAddressReserve", 0, size)
        g = self.granularity
        base = self._mmap("cuMemAddressReserve", None, size + g, _PROT_NONE, _RESERVE_FLAGS, -1, 0)
        start = -(-base // g) * g
        if start > base:
            self._libc.munmap(base, start - base)
        tail = base + size + g - (start + size)
        if tail:
            self._libc.munmap(start + size, tail)
        self._reservations[start] = size
        return start

    def _free_address(self, va: int, size: int) -> None:
        self._check_open("cuMemAddressFree")
        if self._reservations.get(va) != size:
            raise self._invalid("cuMemAddressFree", f"no reservation of {format_bytes(size)} at {va:#x}")
        if any(gr in self._granules for gr in self._granules_of(va, size)):
            raise self._invalid("cuMemAddressFree", f"the reservation at {va:#x} still has mapped memory")
        if self._libc.munmap(va, size) != 0:
            raise self._os_error("cuMemAddressFree", "munmap")
        del self._reservations[va]

    def _create(self, size: int) -> int:
        self._check_open("cuMemCreate")
        self._check_aligned("cuMemCreate", 0, size)
        if self._in_use + size > self.capacity:
            raise driver_error(
                "cuMemCreate",
                OUT_OF_MEMORY,
                detail=f"{format_bytes(size)} requested, {format_bytes(self.capacity - self._in_use)} "
                f"of {format_bytes(self.capacity)} free",
            )
        offsets = self._free_offsets.get(size)
        if offsets:
            offset = offsets.pop()
        else:
            offset = self._bump
            self._bump += size
            if self._bump > self._file_size:
                os.ftruncate(self._fd, self._bump)
                self._file_size = self._bump
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = _Physical(offset, size)
        self._in_use += size
        return handle

    def _release(self, handle: int) -> None:
        self._check_open("cuMemRelease")
        phys = self._handles.get(handle)
        if phys is None or phys.released:
            raise self._invalid("cuMemRelease", f"unknown or already released handle {handle}")
        phys.released = True
        if phys.mappings == 0:
            self._free_physical(handle, phys)

    def _map(self, va: int, size: int, handle: int) -> None:
        self._check_open("cuMemMap")
        self._check_aligned("cuMemMap", va, size)
        phys = self._handles.get(handle)
        if phys is None or phys.released:
            raise self._invalid("cuMemMap", f"unknown or released handle {handle}")
        if size > phys.size:
            raise self._invalid("cuMemMap", f"{format_bytes(size)} is more than the handle's {format_bytes(phys.size)}")
        if self._reservation_of(va, size) is None:
            raise self._invalid("cuMemMap", f"{format_bytes(size)} at {va:#x} is not inside a reservation")
        granules = self._granules_of(va, size)
        if any(gr in self._granules for gr in granules):
            raise self._invalid("cuMemMap", f"{format_bytes(size)} at {va:#x} overlaps a mapped range")
        self._mmap("cuMemMap", va, size, _PROT_NONE, mmap.MAP_SHARED | _MAP_FIXED, self._fd, phys.offset)
        mapping = _Mapping(va, size, handle)
        for gr in granules:
            self._granules[gr] = mapping
        phys.mappings += 1

    def _unmap(self, va: int, size: int) -> None:
        self._check_open("cuMemUnmap")
        self._check_aligned("cuMemUnmap", va, size)
        mappings: dict[int, _Mapping] = {}
        for gr in self._granules_of(va, size):
            mapping = self._granules.get(gr)
            if mapping is None:
                raise self._invalid("cuMemUnmap", f"{gr:#x} in {format_bytes(size)} at {va:#x} is not mapped")
            if mapping.start < va or mapping.start + mapping.size > va + size:
                raise self._invalid("cuMemUnmap", f"{format_bytes(size)} at {va:#x} cuts a mapping in part")
            mappings[mapping.start] = mapping
        # Back to an inaccessible reservation, not munmap: the address space stays reserved.
        self._mmap("cuMemUnmap", va, size, _PROT_NONE, _RESERVE_FLAGS | _MAP_FIXED, -1, 0)
        for gr in self._granules_of(va, size):
            del self._granules[gr]
        for mapping in mappings.values():
            phys = self._handles[mapping.handle]
            phys.mappings -= 1
            if phys.released and phys.mappings == 0:
                self._free_physical(mapping.handle, phys)

    def _set_access(self, va: int, size: int) -> None:
        self._check_open("cuMemSetAccess")
        self._check_aligned("cuMemSetAccess", va, size)
        mappings = []
        for gr in self._granules_of(va, size):
            mapping = self._granules.get(gr)
            if mapping is None:
                raise self._invalid("cuMemSetAccess", f"{gr:#x} in {format_bytes(size)} at {va:#x} is not mapped")
            mappings.append(mapping)
        if self._libc.mprotect(va, size, _PROT_RW) != 0:
            raise self._os_error("cuMemSetAccess", "mprotect")
        for mapping in mappings:
            mapping.accessible = True

    def _zero(self, va: int, size: int) -> None:
        self._check_open("cuMemsetD8Async")
        if not self.is_accessible(va, size):
            raise self._invalid("cuMemsetD8Async", f"{format_bytes(size)} at {va:#x} is not mapped and accessible")
        ctypes.memset(va, 0, size)

    def _mem_info(self) -> tuple[int, int]:
        self._check_open("cuMemGetInfo")
        return self.capacity - self._in_use, self.capacity

    # -- host-only conveniences --------------------------------------------------------
    def is_accessible(self, va: int, size: int) -> bool:
        """Whether every byte of ``[va, va + size)`` is mapped with access granted."""
        g = self.granularity
        first = va - va % g
        return size > 0 and all(
            (m := self._granules.get(gr)) is not None and m.accessible for gr in range(first, va + size, g)
        )

    def read(self, va: int, size: int) -> bytes:
        """Copy ``size`` bytes from ``va``; raises DriverError instead of faulting on inaccessible memory."""
        if not self.is_accessible(va, size):
            raise self._invalid("read", f"{size} bytes at {va:#x} are not mapped and accessible")
        return ctypes.string_at(va, size)

    def write(self, va: int, data: bytes) -> None:
        """Copy ``data`` to ``va``; raises DriverError instead of faulting on inaccessible memory."""
        if not self.is_accessible(va, len(data)):
            raise self._invalid("write", f"{len(data)} bytes at {va:#x} are not mapped and accessible")
        ctypes.memmove(va, data, len(data))

    @property
    def in_use(self) -> int:
        """Simulated device memory held by live physical allocations."""
        return self._in_use

    def close(self) -> None:
        """Unmap every reservation and free the simulated device memory; the driver is unusable after."""
        if self._closed:
            return
        self._closed = True
        self._granules.clear()
        self._handles.clear()
        self._finalizer()

    def __repr__(self) -> str:
        return f"HostDriver(capacity={format_bytes(self.capacity)}, granularity={format_bytes(self.granularity)})"
