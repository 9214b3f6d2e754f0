"""What the policy says about a vLLM model's elastic KV cache, and which vLLM setups can have one.

Pure: imports neither torch nor vllm. ``elastic_settings`` reads the policy once at
engine start; ``check_kv_cache_config`` refuses a vLLM KV cache that the elastic
pool cannot back (read by attribute from vLLM's own ``KVCacheConfig``).

vLLM 0.33 keeps every KV cache group of a rank in one backing buffer drawn from one
block pool, so the buffer is elastic or it is not: marking any of the model's pools
``owner elastic`` makes the whole buffer elastic, and a pool of the same model
marked ``owner runtime`` is a contradiction the adapter refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpolicy.adapters.common import read_policy
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import ENV_POLICY
from kvpolicy.units import format_bytes, round_down

from .layouts import PREFERRED_LAYOUT, BufferGeometry
from ..pools import (
    DEEPSEEK_V4_POOLS,
    VLLM_ELASTIC_POOLS,
    deepseek_v4_pool,
    is_deepseek_v4,
    standard_pool,
)

ELASTIC_LAYOUT = PREFERRED_LAYOUT
"""The layout the adapter asks vLLM for when a model is elastic and the backends accept it (``layouts``)."""


@dataclass(frozen=True)
class ElasticSettings:
    """One instance's elastic KV cache, resolved for its GPU (bytes, whole chunks)."""

    model: str
    pools: tuple[str, ...]
    """The pools the policy marks ``owner elastic``."""
    guarantee: int
    """The model's ``min``: the instance's limit until a controller publishes."""
    virtual: int
    """The model's ``max``: the capacity vLLM plans with; address space only, mapped on demand."""
    chunk: int
    """The GPU's mapping granularity (``chunk``)."""
    runtime_pools: tuple[str, ...] = ()
    """The model's pools the policy marks ``owner runtime`` (checked against the real KV cache at allocation)."""


