"""Whether the installed vLLM (0.32 or 0.33) starts a DeepSeek-V4 model from each of some configs.

``python v4_config_probe.py < configs.json``: for each config (a DeepSeek-V4 config.json's object) builds
vLLM's config and the model on the ``meta`` device as a worker would (tests/vllm/real_vllm.py), plans its KV
cache for 4 GiB as the engine core would (v4_plan_probe.py), and prints one JSON line per config:
``{"built": true}`` or ``{"refused": "ErrorType: message"}``. Imports no kvpolicy.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.vllm

from tests.vllm.real_vllm import Case, layer_specs, vllm_config
from tests.vllm_e2e.v4_plan_probe import plan


def main() -> None:
    for config in json.load(sys.stdin):
        folder = Path(tempfile.mkdtemp(prefix="v4-config-"))
        (folder / "config.json").write_text(json.dumps(config))
        try:
            case = Case(str(folder), 256, max_model_len=65536, kv_cache_dtype="fp8", layout="BLHNC")
            plan(vllm_config(case), layer_specs(case), 1 << 32)
            out: dict[str, object] = {"built": True}
        except Exception as exc:  # noqa: BLE001 - what vLLM raises is the answer, whatever its type
            out = {"refused": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
