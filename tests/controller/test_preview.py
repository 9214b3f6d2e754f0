"""Previewing a change against a live node: ``explain --live``, ``diff --live``, and a
``kvpolicy status --format json`` document fed back as facts, on a real controller's ledger
with real engine processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpolicy.cli import main
from kvpolicy.facts_io import FactsError, parse_facts
from tests.controller.site import POLICY, GiB
from tests.support.waiting import wait_for

HANG = 120.0


def kvpolicy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpolicy.cli", *args], capture_output=True, text=True, timeout=HANG)


def figures(decision: dict) -> dict:
    return {i["id"]: (i["guarantee"], i["limit"], i["target"]) for i in decision["instances"]}


def test_a_change_previewed_live_and_from_a_saved_status(site, tmp_path):
    site.controller()
    site.engine("chat"), site.engine("batch")
    assert wait_for(lambda: (s := site.slot("batch/0")) is not None and s.limit == 68 * GiB, HANG)
    ledger = str(site.ledger_dir)

    # The policy in force, explained on the live facts: the limits the controller published.
    live = kvpolicy("explain", str(site.policy), "--live", "--ledger-dir", ledger, "--format", "json")
    assert live.returncode == 0, live.stderr
    assert figures(json.loads(live.stdout))["batch/0"][1] == 68 * GiB

    # A status document saved now, fed back as facts, decides the same.
    saved = kvpolicy("status", "--ledger-dir", ledger, "--format", "json")
    assert saved.returncode == 0, saved.stderr
    (tmp_path / "status.json").write_text(saved.stdout)
    again = kvpolicy("explain", str(site.policy), "--facts", str(tmp_path / "status.json"), "--format", "json")
    assert again.returncode == 0, again.stderr
    assert figures(json.loads(again.stdout)) == figures(json.loads(live.stdout))

    # The change, previewed both ways before it is saved: chat's min 10 -> 20 GiB lowers batch's limit.
    changed = tmp_path / "changed.kvp"
    changed.write_text(POLICY.replace("min 10 GiB", "min 20 GiB"))
    for source in (["--live", "--ledger-dir", ledger], ["--facts", str(tmp_path / "status.json")]):
        diff = kvpolicy("diff", str(site.policy), str(changed), *source)
        assert diff.returncode == 1, diff.stderr
        (batch,) = [line for line in diff.stdout.splitlines() if "batch/0" in line]
        assert batch.startswith("* batch/0") and "68 GiB -> 58 GiB" in batch
    assert "(live)" in kvpolicy("diff", str(site.policy), str(changed), "--live", "--ledger-dir", ledger).stdout
    # Nothing was published by the preview.
    assert site.slot("batch/0").limit == 68 * GiB


def test_a_status_without_published_figures_is_refused_as_facts(capsys, tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir(mode=0o700)
    main(["status", "--ledger-dir", str(ledger), "--format", "json"])
    document = json.loads(capsys.readouterr().out)
    assert parse_facts(json.dumps(document)).gpus == ()  # no controller, no GPU: empty facts
    document["gpus"] = [{"id": "cuda:0", "elastic_budget": 0, "free": 0, "reserved": {"total": 0}, "capacity": None}]
    with pytest.raises(FactsError, match="GPU 'cuda:0' has no capacity in this status"):
        parse_facts(json.dumps(document), "status.json")
