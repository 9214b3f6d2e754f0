"""A refusal in one of the configs transformers builds from a ``config.json`` as vLLM loads it: the model's (the
one vLLM reads), or a multimodal wrapper's sub-config (``WRAPPER_SUB_CONFIGS``), each from its own keys. Pure
code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .class_defaults import is_wrapper
from .config_values import ModelSpecError

if TYPE_CHECKING:
    from kvpolicy.document_codes import DocumentCode


class Problem(Protocol):
    """What a check finds in one config: where in it, the diagnostic's code, message and hint."""

    @property
    def path(self) -> tuple[str, ...]: ...
    @property
    def code(self) -> DocumentCode: ...
    @property
    def message(self) -> str: ...
    @property
    def hint(self) -> str: ...


def refusal_at_level(config: Mapping[str, Any], level: str,
                     problem_of: Callable[[Mapping[str, Any]], Problem | None]) -> ModelSpecError | None:
    """The refusal of what ``problem_of`` finds in the config at ``level`` ("model", or a wrapper's sub-config
    by its key), at its place and with the sub-config named; None where it finds nothing, or the file has no
    such config."""
    where: tuple[str, ...] = () if level == "model" else (level,)
    values = config if not where else config.get(level) if is_wrapper(config) else None
    problem = problem_of(values) if isinstance(values, Mapping) else None
    if problem is None:
        return None
    prefix = f"{level}." if where else ""
    return ModelSpecError(prefix + problem.message, (*where, *problem.path), problem.code, problem.hint)
