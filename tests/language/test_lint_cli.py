"""`kvpolicy lint`: output formats (JSON exactly as in docs/json.md), exit codes, options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy.cli import main

BROKEN = 'version 1\nmodel "qwen3-8b" {\n  reserve 4 GiBB\n}\n'
WARNS = 'version 1\nmodel "qwen3-8b" {\n  reserve 4 GB\n}\n'
CLEAN = 'version 1\nmodel "qwen3-8b" {\n  reserve 4 GiB\n}\n'


def lint(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["lint", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, text in (("broken", BROKEN), ("warns", WARNS), ("clean", CLEAN)):
        paths[name] = tmp_path / f"{name}.kvp"
        paths[name].write_text(text)
    return paths


def test_json_is_exactly_the_contract(files, capsys) -> None:
    code, out, _ = lint(["--format", "json", str(files["broken"])], capsys)
    assert code == 1
    assert json.loads(out) == {
        "schema": 1,
        "diagnostics": [
            {
                "file": str(files["broken"]), "line": 3, "col": 13, "end_line": 3, "end_col": 17,
                "code": "KV001", "name": "unknown-unit", "severity": "error",
                "message": "unknown unit 'GiBB'", "hint": "did you mean 'GiB'?",
            }
        ],
        "summary": {"files": 1, "errors": 1, "warnings": 0},
    }


def test_json_summary_over_several_files(files, capsys) -> None:
    code, out, _ = lint(["--format", "json", *map(str, files.values())], capsys)
    doc = json.loads(out)
    assert code == 1
    assert doc["summary"] == {"files": 3, "errors": 1, "warnings": 1}
    assert [d["code"] for d in doc["diagnostics"]] == ["KV001", "KV019"]
    assert all(d["hint"] is None or isinstance(d["hint"], str) for d in doc["diagnostics"])


def test_exit_codes(files, capsys) -> None:
    assert lint([str(files["clean"])], capsys)[0] == 0
    assert lint([str(files["warns"])], capsys)[0] == 0
    assert lint(["--strict", str(files["warns"])], capsys)[0] == 1
    assert lint([str(files["broken"])], capsys)[0] == 1
    code, _, err = lint([str(files["clean"].parent / "missing.kvp")], capsys)
    assert code == 2 and "no such file" in err
    with pytest.raises(SystemExit) as info:
        main(["lint", "--gpu-capacity", "141 GiBB", str(files["clean"])])
    assert info.value.code == 2
    assert "did you mean 'GiB'" in capsys.readouterr().err


def test_text_shows_the_line_a_caret_and_the_hint(files, capsys) -> None:
    _, out, _ = lint([str(files["broken"])], capsys)
    assert out.splitlines() == [
        f"{files['broken']}:3:13: KV001 error: unknown unit 'GiBB'",
        "   3 |   reserve 4 GiBB",
        "     |             ^^^^",
        "  hint: did you mean 'GiB'?",
        "1 error, 0 warnings in 1 file",
    ]


def test_text_shows_the_line_without_a_byte_order_mark(tmp_path, capsys) -> None:
    path = tmp_path / "bom.kvp"
    path.write_bytes(b"\xef\xbb\xbfversion 1; model \"x\" { reserve 4 GiBB }\n")
    _, out, _ = lint([str(path)], capsys)
    assert out.splitlines()[:3] == [
        f"{path}:1:34: KV001 error: unknown unit 'GiBB'",
        '   1 | version 1; model "x" { reserve 4 GiBB }',
        "     |                                  ^^^^",
    ]


def test_sarif(files, capsys) -> None:
    code, out, _ = lint(["--format", "sarif", str(files["broken"]), str(files["warns"])], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["version"] == "2.1.0"
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["KV001", "KV019"]
    assert [r["level"] for r in results] == ["error", "warning"]
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
    region = results[0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 3, "startColumn": 13, "endLine": 3, "endColumn": 17}
    assert rules[0]["helpUri"].endswith("#kv001-unknown-unit")


def test_github_annotations(files, capsys) -> None:
    _, out, _ = lint(["--format", "github", str(files["broken"])], capsys)
    assert out == (
        f"::error file={files['broken']},line=3,col=13,endLine=3,endColumn=17,title=KV001 unknown-unit"
        "::unknown unit 'GiBB' (hint: did you mean 'GiB'?)\n"
    )


def test_directory_lints_every_kvp_file(files, capsys) -> None:
    code, out, _ = lint(["--format", "json", str(files["clean"].parent)], capsys)
    assert json.loads(out)["summary"]["files"] == 3 and code == 1


def test_gpu_capacity_checks_over_commitment(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text('version 1\nmodel "a" { reserve 100 GiB }\nmodel "b" { reserve 60 GiB }\n')
    assert lint([str(path)], capsys)[0] == 0
    code, out, _ = lint(["--gpu-capacity", "141GiB", str(path)], capsys)
    assert code == 1 and "KV017 error: over-committed on each GPU" in out


def test_bad_facts_file(tmp_path, files, capsys) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text('{"schema": 1, "gpus": [{"id": "cuda:0"}]}')
    code, _, err = lint(["--facts", str(facts), str(files["clean"])], capsys)
    assert code == 1 and "capacity" in err and str(facts) in err


def test_suppression_silences_only_its_line_and_code(tmp_path, capsys) -> None:
    path = tmp_path / "p.kvp"
    path.write_text(
        "version 1\n"
        'model "a" { reserve 4 GB }  # kvpolicy: ignore[KV019] the vendor sheet is decimal\n'
        'model "b" { reserve 4 GB }\n'
        "# kvpolicy: ignore[KV019, KV020] both on purpose\n"
        'model "c" { reserve 4 GB }\n'
    )
    code, out, _ = lint(["--format", "json", "--strict", str(path)], capsys)
    found = [(d["line"], d["code"]) for d in json.loads(out)["diagnostics"]]
    assert found == [(3, "KV019"), (4, "KV025")]
    assert code == 1


def test_standard_input_is_linted_under_the_name_an_editor_gives(monkeypatch, capsys) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BROKEN.encode())))
    code, out, _ = lint(["-", "--stdin-filename", "unsaved.kvp"], capsys)
    assert code == 1
    assert out.startswith("unsaved.kvp:3:13: KV001 error: unknown unit 'GiBB'")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(CLEAN.encode())))
    code, out, _ = lint(["--format", "json", "-"], capsys)
    assert code == 0 and json.loads(out)["summary"] == {"files": 1, "errors": 0, "warnings": 0}


def test_standard_input_with_files_and_unreadable_files_are_usage_errors(files, monkeypatch, capsys) -> None:
    code, _, err = lint(["-", str(files["clean"])], capsys)
    assert code == 2 and "cannot be combined" in err
    code, out, err = lint(["--stdin-filename", "unsaved.kvp", str(files["clean"])], capsys)
    assert (code, out) == (2, "") and err == (
        "kvpolicy lint: --stdin-filename names standard input, which is read only with - as the one file\n")

    def denied(path, limit):
        raise PermissionError(13, "Permission denied")

    # As root, chmod 0 would not stop the read; tests/cli/test_bad_inputs.py reads as another user.
    monkeypatch.setattr("kvpolicy.lint.source.read_bounded", denied)
    code, out, err = lint([str(files["clean"])], capsys)
    assert code == 2 and err == f"kvpolicy lint: cannot read {files['clean']}: Permission denied\n" and out == ""
