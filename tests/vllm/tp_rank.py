"""One tensor-parallel rank of vLLM's KV planning on a CPU (run by test_vllm_tensor_parallel.py).

``python tp_rank.py RANK WORLD PORT CONFIG_DIR BLOCK_SIZE BUDGET``: joins a gloo world
of WORLD processes, builds the real model on the meta device with tensor_parallel_size
WORLD, and prints this rank's layer specs and vLLM's plan for BUDGET bytes as JSON.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main(rank: int, world: int, port: int, config_dir: str, block_size: int, budget: int) -> None:
    import torch
    from tests.vllm.real_vllm import _CpuEvent
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    cfg = EngineArgs(
        model=config_dir, skip_tokenizer_init=True, load_format="dummy", max_model_len=4096,
        block_size=block_size, tensor_parallel_size=world, distributed_executor_backend="mp",
        max_num_batched_tokens=4096,
    ).create_engine_config()
    torch.cuda.Event = _CpuEvent  # type: ignore[misc,assignment]  # DeepSeek-V4 builds CUDA events
    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=world, rank=rank, local_rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        initialize_model_parallel(world, 1)
        model_cls, _ = get_model_architecture(cfg.model_config)
        with torch.device("meta"):
            model_cls(vllm_config=cfg, prefix="")
        layers = get_layers_from_vllm_config(cfg, AttentionLayerBase)
        specs = {n: s for n, layer in layers.items() if (s := layer.get_kv_cache_spec(cfg)) is not None}
    cfg.cache_config.kv_cache_layout = "BLHNC" if cfg.model_config.hf_config.model_type == "deepseek_v4" else "LBNHC"
    groups = get_global_kv_cache_groups(cfg, [dict(specs)])
    (config,) = get_kv_cache_configs(cfg, [dict(specs)], [budget], groups)
    print(json.dumps({
        "rank": rank,
        "pages": {name: [s.page_size_bytes, s.block_size] for name, s in specs.items()},
        "num_blocks": config.num_blocks,
        "bytes_per_block": config.kv_cache_tensors[0].size // config.num_blocks,
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_concurrent_batches": cfg.max_concurrent_batches,
    }))


if __name__ == "__main__":
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # for tests.vllm
    r, w, p, d, b, budget = sys.argv[1:7]
    main(int(r), int(w), int(p), d, int(b), int(budget))
