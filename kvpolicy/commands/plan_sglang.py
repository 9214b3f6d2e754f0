"""``kvpolicy plan --engine sglang``: the DeepSeek-V4 pools SGLang 0.5.23 builds, without SGLang.

The settings default to what a launch of the model resolves to on the stated
hardware (``adapters/sglang_dsv4/launch.py``); the flags, named as SGLang's, change
them. The dispatcher (``kvpolicy/commands/plan.py``) calls ``add_sglang_arguments``
and ``run_sglang``. Imports neither torch nor sglang. A problem of the model config is reported
as the other documents' are, at its place with its code (``file:line:col: KVDnnn error: ...``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvpolicy.commands.common import parse_positive_count, parse_positive_size
from kvpolicy.units import format_bytes

if TYPE_CHECKING:
    from kvpolicy.adapters.sglang_dsv4.geometry import GeometryConfig
    from kvpolicy.adapters.sglang_dsv4.launch import Hardware, LaunchError, LaunchFlags, LaunchPlan
    from kvpolicy.commands.plan_policy import PolicyTarget

PROG = "kvpolicy plan --engine sglang"

ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
SWA_EVICTION_INTERVAL_ENV = "SGLANG_SWA_EVICTION_INTERVAL"
BAR_WIDTH = 40


def add_sglang_arguments(parser: argparse.ArgumentParser) -> None:
    """The hardware and the SGLang flags; unset flags take the value a launch resolves to."""
    hw = parser.add_argument_group(
        "hardware (SGLang's defaults depend on it)", "default: one H200 (143771 MiB as nvidia-smi reports it), TP 1"
    )
    hw.add_argument("--gpu-memory", type=parse_positive_size, metavar="SIZE", help="memory of each GPU, e.g. 80GiB")
    hw.add_argument("--tp-size", type=parse_positive_count, default=1, metavar="N", help="SGLang's --tp-size (default 1)")
    sg = parser.add_argument_group(
        "sglang (DeepSeek-V4)", "SGLang's flags; unset, each takes what a launch of the model resolves to"
    )
    sg.add_argument("--max-running-requests", type=parse_positive_count, metavar="R", help="default 256")
    sg.add_argument("--swa-ratio", "--swa-full-tokens-ratio", dest="swa_ratio", type=float, metavar="X",
                    help="default 0.1 (deepseek_v4); unset for deepseek_v41, which sizes SWA from the request cap")
    sg.add_argument("--context-length", type=parse_positive_count, metavar="N", help="default: derived from the config")
    sg.add_argument("--chunked-prefill-size", type=int, metavar="N", help="default: by GPU memory (8192 on an H200)")
    sg.add_argument("--max-total-tokens", type=parse_positive_count, metavar="N", help="a cap on the full tokens")
    sg.add_argument("--attn-dp-size", type=parse_positive_count, default=1, metavar="N", help="attention data parallel")
    sg.add_argument("--page-size", type=parse_positive_count, metavar="P", help="SGLang replaces it with 256 for DeepSeek-V4")
    sg.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE",
                    help="SGLang: auto (fp8_e4m3), fp8_e4m3, bfloat16; vLLM: auto, bfloat16, float16, fp8")
    sg.add_argument("--disable-radix-cache", action="store_true", help="as SGLang's flag of that name")
    sg.add_argument("--disable-overlap-schedule", action="store_true", help="as SGLang's flag of that name")
    sg.add_argument("--swa-prefix-tails", type=int, metavar="N", help="default: 4 per running request")


def launch_flags(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LaunchFlags:
    """The SGLang flags given on the command line (and the two SGLang environment variables that matter)."""
    from kvpolicy.adapters.sglang_dsv4.launch import LaunchError, LaunchFlags

    extra = {}
    if environ.get(SWA_EVICTION_INTERVAL_ENV):
        try:
            extra["swa_eviction_interval"] = int(environ[SWA_EVICTION_INTERVAL_ENV])
        except ValueError:  # SGLang reads it with int() and would not start either
            raise LaunchError(
                f"{SWA_EVICTION_INTERVAL_ENV}={environ[SWA_EVICTION_INTERVAL_ENV][:40]!r} is not an integer, "
                "as SGLang reads it", flag=SWA_EVICTION_INTERVAL_ENV,
            ) from None
    return LaunchFlags(
        page_size=args.page_size,
        kv_cache_dtype=args.kv_cache_dtype,
        max_running_requests=args.max_running_requests,
        swa_full_tokens_ratio=args.swa_ratio,
        chunked_prefill_size=args.chunked_prefill_size,
        context_length=args.context_length,
        max_total_tokens=args.max_total_tokens,
        attn_dp_size=args.attn_dp_size,
        disable_radix_cache=args.disable_radix_cache,
        disable_overlap_schedule=args.disable_overlap_schedule,
        swa_prefix_tails=args.swa_prefix_tails,
        allow_longer_context=environ.get(ALLOW_LONGER_CONTEXT_ENV, "").strip().lower() in ("1", "true", "yes"),
        **extra,
    )


def run_sglang(args: argparse.Namespace, target: PolicyTarget | None = None) -> int:
    """Print the plan; 0 ok, 1 the input cannot be planned (message on stderr), 2 usage error."""
    from pydantic import ValidationError

    from kvpolicy.adapters.errors import AdapterError
    from kvpolicy.adapters.sglang_dsv4.elastic_policy import elastic_swa_policy
    from kvpolicy.adapters.sglang_dsv4.geometry import ConfigUnreadable, GeometryError, read_geometry
    from kvpolicy.adapters.sglang_dsv4.launch import (
        LaunchError,
        PolicyReserve,
        plan_launch,
        resolve_launch,
    )
    from kvpolicy.adapters.sglang_dsv4.plan import PlanError
    from kvpolicy.commands.json_failure import refuse_document
    from kvpolicy.commands.plan_policy import PolicyPlanError

    config: GeometryConfig | None = None
    try:
        config = read_geometry(args.model_config)
        geometry = config.geometry
        hardware = _hardware(args)
        launch = resolve_launch(geometry, hardware, launch_flags(args))
        policy = elastic = None
        if target is not None:
            policy = PolicyReserve(
                policy=str(target.path), model=target.model, block=target.settings.pattern,
                line=target.settings.line, gpu=target.gpu, reserve=target.reserve(),
            )
            # Percentages resolve against the policy's capacity for the GPU, else the GPU planned for.
            capacity = target.capacity if target.capacity is not None else hardware.gpu_memory
            elastic = elastic_swa_policy(target.settings, chunk=target.chunk, capacity=capacity)
        plan = plan_launch(
            geometry, launch, budget=args.budget, full_tokens=args.full_tokens, policy=policy, elastic_swa=elastic
        )
    except ConfigUnreadable as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2  # a file that cannot be read is a usage error, as for every command
    except GeometryError as exc:  # its problems at their places (or its message)
        refuse_document(exc, "plan --engine sglang")
        return 1
    except (PlanError, AdapterError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except LaunchError as exc:
        return _refuse_launch(exc, config)
    except PolicyPlanError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.code
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"{PROG}: {problems}", file=sys.stderr)
        return 2
    print(plan.to_json() if args.format == "json" else render_text(plan))
    return 0


def _refuse_launch(exc: LaunchError, config: GeometryConfig | None) -> int:
    """A launch SGLang refuses: at the config's value at fault if one is (KVD008), else as a message; exit 2 for a
    flag at fault, else 1."""
    from kvpolicy.commands.json_failure import refuse_document
    from kvpolicy.document_codes import VALUE_NOT_ALLOWED
    from kvpolicy.json_text import DocumentInvalid

    if exc.key is not None and exc.flag is None and config is not None:
        refuse_document(DocumentInvalid([config.diagnostic(VALUE_NOT_ALLOWED, exc.key, str(exc))]), "plan --engine sglang")
        return 1
    print(f"{PROG}: {exc}", file=sys.stderr)
    return 2 if exc.flag else 1


def _hardware(args: argparse.Namespace) -> Hardware:
    """The GPUs given; only an absent --gpu-memory takes the default H200 (the parser refuses 0)."""
    from kvpolicy.adapters.sglang_dsv4.launch import Hardware

    if args.gpu_memory is None:
        return Hardware(tp_size=args.tp_size)
    return Hardware(tp_size=args.tp_size, gpu_memory=args.gpu_memory)


SETTING_LABELS = {
    "page_size": "page size",
    "kv_cache_dtype": "KV cache dtype",
    "max_running_requests": "max running requests",
    "swa_ratio": "SWA full-tokens ratio",
    "chunked_prefill_size": "chunked prefill size",
    "context_length": "context length",
    "attn_dp_size": "attention DP size",
}


def render_text(plan: LaunchPlan) -> str:
    """The launch assumed, the capacities, then one line per pool with a bar proportional to its footprint."""
    t, launch, s = plan.tokens, plan.launch, plan.settings
    if plan.policy is not None:
        p = plan.policy
        head = (
            f"for the reserve of {format_bytes(p.reserve)} of {p.model!r} ({p.policy}:{p.line}) on {p.gpu}: "
            f"budget {plan.budget:,} B"
        )
    elif plan.budget is not None:
        head = f"for a budget of {format_bytes(plan.budget)}"
    else:
        head = f"for {t.full:,} full tokens"
    hw = launch.hardware
    values = {**s.model_dump(), "kv_cache_dtype": launch.kv_cache_dtype}
    lines = [
        f"SGLang {plan.engine_version} DeepSeek-V4 pools {head}",
        f"launch: {launch.model_type} on GPUs of {format_bytes(hw.gpu_memory)} ({hw.gpu_memory_mib:,.0f} MiB), "
        f"TP {hw.tp_size}; per GPU (each rank holds these pools)",
    ]
    for key, label in SETTING_LABELS.items():
        value = values[key]
        shown = "not set" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
        lines.append(f"  {label:<22}{shown:>12}  {launch.sources.get(key, '')}")
    swa = f"{t.swa:,} (ratio {s.swa_ratio or 0.1})" if plan.mode == "ratio" else f"{t.swa:,} (request cap)"
    lines += [
        f"tokens: full {t.full:,}  swa {swa}  c4 {t.c4:,}  c128 {t.c128:,}  "
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
    for name, e in plan.elastic.items():
        lines.append(
            f"{name}: elastic, on kvpolicy's allocator: {format_bytes(e.virtual)} reserved ({e.layers} layers x "
            f"{e.pages:,} pages of {e.page_bytes:,} B, chunks of {format_bytes(e.chunk)}); {format_bytes(e.pinned)} "
            f"pinned (page 0, in the footprint); maps up to {format_bytes(e.limit)} more on demand, "
            f"guarantee {format_bytes(e.guarantee)}"
        )
    lines.append("footprint: what the GPU loses once PyTorch's caching allocator rounds each tensor up")
    lines.append("req_to_token: SGLang's request-to-token table, allocated beside the pools and outside the budget")
    b = plan.beyond_budget
    if b is not None:
        over = "over" if b.pools >= 0 else "under"
        lines.append(
            f"total vs budget: {_signed(b.total)} = req_to_token {format_bytes(b.req_to_token)} (outside the budget) "
            f"{'+' if b.pools >= 0 else '-'} {format_bytes(abs(b.pools))} of V4 pools {over} it (SGLang's configurator "
            "sizes them by a per-token average that leaves out each layer's padding page and the state rows "
            "rounded up to whole rings, and rounds tokens down to pages)"
        )
    return "\n".join(lines)


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))
