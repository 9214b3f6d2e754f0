"""The allocator's exceptions: driver failures, running out, and misuse of block ids.

Every CUDA error becomes a ``DriverError`` that names the driver call and the CUDA
error (never an abort); the host driver raises the very same classes with the same
error names, so code written against one driver handles the other.
"""

from __future__ import annotations

from kvpolicy.units import format_bytes

# CUresult values (from cuda.h) for the errors the host driver simulates; the CUDA
# driver reports whatever the real driver returns.
CUDA_ERROR_CODES: dict[str, int] = {
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_NOT_INITIALIZED": 3,
    "CUDA_ERROR_NO_DEVICE": 100,
    "CUDA_ERROR_INVALID_DEVICE": 101,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_ILLEGAL_STATE": 401,
    "CUDA_ERROR_NOT_PERMITTED": 800,
    "CUDA_ERROR_NOT_SUPPORTED": 801,
    "CUDA_ERROR_UNKNOWN": 999,
}

OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"
INVALID_VALUE = "CUDA_ERROR_INVALID_VALUE"


class AllocError(Exception):
    """Base class of everything the allocator raises on purpose."""


class DriverUnavailable(AllocError):
    """No usable CUDA driver here: cuda-python missing, no driver library, or no such GPU."""


class DriverError(AllocError):
    """A driver call failed; ``call`` is the CUDA function, ``error`` the CUDA error name."""

    def __init__(self, call: str, error: str, code: int | None = None, detail: str = "") -> None:
        self.call = call
        self.error = error
        self.code = CUDA_ERROR_CODES.get(error, -1) if code is None else code
        self.detail = detail
        text = f"{call} failed: {error} ({self.code})"
        super().__init__(f"{text}: {detail}" if detail else text)

    def __reduce__(self) -> tuple[type, tuple[str, str, int, str]]:
        return (type(self), (self.call, self.error, self.code, self.detail))


class DeviceOutOfMemory(DriverError):
    """The driver has no physical memory left for the request (CUDA_ERROR_OUT_OF_MEMORY)."""


def driver_error(call: str, error: str, code: int | None = None, detail: str = "") -> DriverError:
    """The typed exception for ``error`` raised by ``call`` (out-of-memory gets its own class)."""
    cls = DeviceOutOfMemory if error == OUT_OF_MEMORY else DriverError
    return cls(call, error, code, detail)


class OutOfBlocks(AllocError):
    """``alloc`` could not get the blocks it was asked for; nothing was allocated or mapped.

    ``reason`` is one of ``"capacity"`` (the virtual capacity is used up), ``"limit"``
    (the limit in force says no), ``"admission"`` (the limit source refused the bytes,
    e.g. the GPU's elastic budget is taken), ``"device"`` (the GPU ran out of
    physical memory) or ``"revision"`` (``BlockPool.grow``: a new limit waits for ``sync()``). ``needed`` is the bytes the growth would have added.
    """

    def __init__(
        self,
        requested: int,
        free: int,
        reason: str,
        *,
        held: int,
        limit: int,
        needed: int = 0,
        hint: str = "",
    ) -> None:
        self.requested = requested
        self.free = free
        self.reason = reason
        self.held = held
        self.limit = limit
        self.needed = needed
        why = _why_out_of_blocks(reason, held=held, limit=limit, needed=needed)
        message = f"cannot allocate {requested} blocks ({free} free in mapped chunks): {why}"
        super().__init__(f"{message}; {hint}" if hint else message)


def _why_out_of_blocks(reason: str, *, held: int, limit: int, needed: int) -> str:
    """The words for ``reason``, formatting only its own figures: a refused growth raises one every step under contention."""
    if reason == "capacity":
        return "the pool's virtual capacity is used up"
    if reason == "limit":
        return (
            f"growing by {format_bytes(needed)} would take the pool from "
            f"{format_bytes(held)} to {format_bytes(held + needed)}, over its limit of {format_bytes(limit)}"
        )
    if reason == "admission":
        return (
            f"the limit source refused {format_bytes(needed)} more (pool holds {format_bytes(held)}, "
            f"limit {format_bytes(limit)}): the GPU's elastic budget is taken by other instances"
        )
    if reason == "device":
        return f"the GPU has no physical memory left for {format_bytes(needed)} more"
    if reason == "revision":
        return "a new limit revision waits to be applied"
    return reason


class BlockError(AllocError, ValueError):
    """A block id that is out of range, or in the wrong state (double free, claim of a live block)."""
