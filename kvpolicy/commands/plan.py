"""``kvpolicy plan``: what an engine's KV pools hold for a budget, from closed forms.

A dispatcher by ``--engine``: each engine registers its options and its run
function; the engine parts live beside their adapter and import nothing heavy
(no torch, no engine), so ``plan`` runs on a lean install.
"""

from __future__ import annotations

import argparse
import sys

from kvpolicy.commands import add_format_option
from kvpolicy.commands.common import parse_size
from kvpolicy.commands.plan_vllm import add_vllm_arguments, run_vllm
from kvpolicy.units import format_bytes

ENGINES = ("sglang", "vllm")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="token capacities and bytes per KV pool for a budget (closed forms)",
        description="Compute an engine's KV pool sizes for a byte budget or a token count, "
        "byte for byte as the engine's own configurator and pools would.",
    )
    p.add_argument("--engine", required=True, choices=ENGINES, help="serving engine")
    p.add_argument("--model-config", required=True, metavar="CONFIG.json", help="the model's config.json")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--budget", type=parse_size, metavar="SIZE", help="available bytes, e.g. 40GiB")
    amount.add_argument("--full-tokens", type=_positive_int, metavar="N", help="full-token capacity")
    sg = p.add_argument_group("sglang (DeepSeek-V4)")
    sg.add_argument("--max-running-requests", type=_positive_int, metavar="R")
    sg.add_argument("--page-size", type=_positive_int, default=256, metavar="P", help="default 256")
    sg.add_argument("--swa-ratio", type=float, metavar="X", help="--swa-full-tokens-ratio (default 0.1)")
    sg.add_argument("--context-length", type=_positive_int, metavar="N", help="default: max_position_embeddings")
    sg.add_argument(
        "--chunked-prefill-size", type=int, default=8192, metavar="N",
        help="sizes SWA in cap mode (--max-running-requests without --swa-ratio); default 8192 (H200)",
    )
    add_format_option(p)
    add_vllm_arguments(p)
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def run(args: argparse.Namespace) -> int:
    return {"sglang": _run_sglang, "vllm": run_vllm}[args.engine](args)


def _run_sglang(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from kvpolicy.adapters.sglang_dsv4.geometry import GeometryError, load_geometry
    from kvpolicy.adapters.sglang_dsv4.plan import (
        PlanError,
        PlanSettings,
        plan_for_budget,
        plan_for_full_tokens,
    )

    try:
        geometry = load_geometry(args.model_config)
        settings = PlanSettings(
            page_size=args.page_size,
            max_running_requests=args.max_running_requests,
            swa_ratio=args.swa_ratio,
            context_length=args.context_length,
            chunked_prefill_size=args.chunked_prefill_size,
        )
    except GeometryError as exc:
        print(f"kvpolicy plan: {exc}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(f"kvpolicy plan: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    if settings.page_size != 256:
        print(
            f"kvpolicy plan: note: SGLang 0.5.23 builds DeepSeek-V4 pools only with page size 256; "
            f"planning with {settings.page_size} anyway",
            file=sys.stderr,
        )
    try:
        if args.budget is not None:
            plan = plan_for_budget(geometry, settings, args.budget)
        else:
            plan = plan_for_full_tokens(geometry, settings, args.full_tokens)
    except PlanError as exc:
        print(f"kvpolicy plan: {exc}", file=sys.stderr)
        return 1
    print(plan.to_json() if args.format == "json" else render_text(plan))
    return 0


BAR_WIDTH = 40


def render_text(plan) -> str:
    """Capacities, then one line per pool with a bar proportional to its footprint."""
    t = plan.tokens
    lines = [
        f"SGLang {plan.engine_version} DeepSeek-V4 pools"
        + (f" for a budget of {format_bytes(plan.budget)}" if plan.budget is not None else ""),
        f"tokens: full {t.full:,}  swa {t.swa:,} ({plan.mode})  c4 {t.c4:,}  c128 {t.c128:,}  "
        f"max running requests {plan.max_running_requests:,}",
        "",
        f"{'pool':<17}{'bytes':>16}{'footprint':>16}  share",
    ]
    total = plan.total_footprint or 1
    for name, pool in plan.pools.items():
        filled = round(BAR_WIDTH * pool.footprint / total)
        lines.append(
            f"{name:<17}{format_bytes(pool.bytes):>16}{format_bytes(pool.footprint):>16}  "
            f"{'█' * filled}{'·' * (BAR_WIDTH - filled)} {100 * pool.footprint / total:5.1f}%"
        )
        for part, nbytes in pool.parts.items():
            lines.append(f"  {part:<15}{format_bytes(nbytes):>16}")
    lines.append(f"{'total':<17}{format_bytes(plan.total_bytes):>16}{format_bytes(plan.total_footprint):>16}")
    lines.append("footprint: what the GPU loses once PyTorch's caching allocator rounds each tensor up")
    return "\n".join(lines)
