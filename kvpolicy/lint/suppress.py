"""Inline suppressions: ``# kvpolicy: ignore[KV019, KV020] reason``.

A suppression after code on a line covers that line; one alone on its line
covers the next line that has code. It needs a reason, may only name codes that
exist and can be suppressed, and is reported when it silences nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvpolicy.catalogue import INVALID_SUPPRESSION, SUPPRESSION_WITHOUT_REASON, UNUSED_SUPPRESSION, rule_by_code
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.policy.lark_parser import Token
from kvpolicy.policy.suppressions import SUPPRESSION as _SUPPRESSION
from kvpolicy.policy.suppressions import covered_lines


@dataclass
class Suppression:
    comment: Token
    covers_line: int
    codes: dict[str, Span]
    used: set[str] = field(default_factory=set)


def find_suppressions(comments: list[Token], lines: list[str], file: str) -> tuple[list[Suppression], list[Diagnostic]]:
    """The suppressions in ``comments``, and what is wrong with them."""
    found: list[Suppression] = []
    problems: list[Diagnostic] = []
    for comment in comments:
        match = _SUPPRESSION.match(comment.value)
        if match is None:
            continue
        comment_span = Span(line=comment.line, col=comment.column, end_line=comment.line, end_col=comment.end_column)
        codes: dict[str, Span] = {}
        offset = comment.column + match.start(1)
        for code_match in re.finditer(r"[^,\s]+", match.group(1)):
            code = code_match.group()
            span = Span(line=comment.line, col=offset + code_match.start(), end_line=comment.line, end_col=offset + code_match.end())
            rule = rule_by_code(code)
            if rule is None:
                problems.append(INVALID_SUPPRESSION.at(file, span, f"unknown code '{code}' in suppression", "codes look like KV019; see docs/lint-rules.md"))
            elif not rule.suppressible:
                problems.append(INVALID_SUPPRESSION.at(file, span, f"{code} ({rule.name}) cannot be suppressed", "fix the policy instead"))
            else:
                codes[code] = span
        if not match.group(2).strip():
            problems.append(SUPPRESSION_WITHOUT_REASON.at(file, comment_span, "suppression without a reason", "say why after the ']': # kvpolicy: ignore[KV019] vendor sizes are decimal"))
        found.append(Suppression(comment, 0, codes))
    for suppression, line in zip(found, covered_lines(lines, [(s.comment.line, s.comment.column) for s in found])):
        suppression.covers_line = line
    return found, problems


def apply_suppressions(diagnostics: list[Diagnostic], suppressions: list[Suppression], file: str) -> list[Diagnostic]:
    """``diagnostics`` without the suppressed ones, plus one finding per unused code."""
    by_line: dict[int, list[Suppression]] = {}
    for s in suppressions:
        by_line.setdefault(s.covers_line, []).append(s)
    kept: list[Diagnostic] = []
    for d in diagnostics:
        silenced = False
        for s in by_line.get(d.line, ()):
            if d.code in s.codes:
                s.used.add(d.code)
                silenced = True
        if not silenced:
            kept.append(d)
    for s in suppressions:
        for code, span in s.codes.items():
            if code not in s.used:
                kept.append(UNUSED_SUPPRESSION.at(file, span, f"{code} is not reported on line {s.covers_line}", "remove it from the suppression"))
    return kept
