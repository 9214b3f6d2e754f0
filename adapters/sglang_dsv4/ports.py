"""What the adapter needs from the rest of kvpolicy, as small protocols.

- ``ReserveSource``: the model's ``reserve`` from the policy (``policy_reserve``
  reads it through ``kvpolicy.policy``; the one place that knows the loader).
- ``LedgerSession``: static admission of the reserve on this GPU, and the
  per-pool facts once the real pools exist — the part of the runtime's
  ``EngineSession`` the hooks use (an elastic SWA pool also reads its limit source
  and reports activity). ``default_connector`` opens one per scheduler
  (``InstanceIdentity`` → ``EngineIdentity``) in the shared-memory ledger, an
  elastic instance owed a guarantee when the SWA pool is elastic; its errors are
  the ledger's, which the hooks turn into ``AdapterError`` at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.session import EngineIdentity, RankGroup

from ..common import read_policy
from ..errors import AdapterError
from ..settings import ENV_POLICY, AdapterEnv

if TYPE_CHECKING:
    from kvpolicy.alloc.limits import LimitSource

    from .plan import SWAElasticPolicy

ENGINE = "sglang"

SWAPolicySource = Callable[[str], "SWAElasticPolicy"]
"""The policy's elastic SWA pool on a GPU (by ledger id), resolved against that GPU's capacity."""


@dataclass(frozen=True)
class Reserve:
    """A model's ``reserve`` and where the policy says it."""

    bytes: int | None
    model: str
    file: str | None = None
    line: int | None = None
    swa_elastic: bool = False
    """The model block marks ``pool swa { owner elastic }``."""
    swa_policy: SWAPolicySource | None = field(default=None, compare=False, repr=False)
    """With ``swa_elastic``: the elastic SWA pool's guarantee, max and chunk on a GPU."""

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

    def ledger_identity(self) -> EngineIdentity:
        """This scheduler as the ledger knows it."""
        return EngineIdentity(
            instance_id=self.instance_id, model=self.model, engine=self.engine, engine_id=self.engine_id,
            rank=self.rank, gpu=self.gpu,
        )


class LedgerSession(Protocol):
    def admit_static(self, nbytes: int) -> int:
        """Atomically admit a static reservation of ``nbytes`` on this GPU; returns the admitted
        bytes, or raises the runtime's ``AdmissionRefused`` naming the GPU's figures."""
        ...

    def admit_static_group(self, nbytes: int, group: RankGroup | None) -> int:
        """``admit_static`` for one rank of a tensor-parallel engine: admitted only if every rank of
        ``group`` is, on its own GPU (all or none; ``kvpolicy.runtime.group``)."""
        ...

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        """The real pools exist: their facts replace the admitted figure in the ledger."""
        ...


@runtime_checkable
class ElasticLedgerSession(LedgerSession, Protocol):
    """The session of an engine whose SWA pool is elastic (an elastic instance in the ledger)."""

    def limit_source(self) -> LimitSource:
        """The instance's limit, as the elastic pool's ``LimitSource``."""
        ...

    def touch(self) -> None:
        """The engine served something now (facts: ``idle_seconds``)."""
        ...


class Connector(Protocol):
    def __call__(self, identity: InstanceIdentity, *, guarantee: int = 0, elastic: bool = False) -> LedgerSession:
        """The session of ``identity``: static, or (``elastic``) an elastic instance owed ``guarantee`` bytes."""
        ...


ReserveSource = Callable[[str], Reserve]


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
        from kvpolicy.policy.resolve import gpu_settings, model_settings

        from .elastic_policy import swa_is_elastic

        loaded = read_policy(path)
        settings = model_settings(loaded, model)

        def swa_policy(gpu: str) -> SWAElasticPolicy:
            from ..ledger_port import gpu_capacity
            from .elastic_policy import elastic_swa_policy

            on_gpu = gpu_settings(loaded, gpu)
            capacity = on_gpu.capacity if on_gpu.capacity is not None else gpu_capacity(gpu, env)
            if capacity is None:
                raise AdapterError(
                    f"kvpolicy: {model!r}'s SWA pool is elastic, but the capacity of {gpu} is unknown (no GPU to "
                    f"measure, no published figures): its min and max cannot be resolved. Set `capacity` for "
                    f"{gpu} in {path}, or start `kvpolicy run` first."
                )
            policy = elastic_swa_policy(settings, chunk=on_gpu.chunk, capacity=capacity)
            assert policy is not None, "the model block marks the SWA pool elastic"
            return policy

        elastic = swa_is_elastic(settings)
        return Reserve(
            bytes=settings.reserve, model=model, file=str(path), line=settings.line or None,
            swa_elastic=elastic, swa_policy=swa_policy if elastic else None,
        )

    return read


def default_connector(env: AdapterEnv) -> Connector:
    """Sessions in the shared-memory ledger under ``KVPOLICY_LEDGER_DIR`` (``LedgerError`` if one cannot open)."""
    from ..ledger_port import open_session

    def connect(identity: InstanceIdentity, *, guarantee: int = 0, elastic: bool = False) -> LedgerSession:
        return open_session(identity.ledger_identity(), env, guarantee=guarantee, elastic=elastic)

    return connect
