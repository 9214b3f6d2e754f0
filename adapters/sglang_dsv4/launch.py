"""What a launch of SGLang 0.5.23 resolves for a DeepSeek-V4 model: a pure mirror of its argument resolution.

``sglang serve --model-path M`` does not hand the pool configurator the flags as
typed: ``prepare_server_args(...).resolve_once()`` applies model overrides and
hardware defaults first. For the settings the DeepSeek-V4 configurator and pools
read, this module replays that resolution from the model's ``config.json``, the
hardware and the flags given, without SGLang installed:

- ``page_size``: the ``DeepseekV4ForCausalLM`` override sets 256 on CUDA, whatever
  ``--page-size`` says (``arg_groups/model_overrides/deepseek_v4.py``);
- ``swa_full_tokens_ratio``: the same override sets 0.1 — recorded as explicitly set,
  so SWA is sized by ratio — unless the config's ``model_type`` is ``deepseek_v41``,
  which leaves it unset so the configurator sizes SWA from the request cap
  (``_swa_full_tokens_ratio_explicitly_set`` in ``arg_groups/kv_cache_hook.py``);
- ``kv_cache_dtype``: ``auto`` becomes ``fp8_e4m3``; only ``fp8_e4m3`` and
  ``bfloat16`` pass (``_deepseek_v4_kv_cache_dtype``);
- ``max_running_requests``: 256 when not given (``apply_deepseek_v4_defaults``);
- ``chunked_prefill_size``: by GPU memory when not given
  (``handle_gpu_memory_settings``: 2048 below 20 GiB, 4096 below 60 GiB, 8192 below
  160 GiB, else 16384), then divided by the attention-DP size
  (``handle_data_parallelism``);
- ``context_length``: ``--context-length`` if at most what SGLang derives from the
  config (``ModelConfig._derive_context_length``) and at least ``MIN_CONTEXT_LENGTH``, else refused.

The tests resolve real SGLang server args on CPU for V4-Flash, V4-Pro and a
``deepseek_v41`` config over random hardware and flags and compare field by field.
The hardware is a CUDA GPU of the Hopper class (an H200 by default): on SM100
SGLang picks other KV layouts, which the adapter refuses at start-up.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from kvpolicy.units import MiB, format_bytes

from .config_fields import V41_MODEL_TYPE
from .geometry import V4_ARCHITECTURE, ModelGeometry
from .plan import (
    DEFAULT_SWA_RATIO,
    V4_PAGE_SIZE,
    Plan,
    PlanError,
    PlanSettings,
    SWAElasticPolicy,
    budget_for_reserve,
    plan_for_budget,
    plan_for_full_tokens,
)
from .rope import MIN_CONTEXT_LENGTH, NO_ROOM

H200_MEMORY_MIB = 143_771
"""``nvidia-smi --query-gpu=memory.total`` of an H200 (141 GB), which SGLang reads as the GPU's memory."""
DEFAULT_MAX_RUNNING_REQUESTS = 256
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "bfloat16")
"""What SGLang's DeepSeek-V4 resolution accepts for --kv-cache-dtype (``auto`` becomes fp8_e4m3)."""
# handle_gpu_memory_settings: (GPU memory below, in MiB) → chunked prefill size.
CHUNKED_PREFILL_BY_GPU_MEMORY = ((20 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192))
CHUNKED_PREFILL_LARGEST_GPU = 16384


