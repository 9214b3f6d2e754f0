"""kvpolicy fmt: golden pairs, safety on every pair and example policy, and the CLI.

Safety, for each input (gdtoolkit's checks): formatting twice changes nothing, the
built Policy is the same (spans and the file hash aside), every comment survives.
Refresh the ``.out.kvp`` files with KVPOLICY_UPDATE_GOLDEN=1 and review them.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.lint.engine import decode_policy, lint_text
from kvpolicy.diagnostics import PolicyError
from kvpolicy.policy.fmt import format_text

from .helpers import comment_texts, semantic_dump

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "fmt"
PAIRS = sorted(GOLDEN.glob("*.in.kvp"))
POLICIES = sorted((ROOT / "policies").glob("*.kvp"))
UPDATE = os.environ.get("KVPOLICY_UPDATE_GOLDEN") == "1"


def _read(path: Path) -> str:
    return decode_policy(path.read_bytes(), path.name)


def _out_path(pair: Path) -> Path:
    return pair.with_name(pair.name.replace(".in.kvp", ".out.kvp"))


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name.split(".")[0] for p in PAIRS])
def test_golden_pair(pair: Path) -> None:
    formatted = format_text(_read(pair), pair.name)
    expected = _out_path(pair)
    if UPDATE:
        expected.write_text(formatted, encoding="utf-8", newline="")
    assert formatted == expected.read_text(encoding="utf-8")


def test_enough_pairs_and_no_stale_outputs() -> None:
    assert len(PAIRS) >= 12
    assert [p.name for p in GOLDEN.glob("*.out.kvp") if not p.with_name(p.name.replace(".out.", ".in.")).exists()] == []


SAFETY_INPUTS = [*PAIRS, *POLICIES, *(p for p in (GOLDEN.glob("*.out.kvp")))]


@pytest.mark.parametrize("path", SAFETY_INPUTS, ids=[str(p.relative_to(ROOT)) for p in SAFETY_INPUTS])
def test_formatting_is_safe(path: Path) -> None:
    text = _read(path)
    formatted = format_text(text, path.name)
    assert format_text(formatted, path.name) == formatted, "not idempotent"
    before, after = lint_text(text, path.name), lint_text(formatted, path.name)
    if before.policy is not None:
        assert semantic_dump(after.policy) == semantic_dump(before.policy)
    else:  # a policy with semantic errors: the same findings (their lines may move)
        assert sorted((d.code, d.message) for d in after.diagnostics) == sorted((d.code, d.message) for d in before.diagnostics)
    assert sorted(comment_texts(formatted)) == sorted(comment_texts(text))


@pytest.mark.parametrize("path", POLICIES, ids=[p.name for p in POLICIES])
def test_example_policies_are_formatted(path: Path) -> None:
    text = _read(path)
    assert format_text(text, path.name) == text, f"run: kvpolicy fmt {path.relative_to(ROOT)}"


def test_syntax_error_is_policy_error_with_position() -> None:
    with pytest.raises(PolicyError) as info:
        format_text('version 1\nmodel "a" {\n  priority\n}\n', "p.kvp")
    assert (info.value.line, info.value.col, info.value.code) == (3, 11, "KV002")


def test_output_rules() -> None:
    """One statement per line, two-space indent, one blank line between blocks, one final newline."""
    out = format_text('version 1;model "a" {engine vllm;priority 1};model "b" {}', "p.kvp")
    assert out == 'version 1\n\nmodel "a" {\n  engine vllm\n  priority 1\n}\n\nmodel "b" {}\n'


# ---- the command ---------------------------------------------------------------------

UGLY = 'version 1\nmodel "a" {reserve 20GiB}  # keep me\n'
PRETTY = 'version 1\n\nmodel "a" {\n  reserve 20 GiB\n}  # keep me\n'
BROKEN = 'version 1\nmodel "a" {\n  reserve\n}\n'


def run_fmt(args: list[str], capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8"))))
    code = main(["fmt", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fmt_rewrites_in_place(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    code, out, _ = run_fmt([str(path)], capsys)
    assert code == 0
    assert path.read_text() == PRETTY
    assert "reformatted" in out
    assert [p.name for p in tmp_path.iterdir()] == ["p.kvp"], "left a temporary file behind"
    code, out, _ = run_fmt([str(path)], capsys)
    assert code == 0 and path.read_text() == PRETTY and "1 unchanged" in out


def test_check_writes_nothing_and_exits_1_when_a_file_would_change(tmp_path, capsys) -> None:
    ugly, pretty = tmp_path / "ugly.kvp", tmp_path / "pretty.kvp"
    ugly.write_text(UGLY)
    pretty.write_text(PRETTY)
    code, out, _ = run_fmt(["--check", str(ugly), str(pretty)], capsys)
    assert code == 1
    assert f"would reformat {ugly}" in out and str(pretty) not in out.replace("unchanged", "")
    assert ugly.read_text() == UGLY
    code, _, _ = run_fmt(["--check", str(pretty)], capsys)
    assert code == 0


def test_diff_prints_a_unified_diff_and_writes_nothing(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(UGLY)
    code, out, _ = run_fmt(["--diff", str(path)], capsys)
    assert code == 1, "a difference exits 1, as diff(1) does"
    assert path.read_text() == UGLY
    assert out.startswith(f"--- {path}\n+++ {path} (formatted)\n")
    assert '-model "a" {reserve 20GiB}  # keep me' in out and "+  reserve 20 GiB" in out


def test_diff_of_a_formatted_file_is_empty_and_exits_0(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(PRETTY)
    code, out, _ = run_fmt(["--diff", str(path)], capsys)
    assert (code, out) == (0, "")


def test_a_syntax_error_is_shown_with_its_caret_and_the_file_not_formatted(tmp_path, capsys) -> None:
    path = tmp_path / "broken.kvp"
    path.write_text(BROKEN)
    code, _, err = run_fmt([str(path)], capsys)
    assert code == 1 and path.read_text() == BROKEN
    assert f"kvpolicy fmt: {path}: not formatted: 1 syntax error\n" in err
    assert f"{path}:3:10: KV002 error: 'reserve' needs a size" in err
    assert "   3 |   reserve\n     |          ^" in err, err


def test_stdin_to_stdout(capsys, monkeypatch) -> None:
    code, out, err = run_fmt(["-"], capsys, stdin=UGLY, monkeypatch=monkeypatch)
    assert (code, out, err) == (0, PRETTY, "")


def test_stdin_with_syntax_error(capsys, monkeypatch) -> None:
    code, out, err = run_fmt(["-"], capsys, stdin=BROKEN, monkeypatch=monkeypatch)
    assert code == 1 and out == ""
    assert "<stdin>:3:10: KV002 error: 'reserve' needs a size" in err


def test_file_with_syntax_error_is_left_alone(tmp_path, capsys) -> None:
    broken, ugly = tmp_path / "broken.kvp", tmp_path / "ugly.kvp"
    broken.write_text(BROKEN)
    ugly.write_text(UGLY)
    code, _, err = run_fmt([str(broken), str(ugly)], capsys)
    assert code == 1
    assert broken.read_text() == BROKEN
    assert ugly.read_text() == PRETTY, "the other files are still formatted"
    assert f"{broken}:3:10: KV002" in err


def test_non_utf8_file_is_left_alone(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_bytes(b"version 1\n# caf\xe9\n")
    code, _, err = run_fmt([str(path)], capsys)
    assert code == 1 and "not UTF-8" in err
    assert path.read_bytes() == b"version 1\n# caf\xe9\n"


def test_json_format(tmp_path, capsys) -> None:
    ugly, broken = tmp_path / "ugly.kvp", tmp_path / "broken.kvp"
    ugly.write_text(UGLY)
    broken.write_text(BROKEN)
    code, out, _ = run_fmt(["--check", "--format", "json", str(ugly), str(broken)], capsys)
    assert code == 1
    doc = json.loads(out)
    assert doc["schema"] == 1
    by_file = {f["file"]: f for f in doc["files"]}
    assert by_file[str(ugly)]["changed"] is True
    assert by_file[str(broken)]["changed"] is False and "KV002" in by_file[str(broken)]["error"]


def test_directory_is_expanded_to_kvp_files(tmp_path, capsys) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.kvp").write_text(UGLY)
    (tmp_path / "notes.txt").write_text("not a policy {")
    code, _, _ = run_fmt([str(tmp_path)], capsys)
    assert code == 0
    assert (tmp_path / "sub" / "a.kvp").read_text() == PRETTY
    assert (tmp_path / "notes.txt").read_text() == "not a policy {"


def test_missing_file_is_a_usage_error(tmp_path, capsys) -> None:
    code, _, err = run_fmt([str(tmp_path / "nope.kvp")], capsys)
    assert code == 2 and "no such file" in err


def test_check_and_diff_are_exclusive(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fmt", "--check", "--diff", "x.kvp"])
    assert info.value.code == 2


def test_rewrite_goes_through_a_symlink_and_keeps_the_mode(tmp_path, capsys) -> None:
    # A ConfigMap-style layout: the policy is a link into a versioned directory.
    version = tmp_path / "..2026_11_30"
    version.mkdir()
    real = version / "p.kvp"
    real.write_text('version 1\nmodel "a" {priority 1}\n')
    os.chmod(real, 0o640)
    link = tmp_path / "p.kvp"
    link.symlink_to(real)
    assert main(["fmt", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real
    assert real.read_text() == 'version 1\n\nmodel "a" {\n  priority 1\n}\n'
    assert os.stat(real).st_mode & 0o777 == 0o640
    assert [p.name for p in version.iterdir()] == ["p.kvp"]  # no temporary file left behind


# ---- a suppression on the '}' of a block that would close up --------------------------

SUPPRESSED_CLOSE = [
    ('model "d" {\n} # kvpolicy: ignore[KV019] x\n', 'model "d" {\n}  # kvpolicy: ignore[KV019] x\n'),
    ("gpu * {\n}  # kvpolicy: ignore[KV019] x\n", "gpu * {\n}  # kvpolicy: ignore[KV019] x\n"),
    ('rule "r" {\n}  # kvpolicy: ignore[KV020] x\n', 'rule "r" {\n}  # kvpolicy: ignore[KV020] x\n'),
    ('model "m" {\n  pool p {\n  owner x\n  } # kvpolicy: ignore[KV019] x\n  priority 1\n}\n',
     'model "m" {\n  pool p {\n    owner x\n  }  # kvpolicy: ignore[KV019] x\n  priority 1\n}\n'),
]


def _codes(text: str) -> list[tuple[str, int]]:
    return sorted((d.code, d.line) for d in lint_text(text, "p.kvp").diagnostics)


@pytest.mark.parametrize(("body", "expected"), SUPPRESSED_CLOSE, ids=["model", "gpu", "rule", "pool"])
def test_a_suppression_after_a_closing_brace_keeps_the_brace_on_its_line(body: str, expected: str) -> None:
    """Joined onto its header's line, the block's '}' was printed again from the covered line
    (a second '}': a syntax error), and the suppression moved onto the header."""
    text = "version 1\n" + body
    formatted = format_text(text, "p.kvp")
    assert formatted == "version 1\n\n" + expected
    assert format_text(formatted, "p.kvp") == formatted
    assert formatted.count("# kvpolicy: ignore") == 1
    # the same findings on the same code: the header's line and the '}' line both kept
    assert _codes(formatted) == [(code, line + 1) for code, line in _codes(text)]


def test_a_plain_comment_after_a_closing_brace_still_closes_the_block_up() -> None:
    assert format_text('version 1\nmodel "d" {\n} # plain\n') == 'version 1\n\nmodel "d" {}  # plain\n'


def test_blank_lines_inside_a_block_closed_up_stay_inside_it() -> None:
    """A block joined onto one line ends at its '}': a blank line before that '}' is not
    one between the block and the next statement."""
    text = 'version 1\nmodel "a" {\n  pool p {\n  owner x\n\n  }\n  pool q {\n\n  }\n  priority 1\n}\n'
    assert format_text(text) == 'version 1\n\nmodel "a" {\n  pool p { owner x }\n  pool q {}\n  priority 1\n}\n'
