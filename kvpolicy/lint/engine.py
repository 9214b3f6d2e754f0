"""Lint one policy text: parse, build, run every check rule, apply suppressions."""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.catalogue import SYNTAX_ERROR
from kvpolicy.diagnostics import Diagnostic, PolicyError, Span
from kvpolicy.facts import Facts
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.rules import all_checks
from kvpolicy.lint.suppress import apply_suppressions, find_suppressions
from kvpolicy.policy.build import PolicyBuilder
from kvpolicy.policy.model import Policy
from kvpolicy.policy.syntax import gc_paused, parse_tree


@dataclass(frozen=True)
class LintResult:
    file: str
    policy: Policy | None
    """The built policy; None when the text has errors (it must not be used)."""
    diagnostics: tuple[Diagnostic, ...]
    text: str | None = None
    """The text linted (bytes decoded, a byte order mark dropped); None when they could not be decoded."""

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.is_error)

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if not d.is_error)


def lint_text(
    text: str,
    file: str = "<policy>",
    *,
    sha256: str | None = None,
    gpu_capacity: int | None = None,
    facts: Facts | None = None,
) -> LintResult:
    """Every diagnostic for ``text``; ``policy`` is set only when there is no error."""
    with gc_paused():
        return _lint_text(text, file, sha256, gpu_capacity, facts)


def _lint_text(text: str, file: str, sha256: str | None, gpu_capacity: int | None, facts: Facts | None) -> LintResult:
    lines = text.split("\n")
    syntax = parse_tree(text, file)
    diagnostics = list(syntax.diagnostics)
    policy: Policy | None = None
    if syntax.tree is not None:
        builder = PolicyBuilder(file)
        end = Span.point(len(lines), len(lines[-1]) + 1)
        digest = sha256 or hashlib.sha256(text.encode("utf-8")).hexdigest()
        policy = builder.policy(syntax.tree, digest, end)
        diagnostics.extend(builder.diagnostics)
        if not syntax.diagnostics:  # other checks once the file parses
            ctx = LintContext(policy, gpu_capacity=gpu_capacity, facts=facts, parse_diagnostics=tuple(diagnostics))
            for check in all_checks():
                diagnostics.extend(check().check(ctx))
        suppressions, problems = find_suppressions(syntax.comments, lines, file)
        diagnostics = apply_suppressions(diagnostics, suppressions, file) + problems
    diagnostics.sort(key=Diagnostic.sort_key)
    has_errors = any(d.is_error for d in diagnostics)
    return LintResult(file, None if has_errors else policy, tuple(diagnostics), text)


def decode_policy(data: bytes, file: str) -> str:
    """The policy text (a UTF-8 byte order mark dropped); non-UTF-8 bytes are a
    syntax error at their line and column."""
    body = data[len(codecs.BOM_UTF8) :] if data.startswith(codecs.BOM_UTF8) else data
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = body[: exc.start]
        line = before.count(b"\n") + 1
        # a column counts characters, not bytes: decode the valid start of the line
        col = len(before[before.rfind(b"\n") + 1 :].decode("utf-8")) + 1
        raise PolicyError(
            [
                SYNTAX_ERROR.at(
                    file, Span.point(line, col),
                    f"the file is not UTF-8 text (byte 0x{body[exc.start]:02x} at line {line})",
                    "save the policy as UTF-8",
                )
            ]
        ) from None


def lint_file(path: Path | str, *, display_name: str | None = None, **context) -> LintResult:
    """Read and lint a policy file; unreadable bytes become a diagnostic, not an exception."""
    path = Path(path)
    return lint_bytes(path.read_bytes(), display_name or str(path), **context)


def lint_bytes(data: bytes, name: str, **context) -> LintResult:
    """Lint a policy's raw bytes (a file's, or standard input's) reported as ``name``."""
    try:
        text = decode_policy(data, name)
    except PolicyError as exc:
        return LintResult(name, None, exc.diagnostics)
    return lint_text(text, name, sha256=hashlib.sha256(data).hexdigest(), **context)
