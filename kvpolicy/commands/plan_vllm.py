"""``kvpolicy plan --engine vllm``: vLLM 0.33's KV plan for a model and a budget.

The dispatcher (``kvpolicy/commands/plan.py``) calls ``add_vllm_arguments(parser)``
and, for ``--engine vllm``, ``run_vllm(args)``. Options the SGLang part may define
too (``--model-config``, ``--budget``, ``--max-model-len``, ``--format``) are added
only if the parser lacks them. Imports neither torch nor vllm.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpolicy.commands.common import parse_size

# Options whose flag another engine's part may already have added.
SHARED_OPTIONS = ("--model-config", "--budget", "--num-blocks", "--max-model-len", "--format")


def _add(parser: Any, *flags: str, **kwargs: Any) -> None:
    # argparse has no public way to ask whether a parser already has an option.
    if any(flag in parser._option_string_actions for flag in flags):
        return
    parser.add_argument(*flags, **kwargs)


def _amount_group(parser: argparse.ArgumentParser) -> Any:
    """The mutually exclusive group that holds ``--budget`` (the dispatcher's), or the parser."""
    # argparse internals: its groups and their actions are not public.
    budget = parser._option_string_actions.get("--budget")
    for group in parser._mutually_exclusive_groups:
        if budget is not None and budget in group._group_actions:
            return group
    return parser


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plan --engine vllm`` (shared ones only if absent)."""
    _add(parser, "--model-config", metavar="CONFIG.json", help="the model's config.json (no weights needed)")
    _add(parser, "--budget", type=parse_size, metavar="SIZE", help="KV budget per GPU, e.g. 60GiB")
    _add(_amount_group(parser), "--num-blocks", type=int, metavar="N", help="vLLM: a block count instead of a budget")
    _add(parser, "--max-model-len", type=int, metavar="L", help="--max-model-len of vLLM")
    _add(parser, "--format", choices=("text", "json"), default="text", help="output format (default: text)")
    group = parser.add_argument_group("vLLM options (names as vLLM's flags)")
    _add(group, "--block-size", type=int, help="default: vLLM's CUDA choice (16; MLA 64; DeepSeek-V4 256)")
    _add(group, "--sliding-window-block-size", type=int, help="default: --block-size")
    _add(group, "--kv-cache-dtype", default="auto", help="auto, bfloat16, float16, fp8 (default: auto)")
    _add(group, "--indexer-kv-dtype", choices=("fp8", "mxfp4"), default="fp8", help="DeepSeek-V4 indexer cache")
    _add(group, "--kv-cache-layout", help="VLLM_KV_CACHE_LAYOUT (default: BLHNC for DeepSeek-V4, else LBNHC)")
    _add(group, "--tensor-parallel-size", type=int, default=1, help="per-rank figures (default: 1)")
    _add(group, "--max-num-batched-tokens", type=int, default=8192, help="default: 8192")
    _add(group, "--max-concurrent-batches", type=int, default=2, help="2 with async scheduling (default)")


def run_vllm(args: argparse.Namespace) -> int:
    """Print the plan; 0 ok, 1 the input cannot be planned (message on stderr), 2 usage error."""
    from pydantic import ValidationError

    from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan

    if not args.model_config or not args.max_model_len:
        print("kvpolicy plan --engine vllm: --model-config and --max-model-len are required", file=sys.stderr)
        return 2
    budget = args.budget  # parsed by the option's type
    if (budget is None) == (args.num_blocks is None):
        print("kvpolicy plan --engine vllm: give exactly one of --budget or --num-blocks", file=sys.stderr)
        return 2
    try:
        settings = PlanSettings(
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            sliding_window_block_size=args.sliding_window_block_size,
            kv_cache_dtype=args.kv_cache_dtype,
            indexer_kv_dtype=args.indexer_kv_dtype,
            kv_cache_layout=args.kv_cache_layout,
            tensor_parallel_size=args.tensor_parallel_size,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_concurrent_batches=args.max_concurrent_batches,
        )
    except ValidationError as exc:
        problems = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        print(f"kvpolicy plan --engine vllm: {problems}", file=sys.stderr)
        return 2
    try:
        plan = make_plan(load_config(args.model_config), settings, budget=budget, num_blocks=args.num_blocks)
    except (ModelSpecError, PlanError) as exc:
        print(f"kvpolicy plan --engine vllm: {args.model_config}: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(plan.to_json())
    else:
        print(render_text(plan))
    return 0


def render_text(plan: Any) -> str:
    """The plan as a short table for people."""
    from kvpolicy.units import format_bytes

    budget = f", from a budget of {format_bytes(plan.budget)}" if plan.budget is not None else ""
    lines = [
        (
            f"vLLM {plan.engine_version} KV cache plan ({plan.model}, layout {plan.kv_cache_layout}, "
            f"max_model_len {plan.max_model_len:,})"
        ),
        (
            f"  {plan.num_blocks:,} blocks × {plan.bytes_per_block:,} B = {format_bytes(plan.total_bytes)} "
            f"({plan.total_bytes:,} B) per GPU{budget}"
        ),
        (
            f"  one request at max_model_len: {plan.per_request.blocks:,} blocks "
            f"({format_bytes(plan.per_request.bytes)}); max concurrency {plan.max_concurrency:.2f}x, "
            f"{plan.kv_cache_size_tokens:,} tokens"
        ),
        "",
        f"  {'group':>5} {'kind':<19} {'block':>6} {'layers':>6} {'bytes/block':>12} {'padding':>10}  pools",
    ]
    for i, g in enumerate(plan.groups):
        pools = ", ".join(f"{p} {b:,}" for p, b in g.pool_bytes_per_block.items())
        lines.append(
            f"  {i:>5} {g.kind:<19} {g.block_size:>6} {g.layers:>6} {g.bytes_per_block:>12,} "
            f"{g.padding_per_block:>10,}  {pools}"
        )
    lines += ["", f"  {'pool':<20} {'bytes/block':>12} {'per request':>14}  groups"]
    for name, p in plan.pools.items():
        lines.append(
            f"  {name:<20} {p.bytes_per_block:>12,} {format_bytes(p.per_request_bytes):>14}  "
            + ",".join(map(str, p.groups))
        )
    return "\n".join(lines)
