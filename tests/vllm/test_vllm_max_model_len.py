"""max_model_len and the auto dtype as vLLM 0.33 resolves them, for random configs.

Each example writes a config.json (Qwen3-, Gemma-3-, gpt-oss-, DeepSeek-V2- or DeepSeek-V4-shaped)
with random length keys (``max_position_embeddings`` and the others vLLM reads), ``model_max_length``,
RoPE scaling (type, factor, where it is given, ``original_max_position_embeddings``) and an asked
``--max-model-len`` or none, and resolves it with vLLM's own ``EngineArgs.create_engine_config``
(``ModelConfig`` → ``_get_and_verify_max_len``; milliseconds, no model is built). kvpolicy's
``model_length`` / ``check_max_model_len`` must give vLLM's ``max_model_len``, or refuse where vLLM
refuses. The same resolution, with a random ``--dtype`` (vLLM's values, or none), gives vLLM's model dtype,
which ``model_dtype`` must name (the KV cache's dtype under ``--kv-cache-dtype auto``), or refuse where vLLM
refuses it. vLLM 0.32.0 has the same code (tests/vllm_e2e/test_vllm_versions.py pins what differs between them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.hf_config import MODEL_DTYPES, ModelSpecError, load_config, model_dtype
from kvpolicy.adapters.vllm_adapter.planning.max_len import (
    ALLOW_LONG_ENV,
    LENGTH_KEYS,
    check_max_model_len,
    check_rope_parameters,
    model_length,
)
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_MAX_LEN_EXAMPLES", "200"))
"""Each example is one config resolution (about 10 ms once vLLM is imported)."""

BASES = ("qwen3-8b", "gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite", "deepseek-v4-flash")
OTHER_KEYS = [k for k in LENGTH_KEYS if k not in ("max_position_embeddings", "model_max_length")]
DTYPES = ["bfloat16", "float16", "float32", "half", "float", "float64", "float8_e4m3fn", "int8"]


def lengths() -> st.SearchStrategy[int]:
    return st.integers(1, 1 << 21)


@st.composite
def rope(draw: st.DrawFn, head_dim: int) -> dict[str, Any] | None:
    """A RoPE scaling transformers accepts, named as checkpoints name it (rope_type or the legacy type)."""
    kind = draw(st.sampled_from(["none", "default", "linear", "dynamic", "yarn", "llama3", "longrope", "su"]))
    if kind == "none":
        return None
    params: dict[str, Any] = {draw(st.sampled_from(["rope_type", "type"])): kind}
    factor = draw(st.one_of(st.integers(1, 64), st.floats(1.0, 64.0).map(lambda f: round(f, 3))))
    if kind in ("linear", "dynamic", "yarn"):
        params["factor"] = factor
    if kind == "llama3":
        params |= {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": draw(lengths())}
    if kind in ("longrope", "su"):
        half = head_dim // 2
        params |= {"short_factor": [1.0] * half, "long_factor": [2.0] * half}
        if draw(st.booleans()):
            params["factor"] = factor
    if kind == "yarn" and draw(st.booleans()):
        params["original_max_position_embeddings"] = draw(lengths())
    return params


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(BASES[:2]) | st.sampled_from(BASES))  # half of them with a RoPE drawn
    config = json.loads((CONFIGS / name / "config.json").read_text())
    config |= {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "vocab_size": 512}
    if name.startswith("deepseek-v4"):
        config["compress_ratios"] = [0, 4, 0]
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:2]
    config["max_position_embeddings"] = draw(lengths())
    for key in draw(st.lists(st.sampled_from(OTHER_KEYS), max_size=3, unique=True)):
        config[key] = draw(lengths())
    if draw(st.integers(0, 3)) == 0:
        config["model_max_length"] = draw(lengths())
    head_dim = config.get("qk_rope_head_dim") or config.get("head_dim") or 128
    scaling = draw(rope(head_dim)) if name in ("qwen3-8b", "gemma-3-1b") else None
    if scaling is not None:  # Gemma-3 checkpoints give rope_scaling (its config class nests rope_parameters)
        config["rope_scaling" if name == "gemma-3-1b" else draw(st.sampled_from(["rope_scaling", "rope_parameters"]))] \
            = scaling
    if draw(st.booleans()):
        config["original_max_position_embeddings"] = draw(lengths())
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    dtype = draw(st.sampled_from([None, *DTYPES]))
    if dtype is not None:
        config[draw(st.sampled_from(["torch_dtype", "dtype"]))] = dtype
    return config


def resolve(folder: Path, max_model_len: int | None, dtype: str | None = None) -> Any:
    """vLLM's own VllmConfig for the config in ``folder``, as ``vllm serve`` builds it."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(folder), skip_tokenizer_init=True, load_format="dummy", max_model_len=max_model_len,
                      **({"dtype": dtype} if dtype is not None else {})).create_engine_config()


REASONS = {"User-specified max_model_len": "vLLM refuses it at start-up", "Found conflicts": "refuses the conflict",
           "does not support float16": "vLLM refuses float16 for model_type"}
