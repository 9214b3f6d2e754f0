"""Fuzz: 10,000 mutated policies through lint and fmt in-process, 300 through the CLI.

Each mutant is an example policy or golden file broken by byte and token edits
(``mutate.py``). For every one: lint returns only positioned diagnostics (never an
exception); fmt either formats it or refuses with a positioned syntax error; what
fmt writes formats to itself and lints to the same findings (codes and severities,
suppressions included). Every input runs under a hang bound (``HANG_SECONDS``, a
catcher, not a speed goal). A failure names the mutant's seed and index.
"""

from __future__ import annotations

import re
import subprocess
import sys
import traceback
from collections import Counter

import pytest

from kvpolicy.diagnostics import Diagnostic, PolicyError
from kvpolicy.lint.engine import lint_bytes
from kvpolicy.policy.fmt import format_text
from tests.fuzz.guard import hang_guard
from tests.fuzz.mutate import bases, mutant
from tests.fuzz.scale import CLI_MUTANTS, HANG_SECONDS, MUTANTS, scaled, seed

pytestmark = pytest.mark.fuzz

CODE = re.compile(r"KV\d{3}")
DIAGNOSTIC_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): KV\d{3} (error|warning): ")


def positioned(d: Diagnostic, text: str | None) -> str | None:
    """What is wrong with ``d``'s position, or None."""
    if not CODE.fullmatch(d.code):
        return f"code {d.code!r}"
    if d.line < 1 or d.col < 1 or (d.end_line, d.end_col) < (d.line, d.col):
        return f"span {d.line}:{d.col}-{d.end_line}:{d.end_col}"
    if text is not None and d.line > text.count("\n") + 2:
        return f"line {d.line} past the end"
    return None


def findings(diagnostics) -> Counter:
    return Counter((d.code, d.severity.value) for d in diagnostics)


def check(data: bytes) -> list[str]:
    """Everything wrong with how lint and fmt treat ``data``."""
    problems = []
    result = lint_bytes(data, "m.kvp")
    problems += [f"lint: {why}: {d.render()}" for d in result.diagnostics if (why := positioned(d, result.text))]
    if result.text is None:
        return problems  # not UTF-8: a positioned syntax error, checked above
    try:
        formatted = format_text(result.text, "m.kvp")
    except PolicyError as exc:
        problems += [f"fmt: {why}: {d.render()}" for d in exc.diagnostics if (why := positioned(d, result.text))]
        if not any(d.code == "KV002" or d.is_error for d in result.diagnostics):
            problems.append("fmt refused a file that lint found no error in")
        return problems
    again = format_text(formatted, "m.kvp")
    if again != formatted:
        problems.append("fmt is not idempotent")
    after = lint_bytes(formatted.encode(), "m.kvp")
    if findings(after.diagnostics) != findings(result.diagnostics):
        problems.append(f"fmt changed lint's findings: {sorted(findings(result.diagnostics).items())} -> "
                        f"{sorted(findings(after.diagnostics).items())}")
    return problems


def test_mutants_in_process():
    texts, s, count = bases(), seed(), scaled(MUTANTS)
    assert len(texts) >= 20
    failures: list[str] = []
    for i in range(count):
        data = mutant(texts, s, i)
        try:
            with hang_guard(HANG_SECONDS):
                problems = check(data)
        except Exception:  # noqa: BLE001 - any exception is a finding, reported with its traceback
            problems = ["raised:\n" + traceback.format_exc(limit=-3)]
        if problems:
            failures.append(f"mutant {s}/{i} {data[:300]!r}:\n  " + "\n  ".join(problems))
    assert not failures, f"{len(failures)} of {count} mutants failed; the first:\n\n" + "\n\n".join(failures[:5])


def test_the_mutants_exercise_fmt_and_suppressions():
    """The generator is not degenerate: many mutants parse (fmt has work), many carry suppressions."""
    texts, s = bases(), seed()
    sample = [mutant(texts, s, i) for i in range(500)]
    parsed = 0
    for data in sample:
        try:
            format_text(data.decode("utf-8"))
            parsed += 1
        except (UnicodeDecodeError, PolicyError):
            pass
    assert parsed >= 50, parsed
    assert sum(b"kvpolicy: ignore[" in d for d in sample) >= 100
    assert sum(b"\xff" in d or b"\xc3" in d for d in sample) >= 10


def test_mutants_through_the_cli(tmp_path):
    """The same inputs as files, through ``kvpolicy lint`` and ``kvpolicy fmt --check``: exit 0 or 1,
    every diagnostic line positioned, never a traceback."""
    texts, s, count = bases(), seed(), scaled(CLI_MUTANTS)
    paths = []
    for i in range(count):
        path = tmp_path / f"m{i:05d}.kvp"
        path.write_bytes(mutant(texts, s, MUTANTS + i))  # other mutants than the in-process ones
        paths.append(str(path))
    for start in range(0, count, 50):
        batch = paths[start : start + 50]
        for command in (["lint"], ["lint", "--format", "json"], ["fmt", "--check"]):
            out = subprocess.run([sys.executable, "-m", "kvpolicy.cli", *command, *batch], capture_output=True,
                                 text=True, errors="backslashreplace", timeout=HANG_SECONDS * len(batch))
            assert out.returncode in (0, 1), (command, out.returncode, out.stderr[-2000:])
            assert "Traceback" not in out.stdout + out.stderr, (command, out.stderr[-2000:])
            if command == ["lint"]:
                for line in out.stdout.splitlines():
                    if line.startswith(str(tmp_path)):
                        assert DIAGNOSTIC_LINE.match(line), line
