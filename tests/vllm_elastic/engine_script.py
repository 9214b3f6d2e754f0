"""One elastic vLLM engine process on a CPU, end to end through vLLM's plugin loading (run by test_elastic_plugin.py).

Real: vLLM's plugin loader finding kvpolicy, ``Worker.determine_available_memory`` and
``Worker.initialize_from_config``, vLLM's planning (``get_kv_cache_configs``) of the
virtual capacity, ``GPUModelRunner.initialize_kv_cache_tensors`` (allocation and binding to
the real attention layers, built on the meta device), vLLM's ``Scheduler`` (and its
KVCacheManager, bound by the plugin at construction), the shared-memory ledger and the
controller's ``LedgerDir.publish``. Stand-ins: the model runner object around that method
(no GPU model), the worker's CUDA memory snapshot, and the model's outputs (one sampled
token per finished prefill), as in vLLM's own scheduler tests.

argv: the repository root (for the tests package), steps. Prints one JSON line.
"""

import json
import sys
from types import SimpleNamespace

sys.path.append(sys.argv[1])
STEPS = int(sys.argv[2])

import torch
from tests.vllm_elastic.elastic_harness import KVSigner

from tests.vllm.real_vllm import Case, layer_specs, vllm_config
from vllm.plugins import load_general_plugins

load_general_plugins()
sys.modules["cuda.bindings"] = None  # no CUDA driver here: measure_gpu must not try it

import random

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

from kvpolicy.adapters.vllm_adapter.elastic.pool import elastic_of
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from kvpolicy.adapters.vllm_adapter.elastic import lifecycle
from kvpolicy.runtime.client import resolve_access, resolve_ledger_dir
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.ledger import GpuLedger, GpuLimits, InstanceLimits

GPU = "cuda:3"
MiB, GiB = 2**20, 2**30
ledger = GpuLedger.open(resolve_ledger_dir(), GPU, resolve_access())
ledger.provide_figures(capacity=8 * GiB, headroom=0, other_used=0)  # no GPU to measure here

case = Case("qwen3-8b", 16, max_model_len=1024, layout="BLHNC", max_num_batched_tokens=1024)
cfg = vllm_config(case)
# On CUDA, tensor parallel 1 runs the worker in the engine core's process ('uni'); vLLM's CPU
# platform picks 'mp' even then. This script stands for the CUDA setup.
cfg.parallel_config.distributed_executor_backend = "uni"
specs = layer_specs(case)  # builds the real model on meta: its attention layers are in the forward context

# The engine core's pre-hook: the policy marks the model elastic, so vLLM is asked for BLHNC.
lifecycle.prepare_engine(cfg, "qwen3-8b")
import os

layout_env = os.environ.get("VLLM_KV_CACHE_LAYOUT")

