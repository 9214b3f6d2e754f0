"""Diagnostics out: text (with the source line), JSON (docs/json.md), SARIF 2.1.0, GitHub annotations."""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvpolicy import __version__
from kvpolicy.catalogue import all_rules
from kvpolicy.diagnostics import Diagnostic, Severity, printable
from kvpolicy.terminal import PLAIN, Style

LINT_SCHEMA = 1
RULES_DOC = "https://github.com/kvpolicy/kvpolicy/blob/main/docs/lint-rules.md"


def summary(diagnostics: Sequence[Diagnostic], files: int) -> dict[str, int]:
    errors = sum(1 for d in diagnostics if d.is_error)
    return {"files": files, "errors": errors, "warnings": len(diagnostics) - errors}


def render_text(
    diagnostics: Sequence[Diagnostic], sources: dict[str, list[str]], files: int, style: Style = PLAIN
) -> str:
    """Each diagnostic, the source line with a caret under the span, and the hint; then the counts."""
    out: list[str] = []
    for d in diagnostics:
        out.extend(render_diagnostic(d, sources.get(d.file), style))
    counts = summary(diagnostics, files)
    out.append(
        f"{counts['errors']} error{'s' * (counts['errors'] != 1)}, "
        f"{counts['warnings']} warning{'s' * (counts['warnings'] != 1)} "
        f"in {files} file{'s' * (files != 1)}"
    )
    return "\n".join(out) + "\n"


def render_diagnostic(d: Diagnostic, lines: Sequence[str] | None, style: Style = PLAIN) -> list[str]:
    """``file:line:col: CODE severity: message``, the source line (when ``lines`` has it) with a
    caret under the span, and the hint: what every command shows for a finding.

    Everything from the policy is ``printable``: a control character in it (an ESC that
    would start a terminal escape sequence) is shown escaped, the caret moved to match."""
    severity = style.paint(d.severity.value, "error" if d.is_error else "warning")
    location = style.paint(f"{printable(d.file)}:{d.line}:{d.col}:", "location")
    out = [f"{location} {style.paint(d.code, 'code')} {severity}: {printable(d.message)}"]
    if lines is not None and 1 <= d.line <= len(lines):
        text = lines[d.line - 1].rstrip("\r").expandtabs(1)
        width = max(1, (d.end_col - d.col) if d.end_line == d.line else len(text) - d.col + 1)
        before, span = printable(text[: d.col - 1]), printable(text[d.col - 1 : d.col - 1 + width])
        gutter = f"{d.line:>4} | "
        out.append(gutter + before + span + printable(text[d.col - 1 + width :]))
        caret = style.paint("^" * max(1, len(span)), "caret" if d.is_error else "caret_warning")
        out.append(" " * (len(gutter) - 2) + "| " + " " * len(before) + caret)
    if d.hint:
        out.append(f"  {style.paint('hint:', 'hint')} {printable(d.hint)}")
    return out


def render_json(diagnostics: Sequence[Diagnostic], files: int) -> str:
    document = {
        "schema": LINT_SCHEMA,
        "diagnostics": [d.model_dump(mode="json") for d in diagnostics],
        "summary": summary(diagnostics, files),
    }
    return json.dumps(document, indent=2) + "\n"


def render_sarif(diagnostics: Sequence[Diagnostic]) -> str:
    rules = all_rules()
    index = {r.code: i for i, r in enumerate(rules)}
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvpolicy",
                        "version": __version__,
                        "informationUri": RULES_DOC,
                        "rules": [
                            {
                                "id": r.code,
                                "name": r.name,
                                "shortDescription": {"text": r.summary()},
                                "helpUri": f"{RULES_DOC}#{r.anchor()}",
                                "defaultConfiguration": {"level": _level(r.severity)},
                            }
                            for r in rules
                        ],
                    }
                },
                "results": [
                    {
                        "ruleId": d.code,
                        "ruleIndex": index[d.code],
                        "level": _level(d.severity),
                        "message": {"text": d.message + (f" ({d.hint})" if d.hint else "")},
                        "locations": [
                            {
                                "physicalLocation": {
                                    "artifactLocation": {"uri": d.file},
                                    "region": {
                                        "startLine": d.line,
                                        "startColumn": d.col,
                                        "endLine": d.end_line,
                                        "endColumn": d.end_col,
                                    },
                                }
                            }
                        ],
                    }
                    for d in diagnostics
                ],
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def render_github(diagnostics: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands: one annotation per diagnostic."""
    lines = []
    for d in diagnostics:
        message = printable(d.message + (f" (hint: {d.hint})" if d.hint else ""))
        lines.append(
            f"::{d.severity.value} file={_escape_property(d.file)},line={d.line},col={d.col},"
            f"endLine={d.end_line},endColumn={d.end_col},title={d.code} {d.name}::{_escape_data(message)}"
        )
    return "".join(line + "\n" for line in lines)


def _level(severity: Severity) -> str:
    return "error" if severity is Severity.ERROR else "warning"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
