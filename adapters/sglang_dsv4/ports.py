"""What the adapter needs from the rest of kvpolicy, as small protocols.

- ``ReserveSource``: the model's ``reserve`` from the policy (``policy_reserve``
  reads it through ``kvpolicy.policy``; the one place that knows the loader).
- ``LedgerSession``: static admission of the reserve on this GPU, and the
  per-pool facts once the real pools exist. ``InProcessLedger`` implements it in
  one process (tests, and a model of the semantics the shared-memory ledger
  implements across processes); the ledger client plugs in through ``connect``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvpolicy.facts import PoolFacts
from kvpolicy.units import format_bytes

from ..common import read_policy
from ..errors import AdapterError
from ..settings import ENV_POLICY, AdapterEnv

ENGINE = "sglang"


@dataclass(frozen=True)
class Reserve:
    """A model's ``reserve`` and where the policy says it."""

    bytes: int | None
    model: str
    file: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        if self.file is None:
            return "the policy"
        return f"{self.file}:{self.line}" if self.line else self.file


def default_engine_id(model: str) -> str:
    """What the ranks of one SGLang engine share: ``KVPOLICY_ENGINE_ID``, else the model and
    the launcher's pid (every scheduler is a child of the launcher), so two engines of
    one model never collide in the ledger."""
    return AdapterEnv.from_environ().engine_id or f"{model}@{os.getppid()}"


@dataclass(frozen=True)
class InstanceIdentity:
    """One SGLang scheduler process on one GPU."""

    model: str
    gpu: str
    rank: int
    pid: int = field(default_factory=os.getpid)
    engine: str = ENGINE
    engine_id: str = ""
    """Shared by the engine's ranks (tensor parallel); by default ``default_engine_id(model)``."""

    def __post_init__(self) -> None:
        if not self.engine_id:
            object.__setattr__(self, "engine_id", default_engine_id(self.model))

    @property
    def instance_id(self) -> str:
        return f"{self.engine_id}/{self.rank}"


class AdmissionRefused(AdapterError):
    """The ledger would not admit the reserve; the message has the figures."""


class LedgerSession(Protocol):
    def admit(self, nbytes: int) -> int:
        """Atomically admit a static reservation of ``nbytes`` on this GPU; returns the
        admitted bytes, or raises ``AdmissionRefused`` naming the GPU's figures."""
        ...

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        """The real pools exist: their facts replace the admitted figure in the ledger."""
        ...


ReserveSource = Callable[[str], Reserve]
Connector = Callable[[InstanceIdentity], LedgerSession]


def require_policy_file(env: AdapterEnv) -> Path:
    """The policy file named by ``KVPOLICY_POLICY``, or an error saying what is wrong with it."""
    if env.policy is None:
        raise AdapterError(
            f"kvpolicy: {ENV_POLICY} is not set. The DeepSeek-V4 adapter sizes SGLang's pools from "
            f"the model's `reserve` in the policy: set {ENV_POLICY}=/path/to/policy.kvp."
        )
    if not env.policy.is_file():
        raise AdapterError(f"kvpolicy: {ENV_POLICY}={env.policy}: no such file")
    return env.policy


def policy_reserve(env: AdapterEnv) -> ReserveSource:
    """Read ``reserve`` for a model from the policy file named by ``KVPOLICY_POLICY``."""
    path = require_policy_file(env)

    def read(model: str) -> Reserve:
        settings = read_policy(path).model_settings(model)
        return Reserve(bytes=settings.reserve, model=model, file=str(path), line=settings.line or None)

    return read


def default_connector(env: AdapterEnv) -> Connector:
    """The shared-memory ledger under ``KVPOLICY_LEDGER_DIR``, through its client."""
    from kvpolicy.runtime.engines import attach_static

    return lambda identity: attach_static(env.ledger_dir, identity)


class InProcessLedger:
    """Static admission and pool reports for the GPUs of one process.

    ``unreserved`` is, per GPU, what DESIGN §5 calls the GPU's unreserved memory
    (C − H − U − R − Σ guarantees) before anything is admitted here. Invariant,
    under the lock: ``admitted[gpu] + reported[gpu] ≤ unreserved[gpu]`` is checked
    at every admission, and each instance holds either an admission or a report.
    """

    def __init__(self, unreserved: Mapping[str, int]) -> None:
        self._lock = threading.Lock()
        self.unreserved = dict(unreserved)
        self.admitted: dict[str, dict[str, int]] = {gpu: {} for gpu in unreserved}
        self.reports: dict[str, dict[str, dict[str, PoolFacts]]] = {gpu: {} for gpu in unreserved}

    def held(self, gpu: str) -> int:
        """Bytes admitted or reported on ``gpu``."""
        reported = sum(sum(p.bytes for p in pools.values()) for pools in self.reports[gpu].values())
        return sum(self.admitted[gpu].values()) + reported

    def session(self, identity: InstanceIdentity) -> _InProcessSession:
        if identity.gpu not in self.unreserved:
            raise AdapterError(f"kvpolicy: the ledger knows no GPU {identity.gpu!r} (known: {sorted(self.unreserved)})")
        return _InProcessSession(self, identity)


@dataclass
class _InProcessSession:
    ledger: InProcessLedger
    identity: InstanceIdentity

    def admit(self, nbytes: int) -> int:
        ledger, gpu, key = self.ledger, self.identity.gpu, self.identity.instance_id
        with ledger._lock:
            others = ledger.held(gpu) - ledger.admitted[gpu].get(key, 0)
            free = ledger.unreserved[gpu] - others
            if nbytes > free:
                raise AdmissionRefused(
                    f"kvpolicy: cannot admit {format_bytes(nbytes)} ({nbytes} B) for {key} on {gpu}: "
                    f"{format_bytes(max(free, 0))} ({free} B) of the GPU's "
                    f"{format_bytes(ledger.unreserved[gpu])} unreserved memory is left "
                    f"({format_bytes(others)} held by other instances)"
                )
            ledger.admitted[gpu][key] = nbytes
            return nbytes

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        ledger, gpu, key = self.ledger, self.identity.gpu, self.identity.instance_id
        with ledger._lock:
            ledger.admitted[gpu].pop(key, None)  # the real bytes replace the admission
            ledger.reports[gpu][key] = dict(pools)
