"""docs/json.md is true: every field its examples show is in the command's real output.

Each example on that page is marked ``<!-- json: NAME -->``; this test runs the command
NAME stands for and walks the example: every key it shows must be in the output, nested
objects are walked in turn, and a list's first item against the output list's first item.
A field the docs show and the command does not print fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvpolicy.cli import main
from kvpolicy.runtime.status import Status

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "json.md"
POLICIES = ROOT / "policies"


def documented() -> dict[str, Any]:
    """Each marked example of docs/json.md by its name, parsed."""
    text = DOC.read_text(encoding="utf-8")
    found = re.findall(r"<!-- json: ([\w-]+) -->\n```json\n(.*?)\n```", text, flags=re.S)
    return {name: json.loads(body) for name, body in found}


def missing(shown: Any, real: Any, path: str = "$") -> list[str]:
    """The paths of fields in ``shown`` that ``real`` lacks."""
    if isinstance(shown, dict):
        if not isinstance(real, dict):
            return [f"{path}: an object in the docs, {type(real).__name__} in the output"]
        gaps = [f"{path}.{key}" for key in shown if key not in real]
        for key, value in shown.items():
            if key in real and real[key] is not None:
                gaps += missing(value, real[key], f"{path}.{key}")
        return gaps
    if isinstance(shown, list) and shown and isinstance(shown[0], (dict, list)):
        if not isinstance(real, list):
            return [f"{path}: a list in the docs, {type(real).__name__} in the output"]
        return missing(shown[0], real[0], f"{path}[0]") if real else [f"{path}: empty in the output"]
    return []


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    main([*argv, "--format", "json"])
    return json.loads(capsys.readouterr().out)


POLICY = """version 1
model "chat" { engine vllm; priority 10; min 4 GiB; max 60%; pool full { owner elastic } }
"""
FACTS = {
    "schema": 1, "now": 100.0,
    "gpus": [{"id": "cuda:0", "capacity": 80 << 30, "other_used": 0}],
    "instances": [{"id": "chat/0", "model": "chat", "engine": "vllm", "gpu": "cuda:0",
                   "elastic": {"used": 1 << 30, "mapped": 1 << 30}}],
}
KVTEST = {"schema": 1, "policy": "p.kvp",
          "cases": [{"name": "guaranteed", "facts": "p.facts.json",
                     "expect": {"instances": {"chat/0": {"guarantee": "4 GiB"}}}}]}


def outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    (tmp_path / "bad.kvp").write_text('version 1\nmodel "a" {\n  min 4 GiBB\n}\n')
    (tmp_path / "p.kvp").write_text(POLICY)
    (tmp_path / "p2.kvp").write_text(POLICY.replace("min 4 GiB", "min 8 GiB"))
    (tmp_path / "p.facts.json").write_text(json.dumps(FACTS))
    (tmp_path / "p.kvtest.json").write_text(json.dumps(KVTEST))
    (tmp_path / "bad.json").write_text('{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": -5}]}\n')
    ledger = tmp_path / "ledger"
    ledger.mkdir(mode=0o700)
    return {
        "error": run_json(capsys, "explain", str(tmp_path / "p.kvp"), "--facts", str(tmp_path / "bad.json")),
        "lint": run_json(capsys, "lint", str(tmp_path / "bad.kvp")),
        "fmt": run_json(capsys, "fmt", "--check", str(POLICIES / "two-models.kvp")),
        "explain": run_json(capsys, "explain", str(POLICIES / "two-models.kvp")),
        "diff": run_json(capsys, "diff", str(tmp_path / "p.kvp"), str(tmp_path / "p2.kvp"),
                         "--facts", str(tmp_path / "p.facts.json")),
        "test": run_json(capsys, "test", str(tmp_path / "p.kvtest.json")),
        "plan-sglang": run_json(capsys, "plan", "--engine", "sglang", "--budget", "40 GiB",
                                "--model-config", str(POLICIES / "models" / "deepseek-v4-flash.json")),
        "plan-vllm": run_json(capsys, "plan", "--engine", "vllm", "--budget", "4 GiB", "--max-model-len", "4096",
                              "--model-config", str(ROOT / "tests" / "vllm" / "configs" / "gemma-3-1b" / "config.json")),
        "status": run_json(capsys, "status", "--ledger-dir", str(ledger)),
    }


def test_every_example_is_a_command_s_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs, real = documented(), outputs(tmp_path, capsys)
    assert sorted(docs) == sorted(real), "docs/json.md's examples and this test's commands differ"
    gaps = {name: missing(docs[name], real[name]) for name in docs if name != "status"}
    # an empty ledger lists no GPU or instance: those are checked against the model below
    gaps["status"] = [key for key in docs["status"] if key not in real["status"]]
    assert {name: found for name, found in gaps.items() if found} == {}
    assert real["lint"]["diagnostics"][0]["code"] == docs["lint"]["diagnostics"][0]["code"] == "KV001"
    shown, error = docs["error"]["error"]["diagnostics"][0], real["error"]["error"]["diagnostics"][0]
    assert {**shown, "file": error["file"]} == error, "the error document's example is explain's, on its facts"
    assert real["test"]["summary"]["passed"] == 1
    assert real["diff"]["changed"] == 1 and real["diff"]["instances"][0]["guarantee"]["new"] == 8 << 30
    # JSON status carries what the text output flags (here: no controller has written one)
    assert real["status"]["problems"] == ["no controller has written a status here"]


def test_the_status_example_is_the_status_model() -> None:
    """An empty ledger has no instances to walk, so the status example is checked against the
    model the controller writes: it validates, and every field it shows is one of the model's."""
    example = documented()["status"]
    status = Status.model_validate(example)
    assert missing(example, status.model_dump(by_alias=True, mode="json")) == []
    assert not status.model_extra and all(not i.model_extra for i in status.instances)


def test_the_walk_finds_a_missing_field() -> None:
    assert missing({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {}}) == ["$.b.c"]
    assert missing({"xs": [{"k": 1}]}, {"xs": [{"j": 1}]}) == ["$.xs[0].k"]
    assert missing({"xs": [{"k": 1}]}, {"xs": []}) == ["$.xs: empty in the output"]
