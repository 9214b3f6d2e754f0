"""Which driver a process gets: the CUDA driver where a GPU is usable, else the host's simulation.

Apart from ``driver`` (the interface and the CUDA driver) and ``host`` (the simulation, which
implements that interface), so that each of the two imports only downward.
"""

from __future__ import annotations

from kvpolicy.alloc.driver import CudaDriver, Driver
from kvpolicy.alloc.errors import DriverUnavailable
from kvpolicy.alloc.host import HostDriver


def open_driver(kind: str = "auto", *, device: int = 0, host_capacity: int | None = None) -> Driver:
    """A driver of ``kind`` ``"cuda"``, ``"host"``, or ``"auto"`` (CUDA when a GPU is usable, else host).

    ``"cuda"`` raises ``DriverUnavailable`` with the reason when it cannot start;
    ``host_capacity`` sets the simulated device memory of a host driver.
    """
    if kind not in ("auto", "cuda", "host"):
        raise ValueError(f"unknown driver kind {kind!r}; expected 'auto', 'cuda' or 'host'")
    if kind in ("auto", "cuda"):
        try:
            return CudaDriver(device)
        except DriverUnavailable:
            if kind == "cuda":
                raise
    if host_capacity is None:
        return HostDriver(device=device)
    return HostDriver(capacity=host_capacity, device=device)


__all__ = ["open_driver"]
