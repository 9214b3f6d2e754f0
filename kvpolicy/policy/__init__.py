"""Policy text → checked, typed Policy.

``load_policy`` is what everything that *uses* a policy calls (the controller,
the adapters, ``explain``): it refuses any file with an error, so an invalid
policy can never be used.
"""

from __future__ import annotations

from pathlib import Path

from kvpolicy.diagnostics import Diagnostic, PolicyError, Severity, Span
from kvpolicy.policy.model import Policy


def policy_from_text(text: str, file: str = "<policy>") -> Policy:
    """The Policy in ``text``; raises PolicyError if it has any error."""
    from kvpolicy.lint.engine import lint_text

    return _checked(lint_text(text, file))


def load_policy(path: Path | str) -> Policy:
    """Read, parse and check a policy file; raises PolicyError if it has any error."""
    from kvpolicy.lint.engine import lint_file

    return _checked(lint_file(path))


def _checked(result) -> Policy:
    if result.policy is None:
        raise PolicyError(result.diagnostics)
    return result.policy


__all__ = ["Diagnostic", "Policy", "PolicyError", "Severity", "Span", "load_policy", "policy_from_text"]
