"""Who a vLLM rank is in the ledger: its ``InstanceKey`` (engine id, model, rank) and its GPU."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpolicy.adapters.ledger_port import HOST_DEVICE
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.runtime.gpu_identity import entry_gpu, local_gpu


@dataclass(frozen=True)
class InstanceKey:
    """One engine process on one GPU: rank ``rank`` of engine ``engine_id``.

    Every rank of one vLLM engine shares ``engine_id`` (tensor/pipeline parallel
    ranks are one engine); ``dp_rank`` tells data-parallel engines apart.
    """

    engine_id: str
    model: str
    rank: int = 0
    dp_rank: int = 0

    @property
    def id(self) -> str:
        dp = f"/dp{self.dp_rank}" if self.dp_rank else ""
        return f"{self.engine_id}{dp}/{self.rank}"


def default_engine_id() -> str:
    """The default engine id: this host and the process that loaded the plugin first.

    ``register`` puts it in ``KVPOLICY_ENGINE_ID`` for the processes vLLM starts after it."""
    return f"vllm-{socket.gethostname()}-{os.getpid()}"


def served_model_name(vllm_config: Any) -> str:
    name = getattr(vllm_config.model_config, "served_model_name", None) or vllm_config.model_config.model
    return name[0] if isinstance(name, (list, tuple)) else str(name)


def policy_model(vllm_config: Any) -> str:
    """The policy's name for the model: ``KVPOLICY_MODEL``, else vLLM's served model name."""
    return AdapterEnv.from_environ().model or served_model_name(vllm_config)


def instance_key(vllm_config: Any, rank: int) -> InstanceKey:
    env = AdapterEnv.from_environ()
    dp_rank = getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0
    return InstanceKey(
        engine_id=env.engine_id or default_engine_id(),
        model=env.model or served_model_name(vllm_config),
        rank=rank,
        dp_rank=dp_rank,
    )


def worker_gpu(worker: Any) -> str:
    """The ledger's id of the device an initialized vLLM worker keeps its KV cache on: ``HOST_DEVICE``
    for vLLM's CPU worker (its ``init_device`` sets ``device`` to the CPU), else the GPU's UUID.

    The CUDA ordinal of ``worker.device`` goes through this process's ``CUDA_VISIBLE_DEVICES``;
    without it, vLLM's assigned physical id (an index), else ``local_rank`` (see ``gpu_of``).
    """
    device = getattr(worker, "device", None)
    if getattr(device, "type", None) == "cpu":
        return HOST_DEVICE
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and isinstance(index, int):
        return local_gpu(index).id
    assigned = getattr(worker.parallel_config, "assigned_physical_gpu_ids", None)
    if assigned is not None and worker.local_rank < len(assigned):
        return entry_gpu(str(assigned[worker.local_rank])).id
    return gpu_of(worker.local_rank)


def gpu_of(local_rank: int, environ: Mapping[str, str] | None = None) -> str:
    """The ledger's id of logical GPU ``local_rank``: the UUID of the device ``CUDA_VISIBLE_DEVICES`` maps it to
    (``kvpolicy.runtime.gpu_identity``; ``cuda:N`` without NVML).

    (vLLM's ``Worker.init_device`` turns ``local_rank`` into the DP-adjusted logical
    index before the KV cache is sized.)
    """
    return local_gpu(local_rank, environ).id
