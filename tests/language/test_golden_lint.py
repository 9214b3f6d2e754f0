"""Golden tests: the exact `kvpolicy lint` text for a corpus of broken policies.

Each ``tests/golden/lint/NN-name.kvp`` is linted from inside that directory (so
file names in the output are short), and the output plus the exit code must equal
``NN-name.out``. A first line ``# args: ...`` adds command-line options.

To refresh the expected files after a deliberate change, run with
``KVPOLICY_UPDATE_GOLDEN=1`` and review every changed ``.out`` by eye: each
message in the user's words, on the right token, with a useful hint.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.catalogue import all_rules
from kvpolicy.policy.syntax_messages import ERROR_EXAMPLES

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "lint"
CASES = sorted(GOLDEN.glob("*.kvp"))
UPDATE = os.environ.get("KVPOLICY_UPDATE_GOLDEN") == "1"
_ARGS = re.compile(rb"#\s*args:(.*)")


def _args(case: Path) -> list[str]:
    first = case.read_bytes().split(b"\n", 1)[0]
    match = _ARGS.match(first)
    return shlex.split(match.group(1).decode()) if match else []


def run_lint(case: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.chdir(GOLDEN)
    code = main(["lint", *_args(case), case.name])
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return captured.out + f"[exit {code}]\n"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_lint_output_matches_golden(case: Path, monkeypatch, capsys) -> None:
    out = run_lint(case, monkeypatch, capsys)
    expected = case.with_suffix(".out")
    if UPDATE:
        expected.write_text(out, encoding="utf-8")
    assert expected.exists(), f"no {expected.name}: run with KVPOLICY_UPDATE_GOLDEN=1 and review it"
    assert out == expected.read_text(encoding="utf-8")


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


def test_every_output_has_a_policy() -> None:
    """No stale .out file is left behind when a case is renamed or removed."""
    stale = [p.name for p in GOLDEN.glob("*.out") if not p.with_suffix(".kvp").exists()]
    assert stale == []


def test_corpus_covers_every_rule() -> None:
    reported = set()
    for out in GOLDEN.glob("*.out"):
        reported |= set(re.findall(r": (KV\d{3}) (?:error|warning):", out.read_text(encoding="utf-8")))
    missing = [f"{r.code} {r.name}" for r in all_rules() if r.code not in reported]
    assert missing == []


def test_corpus_covers_every_syntax_error_kind() -> None:
    """Each kind in ERROR_EXAMPLES has a golden case named after it."""
    names = " ".join(c.stem for c in CASES)
    assert [kind for kind in ERROR_EXAMPLES if f"syntax-{kind}" not in names] == []


def test_corpus_has_files_with_several_errors() -> None:
    """Recovery: at least a few cases report several errors from one run."""
    many = [
        out.name
        for out in GOLDEN.glob("*.out")
        if len(re.findall(r"^\S+:\d+:\d+: KV\d{3} error:", out.read_text(encoding="utf-8"), re.M)) >= 3
    ]
    assert len(many) >= 5, many
