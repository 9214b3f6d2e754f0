"""``kvpolicy plan --engine vllm`` equals vLLM 0.33's own planning for random standard-attention and MLA configs.

Each example writes a config.json — Qwen3-shaped (random layer count, heads, KV heads, head size), Gemma-3-shaped
(layers a random mix of sliding-window and full attention, random window) or DeepSeek-V2-shaped (MLA: random
latent and RoPE sizes, heads, dense and MoE layers) — with a random checkpoint dtype (bfloat16, float16, float32,
or none), and draws a launch: max_model_len, --dtype (mostly auto; any of vLLM's), KV cache dtype (auto, 16-bit or fp8
variants), tensor parallel size
(one that divides the heads, or any), batched tokens, async scheduling (one or two batches in flight), block size,
layout and budget. vLLM's real model class gives the layer specs on the meta device (as rank 0 of the tensor
parallel size), and vLLM's ``get_global_kv_cache_groups`` / ``get_kv_cache_configs`` plan them. The plan must agree
on blocks, bytes per block, total bytes, groups and concurrency, or refuse where vLLM refuses, for vLLM's reason
(a budget with vLLM's figures; a tensor parallel size, a model or KV cache dtype). vLLM's ``allocate_kv_cache`` then
builds the plan on the ``meta`` device (no memory, so budgets need no cap), and its views must be the plan's buffer and
per-pool bytes (tests/vllm/allocation_check.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tests.vllm.allocation_check import check_allocation
from tests.vllm.refusals import assert_same_refusal
from tests.vllm.vllm_paths import CONFIGS

from kvpolicy.adapters.vllm_adapter.planning.class_defaults import with_class_defaults
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config, model_specs
from kvpolicy.adapters.vllm_adapter.planning.hf_config import MODEL_DTYPES as DTYPE_FLAGS
from kvpolicy.adapters.vllm_adapter.planning.model_build import ModelBuildRefused
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanError, PlanSettings, make_plan

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_PLAN_RANDOM_EXAMPLES", "40"))
"""Examples per run and test: each builds a real vLLM model on the meta device (tens of milliseconds once
vLLM is imported; the first one of a process takes seconds)."""

MODEL_DTYPES = ["bfloat16", "float16", "float32", None]
"""None: the config gives no dtype (vLLM reads it as float32)."""
STANDARD_KV_DTYPES = ["auto", "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
MLA_KV_DTYPES = ["auto", "auto", "auto", "bfloat16", "float16", "fp8", "fp8_e4m3"]
TP_SIZES = [1, 2, 3, 4, 6, 8, 16]
WIDTHS = [96, 192]
"""MLP widths every size in TP_SIZES divides (drawn half the time; else any width, which some sizes do not)."""

REFUSALS = {  # vLLM's start-up refusal → the plan's words for it
    "must be divisible by tensor parallel size": "does not divide the model's",
    "is not supported by MLA attention on CPU": "MLA attention on CPU takes auto, bfloat16 or float16 only",
    "is incompatible with dtype": "refuses a 16-bit KV cache of another dtype",
    "does not support float16": "vLLM refuses float16 for model_type",
    "Sliding window for some but all layers is not supported": "mix sliding and full attention",
}
"""Any other refusal must be an assertion of a module vLLM builds, the one the plan names (``ModelBuildRefused``)."""
HOST_REFUSAL = "is not supported by the CPU attention backend on this host"
"""vLLM's CPU attention takes an fp8 cache only on a CPU with AMX or AVX-512: the host, not the plan, decides."""
CPU_MOE_REFUSAL = "No Unquantized MoE backend supports the deployment configuration"
"""vLLM's CPU MoE kernels want each rank's expert width a multiple of 32 (gpt-oss): a CPU engine's limit, which a
plan for CUDA's kernels does not model."""


@st.composite
def spread(draw: st.DrawFn, low_bits: int, high_bits: int) -> int:
    """Log-uniform in [2**low_bits, 2**high_bits): every scale equally often, no round numbers."""
    bits = draw(st.integers(low_bits, high_bits - 1))
    return draw(st.integers(1 << bits, (2 << bits) - 1))


