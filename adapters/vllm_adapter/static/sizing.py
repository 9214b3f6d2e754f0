"""Sizing a runtime-owned vLLM KV cache: admit the policy's ``reserve``, then hand it to vLLM.

Runs in each worker (one per GPU) inside ``Worker.determine_available_memory``,
before vLLM's memory profiling would size the cache: the reserve is admitted in
the ledger for the worker's GPU — with several ranks, all or none across them over
vLLM's world group (``kvpolicy.runtime.group``) — and ``cache_config.kv_cache_memory_bytes`` — vLLM's
own switch that bypasses profiling — is set to the admitted bytes. vLLM then plans
``reserve // bytes_per_block`` blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpolicy.adapters.collective import process_group_ranks
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.runtime.session import RankGroup

from ..identity import InstanceKey, instance_key, worker_gpu
from ..ledger import static_ledger
from ..pools import ALLOCATOR_GRANULE
from .reserve import policy_reserve

ReserveOf = Callable[[AdapterEnv, str], int]

_admitted: dict[InstanceKey, int] = {}
"""The budget each rank of this process was given: profiling again (e.g. after sleep) keeps it."""


def size_kv_cache(worker: Any, reserve_of: ReserveOf | None = None) -> int:
    """Admit this model's reserve on the worker's GPU and make vLLM size the KV cache from it.

    Sets ``worker.cache_config.kv_cache_memory_bytes`` to the admitted bytes (rounded down
    to whole 2 MiB allocator granules) and returns them. Refuses (AdapterError) settings
    that would bypass the budget; a refused admission is the ledger's ``AdmissionRefused``.
    ``reserve_of(env, model)`` defaults to the policy's ``reserve``.
    """
    cache = worker.cache_config
    if cache.num_gpu_blocks_override is not None:
        raise AdapterError(
            f"kvpolicy: --num-gpu-blocks-override={cache.num_gpu_blocks_override} would size vLLM's KV "
            "cache past the policy's reserve; remove it while KVPOLICY_ENABLE=1."
        )
    env = AdapterEnv.from_environ()
    key = instance_key(worker.vllm_config, worker.rank)
    if key in _admitted:  # profiling again: the admission stands
        cache.kv_cache_memory_bytes = _admitted[key]
        return _admitted[key]
    reserve = (reserve_of or (lambda e, m: policy_reserve(e.policy, m)))(env, key.model)
    if cache.kv_cache_memory_bytes is not None and cache.kv_cache_memory_bytes != reserve:
        raise AdapterError(
            f"kvpolicy: --kv-cache-memory-bytes={cache.kv_cache_memory_bytes} disagrees with the policy's "
            f"reserve of {reserve} bytes for {key.model!r}; remove the flag (the policy sizes the cache)."
        )
    admitted = static_ledger().admit(key, worker_gpu(worker), reserve, engine_ranks(worker))
    # Whole allocator granules: the buffer PyTorch rounds up then still fits the admission.
    budget = admitted - admitted % ALLOCATOR_GRANULE
    _admitted[key] = budget
    cache.kv_cache_memory_bytes = budget
    return budget


def engine_ranks(worker: Any) -> RankGroup | None:
    """The engine's ranks, admitted all or none: vLLM's world group (tensor × pipeline parallel and,
    with data parallelism, every replica's ranks, which start together); None for a world of one."""
    pc = worker.parallel_config
    if pc.world_size * (getattr(pc, "data_parallel_size", 1) or 1) <= 1:
        return None
    from vllm.distributed.parallel_state import get_world_group

    return process_group_ranks(get_world_group())


def forget_admissions() -> None:
    """Forget the budgets this process gave (tests that reuse one rank's key against a new ledger)."""
    _admitted.clear()
