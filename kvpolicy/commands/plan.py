"""``kvpolicy plan``: what an engine's KV pools hold — for a budget, a token count, or a policy's reserve.

A dispatcher by engine: each engine's part (``plan_sglang``, ``plan_vllm``) adds its
options and plans; ``plan_policy`` reads a policy the way the adapters do at
start-up. The engine parts live beside their adapter and import nothing heavy (no
torch, no engine), so ``plan`` runs on a lean install.

With ``--policy FILE --model NAME`` the engine comes from the model block (else
``--engine``) and the amount from the policy: for SGLang the budget whose pools and
request table fit the model's ``reserve`` (what the adapter's budget hook picks);
for vLLM the ``kv_cache_memory_bytes`` the adapter sets (the reserve in whole 2 MiB
granules, or an elastic model's ``max``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import parse_positive_count, parse_positive_size, parse_size
from kvpolicy.commands.plan_sglang import add_sglang_arguments, run_sglang
from kvpolicy.commands.plan_vllm import add_vllm_arguments, run_vllm

if TYPE_CHECKING:
    from kvpolicy.commands.plan_policy import PolicyTarget

ENGINES = ("sglang", "vllm")


def add_parser(subparsers: Subcommands) -> None:
    p = subparsers.add_parser(
        "plan",
        help="token capacities and bytes per KV pool for a budget, a token count or a policy (closed forms)",
        description="Compute an engine's KV pool sizes for a byte budget, a token count or a policy's "
        "reserve, byte for byte as the engine's own configurator and pools would.",
    )
    p.add_argument("--engine", choices=ENGINES, help="serving engine (with --policy: default the model block's)")
    p.add_argument("--model-config", required=True, metavar="CONFIG.json", help="the model's config.json")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--budget", type=parse_size, metavar="SIZE", help="available bytes, e.g. 40GiB")
    amount.add_argument("--full-tokens", type=parse_positive_count, metavar="N", help="SGLang: a full-token capacity")
    amount.add_argument("--policy", metavar="FILE", help="plan the model's reserve in this policy, as its adapter does")
    pol = p.add_argument_group("policy (with --policy)")
    pol.add_argument("--model", metavar="NAME", help="the model's name, as the policy binds it")
    pol.add_argument("--gpu", default="cuda:0", metavar="ID", help="the GPU whose settings apply (default cuda:0)")
    pol.add_argument("--gpu-capacity", type=parse_positive_size, metavar="SIZE",
                     help="the GPU's capacity for percentages (default: the policy's `capacity` for it)")
    add_format_option(p)
    add_sglang_arguments(p)
    add_vllm_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.commands.plan_policy import PolicyPlanError, choose_engine, load_target

    target = None
    engine = args.engine
    try:
        if args.policy is not None:
            target = load_target(args.policy, args.model, args.gpu, args.gpu_capacity)
            engine = choose_engine(target, engine)
        elif engine is None:
            raise PolicyPlanError("--engine is required (or --policy, whose model block names the engine)", code=2)
    except PolicyPlanError as exc:
        print(f"kvpolicy plan: {exc}", file=sys.stderr)
        return exc.code
    if engine == "sglang":
        if args.num_blocks is not None:
            print("kvpolicy plan --engine sglang: --num-blocks is vLLM's; give --budget or --full-tokens",
                  file=sys.stderr)
            return 2
        return run_sglang(args, target)
    if args.full_tokens is not None:
        print("kvpolicy plan --engine vllm: --full-tokens is SGLang's; give --budget or --num-blocks", file=sys.stderr)
        return 2
    return _run_vllm(args, target)


def _run_vllm(args: argparse.Namespace, target: PolicyTarget | None) -> int:
    """``run_vllm`` with the budget the vLLM adapter sets at start-up when planning a policy."""
    from kvpolicy.commands.plan_policy import PolicyPlanError, vllm_startup_budget

    if target is not None:
        try:
            startup = vllm_startup_budget(target)
        except PolicyPlanError as exc:
            print(f"kvpolicy plan --engine vllm: {exc}", file=sys.stderr)
            return exc.code
        args.budget = startup.budget
        if startup.kv_cache_layout is not None and args.kv_cache_layout is None:
            args.kv_cache_layout = startup.kv_cache_layout
            args.kv_cache_layout_source = f"{startup.kv_cache_layout} (the layout the adapter plans an elastic model with)"
        print(
            f"kvpolicy plan: {target.model!r} on {target.gpu} ({target.where}): {startup.why}: "
            f"kv_cache_memory_bytes {args.budget}",
            file=sys.stderr,
        )
    return run_vllm(args)
