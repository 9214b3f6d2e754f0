"""Glue for the engine adapters: their ledger protocols, implemented with ``attach``.

- SGLang DeepSeek-V4 (``adapters/sglang_dsv4/ports.py``): ``attach_static(ledger_dir, identity)``
  returns a session with ``admit(nbytes) -> int`` and ``report_pools(pools)``.
- vLLM (``adapters/vllm_adapter/static/ledger.py``): ``connect_vllm_ledger(env)`` returns an object
  with ``admit(instance, gpu, nbytes) -> int``, ``report_pools(instance, pools)`` and
  ``release(instance)``.

Both run inside the engine process at the point where the engine sizes its KV cache,
when its CUDA device is current. Before any controller has published the GPU's
figures, static admission needs the capacity and headroom (docs/ledger.md, "Before
the controller"): ``measure_gpu`` reads cuMemGetInfo through torch (or cuda-python)
for the current device, and the headroom and any capacity override come from the
policy named by ``KVPOLICY_POLICY``. Other use is what the GPU has in use that the
ledger does not account for. Refusals become ``AdapterError`` with every figure.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvpolicy.adapters.common import read_policy
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.client import Instance, attach
from kvpolicy.runtime.errors import LedgerError


class LedgerAdmissionRefused(AdapterError):
    """The ledger would not admit the reservation (or could not be used); the message has the figures."""


@dataclass(frozen=True)
class Measured:
    capacity: int
    used: int


def measure_gpu() -> Measured | None:
    """Total and used memory of the current CUDA device, or None without a CUDA runtime in this process."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        return Measured(capacity=int(total), used=int(total - free))
    try:
        from cuda.bindings import driver

        err, free, total = driver.cuMemGetInfo()
    except Exception:  # no cuda-python, or no driver library on this machine (DynamicLibNotFoundError)
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None  # no current context: the controller's figures are needed
    return Measured(capacity=int(total), used=int(total - free))


def policy_gpu_figures(policy: Path | None, gpu: str, capacity: int) -> tuple[int, int]:
    """(capacity, headroom) for ``gpu`` from the policy file (capacity override applied); headroom 0 without one."""
    if policy is None:
        return capacity, 0
    settings = read_policy(policy).gpu_settings(gpu)
    cap = settings.capacity if settings.capacity is not None else capacity
    return cap, settings.headroom_bytes(cap)


def admit_static(inst: Instance, nbytes: int, policy: Path | None) -> int:
    """Admit ``nbytes`` of runtime-owned memory for ``inst`` (its reserve), or LedgerAdmissionRefused with the figures.

    Before any controller published, the GPU's figures are measured here (the current device)
    with the headroom and any capacity override of ``policy``.
    """
    figures: dict[str, Any] = {}
    if inst.gpu_figures().source != "published":
        m = measure_gpu()
        if m is not None:
            capacity, headroom = policy_gpu_figures(policy, inst.gpu, m.capacity)
            accounted = sum(v.accounted for v in inst.gpu_instances())
            figures = {"capacity": capacity, "headroom": headroom, "other_used": max(0, m.used - accounted)}
    try:
        return inst.admit_static(nbytes, reserve=nbytes, **figures)
    except LedgerError as exc:
        raise LedgerAdmissionRefused(str(exc)) from None


class _Identity(Protocol):
    model: str
    gpu: str
    rank: int
    engine: str
    engine_id: str

    @property
    def instance_id(self) -> str: ...


class StaticSession:
    """SGLang's ``LedgerSession``: one instance on one GPU."""

    def __init__(self, inst: Instance, policy: Path | None) -> None:
        self.instance = inst
        self._policy = policy

    def admit(self, nbytes: int) -> int:
        return admit_static(self.instance, nbytes, self._policy)

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        try:
            self.instance.report_pools(pools)
        except LedgerError as exc:
            raise LedgerAdmissionRefused(str(exc)) from None


def attach_static(ledger_dir: Path | str, identity: _Identity) -> StaticSession:
    """Attach an SGLang scheduler (``InstanceIdentity``) for static admission and pool reports."""
    try:
        inst = attach(
            model=identity.model,
            gpu=identity.gpu,
            engine=identity.engine,
            rank=identity.rank,
            id=identity.instance_id,
            engine_id=identity.engine_id,
            ledger_dir=ledger_dir,
        )
    except LedgerError as exc:
        raise LedgerAdmissionRefused(str(exc)) from None
    return StaticSession(inst, AdapterEnv.from_environ().policy)


class _Key(Protocol):
    engine_id: str
    model: str
    rank: int

    @property
    def id(self) -> str: ...


def attach_vllm(key: _Key, gpu: str, ledger_dir: Path | str | None, **options: Any) -> Instance:
    """The ledger instance of vLLM rank ``key`` on ``gpu`` (``options``: e.g. ``elastic``, ``guarantee``).

    One place maps a vLLM rank to its ledger identity, for the static and the elastic paths.
    Raises ``LedgerError``.
    """
    return attach(
        model=key.model, gpu=gpu, engine="vllm", rank=key.rank, id=key.id, engine_id=key.engine_id,
        ledger_dir=ledger_dir, **options,
    )


class VllmLedgerClient:
    """vLLM's ``VllmLedger``: instances keyed by the adapter's ``InstanceKey``, attached on first admission."""

    def __init__(self, env: AdapterEnv) -> None:
        self._env = env
        self._instances: dict[Any, Instance] = {}

    def admit(self, instance: _Key, gpu: str, nbytes: int) -> int:
        inst = self._instances.get(instance)
        if inst is None:
            try:
                inst = attach_vllm(instance, gpu, self._env.ledger_dir)
            except LedgerError as exc:
                raise LedgerAdmissionRefused(str(exc)) from None
            self._instances[instance] = inst
        elif inst.gpu != gpu:
            raise LedgerAdmissionRefused(f"kvpolicy: {instance.id} is attached on {inst.gpu}, not {gpu}")
        return admit_static(inst, nbytes, self._env.policy)

    def report_pools(self, instance: _Key, pools: Mapping[str, PoolFacts]) -> None:
        inst = self._instances.get(instance)
        if inst is None:
            raise LedgerAdmissionRefused(f"kvpolicy: {instance.id} reports pools but admitted nothing in this process")
        try:
            inst.report_pools(pools)
        except LedgerError as exc:
            raise LedgerAdmissionRefused(str(exc)) from None

    def release(self, instance: _Key) -> None:
        inst = self._instances.pop(instance, None)
        if inst is not None:
            inst.detach()


def connect_vllm_ledger(env: AdapterEnv | None = None) -> VllmLedgerClient:
    """The vLLM adapter's ledger, under ``env.ledger_dir`` (KVPOLICY_LEDGER_DIR)."""
    return VllmLedgerClient(env or AdapterEnv.from_environ())


__all__ = [
    "LedgerAdmissionRefused",
    "admit_static",
    "attach_static",
    "attach_vllm",
    "connect_vllm_ledger",
    "measure_gpu",
]
