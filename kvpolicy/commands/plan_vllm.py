"""``kvpolicy plan --engine vllm``: vLLM's KV plan for a model and a budget (vLLM 0.32.0 or 0.33.0).

The dispatcher (``kvpolicy/commands/plan.py``) calls ``add_vllm_arguments(parser)``
and, for ``--engine vllm``, ``run_vllm(args)``. Options the SGLang part may define
too (``--model-config``, ``--budget``, ``--max-model-len``, ``--format``) are added
only if the parser lacks them. Imports neither torch nor vllm. Every default a flag
left to vLLM is stated in the plan (``assumed``): the vLLM version (the installed one,
else the newest validated), max_model_len (as vLLM derives it from the config's length keys and
RoPE scaling, ``planning/max_len.py``), the platform (``--platform``, default cuda, and the GPU class
it assumes) and what it decides — block size and the scheduler's batch figures
(``planning/platform.py``) — the model dtype (``--dtype auto``), KV dtype and layout. Launches vLLM refuses are
refused (exit 1): a problem of the config as the other documents' are, at its place with its code
(``file:line:col: KVDnnn error: ...``, ``planning/config_places.py``), one of the flags alone as a message.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpolicy.commands.common import parse_positive_count, parse_size

if TYPE_CHECKING:
    from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError

PROG = "kvpolicy plan --engine vllm"


def _add(parser: Any, *flags: str, **kwargs: Any) -> None:
    """Add an option unless another engine's part of ``kvpolicy plan`` added its flag already
    (``--model-config``, ``--budget``, ``--format``...)."""
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
    _add(_amount_group(parser), "--num-blocks", type=parse_positive_count, metavar="N",
         help="vLLM: a block count instead of a budget")
    _add(parser, "--max-model-len", type=parse_positive_count, metavar="L",
         help="--max-model-len of vLLM (default, as vLLM: the config's max_position_embeddings or other "
              "length key, times its RoPE scaling factor)")
    _add(parser, "--vllm-version", metavar="X.Y",
         help="the vLLM release to plan for: 0.32 or 0.33 (default: the installed vLLM, else 0.33)")
    _add(parser, "--format", choices=("text", "json"), default="text", help="output format (default: text)")
    group = parser.add_argument_group("vLLM options (names as vLLM's flags)")
    _add(group, "--platform", choices=("cuda", "cpu"), default="cuda",
         help="the platform whose defaults to plan with (default: cuda, a Hopper GPU of 70 to 160 GiB)")
    _add(group, "--cpu-amx", action="store_true",
         help="--platform cpu: the CPU has AMX (vLLM then keeps chunked prefill on for MLA models)")
    _add(group, "--block-size", type=int,
         help="default: the platform's (CUDA: 16, MLA with an fp8 cache 64, DeepSeek-V4 256; "
              "CPU: 128, MLA 16, DeepSeek-V4 256)")
    _add(group, "--sliding-window-block-size", type=int, help="default: --block-size")
    _add(group, "--dtype", choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
         help="the dtype vLLM serves the model in, and an auto KV cache's (default: auto, the checkpoint's, "
              "float32 served as bfloat16)")
    _add(group, "--kv-cache-dtype", default="auto",
         help="auto, bfloat16, float16, fp8 (default: auto: the model's dtype, or what the checkpoint's "
              "quantization_config gives, as vLLM resolves it)")
    _add(group, "--indexer-kv-dtype", choices=("fp8", "mxfp4"), default="fp8", help="DeepSeek-V4 indexer cache")
    _add(group, "--kv-cache-layout", help="VLLM_KV_CACHE_LAYOUT (default: BLHNC for DeepSeek-V4, else LBNHC)")
    _add(group, "--tensor-parallel-size", type=int, default=1, help="per-rank figures (default: 1)")
    _add(group, "--max-num-batched-tokens", type=int, help="default: the platform's (CUDA 8192, CPU 2048 x TP)")
    _add(group, "--max-concurrent-batches", type=int,
         help="batches in flight (default: CUDA 2, async scheduling; CPU 1)")


def run_vllm(args: argparse.Namespace) -> int:
    """Print the plan; 0 ok, 1 the input cannot be planned (message on stderr), 2 usage error."""
    from pydantic import ValidationError

    from kvpolicy.adapters.vllm_adapter.planning import platform as pf
    from kvpolicy.adapters.vllm_adapter.planning.hf_config import (
        FilledConfig,
        ModelSpecError,
        load_config,
        model_family,
    )
    from kvpolicy.adapters.vllm_adapter.planning.max_len import model_length
    from kvpolicy.adapters.vllm_adapter.planning.plan import (
        PlanError,
        PlanSettings,
        make_plan,
    )

    if not args.model_config:
        print("kvpolicy plan --engine vllm: --model-config is required", file=sys.stderr)
        return 2
    budget = args.budget  # parsed by the option's type
    if (budget is None) == (args.num_blocks is None):
        print("kvpolicy plan --engine vllm: give exactly one of --budget or --num-blocks", file=sys.stderr)
        return 2
    try:
        version, version_why = resolve_vllm_version(getattr(args, "vllm_version", None))
    except ValueError as exc:
        print(f"kvpolicy plan --engine vllm: {exc}", file=sys.stderr)
        return 2 if getattr(args, "vllm_version", None) is not None else 1  # asked for: the flag is at fault
    config: FilledConfig | None = None
    try:
        config = load_config(args.model_config)
        length = model_length(config)
        family = model_family(config)
    except ModelSpecError as exc:
        return refuse_config(exc, config, args.model_config)
    platform: pf.Platform = getattr(args, "platform", "cuda")
    # Only an absent flag takes the config's value (the parser refuses 0).
    if args.max_model_len is not None:
        max_model_len = args.max_model_len
    else:
        max_model_len = length.default if length and length.known else 0
    if not max_model_len:
        print(f"kvpolicy plan --engine vllm: --max-model-len is required: {args.model_config} has no "
              "max_position_embeddings (nor model_max_length) to derive it from, and kvpolicy does not know the "
              f"default of its config class (model_type {config.get('model_type')!r})", file=sys.stderr)
        return 2
    amx = bool(getattr(args, "cpu_amx", False))
    gpu = pf.cuda_gpu(args.indexer_kv_dtype if family == "deepseek_v4" else "fp8")
    resolved = {
        "block_size": pf.block_size(platform, family, args.block_size, amx),
        "max_num_batched_tokens": pf.batched_tokens(
            platform, family, args.max_num_batched_tokens, amx, max_model_len, args.tensor_parallel_size or 1, gpu),
        "max_concurrent_batches": pf.concurrent_batches(platform, args.max_concurrent_batches),
    }
    try:
        settings = PlanSettings(
            max_model_len=max_model_len,
            block_size=resolved["block_size"].value,
            sliding_window_block_size=args.sliding_window_block_size,
            dtype=getattr(args, "dtype", None) or "auto",
            kv_cache_dtype=args.kv_cache_dtype,
            indexer_kv_dtype=args.indexer_kv_dtype,
            kv_cache_layout=args.kv_cache_layout,
            tensor_parallel_size=args.tensor_parallel_size,
            max_num_batched_tokens=resolved["max_num_batched_tokens"].value,
            max_concurrent_batches=resolved["max_concurrent_batches"].value,
        )
    except ValidationError as exc:
        problems = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        print(f"kvpolicy plan --engine vllm: {problems}", file=sys.stderr)
        return 2
    try:
        plan = make_plan(config, settings, budget=budget, num_blocks=args.num_blocks, engine_version=version,
                         platform=platform)
    except ModelSpecError as exc:
        return refuse_config(exc, config, args.model_config)
    except PlanError as exc:
        print(f"{PROG}: {args.model_config}: {exc}", file=sys.stderr)
        return 1
    launch = Launch(platform, amx, gpu.name, length.why if length else "",
                    auto_kv_dtype(config, family, settings.dtype), served_dtype(config))
    assumed = assumed_defaults(args, plan, version_why, max_model_len, launch, resolved)
    defaults = class_defaults_given(config)
    if defaults:
        assumed["config_defaults"] = defaults
    plan = plan.model_copy(update={"assumed": assumed})
    if args.format == "json":
        print(plan.to_json())
    else:
        print(render_text(plan))
    return 0


def refuse_config(exc: ModelSpecError, config: Mapping[str, Any] | None, path: str) -> int:
    """Say why the plan refuses the config at ``path`` (``config`` as read, None if it was not): at the value at fault as a document's problem (reported for ``--format json``'s error document
    too), else as a message. The exit status: 2 for a file that cannot be read, else 1."""
    from kvpolicy.adapters.vllm_adapter.planning.config_places import refusal
    from kvpolicy.adapters.vllm_adapter.planning.hf_config import ConfigUnreadable
    from kvpolicy.commands.json_failure import refuse_document

    problems = refusal(exc, config)
    if problems is not None:
        refuse_document(problems, "plan --engine vllm")
    elif isinstance(exc, ConfigUnreadable):  # its message names the file
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    else:
        print(f"{PROG}: {path}: {exc}", file=sys.stderr)
    return 1


def resolve_vllm_version(asked: str | None) -> tuple[str, str | None]:
    """The validated vLLM version to plan for, and why when it was not asked for (ValueError if none fits).

    ``asked`` may name the release (``0.33``) or the version (``0.33.0``)."""
    from kvpolicy.adapters.vllm_adapter.versions import (
        NEWEST_VALIDATED_VLLM,
        VALIDATED_VLLM,
        installed_vllm,
        is_validated,
        not_validated_message,
    )

    if asked is not None and not asked.strip():
        validated = ", ".join(VALIDATED_VLLM)
        raise ValueError(f"--vllm-version {asked!r}: give a release, e.g. 0.33 (validated: {validated})")
    if asked is not None:
        version = next((v for v in VALIDATED_VLLM if asked in (v, v.rsplit(".", 1)[0])), asked)
        if not is_validated(version):
            raise ValueError(f"--vllm-version {asked}: {not_validated_message(asked)}")
        return version, None
    found = installed_vllm()
    if found is None:
        return NEWEST_VALIDATED_VLLM, "the newest validated; no vLLM is installed here"
    if not is_validated(found.version):
        raise ValueError(
            f"the installed {found.distribution} {found.version} is not a version kvpolicy's vLLM planning is "
            f"validated against (validated: {', '.join(VALIDATED_VLLM)}); give --vllm-version to plan for one of them"
        )
    return found.version, f"installed ({found.distribution})"


def auto_kv_dtype(config: dict[str, Any], family: str, dtype: str = "auto") -> str:
    """What ``--kv-cache-dtype auto`` stores for this model with ``--dtype dtype``, in words: the model's dtype,
    or what the checkpoint's quantization config makes of it (``planning/kv_dtype.py``)."""
    from kvpolicy.adapters.vllm_adapter.planning.hf_config import model_dtype
    from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import auto_words, kv_dtype

    if family == "deepseek_v4":
        return "fp8_ds_mla, DeepSeek-V4's packed cache"
    if dtype == "auto":
        model = f"{model_dtype(config)}, the model's dtype as vLLM's --dtype auto resolves it"
    else:
        model = f"{model_dtype(config, dtype)}, the model's dtype (--dtype {dtype})"
    return auto_words(kv_dtype(config, "auto", family), model)


