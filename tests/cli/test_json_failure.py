"""``--format json`` is one JSON document on stdout, a failure's too (kvpolicy/commands/json_failure.py).

Each case runs ``kvpolicy`` in its own process and parses its whole stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "two-models.kvp"
FACTS = REPO / "policies" / "two-models.facts.json"


def kvpolicy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpolicy.cli", *args, "--format", "json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"})


FAILURES = [
    (["explain", "broken.kvp"], 1, "broken.kvp:2:7: KV002 error: unterminated string"),
    (["diff", "broken.kvp", str(POLICY), "--facts", str(FACTS)], 1, "broken.kvp:2:7: KV002"),
    (["explain", "missing.kvp"], 2, "kvpolicy explain: missing.kvp: no such file"),
    (["lint", str(POLICY), "--facts", "missing.json"], 2, "kvpolicy lint: missing.json: cannot read it"),
    (["plan", "--engine", "vllm", "--model-config", "missing.json", "--budget", "1GiB"], 2, "cannot read the model config"),
    (["test", "missing.kvtest.json"], 2, "missing.kvtest.json: no such file or directory"),
    (["init", "broken.kvp"], 1, "broken.kvp exists; pass --force"),
    (["fmt", "--check", "missing.kvp"], 2, "kvpolicy fmt: missing.kvp: no such file or directory"),
    (["status", "--ledger-dir", "no-ledger"], 1, "no ledger at no-ledger"),
]


@pytest.mark.parametrize(("args", "status", "said"), FAILURES, ids=[" ".join(a[:1] + a[-1:]) for a, _, _ in FAILURES])
def test_a_failure_is_an_error_document(tmp_path: Path, args: list[str], status: int, said: str) -> None:
    (tmp_path / "broken.kvp").write_text('version 1\nmodel "a {\n')
    done = kvpolicy(tmp_path, *args)
    assert done.returncode == status, done.stderr
    document = json.loads(done.stdout)  # the whole of stdout: one document
    error = document["error"]
    assert document == {"schema": 1, "error": {"status": status, "message": error["message"],
                                               "diagnostics": error["diagnostics"], "more": 0}}
    assert said in error["message"] and said in done.stderr  # shown as ever on stderr too
    if "broken.kvp:2:7" in said:  # a policy that does not load: its diagnostics, as lint's JSON has them
        first = error["diagnostics"][0]
        assert (first["file"], first["line"], first["col"], first["code"]) == ("broken.kvp", 2, 7, "KV002")
        assert all(f"{d['file']}:{d['line']}:{d['col']}: {d['code']} error: {d['message']}" in done.stderr
                   for d in error["diagnostics"])
    else:
        assert error["diagnostics"] == []


DOCUMENT_FAILURES = [
    (["explain", str(POLICY), "--facts", "bad.json"], "facts"),
    (["diff", str(POLICY), str(POLICY), "--facts", "bad.json"], "facts"),
    (["lint", str(POLICY), "--facts", "bad.json"], "facts"),
    (["run", str(POLICY), "--once", "--ledger-dir", "ledger", "--facts", "bad.json"], "facts"),
    (["explain", str(POLICY), "--facts", str(FACTS), "--state", "bad.json"], "state"),
]


@pytest.mark.parametrize(("args", "kind"), DOCUMENT_FAILURES, ids=[f"{a[0]}-{k}" for a, k in DOCUMENT_FAILURES])
def test_a_document_with_problems_is_an_error_document_with_their_diagnostics(tmp_path: Path, args: list[str],
                                                                             kind: str) -> None:
    """Each problem with its code, place and hint, as lint's diagnostics; the first ten, and how many more."""
    if kind == "facts":
        bad: dict[str, object] = {"schema": 1, "gpus": [{"id": f"cuda:{i}", "capacity": -1} for i in range(12)]}
        value, code, message = "-1", ("KVD008", "value-not-allowed"), "gpus.{}.capacity: must be 0 or more, not -1"
    else:
        bad = {"schema": 1, "rules": {"r": {f"i/{i}": {"shrink_to": "x"} for i in range(12)}}}
        value, code, message = '"x"', ("KVD007", "wrong-type"), 'rules.r.i/{}.shrink_to: must be a whole number, not "x"'
    text = json.dumps(bad, indent=1)
    places = [(number, row.index(value) + 1) for number, row in enumerate(text.split("\n"), start=1) if value in row]
    (tmp_path / "bad.json").write_text(text)
    (tmp_path / "ledger").mkdir(mode=0o700)
    done = kvpolicy(tmp_path, *args)
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["status"] == 1 and error["more"] == 2
    diagnostics = error["diagnostics"]
    assert [(d["file"], d["line"], d["col"], d["end_line"], d["end_col"]) for d in diagnostics] == [
        ("bad.json", line, col, line, col + len(value)) for line, col in places[:10]]
    assert {(d["code"], d["name"], d["severity"]) for d in diagnostics} == {(*code, "error")}
    assert [d["message"] for d in diagnostics] == [message.format(i) for i in range(10)]
    assert all(d["hint"] for d in diagnostics)
    first = diagnostics[0]
    assert f"bad.json:{first['line']}:{first['col']}: {code[0]} error: {first['message']}\n  hint: {first['hint']}" in done.stderr
    assert done.stderr.rstrip().endswith("bad.json: and 2 more problems") and error["message"] in done.stderr


def test_a_command_that_has_its_document_prints_it_not_an_error(tmp_path: Path) -> None:
    """lint's findings are its document (exit 1), and a success is unchanged."""
    (tmp_path / "broken.kvp").write_text('version 1\nmodel "a {\n')
    done = kvpolicy(tmp_path, "lint", "broken.kvp")
    assert done.returncode == 1 and "error" not in json.loads(done.stdout) and json.loads(done.stdout)["diagnostics"]
    done = kvpolicy(tmp_path, "explain", str(POLICY))
    assert done.returncode == 0 and "error" not in json.loads(done.stdout)
