"""Quick fixes: the lint hints that say exactly what to write, and suppressions.

A hint such as "did you mean 'GiB'?" or "did you mean `grace 30s`?" becomes an
edit. Every such edit is checked before it is offered: the text with the edit
applied is linted again, and the fix is offered only if the diagnostic it answers
is gone and no new error appears. A missing ``version`` gets ``version 1``; a
finding that may be suppressed gets ``# kvpolicy: ignore[CODE]`` with a reason to
fill in.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from kvpolicy.lsp.documents import PolicyDocument
from kvpolicy.lsp.language import Diagnostic, lint, rule_doc
from kvpolicy.lsp.positions import Pos, Region

REASON_PLACEHOLDER = "TODO: say why"
"""The reason a suppression quick fix writes, for the user to replace."""
MAX_CHECKED_FIXES = 8
"""At most this many hint edits are linted per request (each is a full lint)."""

_QUOTED = re.compile(r"did you mean '([^']+)'")
_BACKTICKED = re.compile(r"(?:did you mean|write|or) `([^`]+)`")
_LAST_WORD = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.]*|%)(?!.*[A-Za-z_%])")
_SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[([^\]]*)\]")


@dataclass(frozen=True)
class Edit:
    region: Region
    text: str


@dataclass(frozen=True)
class Fix:
    title: str
    diagnostic: Diagnostic
    edits: tuple[Edit, ...]
    preferred: bool = False


def fixes(doc: PolicyDocument, region: Region) -> list[Fix]:
    """Quick fixes for the diagnostics that touch ``region``."""
    lines = doc.text.split("\n")
    found: list[Fix] = []
    checked = 0
    for d in doc.linted.diagnostics:
        span = Region.of_span(d.span)
        if span.end < region.start or region.end < span.start:
            continue
        candidates = _hint_fixes(d, lines)
        if d.code == "KV003":
            candidates += _version_fix(d, lines)
        for fix in candidates:
            if checked >= MAX_CHECKED_FIXES:
                break
            checked += 1
            if _resolves(doc, fix):
                found.append(fix)
        suppression = _suppression_fix(d, lines)
        if suppression is not None:
            found.append(suppression)
    return found


def _hint_fixes(d: Diagnostic, lines: list[str]) -> list[Fix]:
    if not d.hint or d.line != d.end_line:
        return []
    line = lines[d.line - 1]
    start, end = d.col - 1, d.end_col - 1
    spanned = line[start:end]
    out: list[Fix] = []
    quoted = _QUOTED.search(d.hint)
    if quoted:
        word = _LAST_WORD.search(spanned)
        if word:
            region = Region.on_line(d.line - 1, start + word.start(), start + word.end())
            out.append(Fix(f"Change '{word.group()}' to '{quoted.group(1)}'", d, (Edit(region, quoted.group(1)),)))
    for suggestion in _BACKTICKED.findall(d.hint):
        first = suggestion.split()[0]
        before = line[:start]
        keyword = re.search(rf"(?<![A-Za-z0-9_]){re.escape(first)}[ \t]+$", before)
        if keyword and suggestion != first:
            region = Region.on_line(d.line - 1, keyword.start(), end)
            old = line[keyword.start() : end]
        else:
            region = Region.on_line(d.line - 1, start, end)
            old = spanned
        out.append(Fix(f"Change `{old}` to `{suggestion}`", d, (Edit(region, suggestion),)))
    if len(out) == 1:
        out = [Fix(out[0].title, d, out[0].edits, preferred=True)]
    return out


def _version_fix(d: Diagnostic, lines: list[str]) -> list[Fix]:
    if "no 'version'" not in d.message:
        return []
    first_code = next((i for i, text in enumerate(lines) if text.strip() and not text.lstrip().startswith("#")), 0)
    at = Region(Pos(first_code, 0), Pos(first_code, 0))
    return [Fix("Add `version 1`", d, (Edit(at, "version 1\n"),), preferred=True)]


def _suppression_fix(d: Diagnostic, lines: list[str]) -> Fix | None:
    doc = rule_doc(d.code)
    if doc is None or not doc.suppressible:
        return None
    index = d.line - 1
    line = lines[index]
    title = f"Suppress {d.code} ({d.name}) on this line"
    for target in (index, index - 1):
        text = lines[target] if 0 <= target < len(lines) else ""
        if target != index and not text.lstrip().startswith("#"):
            continue  # a suppression above must be alone on its line
        existing = _SUPPRESSION.search(text)
        if existing is not None:
            if d.code in [c.strip() for c in existing.group(1).split(",")]:
                return None
            at = Pos(target, existing.end(1))
            separator = ", " if existing.group(1).strip() else ""
            return Fix(title, d, (Edit(Region(at, at), f"{separator}{d.code}"),))
    comment = f"# kvpolicy: ignore[{d.code}] {REASON_PLACEHOLDER}"
    if "#" not in _code_part(line):
        end = Pos(index, len(line.rstrip()))
        return Fix(title, d, (Edit(Region(end, Pos(index, len(line))), f"  {comment}"),))
    indent = line[: len(line) - len(line.lstrip())]
    at = Pos(index, 0)
    return Fix(title, d, (Edit(Region(at, at), f"{indent}{comment}\n"),))


def _code_part(line: str) -> str:
    """``line`` with its strings blanked (a ``#`` inside a string is not a comment)."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', line)


def apply(text: str, edits: tuple[Edit, ...]) -> str:
    """``text`` with ``edits`` (which do not overlap) applied."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(p: Pos) -> int:
        return min(starts[p.line] + p.col, len(text)) if p.line < len(lines) else len(text)

    out = text
    for edit in sorted(edits, key=lambda e: e.region.start, reverse=True):
        out = out[: offset(edit.region.start)] + edit.text + out[offset(edit.region.end) :]
    return out


def _resolves(doc: PolicyDocument, fix: Fix) -> bool:
    """Whether the fixed text no longer has the diagnostic on its line, and no new error there.

    (Errors elsewhere may appear: fixing the last build error lets the checks that
    need a built policy run.)"""
    fixed = lint(apply(doc.text, fix.edits), doc.file, gpu_capacity=doc.context.gpu_capacity, facts=doc.context.facts)
    target = fix.diagnostic
    shift = sum(
        e.text.count("\n") - (e.region.end.line - e.region.start.line)
        for e in fix.edits
        if e.region.start.line < target.line - 1
    )
    def on_line(diagnostics: tuple[Diagnostic, ...], line: int) -> Counter[str]:
        return Counter(d.code for d in diagnostics if d.line == line and (d.is_error or d.code == target.code))

    before = on_line(doc.linted.diagnostics, target.line)
    after = on_line(fixed.diagnostics, target.line + shift)
    return after[target.code] < before[target.code] and all(after[c] <= before[c] for c in after if c != target.code)
