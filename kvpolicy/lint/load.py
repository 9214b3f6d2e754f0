"""The policy a program runs under: parsed, linted, and refused if it has any error.

What everything that *uses* a policy calls (the controller's reload goes through the
same ``lint_text``; the adapters, ``explain`` and ``kvpolicy test`` call these): an
invalid policy can never be used. It lives in the lint layer because refusing a
policy takes both the parser and the checks.
"""

from __future__ import annotations

from pathlib import Path

from kvpolicy.diagnostics import PolicyError
from kvpolicy.lint.engine import LintResult, lint_file, lint_text
from kvpolicy.policy.model import Policy


def policy_from_text(text: str, file: str = "<policy>") -> Policy:
    """The Policy in ``text``; raises PolicyError if it has any error."""
    return _usable(lint_text(text, file))


def load_policy(path: Path | str) -> Policy:
    """Read, parse and check a policy file; raises PolicyError if it has any error."""
    return _usable(lint_file(path))


def _usable(result: LintResult) -> Policy:
    if result.policy is None:
        raise PolicyError(result.diagnostics)
    return result.policy