def served_dtype(config: dict[str, Any]) -> str:
    """What ``--dtype auto`` serves this model in, and why, in words."""
    from kvpolicy.adapters.vllm_adapter.planning.hf_config import auto_dtype, auto_dtype_reason

    return f"{auto_dtype(config)}: {auto_dtype_reason(config)}"


def class_defaults_given(config: dict[str, Any]) -> str:
    """The keys config.json omits that its config class gave, with their values, in words ("" if none)."""
    from kvpolicy.adapters.vllm_adapter.planning.class_defaults import FilledConfig

    if not isinstance(config, FilledConfig) or not config.class_defaults:
        return ""
    classes = sorted(set(config.class_defaults.values()))
    values = []
    for key in config.class_defaults:
        value = config.get(key)
        shown = f"{len(value)} layers' kinds" if isinstance(value, list) else str(value)
        values.append(f"{key} {shown}")
    return f"{', '.join(values)} ({' and '.join(classes)}'s defaults for what config.json omits, as vLLM reads them)"


@dataclass(frozen=True)
class Launch:
    """What the plan assumed of the machine and the model where no flag said (for ``assumed``)."""

    platform: str
    amx: bool
    gpu: str
    """The CUDA GPU class assumed."""
    max_model_len_why: str
    kv_dtype: str
    dtype: str
    """What --dtype auto serves the model in, and why."""


