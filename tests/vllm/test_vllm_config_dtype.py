"""A config's dtype is refused by the vLLM plan exactly where vLLM 0.33 cannot start with it, or where
transformers reads it as something that is no torch dtype (``kvpolicy.adapters.hf_dtype``: stricter there);
otherwise the plan's model dtype is the one vLLM serves in.

Each example writes a Qwen3-, Gemma-3- or DeepSeek-V2-shaped config with a random dtype
(``tests/support/dtype_values.py``) and resolves it with vLLM's own ``EngineArgs.create_engine_config``
(milliseconds, no model is built) under ``--dtype auto``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, load_config, model_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from tests.support.dtype_values import dtype_entries, is_torch_dtype
from tests.vllm.real_vllm import Case, layer_specs
from tests.vllm.test_vllm_max_model_len import resolve
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

EXAMPLES = int(os.environ.get("KVPOLICY_DTYPE_EXAMPLES", "200"))
"""Each example is one config resolution (about 10 ms once vLLM is imported)."""

BASES = {name: {k: v for k, v in json.loads((CONFIGS / name / "config.json").read_text()).items()
                if k not in ("dtype", "torch_dtype")}
         for name in ("qwen3-8b", "gemma-3-1b", "deepseek-v2-lite")}


def test_the_plan_reads_a_dtype_where_vllm_does(tmp_path_factory: pytest.TempPathFactory) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(base=st.sampled_from(sorted(BASES)), entries=dtype_entries())
    @example(base="qwen3-8b", entries={"torch_dtype": "bf16"})  # no such attribute: transformers stops
    @example(base="qwen3-8b", entries={"dtype": 5})  # vLLM serves bfloat16; transformers read no dtype
    @example(base="qwen3-8b", entries={"dtype": None, "torch_dtype": "uint16"})  # served in bfloat16
    @example(base="gemma-3-1b", entries={"dtype": "half"})  # float16, which vLLM refuses for Gemma-3: bfloat16
    @example(base="qwen3-8b", entries={"dtype": "float16", "torch_dtype": []})  # transformers ignores the second
    def check(base: str, entries: dict[str, Any]) -> None:
        folder = tmp_path_factory.mktemp("dtype")
        (folder / "config.json").write_text(json.dumps({**BASES[base], **entries}))
        try:
            real = resolve(folder, 4096)
        except Exception as exc:  # noqa: BLE001 - whatever vLLM raises, it does not start
            real = exc
        try:
            served = model_dtype(load_config(folder / "config.json"))
        except ModelSpecError as exc:
            assert exc.code in (VALUE_NOT_ALLOWED, WRONG_TYPE) and exc.key and "dtype" in str(exc.key[0]), exc
            if isinstance(real, Exception):
                seen["both refuse"] += 1
                event(f"both refuse (vLLM: {type(real).__name__})")
            else:  # stricter than vLLM: what transformers read is no dtype (vLLM serves its preferred one)
                read = real.model_config.hf_config.dtype
                assert not is_torch_dtype(read), (entries, read)
                seen["stricter"] += 1
                event(f"stricter: transformers read a {type(read).__name__}")
            return
        assert not isinstance(real, Exception), (entries, real)
        assert served == str(real.model_config.dtype).removeprefix("torch."), entries
        seen["both plan"] += 1
        event(f"both: {served}")

    with no_retry_sleep():
        check()
    assert seen["both refuse"] and seen["stricter"] and seen["both plan"], seen


ROPE_FAULTS = {  # each refused by vLLM or transformers after the config's dtype is read
    "not a mapping": {"rope_scaling": 5},
    "a list": {"rope_scaling": [1]},
    "rope_type and type conflict": {"rope_scaling": {"rope_type": "linear", "type": "dynamic", "factor": 2.0}},
    "rope_type no name": {"rope_scaling": {"rope_type": 5, "factor": 2.0}},
    "legacy type no name": {"rope_scaling": {"type": 5, "factor": 2.0}},
    "rope_parameters conflict": {"rope_parameters": {"rope_type": "linear", "type": "dynamic", "rope_theta": 1e6}},
}


@pytest.mark.parametrize("fault", sorted(ROPE_FAULTS))
def test_a_dtype_transformers_cannot_read_is_named_before_the_rope_parameters(tmp_path: Path, fault: str) -> None:
    """With a dtype name torch lacks beside a RoPE fault, vLLM stops on the dtype, as transformers loads the
    config; the plan names the dtype too. Without the dtype's fault both refuse for the RoPE parameters (here,
    as every plan, in ``make_plan``'s order)."""
    for dtype, expected in (("bf16", "dtype"), ("bfloat16", "rope")):
        folder = tmp_path / dtype
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**BASES["qwen3-8b"], **ROPE_FAULTS[fault], "dtype": dtype}))
        with no_retry_sleep(), pytest.raises(Exception) as vllm_refusal:
            layer_specs(Case(str(folder), 16, max_model_len=4096))
        assert ("'bf16'" in str(vllm_refusal.value)) == (expected == "dtype"), vllm_refusal.value
        with pytest.raises(ModelSpecError) as plan_refusal:
            make_plan(load_config(folder / "config.json"), PlanSettings(max_model_len=4096, block_size=16),
                      budget=1 << 30, platform="cpu")
        assert plan_refusal.value.key is not None
        assert plan_refusal.value.key[0] == ("dtype" if expected == "dtype" else next(iter(ROPE_FAULTS[fault])))


