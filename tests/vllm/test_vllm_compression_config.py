"""An older compressed-tensors checkpoint's ``compression_config`` in the plan against vLLM 0.33's build.

vLLM reads ``compression_config`` where config.json has no ``quantization_config``, and normalises its
``quant_method`` in place as it builds its model config (``_normalize_quantization_config``: lower case,
``compressed_tensors`` → ``compressed-tensors``), so the model's layers see the normalised name whatever case the
checkpoint writes it in: a ``kv_cache_scheme`` there makes the standard attention layers store fp8 (the cache
config, which reads only ``quantization_config``'s ModelOpt algorithm, keeps auto until they do), and one vLLM
cannot load is refused. The same spellings under ``quantization_config`` are checked beside them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvpolicy.adapters.vllm_adapter.planning.config_values import ModelSpecError
from kvpolicy.adapters.vllm_adapter.planning.hf_config import load_config
from kvpolicy.adapters.vllm_adapter.planning.kv_dtype import kv_dtype
from kvpolicy.adapters.vllm_adapter.planning.plan import PlanSettings, make_plan
from tests.vllm.quant_configs import FP8_SCHEME
from tests.vllm.vllm_paths import CONFIGS

pytestmark = pytest.mark.vllm

QWEN = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
SMALL = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 128, "vocab_size": 1024,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
SPELLINGS = ["compressed-tensors", "Compressed-Tensors", "COMPRESSED_TENSORS", "compressed_tensors"]
SCHEMES = {"fp8": FP8_SCHEME, "none": None, "int8": {**FP8_SCHEME, "type": "int"}}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("key", ["compression_config", "quantization_config"])
def test_compressed_tensors_method_in_any_case_plans_as_vllm_does(tmp_path: Path, key: str, spelling: str,
                                                                  scheme: str) -> None:
    from tests.vllm.real_vllm import Case, layer_specs, vllm_config

    quant: dict[str, Any] = {"quant_method": spelling, "format": "float-quantized", "config_groups": {},
                             "ignore": ["lm_head"]}
    if SCHEMES[scheme] is not None:
        quant["kv_cache_scheme"] = SCHEMES[scheme]
    (tmp_path / "config.json").write_text(json.dumps({**QWEN, **SMALL, key: quant}))
    case = Case(str(tmp_path), 16, max_model_len=4096)
    settings_ = PlanSettings(max_model_len=4096, block_size=16)
    mine = load_config(tmp_path / "config.json")
    if scheme == "int8":
        with pytest.raises(NotImplementedError, match="Currently supported kv cache quantization is num_bits=8"):
            layer_specs(case)
        with pytest.raises(ModelSpecError, match="takes num_bits 8 and type float only") as refused:
            make_plan(mine, settings_, budget=1 << 30, platform="cpu")
        assert refused.value.key == (key, "kv_cache_scheme")
        return
    specs = layer_specs(case)
    assert vllm_config(case).model_config.quantization == "compressed-tensors"
    assert vllm_config(case).cache_config.cache_dtype == kv_dtype(mine, "auto", "standard").layers
    assert kv_dtype(mine, "auto", "standard").layers == ("fp8" if scheme == "fp8" else "auto")
    plan = make_plan(mine, settings_, budget=1 << 30, platform="cpu")
    assert plan.bytes_per_block == sum(s.page_size_bytes for s in specs.values())
