"""``launch.py`` against SGLang 0.5.23's own argument resolution, and ``plan``'s defaults against a real launch.

Each case runs the real ``prepare_server_args([...]).resolve_once()`` for a model
directory (on CPU, with the GPU memory SGLang would read from ``nvidia-smi``
stubbed to the figure under test), publishes the resolved arguments as SGLang's
launcher does, and reads them the way the adapter's hooks do; the mirror must
resolve the same settings, or refuse the same launch.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4.geometry import load_geometry
from kvpolicy.adapters.sglang_dsv4.launch import (
    H200_MEMORY_MIB,
    Hardware,
    LaunchError,
    LaunchFlags,
    plan_launch,
    resolve_launch,
)
from kvpolicy.adapters.sglang_dsv4.plan import PlanError, pool_tensors, size_from_budget
from kvpolicy.units import GiB, MiB
from tests.sglang.sglang_support import (
    MODELS,
    RANDOM_EXAMPLES,
    engine_reading,
    published_resolution,
    real_sizes,
    real_tensors,
    resolve_for_real,
    single_process_parallel,
)

pytestmark = pytest.mark.sglang

EXAMPLES = max(RANDOM_EXAMPLES * 2 // 5, 10)
FLASH = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
PRO = json.loads((MODELS / "deepseek-v4-pro.json").read_text())
CONFIGS = {  # model directories: the released shapes, a V4.1-typed one, and the context-length rules
    "flash": FLASH,
    "pro": PRO,
    "v41": {**FLASH, "model_type": "deepseek_v41"},
    "flash-yarn": {**FLASH, "max_position_embeddings": 65536, "rope_scaling": {"type": "yarn", "factor": 16}},
    "flash-linear": {**FLASH, "max_position_embeddings": 65536, "rope_scaling": {"type": "linear", "factor": 4}},
    "flash-dynamic": {**FLASH, "max_position_embeddings": 65536, "rope_scaling": {"rope_type": "dynamic", "factor": 2.5}},
    "flash-seq-length": {**FLASH, "seq_length": 5000, "model_max_length": 7000},
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, sglang_env):
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, config in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        dirs[name] = root / name
    return dirs


def argv_of(flags: LaunchFlags) -> list[str]:
    """The ``sglang serve`` flags that ``LaunchFlags`` stands for."""
    argv = []
    for name, value in flags.model_dump(exclude_defaults=True).items():
        if name in ("allow_longer_context", "swa_eviction_interval"):
            continue  # environment variables, not flags; left at SGLang's defaults here
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


@dataclass(frozen=True)
class LaunchCase:
    model: str
    hardware: Hardware
    flags: LaunchFlags
    fault: str | None


FAULTS = {  # a value SGLang refuses at resolution; at most one per case, so the order of its checks is moot
    "swa_full_tokens_ratio": st.sampled_from((0.0, 1.5, -0.1)),
    "kv_cache_dtype": st.sampled_from(("fp8_e5m2", "mxfp8", "bf16")),
    "swa_prefix_tails": st.integers(-64, -1),
}


@st.composite
def launch_cases(draw) -> LaunchCase:
    model = draw(st.sampled_from(sorted(CONFIGS)))
    mib = draw(st.one_of(
        st.just(float(H200_MEMORY_MIB)),
        st.sampled_from((20 * 1024 - 1.0, 20 * 1024.0, 60 * 1024 - 0.5, 60 * 1024.0, 160 * 1024 - 1.0, 160 * 1024.0)),
        st.floats(4096, 400 * 1024),
    ))
    tp = draw(st.sampled_from((1, 2, 4, 8)))
    attn_dp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp % d == 0]))
    fault = draw(st.one_of(st.none(), st.none(), st.sampled_from([*sorted(FAULTS), "attn_dp_size", "context_length"])))
    context_limit = derived_context_length(CONFIGS[model])
    flags = dict(
        page_size=draw(st.sampled_from((None, None, 256, 128, 64))),
        kv_cache_dtype=draw(st.sampled_from(("auto", "auto", "fp8_e4m3", "bfloat16"))),
        max_running_requests=draw(st.one_of(st.none(), st.integers(1, 4096))),
        swa_full_tokens_ratio=draw(st.one_of(st.none(), st.floats(0.001, 1.0))),
        chunked_prefill_size=draw(st.one_of(st.none(), st.sampled_from((-1, 0)), st.integers(1, 32768))),
        context_length=draw(st.one_of(st.none(), st.integers(128, context_limit))),
        max_total_tokens=draw(st.one_of(st.none(), st.integers(1, 1 << 24))),
        attn_dp_size=attn_dp,
        disable_radix_cache=draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        swa_prefix_tails=draw(st.one_of(st.none(), st.integers(0, 64))),
    )
    if fault == "attn_dp_size":
        flags["attn_dp_size"] = draw(st.sampled_from([d for d in (3, 5, 6, 7) if tp % d]))
    elif fault == "context_length":
        flags["context_length"] = context_limit + draw(st.integers(1, 1 << 20))
    elif fault is not None:
        flags[fault] = draw(FAULTS[fault])
    return LaunchCase(model, Hardware(gpu_memory=int(mib * MiB), tp_size=tp), LaunchFlags(**flags), fault)


def derived_context_length(config: dict) -> int:
    """The context length SGLang derives for ``config`` (the mirror's figure, checked in every case)."""
    from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry

    return ModelGeometry.model_validate(config).derived_context_length


def test_the_mirror_resolves_what_sglang_resolves(model_dirs):
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, derandomize=False, print_blob=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=launch_cases())
    def check(case: LaunchCase) -> None:
        model_dir = model_dirs[case.model]
        try:
            ours = resolve_launch(load_geometry(model_dir / "config.json"), case.hardware, case.flags)
        except LaunchError as exc:
            with pytest.raises((ValueError, AssertionError)):
                resolve_for_real(model_dir, case.hardware, argv_of(case.flags))
            assert case.fault is not None, f"the mirror refuses a launch SGLang accepts: {exc}"
            event(f"refused: {case.fault}")
            seen["refused"] += 1
            return
        assert case.fault is None, f"SGLang refuses {case.fault}, the mirror resolves it"
        real = resolve_for_real(model_dir, case.hardware, argv_of(case.flags))
        with published_resolution(real):
            live, kv_cache_dtype, _kvc = engine_reading(real)
        assert live == ours.settings
        assert kv_cache_dtype == ours.report.kv_cache_dtype
        event(f"{ours.report.model_type}, SWA {'by ratio' if ours.settings.swa_ratio else 'from the request cap'}")
        seen["resolved"] += 1

    with single_process_parallel():
        check()
    assert seen["resolved"] and seen["refused"], seen


LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length")


@st.composite
def context_configs(draw) -> dict:
    """V4-Flash with any context length, rope scaling of each kind and the other length keys HF configs carry."""
    config = {k: v for k, v in FLASH.items() if k != "rope_scaling"}
    config["max_position_embeddings"] = draw(st.integers(1024, 1 << 20))
    kind = draw(st.sampled_from([None, "linear", "dynamic", "yarn", "llama3", "longrope", "default"]))
    if kind is not None:
        scaling: dict = {draw(st.sampled_from(["type", "rope_type"])): kind}
        if kind != "default" or draw(st.booleans()):
            scaling["factor"] = draw(st.sampled_from([2, 4, 2.5, 1.7, 8.0, 16]))
        if kind == "llama3" or draw(st.booleans()):
            scaling["original_max_position_embeddings"] = draw(st.integers(512, 65536))
        if kind == "llama3":
            scaling |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        if kind == "longrope":
            half = FLASH["qk_rope_head_dim"] // 2
            scaling |= {"short_factor": [1.0] * half, "long_factor": [1.0] * half}
        if kind == "yarn":
            scaling |= {"beta_fast": 32, "beta_slow": 1}
        config["rope_scaling"] = scaling
    for key in LENGTH_KEYS:
        if draw(st.integers(0, 4)) == 0:
            config[key] = draw(st.integers(1024, 1 << 20))
    return config


def test_the_context_length_is_sglangs_over_random_configs(tmp_path_factory, sglang_env):
    """The context length a default launch derives from any config: rope scaling (each kind, with and
    without its original length) and the other length keys, against SGLang's own resolution."""
    root = tmp_path_factory.mktemp("contexts")
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES // 2, derandomize=False, print_blob=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(config=context_configs())
    def check(config: dict) -> None:
        model_dir = root / str(len(seen))
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config))
        seen[str(len(seen))] += 1
        ours = resolve_launch(load_geometry(model_dir / "config.json")).settings.context_length
        real = resolve_for_real(model_dir, Hardware(), [])
        with published_resolution(real):
            live, _dtype, _kvc = engine_reading(real)
        assert ours == live.context_length, config
        scaling = config.get("rope_scaling") or {}
        event(f"rope {scaling.get('type') or scaling.get('rope_type') or 'none'}")
        event("scaled" if ours != config["max_position_embeddings"] else "as max_position_embeddings")

    with single_process_parallel():
        check()