def width(draw: st.DrawFn) -> int:
    return draw(st.sampled_from(WIDTHS) | st.integers(16, 1024))


def omit(draw: st.DrawFn, config: dict, keys: list[str]) -> None:
    """Leave out some of ``keys`` (each one time in six): the config class then gives them (class_defaults)."""
    for key in keys:
        if draw(st.integers(0, 5)) == 0:
            config.pop(key, None)


def with_dtype(draw: st.DrawFn, config: dict) -> dict:
    """``config`` with a random checkpoint dtype, under transformers' new name or its old one, or none."""
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    dtype = draw(st.sampled_from(MODEL_DTYPES))
    if dtype is not None:
        config[draw(st.sampled_from(["torch_dtype", "dtype"]))] = dtype
    return config


@st.composite
def attention(draw: st.DrawFn, base: str) -> dict:
    """``base``'s config.json with random attention shapes, shrunk where the KV cache does not look."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    config = json.loads((CONFIGS / base / "config.json").read_text())
    config |= {
        "num_hidden_layers": draw(st.integers(2, 64)),
        "num_key_value_heads": kv_heads,
        "num_attention_heads": kv_heads * draw(st.sampled_from([1, 2, 3, 4])),
        "head_dim": draw(st.sampled_from([64, 128, 256])),  # head sizes vLLM's CPU backend takes
        # A multiple of every head count drawn (and of the classes' defaults), which transformers checks.
        "hidden_size": 384,
        "intermediate_size": width(draw),
        "vocab_size": draw(st.just(3072) | st.integers(256, 8192)),  # 3072: every size splits it
        "max_position_embeddings": draw(st.integers(128, 1 << 20)),
    }
    if base == "qwen3-8b" and draw(st.integers(0, 3)) == 0:  # Qwen3's window: every layer's, or from a layer on
        n = config["num_hidden_layers"]
        config |= {"use_sliding_window": draw(st.booleans()), "sliding_window": draw(st.integers(16, 8192)),
                   "max_window_layers": draw(st.integers(0, n + 1))}
        if draw(st.booleans()):
            config["layer_types"] = draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]),
                                                  min_size=n, max_size=n))
        omit(draw, config, ["use_sliding_window", "max_window_layers"])
    omit(draw, config, ["num_key_value_heads", "num_attention_heads", "head_dim", "intermediate_size", "vocab_size",
                        "max_position_embeddings"])
    return with_dtype(draw, config)


@st.composite
def hybrid(draw: st.DrawFn) -> dict:
    """Gemma-3-shaped: each layer sliding-window or full attention, at random."""
    config = draw(attention("gemma-3-1b"))
    n = config["num_hidden_layers"]
    kinds = st.sampled_from(["sliding_attention", "full_attention"])
    config["layer_types"] = draw(st.lists(kinds, min_size=n, max_size=n))
    config["sliding_window"] = draw(st.integers(16, 8192))
    config["query_pre_attn_scalar"] = config.get("head_dim", 256)
    if draw(st.integers(0, 3)) == 0:
        config["sliding_window_pattern"] = draw(st.integers(1, 8))
    omit(draw, config, ["layer_types", "sliding_window"])
    return config


@st.composite
def mla(draw: st.DrawFn) -> dict:
    """DeepSeek-V2-shaped: random latent and RoPE sizes and heads, dense and MoE layers, shrunk experts."""
    config = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
    layers = draw(st.integers(2, 32))
    config |= {
        "num_hidden_layers": layers,
        "first_k_dense_replace": draw(st.integers(0, layers)),
        "moe_layer_freq": draw(st.sampled_from([1, 1, 2, 3])),
        "num_attention_heads": draw(st.sampled_from([4, 8, 12, 16, 32])),
        "kv_lora_rank": draw(st.sampled_from([128, 256, 512])),
        "qk_rope_head_dim": draw(st.sampled_from([32, 64])),
        "hidden_size": 384, "intermediate_size": width(draw), "moe_intermediate_size": width(draw),
        "n_routed_experts": 8, "n_shared_experts": draw(st.sampled_from([1, 2, 3])),
        "num_experts_per_tok": 2, "vocab_size": draw(st.just(3072) | st.integers(256, 8192)),
        "max_position_embeddings": draw(st.integers(128, 1 << 20)),
    }
    omit(draw, config, ["first_k_dense_replace", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                        "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                        "vocab_size", "max_position_embeddings"])
    return with_dtype(draw, config)


OTHER_TYPES = {  # model type → (the test config it is drawn from, vLLM's architecture)
    "llama": ("qwen3-8b", "LlamaForCausalLM"), "mistral": ("qwen3-8b", "MistralForCausalLM"),
    "qwen2": ("qwen3-8b", "Qwen2ForCausalLM"), "gemma2": ("gemma-3-1b", "Gemma2ForCausalLM"),
    "gpt_oss": ("gpt-oss-20b", "GptOssForCausalLM"),
}


@st.composite
def other_types(draw: st.DrawFn) -> dict:
    """Llama, Mistral, Qwen2, Gemma-2 or gpt-oss: random shapes (as ``attention``) and windows: none, null, or a
    window with or without layer_types, each as the model's class and vLLM's model take it."""
    model_type = draw(st.sampled_from(sorted(OTHER_TYPES)))
    base, architecture = OTHER_TYPES[model_type]
    config = draw(attention(base))
    config |= {"model_type": model_type, "architectures": [architecture]}
    if model_type == "gpt_oss":
        config |= {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_per_token": 2}
    for key in ("layer_types", "sliding_window", "sliding_window_pattern"):
        config.pop(key, None)
    n = config["num_hidden_layers"]
    window = draw(st.sampled_from(["omitted", "null", "given"]))
    if window != "omitted":
        config["sliding_window"] = draw(st.integers(16, 8192)) if window == "given" else None
    if draw(st.booleans()):
        config["layer_types"] = draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]),
                                              min_size=n, max_size=n))
    if model_type == "gemma2":
        config["query_pre_attn_scalar"] = config.get("head_dim", 256)
    return config


@dataclass(frozen=True)
class Launch:
    """A random launch: vLLM's flags (and the scheduler's async switch) for one example."""

    max_model_len: int
    dtype: str
    block_size: int
    layout: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    max_num_batched_tokens: int
    async_scheduling: bool


@st.composite
def launches(draw: st.DrawFn, config: dict, block_sizes: list[int], kv_dtypes: list[str]) -> Launch:
    filled = with_class_defaults(config)  # what vLLM reads: the file and its class's defaults
    heads = filled["num_attention_heads"]
    fitting = [tp for tp in TP_SIZES if heads % tp == 0]
    positions = filled["max_position_embeddings"]
    if filled.get("sliding_window"):  # what vLLM's CPU backend keeps for sliding-window layers (MultipleOf(32))
        block_sizes = [b for b in block_sizes if b >= 32]
    return Launch(
        max_model_len=draw(st.one_of(st.just(positions), st.integers(16, positions))),
        dtype=draw(st.sampled_from(["auto"]) | st.sampled_from(DTYPE_FLAGS)),  # half of them auto
        block_size=draw(st.sampled_from(block_sizes)),
        layout=draw(st.sampled_from(["LBNHC", "BLHNC"])),
        kv_cache_dtype=draw(st.sampled_from(kv_dtypes)),
        # Mostly a size vLLM takes; one in four any (the refusal's parity).
        tensor_parallel_size=draw(st.sampled_from(TP_SIZES) if draw(st.integers(0, 3)) == 0 else st.sampled_from(fitting)),
        max_num_batched_tokens=draw(st.one_of(st.just(8192), spread(4, 17))),
        async_scheduling=draw(st.booleans()),
    )


SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), config=attention("qwen3-8b"), budget=st.integers(1 << 20, 64 << 30))
def test_random_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                                          config: dict, budget: int) -> None:
    launch = data.draw(launches(config, [16, 32, 64], STANDARD_KV_DTYPES))
    plan_and_compare(tmp_path_factory, config, budget, launch)


@SETTINGS
@given(data=st.data(), config=hybrid(), budget=st.integers(1 << 20, 64 << 30))
def test_random_sliding_window_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory,
                                                         data: st.DataObject, config: dict, budget: int) -> None:
    """Block sizes of 32 and up: what vLLM's CPU backend keeps for sliding-window layers too (MultipleOf(32))."""
    kinds = set(with_class_defaults(config)["layer_types"])
    event("sliding and full layers" if len(kinds) == 2 else f"{kinds.pop()} only")
    launch = data.draw(launches(config, [32, 64, 128], STANDARD_KV_DTYPES))
    plan_and_compare(tmp_path_factory, config, budget, launch)


