"""Lint never writes a policy's control characters to the terminal: it shows them escaped."""

from __future__ import annotations

import itertools
import re

import pytest

from kvpolicy.cli import main
from kvpolicy.diagnostics import Diagnostic, Severity, printable

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")

POLICIES = {
    "an escape sequence in a model name": 'version 1\nmodel "a\x1b[2J\x1b]0;owned\x07" { reserve 40 GB }\n',
    "a carriage return mid-line": 'version 1\nmodel "a" { reserve 40 GB\r; priority 1 }\n',
    "a bidi override in a string": 'version 1\nmodel "\u202eevil" { priority 1; reserve 4 GiBB }\n',
    "a bell where a token belongs": 'version 1\nmodel "a" { priority\x07 1 }\n',
    "a control character in a comment": 'version 1\nmodel "a" { reserve 40 GB }  # \x1b[31m kvpolicy: ignore[KV019]\n',
}


@pytest.mark.parametrize("text", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("fmt", ["text", "github"])
def test_lint_shows_control_characters_escaped(text, fmt, tmp_path, capsys):
    path = tmp_path / "p.kvp"
    path.write_text(text, newline="")
    main(["lint", str(path), "--format", fmt])
    out = capsys.readouterr().out
    assert "KV0" in out  # there is a finding that quotes the line
    assert not RAW.search(out), repr(out)


def test_the_caret_stays_under_the_span_when_the_line_has_escapes(tmp_path, capsys):
    path = tmp_path / "p.kvp"
    path.write_text('version 1\nmodel "\x1b[1m" { reserve 40 GiBB }\n')
    main(["lint", str(path)])
    lines = capsys.readouterr().out.splitlines()
    source, caret = next((a, b) for a, b in itertools.pairwise(lines) if b.strip().startswith("|") and "^" in b)
    start = caret.index("^")
    assert "\\x1b[1m" in source and source[start : len(caret)] == "GiBB"


def test_render_and_printable():
    d = Diagnostic(file="a\x1b.kvp", line=1, col=1, end_line=1, end_col=2, code="KV001", name="n",
                   severity=Severity.ERROR, message="unknown unit '\x1b[31m'", hint="say \u202e")
    assert d.render() == "a\\x1b.kvp:1:1: KV001 error: unknown unit '\\x1b[31m'\n  hint: say \\u202e"
    assert printable("tab\tand\nnewline stay; DEL \x7f, NEL \x85 do not") == "tab\tand\nnewline stay; DEL \\x7f, NEL \\x85 do not"
