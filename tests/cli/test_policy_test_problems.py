"""`kvpolicy test`: the problems a case meets as it runs are placed in the test file, with their codes.

Inline facts or an inline state that are no facts or evaluator state (or of another schema version, or
another kind of document), an id a step's ``set`` or ``remove`` names that the facts lack, facts that a step makes
invalid, a facts file that cannot be read: each is a diagnostic at the value the user wrote
(``t.kvtest.json:LINE:COL: KVDnnn error: ...`` and its hint), in the text output under the case
and in ``--format json`` in the case's result. The case fails; the others still run. The
command runs in its own process, as a user runs it, in the test file's folder.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

POLICY = """version 1
model "chat" { priority 100; min 10 GiB; weight 300 }
model "batch" { priority 10; min 4 GiB; weight 100 }
rule "idle-reclaim" { when model.idle > 60s; shrink to min; grace 30s }
"""
FACTS = """{"schema": 1, "now": 1000,
 "gpus": [{"id": "cuda:0", "capacity": "80 GiB"}],
 "instances": [{"id": "chat/0", "model": "chat", "gpu": "cuda:0"},
               {"id": "batch/0", "model": "batch", "gpu": "cuda:0", "idle_seconds": 300}]}
"""
# Each case on lines of its own, so that the places below can be read off the text.
TESTS = """{"schema": 1, "policy": "p.kvp",
 "cases": [
  {"name": "passes", "facts": "p.facts.json",
   "expect": {"gpus": {"cuda:0": {"elastic_budget": "80 GiB"}}}},
  {"name": "bad state", "facts": "p.facts.json",
   "state": {"rules": {"idle-reclaim": {"batch/0": {"holding_snce": 1, "acting_since": "soon"}}}}},
  {"name": "no such instance", "facts": "p.facts.json",
   "steps": [{"advance": 1},
             {"set": {"instances": {"chat/1": {"idle_seconds": 5}}}}]},
  {"name": "no such GPU or removed instance", "facts": "p.facts.json",
   "steps": [{"set": {"gpus": {"gpu-x": {"other_used": 0}}, "remove": ["batch/0", "chat/9"]}}]},
  {"name": "moved to no GPU",
   "facts": {"schema": 1, "gpus": [{"id": "cuda:0", "capacity": "80 GiB"}],
             "instances": [{"id": "chat/0", "model": "chat", "gpu": "cuda:0"}]},
   "steps": [{"set": {"instances": {"chat/0": {"gpu": "cuda:1"}}}}]},
  {"name": "past the end of time", "facts": "p.facts.json",
   "steps": [{"advance": 1.7e308}, {"advance": 1.7e308}]},
  {"name": "a newer state", "facts": "p.facts.json", "state": {"schema": 2}},
  {"name": "facts as state", "facts": "p.facts.json", "state": {"schema": 1, "gpus": []}},
  {"name": "no facts file", "facts": "gone.facts.json"},
  {"name": "removed earlier", "facts": "p.facts.json", "steps": [{"set": {"remove": ["batch/0"]}}, {"set": {"instances": {"batch/0": {"idle_seconds": 1}}, "remove": ["batch/0"]}}]},
  {"name": "bad inline facts", "facts": {"gpus": [{"id": "cuda:0", "capacity": "eighty"}], "instancs": []}}
 ]}