def no_retry_sleep() -> Any:
    """vLLM reads a config again 2 s after it fails to load (for a cache being refreshed): not here."""
    from vllm.transformers_utils import repo_utils

    return mock.patch.object(repo_utils, "time", SimpleNamespace(sleep=lambda seconds: None))


GEMMA3_TEXT = {k: v for k, v in BASES["gemma-3-1b"].items() if k not in ("architectures", "model_type")}
SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
          "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}


def test_a_wrappers_dtypes_are_read_where_vllm_reads_them(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Gemma-3 multimodal config with random dtypes on the wrapper, its text config and its vision config:
    transformers builds each with its own dtype, and vLLM serves the wrapper's, else the text config's. vLLM's CPU
    build cannot inspect Gemma-3's multimodal model, so vLLM's own steps are run one by one: its config loader
    (``get_config``), the dtype it reads (``get_torch_dtype``) and the one it serves (``_resolve_auto_dtype``)."""
    from vllm.config.model import _resolve_auto_dtype
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(top=dtype_entries(), text=dtype_entries(), vision=dtype_entries())
    @example(top={"dtype": "float32"}, text={"dtype": "bf16"}, vision={})  # the text config's stops transformers
    @example(top={"dtype": "bf16"}, text={"dtype": "float32"}, vision={})
    @example(top={}, text={}, vision={"torch_dtype": "bf16"})
    def check(top: dict[str, Any], text: dict[str, Any], vision: dict[str, Any]) -> None:
        folder = tmp_path_factory.mktemp("wrapped")
        (folder / "config.json").write_text(json.dumps({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", **top,
            "text_config": {**GEMMA3_TEXT, **text}, "vision_config": {**SIGLIP, **vision}}))
        try:
            loaded = get_config(str(folder), trust_remote_code=False)
            read = [loaded.dtype, loaded.text_config.dtype, loaded.vision_config.dtype]
            served = _resolve_auto_dtype("gemma3", ModelArchConfigConvertorBase.get_torch_dtype(
                loaded, str(folder), revision=None, config_format="hf"), is_pooling_model=False)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raises, vLLM does not start
            loaded, read, served = exc, [], None
        try:
            mine = model_dtype(load_config(folder / "config.json"))
        except ModelSpecError as exc:
            assert exc.key and "dtype" in str(exc.key[-1]), exc
            stricter = not isinstance(loaded, Exception)
            if stricter:  # transformers read a value that is no dtype at some level
                assert any(value is not None and not is_torch_dtype(value) for value in read), (top, text, vision)
            seen["stricter" if stricter else "both refuse"] += 1
            return
        assert not isinstance(loaded, Exception), (top, text, vision, loaded)
        assert mine == str(served).removeprefix("torch."), (top, text, vision)
        seen["both plan"] += 1

    with no_retry_sleep():
        check()
    assert seen["both refuse"] and seen["stricter"] and seen["both plan"], seen
