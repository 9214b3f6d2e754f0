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
    assert document == {"schema": 1, "error": {"status": status, "message": document["error"]["message"]}}
    assert said in document["error"]["message"] and said in done.stderr  # shown as ever on stderr too


def test_a_command_that_has_its_document_prints_it_not_an_error(tmp_path: Path) -> None:
    """lint's findings are its document (exit 1), and a success is unchanged."""
    (tmp_path / "broken.kvp").write_text('version 1\nmodel "a {\n')
    done = kvpolicy(tmp_path, "lint", "broken.kvp")
    assert done.returncode == 1 and "error" not in json.loads(done.stdout) and json.loads(done.stdout)["diagnostics"]
    done = kvpolicy(tmp_path, "explain", str(POLICY))
    assert done.returncode == 0 and "error" not in json.loads(done.stdout)
