"""The ledger's values: a GPU's figures and totals, an instance's slot, the limits a controller publishes.

Readers get these from the records (``codec`` decodes them); admission (``admission``)
takes them as inputs; the controller hands ``GpuLimits`` and ``InstanceLimits`` to
``GpuLedger.publish``. Nothing here touches shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpolicy.facts import ElasticFacts, InstanceFacts, PoolFacts, runtime_pool_bytes
from kvpolicy.runtime.errors import LedgerError


def check_bytes(what: str, value: object) -> int:
    """``value`` as a byte figure the ledger can hold (0 ≤ value ≤ ``MAX_BYTES``), else LedgerError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LedgerError(f"kvpolicy ledger: {what} must be a whole number of bytes, not {value!r}")
    if not 0 <= value <= MAX_BYTES:
        raise LedgerError(
            f"kvpolicy ledger: {what} of {value} B is outside 0..{MAX_BYTES} B (16 EiB, the ledger's 64-bit "
            "fields): no GPU has that much memory; check the figure and its unit"
        )
    return value

MAX_BYTES = (1 << 64) - 2
"""The largest byte figure the ledger holds (a u64 field; 2⁶⁴ − 1 marks "none")."""

ADMITTED_POOL = "admitted"
"""The pool name under which facts show a static admission not yet replaced by a pool report."""


@dataclass(frozen=True)
class GpuFigures:
    """The GPU's C, H, U (and A once published), and where they come from."""

    source: str
    """``none``, ``provisional`` (engines' own figures before any controller) or ``published``."""
    revision: int
    capacity: int
    headroom: int
    other_used: int
    elastic_budget: int | None
    published_at: float
    controller_pid: int

    @property
    def known(self) -> bool:
        return self.source != "none"


@dataclass(frozen=True)
class Totals:
    runtime_reserved: int
    elastic_mapped: int
    elastic_pending: int
    guarantees: int
    active: int
    unmet_guarantees: int = 0
    """Σ max(0, g_i − held_i): guaranteed memory not yet held, kept free for its owners."""

    @property
    def elastic_committed(self) -> int:
        """Σ mapped + pending: what elastic admission has let through and not yet seen released."""
        return self.elastic_mapped + self.elastic_pending


@dataclass(frozen=True)
class SlotView:
    """One attached instance as read from its slot, consistent across its records."""

    index: int
    epoch: int
    gpu: str
    id: str
    model: str
    engine: str
    engine_id: str | None
    rank: int
    pid: int
    start_time: int
    pidns: int
    uid: int
    attached_at: float
    elastic: bool
    revision: int
    limit: int
    target: int
    guarantee: int
    published_at: float
    used: int
    mapped: int
    pending: int
    waiting: int
    """Bytes the elastic pool was refused in its last period (whole MiB): what its waiting work needs."""
    ack_revision: int
    ack: str | None
    deferred_since: float | None
    static_admitted: int
    reserve: int | None
    pools: dict[str, PoolFacts]
    last_activity: float

    def __post_init__(self) -> None:
        for name in ("limit", "target", "guarantee"):
            check_bytes(f"the instance's {name}", getattr(self, name))

    @property
    def runtime_reserved(self) -> int:
        """R_i: the admission not yet replaced by a report, plus reported runtime-owned pool bytes."""
        return self.static_admitted + runtime_pool_bytes(self.pools.values())

    @property
    def accounted(self) -> int:
        """Bytes of the instance the ledger knows to be on the GPU now: reported runtime-owned pools and elastic mapped."""
        return runtime_pool_bytes(self.pools.values()) + self.mapped

    def idle_seconds(self, now: float) -> float:
        return max(0.0, now - self.last_activity)

    def stuck(self, now: float, after: float) -> bool:
        """A deferral older than ``after`` seconds."""
        return self.ack == "deferred" and self.deferred_since is not None and now - self.deferred_since > after

    def facts(self, now: float) -> InstanceFacts:
        """The instance as ``kvpolicy.evaluate`` sees it."""
        pools = dict(self.pools)
        if self.static_admitted:
            pools[ADMITTED_POOL] = PoolFacts(owner="runtime", bytes=self.static_admitted)
        return InstanceFacts(
            id=self.id,
            model=self.model,
            engine=self.engine,
            engine_id=self.engine_id,
            gpu=self.gpu,
            rank=self.rank,
            pid=self.pid,
            pools=pools,
            elastic=ElasticFacts(used=self.used, mapped=self.mapped, waiting=self.waiting) if self.elastic else None,
            idle_seconds=self.idle_seconds(now),
        )


@dataclass(frozen=True)
class GpuLimits:
    """What the controller publishes for a GPU."""

    capacity: int
    headroom: int
    other_used: int
    elastic_budget: int

    def __post_init__(self) -> None:
        for name in ("capacity", "headroom", "other_used", "elastic_budget"):
            check_bytes(f"the GPU's {name}", getattr(self, name))


@dataclass(frozen=True)
class InstanceLimits:
    """What the controller publishes for an instance."""

    limit: int
    target: int
    guarantee: int

    def __post_init__(self) -> None:
        for name in ("limit", "target", "guarantee"):
            check_bytes(f"the instance's {name}", getattr(self, name))
