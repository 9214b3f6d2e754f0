"""kvpolicy: a declarative policy engine for GPU memory shared by LLM serving engines."""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0.dev0"

__all__ = ["attach"]


def __getattr__(name: str) -> Any:
    # `import kvpolicy` stays cheap (no pydantic, no mmap): the ledger client loads on first use.
    # Any: each name is the function it hands on (a static import here would load it).
    if name == "attach":
        from kvpolicy.runtime.client import attach

        return attach
    raise AttributeError(f"module 'kvpolicy' has no attribute {name!r}")
