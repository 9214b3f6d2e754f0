"""Policy text → typed Policy: the grammar's parser, the builder, the model, the formatter.

This layer reads and builds a policy; it does not lint it. A program that *uses* a
policy loads it with ``kvpolicy.lint.load.load_policy``, which refuses any file
with an error.
"""

from __future__ import annotations

from kvpolicy.diagnostics import Diagnostic, PolicyError, Severity, Span
from kvpolicy.policy.model import Policy

__all__ = ["Diagnostic", "Policy", "PolicyError", "Severity", "Span"]