@pytest.mark.parametrize("model", ["flash", "pro", "v41"])
def test_a_default_launch_on_an_h200(model_dirs, model, capsys):
    """What SGLang resolves for ``sglang serve --model-path M`` on one H200, and plan's defaults."""
    from kvpolicy.cli import main

    real = resolve_for_real(model_dirs[model], Hardware(), [])
    with single_process_parallel(), published_resolution(real):
        live, kv_cache_dtype, _kvc = engine_reading(real)
    ours = resolve_launch(load_geometry(model_dirs[model] / "config.json"))
    assert (live, kv_cache_dtype) == (ours.settings, ours.report.kv_cache_dtype)
    # What ``kvpolicy plan`` itself prints without a launch flag: the same values, and the hardware assumed.
    assert main(["plan", "--engine", "sglang", "--model-config", str(model_dirs[model] / "config.json"),
                 "--budget", "40GiB", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["settings"] == live.model_dump()
    assert printed["launch"]["kv_cache_dtype"] == kv_cache_dtype
    assert printed["launch"]["hardware"] == {"gpu_memory": H200_MEMORY_MIB * MiB, "tp_size": 1}
    assert printed["launch"]["model_type"] == ("deepseek_v41" if model == "v41" else "deepseek_v4")
    # The figures themselves, as SGLang 0.5.23 resolves them (docs/sglang.md states them):
    assert (live.page_size, kv_cache_dtype, live.max_running_requests, live.chunked_prefill_size) == (
        256, "fp8_e4m3", 256, 8192,
    )
    assert live.context_length == 1_048_576
    assert live.swa_ratio == (None if model == "v41" else 0.1)  # explicit ratio 0.1, or the request cap


BUDGETS = [4 * GiB, 40 * GiB, 96 * GiB + 12_345, 300 * MiB]  # the last one is too small


@pytest.mark.parametrize("model", ["flash", "pro", "v41"])
def test_plan_of_a_default_launch_equals_what_sglang_builds(model_dirs, model):
    """Real resolution → published → real configurator and pools (on meta), against ``plan``'s defaults."""
    real = resolve_for_real(model_dirs[model], Hardware(), [])
    geometry = load_geometry(model_dirs[model] / "config.json")
    launch = resolve_launch(geometry)
    refused = []
    with single_process_parallel(), published_resolution(real):
        _live, _dtype, kvc = engine_reading(real)
        for budget in BUDGETS:
            try:
                planned = plan_launch(geometry, launch, budget=budget)
            except PlanError as exc:
                with pytest.raises((ValueError, RuntimeError), match=r"SWA pool"):
                    real_sizes(kvc, budget)
                refused.append((budget, exc.kind))
                continue
            config = real_sizes(kvc, budget)
            assert (planned.tokens.full, planned.tokens.swa, planned.tokens.c4, planned.tokens.c128) == (
                config.max_total_num_tokens, config.swa_max_total_num_tokens,
                config.c4_max_total_num_tokens, config.c128_max_total_num_tokens,
            )
            assert planned.mode == ("cap" if model == "v41" else "ratio")
            sizes = size_from_budget(geometry, launch.settings, budget)
            tensors = [(t.pool, t.nbytes) for t in pool_tensors(geometry, launch.settings, sizes)]
            assert tensors == real_tensors(kvc, config)
    # 256 requests' c128 state alone exceeds 300 MiB; V4.1's request-cap SWA (606,464 tokens) exceeds 4 GiB.
    if model == "v41":
        expected = [(4 * GiB, "swa_cap_no_room"), (300 * MiB, "swa_cap_no_room")]
    else:
        expected = [(300 * MiB, "swa_too_small")]
    assert refused == expected


def test_the_flash_example_of_the_issue_is_accepted_as_sglang_accepts_it(model_dirs):
    """Flash, 4 GiB, 256 requests: SGLang sizes SWA by ratio (its override), so it builds; so does plan."""
    real = resolve_for_real(model_dirs["flash"], Hardware(), ["--max-running-requests", "256"])
    geometry = load_geometry(model_dirs["flash"] / "config.json")
    planned = plan_launch(geometry, resolve_launch(geometry, flags=LaunchFlags(max_running_requests=256)),
                          budget=4 * GiB)
    with single_process_parallel(), published_resolution(real):
        _live, _dtype, kvc = engine_reading(real)
        config = real_sizes(kvc, 4 * GiB)
    assert planned.mode == "ratio" and planned.tokens.full == config.max_total_num_tokens > 0


def test_a_bfloat16_kv_cache_resolves_but_sglang_cannot_build_the_pool(model_dirs):
    real = resolve_for_real(model_dirs["flash"], Hardware(), ["--kv-cache-dtype", "bfloat16"])
    geometry = load_geometry(model_dirs["flash"] / "config.json")
    launch = resolve_launch(geometry, flags=LaunchFlags(kv_cache_dtype="bfloat16"))
    with pytest.raises(PlanError, match="bfloat16") as refused:
        plan_launch(geometry, launch, budget=8 * GiB)
    assert refused.value.kind == "kv_cache_dtype"
    import torch

    with single_process_parallel(), published_resolution(real):
        _live, kv_cache_dtype, kvc = engine_reading(real)
        assert kv_cache_dtype == launch.report.kv_cache_dtype == "bfloat16"
        kvc.kv_cache_dtype = torch.bfloat16
        config = real_sizes(kvc, 8 * GiB)
        with pytest.raises(AssertionError):
            real_tensors(kvc, config)