"""
PROBLEMS = {
    "bad state": [
        ("t.kvtest.json:6:53: KVD010 error: cases.1.state.rules.idle-reclaim.batch/0.holding_snce: unknown field "
         "'holding_snce'", "did you mean 'holding_since'?"),
        ('t.kvtest.json:6:88: KVD007 error: cases.1.state.rules.idle-reclaim.batch/0.acting_since: must be a number, '
         'not "soon"', "acting_since: When the shrink in force started (null: none is in force, or an older state did "
                       "not record it)."),
    ],
    "no such instance": [
        ("t.kvtest.json:9:37: KVD008 error: cases.2.steps.1.set.instances.chat/1: no instance 'chat/1' in the facts",
         "did you mean 'chat/0'?"),
    ],
    "no such GPU or removed instance": [
        ("t.kvtest.json:11:32: KVD008 error: cases.3.steps.0.set.gpus.gpu-x: no GPU 'gpu-x' in the facts",
         "the GPUs of the facts: 'cuda:0'"),
        ("t.kvtest.json:11:83: KVD008 error: cases.3.steps.0.set.remove.1: no instance 'chat/9' in the facts",
         "did you mean 'chat/0'?"),
    ],
    "moved to no GPU": [
        ('t.kvtest.json:15:55: KVD008 error: cases.4.steps.0.set.instances.chat/0.gpu: "cuda:1" is not a GPU of these '
         'facts', 'the GPUs listed: "cuda:0"'),
    ],
    "past the end of time": [
        ("t.kvtest.json:17:48: KVD008 error: cases.5.steps.1.advance: the facts it makes are invalid: now: must be a "
         "finite number, not Infinity",
         "now: The time of the facts, in seconds (any epoch; rules' grace and cooldown count from it)."),
    ],
    "a newer state": [  # as explain --state and the controller say of a state file
        ("t.kvtest.json:18:74: KVD006 error: cases.6.state.schema: state schema 2 is not supported: this kvpolicy "
         "reads schema 1", "a newer kvpolicy wrote it? use that one, or write schema 1 (kvpolicy schema state)"),
    ],
    "facts as state": [
        ("t.kvtest.json:19:64: KVD006 error: cases.7.state: this is facts, not a rule state",
         "expected a rule state (kvpolicy schema state), as the controller's state.json holds"),
    ],
    "no facts file": [
        ("t.kvtest.json:20:38: KVD008 error: cases.8.facts: cannot read 'gone.facts.json': No such file or directory",
         "a case's facts path is relative to the test file's folder"),
    ],
    "removed earlier": [
        ("t.kvtest.json:21:123: KVD008 error: cases.9.steps.1.set.instances.batch/0: no instance 'batch/0' in the "
         "facts: step 1 removed it", "a step's `remove` takes the instance out of the facts for every later step"),
        ("t.kvtest.json:21:167: KVD008 error: cases.9.steps.1.set.remove.0: no instance 'batch/0' in the facts: "
         "step 1 removed it", "a step's `remove` takes the instance out of the facts for every later step"),
    ],
    "bad inline facts": [  # as a facts file's problems: this case fails, the others run
        ("t.kvtest.json:22:80: KVD008 error: cases.10.facts.gpus.0.capacity: 'eighty' is not a size: write a number "
         "and a unit, e.g. 80 GiB", "capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's "
                                    "capacity)."),
        ("t.kvtest.json:22:92: KVD010 error: cases.10.facts.instancs: unknown field 'instancs'",
         "did you mean 'instances'?"),
    ],
}


def kvpolicy_test(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpolicy.cli", "test", "t.kvtest.json", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kvtest")
    (path / "p.kvp").write_text(POLICY)
    (path / "p.facts.json").write_text(FACTS)
    (path / "t.kvtest.json").write_text(TESTS)
    return path


def test_the_places_are_the_values_written() -> None:
    """Each place above is where the test file has what the message is about (the places are checked, not copied)."""
    lines = TESTS.split("\n")
    starts = [lines[int(line) - 1][int(col) - 1:] for line, col in
              (first.split(":")[1:3] for found in PROBLEMS.values() for first, _ in found)]
    assert [start[:14] for start in starts] == ['"holding_snce"', '"soon"}}}}},', '"chat/1": {"id', '"gpu-x": {"oth',
                                                '"chat/9"]}}]},', '"cuda:1"}}}}]}', '1.7e308}]},',
                                                '2}},', '{"schema": 1, ', '"gone.facts.js', '"batch/0": {"i',
                                                '"batch/0"]}}]}', '"eighty"}], "i', '"instancs": []']


def test_text_places_each_problem_under_its_case_with_its_hint(folder: Path) -> None:
    done = kvpolicy_test(folder)
    assert done.returncode == 1 and done.stderr == ""
    expected = ["PASS  t.kvtest.json :: passes"]
    for case, found in PROBLEMS.items():
        expected.append(f"FAIL  t.kvtest.json :: {case}")
        for first, hint in found:
            expected += [f"      cannot run: {first}", f"        hint: {hint}"]
    expected.append("1 passed, 10 failed, 0 file error(s) in 1 file(s)")
    assert done.stdout.split("\n")[:-1] == expected
    (shown,) = re.findall(r"```\n(FAIL  t\.kvtest\.json .*?)\n```", (Path(__file__).parents[2] / "docs" / "policy-tests.md").read_text(),
                          flags=re.S)
    assert shown in done.stdout, "docs/policy-tests.md shows this output"


def test_json_carries_each_problem_in_its_case_s_result(folder: Path) -> None:
    done = kvpolicy_test(folder, "--format", "json")
    assert done.returncode == 1 and done.stderr == ""
    report = json.loads(done.stdout)
    assert report["summary"] == {"files": 1, "cases": 11, "passed": 1, "failed": 10}
    assert (report["errors"], report["diagnostics"], report["more"]) == ([], [], 0), "no problem of the file as a whole"
    passed, *failed = report["results"]
    assert (passed["passed"], passed["failures"], passed["diagnostics"]) == (True, [], [])
    assert {r["case"]: [(f"{d['file']}:{d['line']}:{d['col']}: {d['code']} error: {d['message']}", d["hint"])
                        for d in r["diagnostics"]] for r in failed} == PROBLEMS
    assert {r["case"]: r["failures"] for r in failed} == {
        case: [f"cannot run: {first}" for first, _ in found] for case, found in PROBLEMS.items()}
    assert {d["name"] for r in failed for d in r["diagnostics"]} == {"unknown-key", "wrong-type", "value-not-allowed",
                                                                          "wrong-document"}
    assert all(r["more"] == 0 and not r["passed"] for r in failed)


def test_a_case_s_problems_past_ten_are_counted(tmp_path: Path) -> None:
    (tmp_path / "p.kvp").write_text(POLICY)
    (tmp_path / "p.facts.json").write_text(FACTS)
    memory = ", ".join(f'"x{n}": 1' for n in range(12))
    (tmp_path / "t.kvtest.json").write_text('{"schema": 1, "policy": "p.kvp", "cases": [{"name": "c", "facts": '
                                            '"p.facts.json",\n "state": {"rules": {"r": {"i": {' + memory + "}}}}}]}")
    (result,) = json.loads(kvpolicy_test(tmp_path, "--format", "json").stdout)["results"]
    assert (len(result["diagnostics"]), result["more"]) == (10, 2)
    assert [d["col"] for d in result["diagnostics"]][:2] == [34, 43]
    assert result["failures"][-1] == "cannot run: t.kvtest.json: and 2 more problems"
