"""kvpolicy: a declarative policy engine for GPU memory shared by LLM serving engines."""

__version__ = "0.1.0"
