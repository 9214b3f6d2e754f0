"""Lint one policy text: parse, build, run every check rule, apply suppressions."""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from kvpolicy.catalogue import SYNTAX_ERROR, VALIDATION_BUDGET_EXCEEDED
from kvpolicy.diagnostics import Diagnostic, PolicyError, Span
from kvpolicy.facts import Facts
from kvpolicy.lint.budget import BudgetExceeded, WorkBudget
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.rules import all_checks
from kvpolicy.lint.source import check_size, read_policy_bytes
from kvpolicy.lint.suppress import apply_suppressions, find_suppressions
from kvpolicy.policy.build import PolicyBuilder
from kvpolicy.policy.incremental import BuiltText, StatementCache
from kvpolicy.policy.model import Policy
from kvpolicy.policy.syntax import SyntaxResult, gc_paused, parse_tree

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11


@dataclass(frozen=True)
class LintResult:
    file: str
    policy: Policy | None
    """The built policy; None when the text has errors (it must not be used)."""
    diagnostics: tuple[Diagnostic, ...]
    text: str | None = None
    """The text linted (bytes decoded, a byte order mark dropped); None when they could not be decoded."""
    partial: Policy | None = None
    """What was built even when the text has errors (for an editor's hover and navigation:
    never for deciding); None when nothing parsed."""

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
    budget: int | WorkBudget | None = None,
    max_bytes: int | None = None,
    syntax: SyntaxResult | None = None,
    statements: StatementCache | None = None,
) -> LintResult:
    """Every diagnostic for ``text``; ``policy`` is set only when there is no error.

    ``budget`` (units of work, see ``kvpolicy.lint.budget``) bounds the validation: past
    it, lint stops with KV027 and no policy. A text over ``max_bytes`` (default: the
    size cap, ``kvpolicy.lint.source``) is KV026 and is not parsed. ``syntax`` is this
    text's parse, when the caller already has it. ``statements`` (an editor's, one per
    document) keeps what this lint built for the next lint of an edited version, which
    then parses and builds only the statements that changed; the result is the same.
    """
    encoded = text.encode("utf-8")
    try:
        check_size(encoded, file, max_bytes)
    except PolicyError as exc:
        return LintResult(file, None, exc.diagnostics, text)
    if isinstance(budget, int):
        budget = WorkBudget(budget)
    digest = sha256 or hashlib.sha256(encoded).hexdigest()
    diagnostics: list[Diagnostic] = []
    with gc_paused():
        try:
            return _lint_text(text, file, digest, gpu_capacity, facts, budget, syntax, statements, diagnostics)
        except BudgetExceeded as exc:
            stop = VALIDATION_BUDGET_EXCEEDED.at(
                file, Span.point(1, 1),
                f"the policy was not fully checked: {exc}",
                "a hot reload refuses it and keeps the running policy: make it cheaper to check "
                "(many overlapping model globs, most often); `kvpolicy lint` without --work-budget checks it all",
            )
            return LintResult(file, None, tuple(sorted([*diagnostics, stop], key=Diagnostic.sort_key)), text)


def _lint_text(
    text: str, file: str, digest: str, gpu_capacity: int | None, facts: Facts | None,
    budget: WorkBudget | None, syntax: SyntaxResult | None, statements: StatementCache | None,
    diagnostics: list[Diagnostic],
) -> LintResult:
    lines = text.split("\n")
    end = Span.point(len(lines), len(lines[-1]) + 1)
    # from the document's cache when it has one (None there: a syntax error, parse it whole)
    built = statements.build(text, file, digest, end) if statements is not None and syntax is None else None
    syntax_errors: list[Diagnostic] = []
    if built is None:
        if syntax is None:
            syntax = parse_tree(text, file)
        syntax_errors = syntax.diagnostics
    if budget is not None:
        recoveries = 0 if syntax is None else len(syntax.kinds)
        budget.charge(len(text) * (1 + recoveries))  # each recovery parses the text again
    diagnostics.extend(syntax_errors)
    if built is None and syntax is not None and syntax.tree is not None:
        builder = PolicyBuilder(file)
        built = BuiltText(builder.policy(syntax.tree, digest, end), builder.diagnostics, syntax.comments)
    policy: Policy | None = None
    if built is not None:
        policy = built.policy
        diagnostics.extend(built.diagnostics)
        if not syntax_errors:  # other checks once the file parses
            ctx = LintContext(
                policy, gpu_capacity=gpu_capacity, facts=facts, parse_diagnostics=tuple(diagnostics), budget=budget,
            )
            for check in all_checks():
                ctx.charge(len(ctx.nodes))
                diagnostics.extend(check().check(ctx))
        suppressions, problems = find_suppressions(built.comments, lines, file)
        diagnostics[:] = apply_suppressions(diagnostics, suppressions, file) + problems
    diagnostics.sort(key=Diagnostic.sort_key)
    has_errors = any(d.is_error for d in diagnostics)
    return LintResult(file, None if has_errors else policy, tuple(diagnostics), text, policy)


def decode_policy(data: bytes, file: str, max_bytes: int | None = None) -> str:
    """The policy text (a UTF-8 byte order mark dropped); raises PolicyError for bytes
    over the size cap (KV026) and for non-UTF-8 bytes (a syntax error at their line and column)."""
    check_size(data, file, max_bytes)
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


class LintOptions(TypedDict, total=False):
    """What ``lint_file`` and ``lint_bytes`` hand on to ``lint_text``."""

    gpu_capacity: int | None
    facts: Facts | None
    budget: int | WorkBudget | None
    max_bytes: int | None
    syntax: SyntaxResult | None


def lint_file(path: Path | str, *, display_name: str | None = None, **context: Unpack[LintOptions]) -> LintResult:
    """Read and lint a policy file; unreadable bytes become a diagnostic, not an exception."""
    path = Path(path)
    return lint_bytes(read_policy_bytes(path, context.get("max_bytes")), display_name or str(path), **context)


def lint_bytes(data: bytes, name: str, **context: Unpack[LintOptions]) -> LintResult:
    """Lint a policy's raw bytes (a file's, or standard input's) reported as ``name``."""
    try:
        text = decode_policy(data, name, context.get("max_bytes"))
    except PolicyError as exc:
        return LintResult(name, None, exc.diagnostics)
    return lint_text(text, name, sha256=hashlib.sha256(data).hexdigest(), **context)
