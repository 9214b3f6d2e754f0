"""A vLLM rank's sessions in the ledger, for the runtime-owned and the elastic KV cache.

- ``ledger_identity(key, gpu)``: the one mapping of a vLLM rank (``InstanceKey``) on a
  GPU to the ledger's ``EngineIdentity``.
- ``VllmLedger``: what the runtime-owned path needs — ``admit`` the reserve of a rank
  on its GPU (atomically across processes, and all or none across the engine's ranks,
  before vLLM sizes the cache from it),
  ``report_pools``, ``release``. ``RankSessions`` implements it with one
  ``EngineSession`` per rank of this process, opened on its first admission (a rank that
  cannot measure its device waits up to ``KVPOLICY_FIGURES_WAIT`` for a controller's figures);
  ``static_ledger()`` is this process's (``set_static_ledger`` gives another).
- ``attach_elastic(key, gpu, guarantee, env)``: an elastic rank's session, owed the
  model's ``min`` (its limit until a controller publishes).

Errors are the ledger's (``AdmissionRefused`` with its figures, ``LedgerError``), or
an ``AdapterError`` for what the adapter itself gets wrong; the hooks turn the
ledger's into ``AdapterError`` at start-up (``kvpolicy.adapters.ledger_port``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.ledger_port import open_session
from kvpolicy.adapters.settings import ENV_FIGURES_WAIT, ENV_LEDGER_DIR, AdapterEnv, VllmEnv
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.session import EngineIdentity, EngineSession, RankGroup

from .identity import InstanceKey

ENGINE = "vllm"


def ledger_identity(key: InstanceKey, gpu: str) -> EngineIdentity:
    """Rank ``key`` on ``gpu`` as the ledger knows it."""
    return EngineIdentity(
        instance_id=key.id, model=key.model, engine=ENGINE, engine_id=key.engine_id, rank=key.rank, gpu=gpu
    )


class VllmLedger(Protocol):
    def admit(self, instance: InstanceKey, gpu: str, nbytes: int, group: RankGroup | None = None) -> int:
        """Reserve ``nbytes`` of runtime-owned KV memory for ``instance`` on ``gpu``.

        Atomic across processes and, with ``group`` (the engine's ranks), all or none across
        the ranks. Returns the bytes admitted (never more than asked), or raises
        ``AdmissionRefused`` saying what was asked, what is free and why.
        """
        ...

    def report_pools(self, instance: InstanceKey, pools: Mapping[str, PoolFacts]) -> None:
        """Replace ``instance``'s pool facts; from then on they count instead of its admission."""
        ...

    def release(self, instance: InstanceKey) -> None:
        """The instance stopped: what it holds returns to its GPU."""
        ...


class RankSessions:
    """``VllmLedger`` on the shared-memory ledger: a session per rank, opened on its first admission."""

    def __init__(self, env: AdapterEnv) -> None:
        self._env = env
        self._sessions: dict[InstanceKey, EngineSession] = {}

    def admit(self, instance: InstanceKey, gpu: str, nbytes: int, group: RankGroup | None = None) -> int:
        session = self._sessions.get(instance)
        if session is None:
            session = open_session(ledger_identity(instance, gpu), self._env)
            self._sessions[instance] = session
            self._wait_for_figures(session, instance)
        elif session.gpu != gpu:
            raise AdapterError(f"kvpolicy: {instance.id} is attached on {session.gpu}, not {gpu}")
        return session.admit_static_group(nbytes, group)

    def _wait_for_figures(self, session: EngineSession, instance: InstanceKey) -> None:
        """A rank that cannot measure its device (a CPU engine) waits for a controller's figures; the
        session just created the device's ledger, which is what the controller publishes for."""
        wait = VllmEnv.from_environ().figures_wait
        if session.wait_for_figures(wait):
            return
        self.release(instance)
        raise AdapterError(
            f"kvpolicy: {instance.id} waited {wait:g} s for a controller to publish figures for {session.gpu} "
            f"in {self._env.ledger_dir}, and none did; admission needs the device's capacity. Set `capacity` for "
            f'{session.gpu} in the policy (e.g. `gpu "{session.gpu}" {{ capacity 8 GiB }}`), or start '
            f"`kvpolicy run` (on a machine without GPUs with `--gpu-capacity SIZE`) with "
            f"{ENV_LEDGER_DIR}={self._env.ledger_dir}, or raise {ENV_FIGURES_WAIT}."
        )

    def report_pools(self, instance: InstanceKey, pools: Mapping[str, PoolFacts]) -> None:
        session = self._sessions.get(instance)
        if session is None:
            raise AdapterError(f"kvpolicy: {instance.id} reports pools but admitted nothing in this process")
        session.report_pools(pools)

    def release(self, instance: InstanceKey) -> None:
        session = self._sessions.pop(instance, None)
        if session is not None:
            session.close()


_static: VllmLedger | None = None


def set_static_ledger(ledger: VllmLedger | None) -> None:
    """Use ``ledger`` for the runtime-owned path's admissions and reports in this process (None: the
    shared-memory ledger again)."""
    global _static
    _static = ledger


def static_ledger() -> VllmLedger:
    """This process's ``VllmLedger``: the shared-memory one under ``KVPOLICY_LEDGER_DIR`` unless set."""
    global _static
    if _static is None:
        _static = RankSessions(AdapterEnv.from_environ())
    return _static


def attach_elastic(key: InstanceKey, gpu: str, guarantee: int, env: AdapterEnv) -> EngineSession:
    """The session of elastic rank ``key`` on ``gpu``, owed ``guarantee`` bytes (``LedgerError`` if it cannot attach)."""
    return open_session(ledger_identity(key, gpu), env, guarantee=guarantee, elastic=True)