@SETTINGS
@given(data=st.data(), config=other_types(), budget=st.integers(1 << 20, 64 << 30))
def test_random_configs_of_other_model_types_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory,
                                                               data: st.DataObject, config: dict, budget: int) -> None:
    """Each model type's class defaults and its model's way with windows, KV heads and widths (class_defaults)."""
    kinds = set(load_config_dict(config).get("layer_types") or ["no layer_types"])
    event(f"{config['model_type']}: window {config.get('sliding_window', 'omitted') is not None}, {sorted(kinds)}")
    launch = data.draw(launches(config, [32, 64], STANDARD_KV_DTYPES))
    plan_and_compare(tmp_path_factory, config, budget, launch)


def load_config_dict(config: dict) -> dict:
    return with_class_defaults(config)


@SETTINGS
@given(data=st.data(), config=mla(), budget=st.integers(1 << 20, 64 << 30))
def test_random_mla_configs_plan_as_vllm_does(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                                              config: dict, budget: int) -> None:
    """Block 16: what vLLM's reference CPU MLA kernel takes (the CPU platform forces it without AMX)."""
    launch = data.draw(launches(config, [16], MLA_KV_DTYPES))
    plan_and_compare(tmp_path_factory, config, budget, launch)


def ours_refuse(config: dict, settings: PlanSettings, budget: int) -> ModelSpecError | PlanError:
    """The plan's refusal of this launch on vLLM 0.33's CPU platform (what vLLM ran)."""
    with pytest.raises((ModelSpecError, PlanError)) as refused:
        make_plan(config, settings, budget=budget, platform="cpu")
    return refused.value


