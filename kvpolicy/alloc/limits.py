"""Where an elastic pool gets the limit in force, and where it reports back.

The pool asks its ``LimitSource`` before every mapping and tells it after every
unmapping. ``StaticLimit`` is a fixed limit in this process; the ledger's client
(``kvpolicy.runtime``) implements the same interface across processes, against the
limit the controller publishes and the GPU's elastic budget.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal, Protocol

AckStatus = Literal["applied", "deferred"]


@dataclass(frozen=True)
class LimitReading:
    """One consistent snapshot of what the controller asks of this instance."""

    limit: int
    """Hard cap on mapped bytes."""
    target: int
    """Fair share: the pool gives back memory above it when it can."""
    revision: int
    """Revision of the published limits; 0 before the first publish."""
    guarantee: int = 0
    """Memory no other instance can take: giving back below it frees nothing for anyone."""


class LimitSource(Protocol):
    def read(self) -> LimitReading:
        """The limit, target and revision in force now (cheap: called on every grow)."""
        ...

    def admit(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` before mapping them; False if the limit or budget says no."""
        ...

    def certain_refusal(self, nbytes: int) -> bool:
        """Whether ``admit(nbytes)`` would say no for certain, known without asking anyone: nothing
        changed since a refusal that covers it. Cheap (the pool asks before planning a growth);
        False whenever unsure. A source whose ``admit`` is itself cheap may always say False."""
        ...

    def commit(self, nbytes: int) -> None:
        """The admitted bytes are mapped: they now count as this instance's mapped memory."""
        ...

    def rollback(self, nbytes: int) -> None:
        """The admitted bytes were not mapped after all: give the reservation back."""
        ...

    def release(self, nbytes: int) -> None:
        """``nbytes`` of mapped memory were unmapped."""
        ...

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        """Bytes in live blocks, bytes mapped, and bytes of growth refused lately (work waiting for
        memory: ``ChunkMapping.refused_bytes``), for the controller's facts."""
        ...

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        """The pool applied ``revision`` (or defers it while usage is above the limit)."""
        ...

    def pressure(self) -> int:
        """A counter that moves when another instance wants memory the GPU's budget cannot give
        (the ledger counts refused elastic admissions); cheap: read on every ``sync()``."""
        ...


class StaticLimit:
    """A fixed limit and target in this process; admission checks mapped + pending ≤ limit."""

    def __init__(self, limit: int, target: int | None = None, guarantee: int = 0) -> None:
        self._lock = threading.Lock()
        self._reading = LimitReading(
            limit=limit, target=limit if target is None else target, revision=1, guarantee=guarantee
        )
        self._pressure = 0
        self.mapped = 0
        self.pending = 0
        self.used = 0
        self.waiting = 0
        self.acked: tuple[int, AckStatus] | None = None

    def set(self, limit: int, target: int | None = None, guarantee: int | None = None) -> None:
        """Publish a new limit (and target, guarantee), as the controller would: a new revision."""
        with self._lock:
            self._reading = LimitReading(
                limit=limit,
                target=limit if target is None else target,
                revision=self._reading.revision + 1,
                guarantee=self._reading.guarantee if guarantee is None else guarantee,
            )

    def press(self) -> None:
        """Another instance was refused memory for the GPU's budget, as the ledger would count it."""
        with self._lock:
            self._pressure += 1

    def pressure(self) -> int:
        return self._pressure

    def read(self) -> LimitReading:
        return self._reading

    def certain_refusal(self, nbytes: int) -> bool:
        return False  # admit is a comparison under a thread lock: nothing to save

    def admit(self, nbytes: int) -> bool:
        with self._lock:
            if self.mapped + self.pending + nbytes > self._reading.limit:
                return False
            self.pending += nbytes
            return True

    def commit(self, nbytes: int) -> None:
        with self._lock:
            assert self.pending >= nbytes, "commit without a matching admit"
            self.pending -= nbytes
            self.mapped += nbytes

    def rollback(self, nbytes: int) -> None:
        with self._lock:
            assert self.pending >= nbytes, "rollback without a matching admit"
            self.pending -= nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            assert self.mapped >= nbytes, "released more than was mapped"
            self.mapped -= nbytes

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        self.used = used
        self.waiting = waiting

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        self.acked = (revision, status)
