"""vLLM's KV cache dtype for checkpoints' quantization configs, under whichever vLLM runs this (0.32 or 0.33).

``python kv_dtype_probe.py < cases.json``: each case is ``{"quant": ..., "flag": ...}`` (vLLM's resolution only:
``_normalize_quantization_config``, ``get_kv_cache_quant_algo_string``, ``resolve_kv_cache_dtype_string``) or
``{"config_dir": ..., "flag": ..., "block_size": ...}`` (a real ``VllmConfig`` and model on the meta device, as
tests/vllm/real_vllm.py builds them). Prints one JSON line per case: ``{"resolved", "algo"}``, or
``{"cache_dtype", "layers": {name: [dtype itemsize, page bytes]}}``, or ``{"error": "Type: message"}``. Imports
no kvpolicy (the caller compares).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.vllm


def resolve(quant: Any, flag: str) -> dict[str, Any]:
    import vllm.config  # noqa: F401 - the convertor module imports it back
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    from vllm.utils.torch_utils import get_kv_cache_quant_algo_string, resolve_kv_cache_dtype_string

    hf_config = SimpleNamespace(quantization_config=copy.deepcopy(quant))
    ModelArchConfigConvertorBase._normalize_quantization_config(None, hf_config)
    resolved = resolve_kv_cache_dtype_string(flag, SimpleNamespace(hf_config=hf_config))
    algo = get_kv_cache_quant_algo_string(hf_config.quantization_config) if quant is not None else None
    return {"resolved": resolved, "algo": algo}


def build(config_dir: str, flag: str, block_size: int) -> dict[str, Any]:
    from tests.vllm.real_vllm import Case, layer_specs, vllm_config

    case = Case(config_dir, block_size, max_model_len=4096, kv_cache_dtype=flag)
    cfg = vllm_config(case)
    specs = layer_specs(case)
    layers = {name: [spec.dtype.itemsize, spec.page_size_bytes] for name, spec in specs.items()}
    return {"cache_dtype": cfg.cache_config.cache_dtype, "layers": layers}


def main() -> None:
    for case in json.load(sys.stdin):
        try:
            if "config_dir" in case:
                result = build(case["config_dir"], case["flag"], case["block_size"])
            else:
                result = resolve(case["quant"], case["flag"])
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the answer
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