worker = Worker(cfg, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")


class ModelRunner(GPUModelRunner):
    """Only what GPUModelRunner.initialize_kv_cache_tensors reads; vLLM's method itself runs."""

    def __init__(self) -> None:  # no GPU model: not GPUModelRunner.__init__
        self.device = torch.device("cpu")
        self.cache_config = cfg.cache_config
        self.model_config = cfg.model_config
        self.compilation_config = cfg.compilation_config
        self.shared_kv_cache_layers = {}
        self.attn_groups = []
        self.speculative_config = None
        self.kv_caches = []

    def profile_run(self, **kwargs):
        pass

    def initialize_kv_cache(self, kv_cache_config, kv_cache_allocation_context=None):
        block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        self.views = self.initialize_kv_cache_tensors(
            kv_cache_config, block_sizes, kv_cache_allocation_context=kv_cache_allocation_context
        )


worker.model_runner = ModelRunner()
worker.init_snapshot = SimpleNamespace(free_memory=8 * GiB)

available = worker.determine_available_memory()  # the policy's max: address space only
cfg.cache_config.kv_cache_layout = "BLHNC"
groups = get_global_kv_cache_groups(cfg, [dict(specs)])
(kv_cache_config,) = get_kv_cache_configs(cfg, [dict(specs)], [available], groups)
kv_cache_config.kv_cache_layout = "BLHNC"
worker.initialize_from_config(kv_cache_config)
runner = worker.model_runner
plan = lifecycle.plan_of(worker)
buffer = plan.buffer
bound_layer = next(iter(cfg.compilation_config.static_forward_context.values())).kv_cache
view_in_buffer = buffer.va <= bound_layer.data_ptr() < buffer.va + buffer.size

init_none_hash(sha256)
scheduler = Scheduler(
    vllm_config=cfg, kv_cache_config=kv_cache_config,
    structured_output_manager=StructuredOutputManager(cfg), block_size=16, log_stats=False,
)
vllm_pool = scheduler.kv_cache_manager.block_pool
pool = elastic_of(vllm_pool)
core = SimpleNamespace(scheduler=scheduler)
signer = KVSigner(runner.views, 16)
session = plan.session
rng = random.Random(0)
prompts = [[rng.randrange(1, 30000) for _ in range(rng.randrange(20, 120))] for _ in range(5)]


def publish(revision, limit, target):
    with LedgerDir(resolve_ledger_dir()) as ld:
        view = ld.read()
        skipped = ld.publish(view, revision, {GPU: GpuLimits(8 * GiB, 0, 0, 4 * GiB)},
                             {session.identity.instance_id: InstanceLimits(limit=limit, target=target, guarantee=plan.settings.guarantee)})
        assert not skipped, skipped


from kvpolicy.adapters.vllm_adapter.reports import EngineReporter

# The engine core's live report, as the plugin's step hook sends it (the executor runs it on the worker).
reporter = EngineReporter(interval=0)
core.model_executor = SimpleNamespace(collective_rpc=lambda fn, args=(), non_block=False: fn(worker, *args))
live_pools = None
hasher = get_request_block_hasher(16, sha256)
n = 0
acks = []
held_trace = []
idle_before = None
for step in range(STEPS):
    if step == 0:
        publish(1, 96 * MiB, 64 * MiB)
    if step == STEPS // 2:
        publish(2, 24 * MiB, 16 * MiB)
    if step < STEPS * 3 // 4 and len(scheduler.waiting) < 3:
        prompt = rng.choice(prompts) + [rng.randrange(1, 30000) for _ in range(rng.randrange(1, 40))]
        scheduler.add_request(Request(f"r{n}", prompt, SamplingParams(max_tokens=rng.randrange(1, 60)), None,
                                      block_hasher=hasher))
        n += 1
    out = scheduler.schedule()
    # The "model": write this step's tokens' KV, check what each scheduled request had before.
    sampled = []
    for rid, k in out.num_scheduled_tokens.items():
        req = scheduler.requests[rid]
        ids = scheduler.kv_cache_manager.get_block_ids(rid)[0]
        start = req.num_computed_tokens - k
        signer.verify(ids, req.all_token_ids, start, rid)
        signer.write(ids, req.all_token_ids, start, req.num_computed_tokens)
        sampled.append([rng.randrange(1, 30000)] if req.num_computed_tokens >= req.num_tokens else [])
    rids = list(out.num_scheduled_tokens)
    mro = ModelRunnerOutput(req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)}, sampled_token_ids=sampled)
    scheduler.update_from_output(out, mro)
    lifecycle.after_step(core)  # what the plugin's EngineCore.step hook runs
    pool.check_consistent()
    snap = session.snapshot()
    acks.append((snap.ack_revision, snap.ack))
    held_trace.append(buffer.mapping.held_bytes - buffer.pinned)
    if snap.ack == "applied" and snap.ack_revision >= 1:
        assert buffer.mapping.held_bytes - buffer.pinned <= snap.limit, (step, buffer.mapping.held_bytes, snap.limit)
    assert snap.mapped == buffer.mapping.held_bytes - buffer.pinned and snap.pending == 0
    if step == STEPS // 4:
        reporter.maybe_report(core)
        live = session.snapshot()
        live_pools = {k: [p.owner, p.bytes] for k, p in live.pools.items()}
        live_used = live.used
        live_blocks = sum(len(set(b for b in scheduler.kv_cache_manager.get_block_ids(r)[0])) for r in scheduler.requests)

slot = session.snapshot()
print(json.dumps({
    "layout_env": layout_env,
    "available": available,
    "virtual": plan.settings.virtual,
    "guarantee": plan.settings.guarantee,
    "num_blocks": kv_cache_config.num_blocks,
    "bytes_per_block": buffer.bytes_per_block,
    "pinned": buffer.pinned,
    "view_in_buffer": view_in_buffer,
    "pool_class": type(vllm_pool).__name__,
    "elastic_class": type(pool).__name__,
    "finished": n - len(scheduler.requests),
    "requests": n,
    "acks": sorted(set(acks)),
    "peak": max(held_trace),
    "final_held": held_trace[-1],
    "refusals": dict(pool.refusals),
    "live_pools": live_pools,
    "live_used": live_used,
    "live_blocks": live_blocks,
    "page_bytes": sum(s.page_size_bytes for s in specs.values()),
    "slot": {"elastic": slot.elastic, "mapped": slot.mapped, "used": slot.used, "limit": slot.limit,
             "static_admitted": slot.static_admitted, "runtime_reserved": slot.runtime_reserved,
             "pools": {k: [p.owner, p.bytes] for k, p in slot.pools.items()}, "engine": slot.engine,
             "idle": slot.idle_seconds(__import__("time").time())},
}))
