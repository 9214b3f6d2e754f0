"""Counts of driver calls, so tests and benchmarks can say exactly what an operation cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class CallCounts:
    """Driver calls made (attempts, successful or not), and how many of them failed."""

    address_reserve: int = 0
    address_free: int = 0
    create: int = 0
    release: int = 0
    map: int = 0
    unmap: int = 0
    set_access: int = 0
    zero: int = 0
    """Fills of newly mapped memory with zeros (cuMemsetD8Async), when the pool asks for them."""
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts keyed by the CUDA function name (``failures`` as is)."""
        d = asdict(self)
        return {
            "cuMemAddressReserve": d["address_reserve"],
            "cuMemAddressFree": d["address_free"],
            "cuMemCreate": d["create"],
            "cuMemRelease": d["release"],
            "cuMemMap": d["map"],
            "cuMemUnmap": d["unmap"],
            "cuMemSetAccess": d["set_access"],
            "cuMemsetD8Async": d["zero"],
            "failures": d["failures"],
        }

    def copy(self) -> CallCounts:
        return CallCounts(**asdict(self))

    def __add__(self, other: CallCounts) -> CallCounts:
        mine, theirs = asdict(self), asdict(other)
        return CallCounts(**{k: mine[k] + theirs[k] for k in mine})

    def __sub__(self, other: CallCounts) -> CallCounts:
        mine, theirs = asdict(self), asdict(other)
        return CallCounts(**{k: mine[k] - theirs[k] for k in mine})