def assumed_defaults(args: argparse.Namespace, plan: Any, version_why: str | None, max_model_len: int,
                     launch: Launch, resolved: dict[str, Any]) -> dict[str, str]:
    """Each figure a flag left to its default (or the platform overrode), with where it comes from."""
    assumed: dict[str, str] = {}
    if version_why is not None:
        assumed["vllm_version"] = f"{plan.engine_version} ({version_why})"
    if launch.platform == "cuda":
        assumed["platform"] = f"cuda ({launch.gpu}; --platform cpu plans vLLM's CPU build)"
    elif launch.amx:
        assumed["platform"] = "cpu with AMX (--cpu-amx)"
    else:
        assumed["platform"] = "cpu without AMX (pass --cpu-amx if it has AMX)"
    if args.max_model_len is None:
        assumed["max_model_len"] = f"{max_model_len} ({launch.max_model_len_why})"
    block = resolved["block_size"]
    if args.block_size is None or block.forced:
        sizes = sorted({g.block_size for g in plan.groups})
        over = f", over --block-size {args.block_size}" if args.block_size is not None and block.forced else ""
        assumed["block_size"] = f"{', '.join(map(str, sizes))} ({block.why}{over})"
    if getattr(args, "dtype", None) is None:
        assumed["dtype"] = f"auto ({launch.dtype})"
    if args.kv_cache_dtype == "auto":
        assumed["kv_cache_dtype"] = f"auto ({launch.kv_dtype})"
    if args.kv_cache_layout is None:
        assumed["kv_cache_layout"] = f"{plan.kv_cache_layout} (vLLM's default for this model's attention backends)"
    elif getattr(args, "kv_cache_layout_source", None):  # chosen by the policy's adapter, not by a flag
        assumed["kv_cache_layout"] = args.kv_cache_layout_source
    assumed["tensor_parallel_size"] = f"{args.tensor_parallel_size} (figures are per rank)"
    for key, flag in (("max_num_batched_tokens", args.max_num_batched_tokens),
                      ("max_concurrent_batches", args.max_concurrent_batches)):
        r = resolved[key]
        if flag is None or r.forced:
            assumed[key] = f"{r.value} ({r.why})"
    return assumed


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
    if plan.assumed:
        lines += ["", "  assumed (defaults no flag changed):"]
        lines += [f"    {name:<23} {why}" for name, why in plan.assumed.items()]
    return "\n".join(lines)