def building(exc: BaseException) -> str:
    """The module vLLM was building when it raised: the innermost ``prefix`` of the traceback's frames (every
    vLLM module takes its name as ``prefix``), or "" outside any."""
    module, tb = "", exc.__traceback__
    while tb is not None:
        prefix = tb.tb_frame.f_locals.get("prefix")
        if isinstance(prefix, str) and prefix:
            module = prefix
        tb = tb.tb_next
    return module


def same_module(theirs: str, ours: str) -> bool:
    """vLLM's module is the plan's or one of its parts (an MLP's gate_up_proj), but not its experts."""
    if theirs == ours:
        return True
    rest = theirs.removeprefix(ours + ".")
    return rest != theirs and rest.split(".")[0] not in ("experts", "shared_experts")


def plan_and_compare(tmp_path_factory: pytest.TempPathFactory, config: dict, budget: int, launch: Launch,
                     refusals: dict[str, str] = REFUSALS, files: dict[str, dict] | None = None) -> Any:
    """Plan ``config`` (with ``files`` beside it: name → JSON) as vLLM and as the plan, and compare; vLLM's
    ``VllmConfig`` once it built the model (None where it refused). ``refusals``: vLLM's words → the plan's."""
    from tests.vllm.real_vllm import Case, allocated_views, layer_specs, real_plan, vllm_config

    folder = tmp_path_factory.mktemp("random-config")
    (folder / "config.json").write_text(json.dumps(config))
    for name, content in (files or {}).items():
        (folder / name).write_text(json.dumps(content))
    mine = load_config(folder / "config.json")
    case = Case(str(folder), launch.block_size, max_model_len=launch.max_model_len, layout=launch.layout,
                kv_cache_dtype=launch.kv_cache_dtype, max_num_batched_tokens=launch.max_num_batched_tokens,
                tensor_parallel_size=launch.tensor_parallel_size, dtype=launch.dtype)  # absolute: config_dir is it
    assert case.config_dir == folder
    ours = PlanSettings(max_model_len=launch.max_model_len, block_size=launch.block_size, dtype=launch.dtype,
                        kv_cache_layout=launch.layout, kv_cache_dtype=launch.kv_cache_dtype,
                        tensor_parallel_size=launch.tensor_parallel_size)
    try:  # vLLM's start-up: its config, then the model's attention layers
        real_config = vllm_config(case)
        layer_specs(case)
    except (ValueError, AssertionError, ZeroDivisionError, AttributeError, NotImplementedError) as exc:
        # ZeroDivisionError: gpt-oss with no KV head on a rank; AttributeError: a Llama window it has not
        theirs = f"{type(exc).__name__}: {exc}"
        if HOST_REFUSAL in theirs:
            event("not compared: this CPU runs no fp8 cache")
            return None
        if CPU_MOE_REFUSAL in theirs:
            event("not compared: vLLM's CPU MoE kernels take no such width")
            return None
        refused = ours_refuse(mine, ours, budget)
        reason = next((r for r in refusals if r in theirs), None)
        if reason is None:  # vLLM's model refused to build: the plan must name the module, as its own refusal
            module = building(exc)
            assert isinstance(exc, (AssertionError, ZeroDivisionError, AttributeError)), theirs
            assert isinstance(refused, ModelBuildRefused), (theirs, module, refused)
            assert same_module(module, refused.module), (theirs, module, refused.module, str(refused))
            event(f"refused building {refused.module.split('.')[-1]}")
            return None
        assert refusals[reason] in str(refused), (theirs, str(refused))
        event(f"refused at start-up: {reason}")
        return None
    sched = real_config.scheduler_config
    saved = sched.async_scheduling
    sched.async_scheduling = launch.async_scheduling  # 2 batches in flight as on a GPU, or 1
    try:
        ours = ours.model_copy(update={"max_num_batched_tokens": sched.max_num_batched_tokens,
                                       "max_concurrent_batches": real_config.max_concurrent_batches})
        try:
            real = real_plan(case, budget)
        except ValueError as exc:  # vLLM refuses the budget: so must the plan, for vLLM's reason
            with pytest.raises(PlanError) as refused:
                make_plan(mine, ours, budget=budget, platform="cpu")
            event(f"refused: {assert_same_refusal(str(refused.value), str(exc))}")
            return real_config
        concurrency = real.max_concurrency
        allocated = allocated_views(real.kv_cache_config, case.layout)
    finally:
        sched.async_scheduling = saved
    groups = real.kv_cache_config.kv_cache_groups
    event(f"planned: {len(groups)} groups" if len(groups) > 1 else "planned: 1 group")
    event(f"planned: kv {launch.kv_cache_dtype}, model dtype {mine.get('dtype') or mine.get('torch_dtype')}, "
          f"--dtype {launch.dtype}")
    event(f"planned: tp {launch.tensor_parallel_size}")
    plan = make_plan(mine, ours, budget=budget, platform="cpu")
    assert plan.num_blocks == real.kv_cache_config.num_blocks
    assert plan.bytes_per_block == real.bytes_per_block
    assert {t.size for t in real.kv_cache_config.kv_cache_tensors} == {plan.total_bytes}  # the one backing buffer
    assert plan.max_concurrency == pytest.approx(concurrency, rel=1e-12)
    assert [(g.layers, g.block_size) for g in plan.groups] == [
        (len(g.layer_names), g.kv_cache_spec.block_size) for g in groups]
    # What vLLM allocates for it: the plan names layers by index (model.layers.N), vLLM by module.
    layers = model_specs(mine, ours).layers
    pools = {name: (layers[".".join(name.split(".")[:3])].pool, "") for name in allocated["layers"]}
    check_allocation(plan, pools, allocated)
    return real_config