"""vLLM's refusal → the plan's words for the same reason."""


def refusal(theirs: Exception | None, ours: Exception | None) -> str | None:
    """Assert that both resolutions refuse, for the same reason, or neither does; return the reason."""
    assert (theirs is None) == (ours is None), (theirs, ours)
    if theirs is None:
        return None
    reason = next((r for r in REASONS if r in str(theirs)), None)
    assert reason is not None, theirs  # a refusal the plan does not know
    assert REASONS[reason] in str(ours), (theirs, ours)
    return reason


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs(), ask=st.one_of(st.none(), st.floats(0.25, 4.0), lengths()),
       dtype=st.one_of(st.none(), st.none(), st.sampled_from(MODEL_DTYPES)))
def test_max_model_len_and_dtype_resolve_as_vllms(tmp_path_factory: pytest.TempPathFactory,
                                                  monkeypatch: pytest.MonkeyPatch, config: dict[str, Any],
                                                  ask: float | int | None, dtype: str | None) -> None:
    monkeypatch.delenv(ALLOW_LONG_ENV, raising=False)
    folder = tmp_path_factory.mktemp("max-len")
    (folder / "config.json").write_text(json.dumps(config))
    # An asked length: none (vLLM's default), a fraction or multiple of max_position_embeddings, or any.
    positions = config["max_position_embeddings"]
    asked = None if ask is None else max(1, int(positions * ask)) if isinstance(ask, float) else ask
    theirs: Exception | None = None
    ours: Exception | None = None
    try:
        real = resolve(folder, asked, dtype)
    except ValueError as exc:  # vLLM refuses the launch: so must the plan, for its reason
        theirs = exc
    plan_config = load_config(folder / "config.json")
    try:  # in vLLM's order: the config's RoPE parameters as it loads it, the model's dtype, then its length
        check_rope_parameters(plan_config)
        served = model_dtype(plan_config, dtype or "auto")
        length = model_length(plan_config)
        assert length is not None and length.known
        if asked is not None:
            check_max_model_len(length, asked)
    except ModelSpecError as exc:
        ours = exc
    reason = refusal(theirs, ours)
    if reason is not None:
        event(f"refused: {reason}")
        return
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    event(f"{'asked' if asked is not None else 'default'}, rope {rope.get('rope_type') or rope.get('type')}")
    event(f"--dtype {dtype or 'unset'}: {served}")
    assert real.model_config.max_model_len == (length.default if asked is None else asked)
    assert served == str(real.model_config.dtype).removeprefix("torch.")


@settings(max_examples=max(EXAMPLES // 5, 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs(), asked=lengths(), known_type=st.booleans())
def test_without_max_position_embeddings_the_class_default_is_vllms(tmp_path_factory: pytest.TempPathFactory,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   config: dict[str, Any], asked: int,
                                                                   known_type: bool) -> None:
    """Without max_position_embeddings the config class's default joins vLLM's smallest length: the plan takes it for
    the model types it knows (class_defaults), and derives vLLM's default; for another (here: the same config under
    a model type transformers has but kvpolicy does not know, Phi-3's, whose class default is 4096) it derives none
    (unless model_max_length decides), and a refusal must still be vLLM's."""
    monkeypatch.delenv(ALLOW_LONG_ENV, raising=False)
    del config["max_position_embeddings"]
    if not known_type:
        config |= {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}
        config.pop("rope_scaling", None)
        config.pop("rope_parameters", None)
    folder = tmp_path_factory.mktemp("max-len")
    (folder / "config.json").write_text(json.dumps(config))
    try:
        length = model_length(load_config(folder / "config.json"))
    except ModelSpecError as ours:  # a config vLLM cannot load either
        with pytest.raises(ValueError) as theirs:
            resolve(folder, asked)
        event(f"refused: {refusal(theirs.value, ours)}")
        return
    assert (length is not None and length.known) == (known_type or bool(config.get("model_max_length")))
    try:
        check_max_model_len(length, asked)
    except ModelSpecError as ours:
        with pytest.raises(ValueError) as theirs:
            resolve(folder, asked)
        event(f"refused: {refusal(theirs.value, ours)}")
        return
    if length is not None and length.known:  # the class default, or model_max_length, which decides alone
        assert length.default == resolve(folder, None).model_config.max_model_len
        event("known: the default is vLLM's")
    else:
        event("unknown: accepted as vLLM accepts it")


def test_a_rope_conflict_is_refused_before_the_dtype_as_vllm_loads_the_config(tmp_path: Path) -> None:
    """Gemma-3 lays its legacy ``type`` over a ``rope_type`` "default": vLLM refuses the conflict as it loads
    the config, before it looks at a float16 it also refuses for Gemma-3; the plan names the same reason."""
    from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan

    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 1},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Found conflicts") as theirs:
        resolve(tmp_path, None, "half")
    with pytest.raises(ModelSpecError) as ours:
        make_plan(load_config(tmp_path / "config.json"), PlanSettings(dtype="half", max_model_len=4096), num_blocks=16)
    assert refusal(theirs.value, ours.value) == "Found conflicts"
