"""vLLM's own KV plans for DeepSeek-V4 layer patterns, under whichever vLLM runs this (0.32 or 0.33).

``python v4_plan_probe.py CONFIG.json < cases.json``: builds the template V4 model of
tests/vllm/real_vllm.py once on the meta device (one real spec per layer kind), then for each
case (``ratios``, ``max_len``, ``budget``, ``batched``, ``async_scheduling``) plans the reassembled
pattern with the installed vLLM's planning functions, builds each plan with its ``allocate_kv_cache``
on the ``meta`` device, and prints one JSON line per case: the figures and the allocation's views, or
``{"refused": message}``. Imports no kvpolicy (the figures are compared by the caller).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.vllm

from tests.vllm.real_vllm import (
    Case,
    RealPlan,
    allocated_views,
    v4_layer_templates,
    v4_specs,
    v4_template_config,
    vllm_config,
)


def plan(cfg: Any, specs: dict[str, Any], budget: int) -> tuple[RealPlan, int]:
    """(vLLM's plan, its worst case for one request), through the installed release's functions."""
    from vllm.v1.core import kv_cache_utils

    cfg.cache_config.kv_cache_layout = "BLHNC"
    try:
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:  # 0.32: planning lives in kv_cache_utils and computes the groups itself
        (config,) = kv_cache_utils.get_kv_cache_configs(cfg, [specs], [budget])
        groups = config.kv_cache_groups
        return RealPlan(cfg, groups, config), kv_cache_utils._max_memory_usage_bytes_from_groups(cfg, groups)
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

    groups = planning.get_global_kv_cache_groups(cfg, [specs])
    (config,) = planning.get_kv_cache_configs(cfg, [specs], [budget], groups)
    builder = get_kv_cache_config_builder(cfg)
    return RealPlan(cfg, groups, config), planning._max_memory_usage_bytes_from_groups(builder, cfg, groups)


def group_bytes(group: Any) -> int:
    """Bytes one block of the group holds: a page per layer."""
    spec = group.kv_cache_spec
    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    return sum(s.page_size_bytes for s in inner.values()) if inner else spec.page_size_bytes * len(group.layer_names)


def main() -> None:
    base = json.loads(Path(sys.argv[1]).read_text())
    cases = json.load(sys.stdin)
    folder = Path(tempfile.mkdtemp(prefix="v4-template-"))
    config = v4_template_config(base)
    (folder / "config.json").write_text(json.dumps(config))
    templates = v4_layer_templates(Case(str(folder), 256, max_model_len=65536, kv_cache_dtype="fp8", layout="BLHNC"))
    for case in cases:
        cfg = vllm_config(Case(str(folder), 256, max_model_len=case["max_len"], kv_cache_dtype="fp8", layout="BLHNC"))
        sched = cfg.scheduler_config
        saved = sched.max_num_batched_tokens, sched.async_scheduling
        if case["batched"] is not None:
            sched.max_num_batched_tokens, sched.async_scheduling = case["batched"], case["async_scheduling"]
        out: dict[str, Any] = {"max_num_batched_tokens": sched.max_num_batched_tokens,
                               "max_concurrent_batches": cfg.max_concurrent_batches}
        try:
            real, need = plan(cfg, v4_specs(templates, case["ratios"]), case["budget"])
            kc = real.kv_cache_config
            out |= {
                "num_blocks": kc.num_blocks, "bytes_per_block": real.bytes_per_block,
                # Each KVCacheTensor of a block-outermost plan aliases the one backing buffer.
                "tensor_sizes": sorted({t.size for t in kc.kv_cache_tensors}), "per_request_bytes": need,
                "max_concurrency": real.max_concurrency,
                "groups": [[len(g.layer_names), g.kv_cache_spec.block_size, group_bytes(g)]
                           for g in kc.kv_cache_groups],
                "allocated": allocated_views(kc, "BLHNC"),
            }
        except ValueError as exc:
            out["refused"] = str(exc)
        finally:
            sched.max_num_batched_tokens, sched.async_scheduling = saved
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