class Hardware(BaseModel):
    """The GPUs the launch runs on, as SGLang sees them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_memory: PositiveInt = H200_MEMORY_MIB * MiB
    """Bytes per GPU, as ``nvidia-smi`` reports its memory.total (SGLang reads it in MiB)."""
    tp_size: PositiveInt = 1
    """--tp-size: GPUs of the engine; each rank holds the same V4 pools."""

    @property
    def gpu_memory_mib(self) -> float:
        return self.gpu_memory / MiB


class LaunchFlags(BaseModel):
    """The flags given to ``sglang serve`` (SGLang's names); ``None``: not given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size: PositiveInt | None = None
    kv_cache_dtype: str = "auto"
    max_running_requests: PositiveInt | None = None
    swa_full_tokens_ratio: float | None = None
    chunked_prefill_size: int | None = None
    """Before the attention-DP division; -1 or 0 disable chunked prefill."""
    context_length: PositiveInt | None = None
    max_total_tokens: PositiveInt | None = None
    attn_dp_size: PositiveInt = 1
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    swa_prefix_tails: int | None = None
    allow_longer_context: bool = False
    """SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: a --context-length above the derived one is accepted."""
    swa_eviction_interval: int = 128
    """SGLANG_SWA_EVICTION_INTERVAL (SGLang clamps it to at least 1)."""


class LaunchError(ValueError):
    """SGLang refuses the launch while resolving its arguments; the message says why and what to change.

    ``flag`` is the flag at fault (None when the model config is); ``key`` the config's value at fault, if one is
    (its path among the geometry's fields: ``("architectures", 0)``).
    """

    def __init__(self, message: str, flag: str | None = None, key: tuple[str | int, ...] | None = None) -> None:
        super().__init__(message)
        self.flag, self.key = flag, key


class LaunchReport(BaseModel):
    """The launch a plan assumes: the model type, the hardware, and where each resolved value comes from."""

    model_config = ConfigDict(frozen=True)

    model_type: str
    hardware: Hardware
    kv_cache_dtype: str
    sources: dict[str, str] = Field(default_factory=dict)
    """Per setting: the flag that set it, or the SGLang default that did."""


class ResolvedLaunch(BaseModel):
    """What the DeepSeek-V4 configurator and pools will read, and the report of how it was resolved."""

    model_config = ConfigDict(frozen=True)

    settings: PlanSettings
    report: LaunchReport


class PolicyReserve(BaseModel):
    """Where a plan's budget comes from when it plans a policy's ``reserve``."""

    model_config = ConfigDict(frozen=True)

    policy: str
    model: str
    block: str | None
    """The model block that binds ``model`` (its pattern)."""
    line: NonNegativeInt
    gpu: str
    reserve: NonNegativeInt


class LaunchPlan(Plan):
    """``kvpolicy plan --engine sglang --format json``: the pools, and the launch and policy they assume."""

    launch: LaunchReport
    policy: PolicyReserve | None = None


def default_chunked_prefill_size(gpu_memory_mib: float) -> int:
    """SGLang's --chunked-prefill-size default for a GPU of ``gpu_memory_mib`` MiB."""
    for below, size in CHUNKED_PREFILL_BY_GPU_MEMORY:
        if gpu_memory_mib < below:
            return size
    return CHUNKED_PREFILL_LARGEST_GPU


def _check_architectures(architectures: tuple[str, ...]) -> None:
    """LaunchError unless the list is V4's name alone (the config is at fault: no flag). SGLang reads the list by
    its first name in some places and by whether it holds a name in others, so another name anywhere in it may
    make the model another (a DeepseekV3ForCausalLM: MLA, whose pools are not V4's)."""
    if not architectures or architectures[0] != V4_ARCHITECTURE:
        raise LaunchError(
            f"architecture {', '.join(architectures) or 'none'}: SGLang 0.5.23 builds DeepSeek-V4 pools for "
            f"{V4_ARCHITECTURE} only",
            key=("architectures", 0) if architectures else ("architectures",),
        )
    for i, other in enumerate(architectures[1:], start=1):
        if other != V4_ARCHITECTURE:
            raise LaunchError(
                f"architecture {other} after {V4_ARCHITECTURE}: SGLang 0.5.23 reads the list by its first name and "
                "by whether it holds a name (a DeepseekV3ForCausalLM anywhere in it makes the model MLA, and the V4 "
                f"pools cannot be sized); the plan reads [\"{V4_ARCHITECTURE}\"] only",
                key=("architectures", i),
            )


def resolve_launch(
    geometry: ModelGeometry, hardware: Hardware | None = None, flags: LaunchFlags | None = None
) -> ResolvedLaunch:
    """The settings a ``sglang serve`` of this model with ``flags`` on ``hardware`` resolves to."""
    hw, f = hardware or Hardware(), flags or LaunchFlags()
    _check_architectures(geometry.architectures)
    sources: dict[str, str] = {}
    v41 = geometry.model_type == V41_MODEL_TYPE

    if f.page_size not in (None, V4_PAGE_SIZE):
        sources["page_size"] = f"SGLang's DeepSeek-V4 override replaces --page-size {f.page_size}"
    else:
        sources["page_size"] = "SGLang's DeepSeek-V4 override"

    if f.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise LaunchError(
            f"--kv-cache-dtype {f.kv_cache_dtype}: SGLang refuses it for {V4_ARCHITECTURE} "
            f"('{f.kv_cache_dtype} is not supported'); use fp8_e4m3 (the default) or bfloat16",
            flag="--kv-cache-dtype",
        )
    kv_cache_dtype = "fp8_e4m3" if f.kv_cache_dtype == "auto" else f.kv_cache_dtype
    sources["kv_cache_dtype"] = "SGLang's DeepSeek-V4 default" if f.kv_cache_dtype == "auto" else "--kv-cache-dtype"

    if hw.tp_size % f.attn_dp_size:
        raise LaunchError(
            f"--tp-size {hw.tp_size} is not a multiple of --attn-dp-size {f.attn_dp_size} (SGLang asserts it)",
            flag="--attn-dp-size",
        )

    if f.swa_full_tokens_ratio is not None:
        if not 0 < f.swa_full_tokens_ratio <= 1:
            raise LaunchError(
                f"--swa-full-tokens-ratio {f.swa_full_tokens_ratio}: SGLang needs a ratio in (0, 1.0]",
                flag="--swa-full-tokens-ratio",
            )
        swa_ratio: float | None = f.swa_full_tokens_ratio
        sources["swa_ratio"] = "--swa-full-tokens-ratio (explicit: SWA sized by ratio)"
    elif v41:
        swa_ratio = None
        sources["swa_ratio"] = (
            f"SGLang leaves it unset for {V41_MODEL_TYPE}: SWA sized from the request cap "
            f"(ratio {DEFAULT_SWA_RATIO} without chunked prefill)"
        )
    else:
        swa_ratio = DEFAULT_SWA_RATIO
        sources["swa_ratio"] = f"SGLang's {geometry.model_type} override (explicit: SWA sized by ratio)"

    if f.swa_prefix_tails is not None and f.swa_prefix_tails < 0:
        raise LaunchError(
            f"--swa-prefix-tails {f.swa_prefix_tails}: SGLang needs a non-negative integer", flag="--swa-prefix-tails"
        )

    if f.max_running_requests is not None:
        max_running_requests = f.max_running_requests
        sources["max_running_requests"] = "--max-running-requests"
    else:
        max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        sources["max_running_requests"] = "SGLang's DeepSeek-V4 default"

    if f.chunked_prefill_size is not None:
        chunked = f.chunked_prefill_size
        sources["chunked_prefill_size"] = "--chunked-prefill-size"
    else:
        chunked = default_chunked_prefill_size(hw.gpu_memory_mib)
        sources["chunked_prefill_size"] = (
            f"SGLang's default for a GPU of {hw.gpu_memory_mib:,.0f} MiB ({format_bytes(hw.gpu_memory)})"
        )
    if f.attn_dp_size > 1:
        chunked //= f.attn_dp_size
        sources["chunked_prefill_size"] += f", divided by --attn-dp-size {f.attn_dp_size}"

    derived = geometry.derived_context_length
    if f.context_length is not None:
        if f.context_length < MIN_CONTEXT_LENGTH:
            raise LaunchError(f"--context-length {f.context_length} leaves no room for a request: {NO_ROOM}",
                              flag="--context-length")
        if f.context_length > derived and not f.allow_longer_context:
            raise LaunchError(
                f"--context-length {f.context_length} is greater than the context length SGLang derives from "
                f"the config ({derived}); SGLang refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
                flag="--context-length",
            )
        context = f.context_length
        sources["context_length"] = "--context-length"
    else:
        context = derived
        sources["context_length"] = "derived from the config"

    sources["attn_dp_size"] = "--attn-dp-size" if f.attn_dp_size > 1 else "SGLang's default (no attention DP)"
    settings = PlanSettings(
        page_size=V4_PAGE_SIZE,
        max_running_requests=max_running_requests,
        swa_ratio=swa_ratio,
        context_length=context,
        chunked_prefill_size=chunked,
        max_total_tokens=f.max_total_tokens,
        attn_dp_size=f.attn_dp_size,
        disable_radix_cache=f.disable_radix_cache,
        disable_overlap_schedule=f.disable_overlap_schedule,
        swa_prefix_tails=f.swa_prefix_tails,
        swa_eviction_interval=max(1, f.swa_eviction_interval),
    )
    report = LaunchReport(model_type=geometry.model_type, hardware=hw, kv_cache_dtype=kv_cache_dtype, sources=sources)
    return ResolvedLaunch(settings=settings, report=report)


def check_pool_dtype(launch: ResolvedLaunch) -> None:
    """The V4 pool on CUDA stores fp8 only: SGLang resolves ``bfloat16`` but fails building the pool."""
    if launch.report.kv_cache_dtype != "fp8_e4m3":
        raise PlanError(
            f"--kv-cache-dtype {launch.report.kv_cache_dtype}: SGLang 0.5.23 resolves it, then fails building "
            "the DeepSeek-V4 pool on CUDA (DeepSeekV4SingleKVPool asserts fp8 storage); use fp8_e4m3 (the default)",
            kind="kv_cache_dtype",
        )


def plan_launch(
    geometry: ModelGeometry,
    launch: ResolvedLaunch,
    *,
    budget: int | None = None,
    full_tokens: int | None = None,
    policy: PolicyReserve | None = None,
    elastic_swa: SWAElasticPolicy | None = None,
) -> LaunchPlan:
    """The pools of this launch for exactly one of: an available-bytes ``budget``, a ``full_tokens``
    count, or a ``policy`` reserve (the budget the adapter's hook picks so the footprint fits it).
    ``elastic_swa``: the SWA pool runs on the allocator (only with TP 1, as the adapter requires)."""
    if sum(x is not None for x in (budget, full_tokens, policy)) != 1:
        raise ValueError("give exactly one of budget, full_tokens or policy")
    check_pool_dtype(launch)
    if elastic_swa is not None and launch.report.hardware.tp_size != 1:
        raise PlanError(
            f"an elastic SWA pool needs --tp-size 1 (the adapter refuses TP {launch.report.hardware.tp_size} "
            "at start); plan it with --tp-size 1, or mark the pool `owner runtime`",
            kind="elastic_tp",
        )
    if policy is not None:
        plan = budget_for_reserve(geometry, launch.settings, policy.reserve, elastic_swa)
    elif budget is not None:
        plan = plan_for_budget(geometry, launch.settings, budget, elastic_swa)
    else:
        assert full_tokens is not None
        plan = plan_for_full_tokens(geometry, launch.settings, full_tokens, elastic_swa)
    return LaunchPlan(**dict(plan), launch=launch.report, policy=policy)


__all__ = [
    "H200_MEMORY_MIB",
    "Hardware",
    "LaunchError",
    "LaunchFlags",
    "LaunchPlan",
    "LaunchReport",
    "PolicyReserve",
    "ResolvedLaunch",
    "check_pool_dtype",
    "default_chunked_prefill_size",
    "plan_launch",
    "resolve_launch",
]
