"""What a default ``vllm serve`` launch resolves to on this platform, without loading a model.

``python resolve_defaults.py < launches.json``: each launch is ``{"model": DIR, "max_model_len": L}``
plus optional vLLM flags (``block_size``, ``max_num_batched_tokens``); it builds vLLM's
``EngineArgs`` → ``VllmConfig`` as the OpenAI server does (usage context ``OPENAI_API_SERVER``,
so the server's defaults) and prints one JSON line per launch: the block size, batched tokens,
batches in flight and whether chunked prefill is on. Needs only the config.json; imports no kvpolicy.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    for launch in json.load(sys.stdin):
        flags = {k: v for k, v in launch.items() if k not in ("model",)}
        cfg = EngineArgs(model=launch["model"], skip_tokenizer_init=True, load_format="dummy", **flags)\
            .create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        print(json.dumps({
            "block_size": cfg.cache_config.block_size,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "max_concurrent_batches": cfg.max_concurrent_batches,
            "chunked_prefill": bool(cfg.scheduler_config.enable_chunked_prefill),
        }), flush=True)


if __name__ == "__main__":
    main()
