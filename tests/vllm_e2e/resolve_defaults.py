"""What a default ``vllm serve`` launch resolves to on this platform, without loading weights.

``python resolve_defaults.py < launches.json``: each launch is ``{"model": DIR, "max_model_len": L}``
plus optional vLLM flags (``block_size``, ``max_num_batched_tokens``, ``kv_cache_dtype``); it builds
vLLM's ``EngineArgs`` → ``VllmConfig`` as the OpenAI server does (usage context ``OPENAI_API_SERVER``,
so the server's defaults), and prints one JSON line per launch: the block size, batched tokens, batches
in flight and whether chunked prefill is on. vLLM 0.32's CPU platform sets the block size in the config;
0.33's only when a worker starts (``update_block_size_for_backend``, once the model's layers have picked
their attention backends), so under 0.33 the model is built on the meta device and the block size fitted
as a worker fits it. Needs only the config.json; imports no kvpolicy. Runs under vLLM 0.32 (the e2e venv,
tests/vllm_e2e/test_vllm_cpu_defaults.py) or 0.33 (tests/vllm/test_vllm_cpu_defaults_033.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


class _CpuEvent:
    """Stands in for torch.cuda.Event, which DeepSeek-V4's attention creates at construction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fitted_block_size(cfg: Any) -> int:
    """The block size once vLLM has fitted it to the attention backends of the model's layers (0.32: the
    config's, which its update_block_size_for_backend changes only for hybrid attention + Mamba models)."""
    import vllm

    if vllm.__version__.startswith("0.32."):
        return cfg.cache_config.block_size
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import destroy_model_parallel, model_parallel_is_initialized
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.platforms import current_platform

    torch.cuda.Event = _CpuEvent  # type: ignore[misc,assignment]
    with set_current_vllm_config(cfg):
        if model_parallel_is_initialized():  # set up again: a MoE model needs the expert group a dense one lacks
            destroy_model_parallel()
        else:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)
        model_cls, _ = get_model_architecture(cfg.model_config)
        with torch.device("meta"):
            model_cls(vllm_config=cfg, prefix="")
        current_platform.update_block_size_for_backend(cfg)
    return cfg.cache_config.block_size


def main() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    for launch in json.load(sys.stdin):
        flags = {k: v for k, v in launch.items() if k not in ("model",)}
        cfg = EngineArgs(model=launch["model"], skip_tokenizer_init=True, load_format="dummy", **flags)\
            .create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        print(json.dumps({
            "block_size": fitted_block_size(cfg),
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "max_concurrent_batches": cfg.max_concurrent_batches,
            "chunked_prefill": bool(cfg.scheduler_config.enable_chunked_prefill),
        }), flush=True)


if __name__ == "__main__":
    main()
