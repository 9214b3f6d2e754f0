"""`kvpolicy explain` and `kvpolicy test` end to end, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main

POLICY = """version 1
defaults { headroom 2 GiB }
model "chat" { priority 100; min 10 GiB; max 60%; weight 300 }
model "batch" { priority 10; min 4 GiB; weight 100 }
model "dsv4" { engine sglang; reserve 2 GiB; pool c4 { owner runtime; max 1 GiB } }
rule "idle-reclaim" {
  when model.idle > 60s
  shrink to min
  grace 30s
}
"""
GiB = 1 << 30
FACTS = {
    "schema": 1, "now": 1000.0,
    "gpus": [{"id": "cuda:0", "capacity": 80 * GiB, "other_used": 4 * GiB}],
    "instances": [
        {"id": "chat/0", "model": "chat", "gpu": "cuda:0", "elastic": {"used": 30 * GiB, "mapped": 30 * GiB}},
        {"id": "batch/0", "model": "batch", "gpu": "cuda:0", "elastic": {"used": 20 * GiB, "mapped": 20 * GiB},
         "idle_seconds": 300},
        {"id": "dsv4/0", "model": "dsv4", "engine": "sglang", "gpu": "cuda:0",
         "pools": {"c4": {"owner": "runtime", "bytes": 2 * GiB}, "swa": {"owner": "runtime", "bytes": GiB}}},
    ],
}


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "p.kvp").write_text(POLICY)
    (tmp_path / "p.facts.json").write_text(json.dumps(FACTS))
    return tmp_path


def test_explain_json_is_the_decision(project, capsys):
    assert main(["explain", str(project / "p.kvp"), "--format", "json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["schema"] == 1
    gpu = decision["gpus"][0]
    # A = 80 - 2 - 4 - (2 + 1) = 71 GiB
    assert gpu["elastic_budget"] == 71 * GiB and gpu["reserved"]["by_pool"] == {"c4": 2 * GiB, "swa": GiB}
    by_id = {i["id"]: i for i in decision["instances"]}
    assert by_id["chat/0"]["guarantee"] == 10 * GiB
    assert [(v["kind"], v["pool"], v["line"]) for v in by_id["dsv4/0"]["violations"]] == [
        ("pool_over_max", "c4", 5), ("reserve_exceeded", None, 5),
    ]


def test_explain_text_gives_reasons_and_exits_zero_on_violations(project, capsys):
    assert main(["explain", str(project / "p.kvp")]) == 0  # sample facts beside the policy
    out = capsys.readouterr().out
    assert "GPU cuda:0: capacity 80 GiB" in out
    assert "its max 60% (line 3)" in out
    assert "VIOLATION" in out and "pool_over_max" in out
    assert "elastic budget" in out and "71 GiB" in out


def test_explain_without_facts_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "lonely.kvp").write_text("version 1\n")
    assert main(["explain", str(tmp_path / "lonely.kvp")]) == 2
    assert "no sample facts" in capsys.readouterr().err


def test_explain_refuses_an_invalid_policy_with_its_position(project, capsys):
    (project / "bad.kvp").write_text("version 1\nmodel \"a\" { reserve 4 GiBB }\n")
    assert main(["explain", str(project / "bad.kvp"), "--facts", str(project / "p.facts.json")]) == 1
    assert "bad.kvp:2:23: KV001 error: unknown unit 'GiBB'" in capsys.readouterr().err


def test_explain_reports_bad_facts_as_input_errors(project, capsys):
    (project / "broken.json").write_text('{"schema": 1, "gpus": [{"id": "cuda:0"}]}')
    assert main(["explain", str(project / "p.kvp"), "--facts", str(project / "broken.json")]) == 1
    assert "gpus.0.capacity" in capsys.readouterr().err


def test_policy_tests_pass_fail_and_diff(project, capsys):
    tests = {
        "schema": 1, "policy": "p.kvp",
        "cases": [
            {"name": "right", "facts": "p.facts.json",
             "expect": {"instances": {"chat/0": {"guarantee": "10 GiB", "limit": {"max": "48 GiB"}}}}},
            {"name": "grace", "facts": "p.facts.json",
             "steps": [{"expect": {"instances": {"batch/0": {"actions": []}}}},
                       {"advance": 30, "expect": {"instances": {"batch/0": {"limit": "4 GiB", "actions": ["idle-reclaim"]}}}}]},
            {"name": "wrong", "facts": "p.facts.json",
             "expect": {"instances": {"chat/0": {"target": "1 GiB"}}}},
        ],
    }
    (project / "p.kvtest.json").write_text(json.dumps(tests))
    assert main(["test", str(project)]) == 1
    out = capsys.readouterr().out
    assert "PASS" in out and "p.kvtest.json :: right" in out and "p.kvtest.json :: grace" in out
    assert "FAIL" in out and "chat/0 target: expected 1 GiB (1073741824), got" in out
    assert "2 passed, 1 failed" in out
    tests["cases"].pop()
    (project / "p.kvtest.json").write_text(json.dumps(tests))
    assert main(["test", str(project), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"] == {"files": 1, "cases": 2, "passed": 2, "failed": 0}


def test_policy_test_with_unknown_field_is_an_error(project, capsys):
    (project / "x.kvtest.json").write_text(json.dumps({"schema": 1, "policy": "p.kvp", "cases": [
        {"name": "typo", "facts": "p.facts.json", "expect": {"instances": {"chat/0": {"limt": 1}}}}]}))
    assert main(["test", str(project / "x.kvtest.json")]) == 1
    assert "limt" in capsys.readouterr().out


def test_explain_runs_as_a_command(project):
    out = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "explain", str(project / "p.kvp"), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["policy"]["file"].endswith("p.kvp")