def marked_pools(pools: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(pools marked ``owner elastic``, pools marked ``owner runtime``) of a model block's pools."""
    elastic, runtime = [], []
    for name, block in pools.items():
        owner = getattr(getattr(block, "owner", None), "value", None)
        if owner == "elastic":
            elastic.append(name)
        elif owner == "runtime":
            runtime.append(name)
    return tuple(sorted(elastic)), tuple(sorted(runtime))


def elastic_settings(policy: Path | None, model: str, gpu: str, capacity: int | None) -> ElasticSettings | None:
    """The elastic settings of ``model`` on ``gpu``, or None when the policy marks none of its pools elastic.

    ``capacity`` is the GPU's measured total (the policy's ``capacity`` overrides it);
    percentages of ``min``/``max`` resolve against it. Raises AdapterError for pools
    the vLLM adapter cannot run elastically and for a capacity it needs but lacks.
    """
    from kvpolicy.policy.resolve import gpu_settings, model_settings

    if policy is None:
        return None
    loaded = read_policy(policy)
    settings = model_settings(loaded, model)
    on_gpu = gpu_settings(loaded, gpu)
    elastic, runtime = marked_pools(settings.pools)
    if not elastic:
        return None
    unsupported = [p for p in elastic if p not in VLLM_ELASTIC_POOLS]
    if unsupported:
        why = (
            "DeepSeek-V4's pools stay runtime-owned (its indexer aliases compressed entries on the decode hot path)"
            if set(unsupported) & set(DEEPSEEK_V4_POOLS)
            else "only standard attention caches can be elastic"
        )
        raise AdapterError(
            f"kvpolicy: the policy {policy} marks pool(s) {', '.join(unsupported)} of {model!r} `owner elastic`, "
            f"which the vLLM adapter cannot back with the allocator: {why}. Elastic vLLM pools: "
            f"{', '.join(VLLM_ELASTIC_POOLS)}. Use `owner runtime` for the others (`kvpolicy lint` says the same)."
        )
    from kvpolicy.policy.model import PercentLit

    percent = isinstance(settings.min, PercentLit) or isinstance(settings.max, PercentLit)
    if capacity is None and on_gpu.capacity is None and percent:
        raise AdapterError(
            f"kvpolicy: {model!r} has an elastic KV cache whose min/max are percentages, but the capacity of "
            f"{gpu} is unknown (no GPU to measure, no published figures). Set `capacity` for it in the policy, "
            "or start `kvpolicy run` first."
        )
    cap = on_gpu.capacity if on_gpu.capacity is not None else capacity
    chunk = on_gpu.chunk
    maximum = settings.max_bytes(cap or 0)
    if cap is not None:
        maximum = min(maximum, cap)  # the limit can never exceed the GPU
    maximum = round_down(maximum, chunk)
    guarantee = round_down(settings.min_bytes(cap or 0), chunk)
    if maximum < chunk:
        raise AdapterError(
            f"kvpolicy: {model!r}'s `max` on {gpu} is {format_bytes(maximum)}, less than one chunk "
            f"({format_bytes(chunk)}): vLLM could not plan a KV cache. Raise `max` in {ENV_POLICY}={policy}."
        )
    if guarantee > maximum:
        raise AdapterError(
            f"kvpolicy: {model!r}'s `min` {format_bytes(guarantee)} is above its `max` {format_bytes(maximum)} "
            f"on {gpu}; fix the policy {policy}."
        )
    return ElasticSettings(
        model=model, pools=elastic, guarantee=guarantee, virtual=maximum, chunk=chunk, runtime_pools=runtime
    )


IN_PROCESS_EXECUTORS = ("uni", "external_launcher", None)
"""Executors that run the one worker in the engine core's process."""


def executor_name(backend: Any) -> str | None:
    """vLLM's ``distributed_executor_backend`` as a name (it may be a class)."""
    return backend if isinstance(backend, str) or backend is None else getattr(backend, "__name__", str(backend))


def in_process(world_size: int, backend: Any) -> bool:
    """Whether the scheduler and the KV tensors share one process (the single-process elastic pool)."""
    return world_size == 1 and executor_name(backend) in IN_PROCESS_EXECUTORS


def check_parallel(world_size: int, backend: Any, data_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> None:
    """Refuse parallel setups the elastic pool does not support: see docs/vllm.md, "Elastic KV cache".

    Supported: the in-process executor with one worker (the pool maps in the process that
    hands blocks out), and vLLM's multiprocess executor (``mp``) with tensor parallel ranks
    — the engine core keeps the books and every rank maps the same chunks (``group``).
    Pipeline and data parallel, and other executors (Ray), are refused.
    """
    backend_name = executor_name(backend)
    if data_parallel_size == 1 and (in_process(world_size, backend) or (backend_name == "mp" and pipeline_parallel_size == 1)):
        return
    raise AdapterError(
        "kvpolicy: an elastic vLLM KV cache needs tensor parallel ranks of one engine core: executor 'uni' "
        "with one worker, or executor 'mp' with pipeline parallel 1, and data parallel 1; this engine has "
        f"world size {world_size}, pipeline parallel {pipeline_parallel_size}, data parallel {data_parallel_size}, "
        f"executor {backend_name!r}. Run each pipeline stage or data-parallel replica as its own engine, "
        "or mark the pools `owner runtime`."
    )


def kv_pools_of(kv_cache_config: Any) -> tuple[str, ...]:
    """The kvpolicy pools the layers of a real ``KVCacheConfig`` belong to (DeepSeek-V4's names for V4)."""
    specs: list[tuple[str, Any]] = []
    for group in kv_cache_config.kv_cache_groups:
        inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        specs += [(name, inner[name] if inner is not None else group.kv_cache_spec) for name in group.layer_names]
    v4 = is_deepseek_v4([s for _, s in specs])
    names: dict[str, None] = {}
    for name, spec in specs:
        names[(deepseek_v4_pool(name, spec) if v4 else standard_pool(spec))[0]] = None
    return tuple(names)


def check_kv_cache_config(kv_cache_config: Any, layout: str, runtime: Iterable[str] = ()) -> BufferGeometry:
    """Refuse a vLLM KV cache the elastic pool cannot back (the message says why and what to do), else
    say where its blocks lie.

    Needs: only standard attention pools (not DeepSeek-V4, Mamba, …), one device
    backing buffer, a layout whose blocks the allocator can map (``layouts``: block-outermost,
    or layer-outermost with one page per layer and block), and no pool of the model
    marked ``owner runtime``.
    """
    pools = kv_pools_of(kv_cache_config)
    bad = [p for p in pools if p not in VLLM_ELASTIC_POOLS]
    if bad:
        extra = " DeepSeek-V4's pools stay runtime-owned." if set(bad) & set(DEEPSEEK_V4_POOLS) else ""
        raise AdapterError(
            f"kvpolicy: this model's KV cache has pool(s) {', '.join(bad)}, which cannot be elastic on vLLM "
            f"(elastic: {', '.join(VLLM_ELASTIC_POOLS)}).{extra} Mark its pools `owner runtime` and size it with `reserve`."
        )
    clash = sorted(set(runtime) & set(pools))
    if clash:
        raise AdapterError(
            f"kvpolicy: the policy marks pool(s) {', '.join(clash)} `owner runtime` and others `owner elastic`, but "
            "vLLM keeps all of a model's KV cache groups in one buffer: it is elastic as a whole or not at all. "
            "Mark every pool of the model the same way."
        )
    tensors = kv_cache_config.kv_cache_tensors
    sizes = {t.size for t in tensors}
    if len(sizes) != 1 or any(getattr(t, "host_resident", False) for t in tensors):
        raise AdapterError(
            f"kvpolicy: expected one device KV backing buffer, got sizes {sorted(sizes)}; this placement "
            "(host-resident groups, several buffers) cannot be elastic"
        )
    return BufferGeometry.of(kv_cache_config, layout)
