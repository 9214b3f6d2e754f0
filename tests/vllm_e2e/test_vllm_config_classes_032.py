"""vLLM 0.32 loads the model types the plan knows with transformers' strict classes, as 0.33 does.

``kvpolicy plan --vllm-version 0.32`` refuses a field of a kind the config class refuses
(planning/field_kinds.py) for every model type but DeepSeek-V4, for which 0.32 registers a class of its own.
This runs the e2e venv's vLLM 0.32.0: its transformers is 5.19 (whose classes the tables hold), it registers
classes of its own only for ``deepseek_v4`` and ``kimi_k2`` (DeepseekV3Config, as 0.33 does), and its
``get_config`` refuses an integer where Qwen3Config declares a float.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvpolicy.adapters.vllm_adapter.planning.class_defaults import CONFIG_CLASSES

pytestmark = [pytest.mark.vllm_engine]

PROBE = """
import json, sys, tempfile, transformers
from pathlib import Path
from vllm.transformers_utils.config import _CONFIG_REGISTRY, get_config
folder = Path(tempfile.mkdtemp())
(folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "rms_norm_eps": 1}))
try:
    get_config(str(folder), trust_remote_code=False)
    refused = None
except Exception as exc:
    refused = f"{type(exc).__name__}: {exc}"
registry = {k: (v if isinstance(v, str) else v.__name__) for k, v in _CONFIG_REGISTRY.items()}
print(json.dumps({"transformers": transformers.__version__, "registry": registry, "refused": refused}))
"""


def test_vllm_032_loads_the_known_model_types_with_transformers_strict_classes(e2e_python: Path) -> None:
    out = subprocess.run([str(e2e_python), "-c", PROBE], capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-4000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["transformers"].startswith("5.19."), found["transformers"]
    own = {k: v for k, v in found["registry"].items() if k in CONFIG_CLASSES}
    assert own == {"deepseek_v4": "DeepseekV4Config", "kimi_k2": "DeepseekV3Config"}
    assert found["refused"].startswith("StrictDataclassFieldValidationError: Validation error for field "
                                       "'rms_norm_eps':\n    TypeError: Field 'rms_norm_eps' expected float"), found
