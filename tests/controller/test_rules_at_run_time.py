"""Rules seen at run time, and kept across restarts: ``kvpolicy run`` as a real process with
real engine processes, the rule state file beside the ledger, ``status``, ``top`` (through a
terminal), ``explain --live``, the metrics and the decision log."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import urllib.request

from kvpolicy.cli import main
from kvpolicy.terminal import strip_styles
from kvpolicy.runtime.rulestate import STATE_FILE, read_rule_state
from kvpolicy.runtime.status import read_status
from tests.controller.site import POLICY, GiB
from tests.support.terminal import in_a_terminal
from tests.support.waiting import wait_for

HANG = 120.0
"""Only a hang waits this long."""

RULE = """
rule "squeeze-batch" {
  when model.name == "batch"
  shrink to min
  grace 1s
}
"""
SQUEEZED = 4 * GiB
"""batch's min: what the rule holds it to."""
FREE = 68 * GiB
"""batch's limit with no rule acting: 80 - 2 headroom - chat's 10 GiB guarantee."""


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=HANG)


def published_after(site, revision: int):
    """batch's slot once a controller has published a revision above ``revision``."""
    return wait_for(lambda: (s := site.slot("batch/0")) is not None and s.revision > revision and s, HANG)


def test_a_restart_keeps_the_rule_s_shrink_and_a_renamed_rule_starts_again(site):
    site.policy.write_text(POLICY + RULE)
    first, log = site.run_process("--log-format", "json")
    assert wait_for(lambda: read_status(site.ledger_dir) is not None, HANG), log.read_text()
    site.engine("chat"), site.engine("batch")
    assert wait_for(lambda: (s := site.slot("batch/0")) is not None and s.limit == SQUEEZED, HANG), log.read_text()

    # The rule's memory beside the ledger: the evaluator's State document, as private as status.json.
    path = site.ledger_dir / STATE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    memory = read_rule_state(site.ledger_dir).rules["squeeze-batch"]["batch/0"]
    assert memory.shrink_to == SQUEEZED and memory.acting_since is not None

    assert stop(first) == 0
    # A clean stop is recorded: status says stopped, needs attention, and is not "heartbeat ok".
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "status", "--ledger-dir", str(site.ledger_dir)],
                          capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "stopped" in done.stdout and "(a clean stop)" in done.stdout and "heartbeat" not in done.stdout
    assert "ATTENTION: controller pid" in done.stdout and "nothing enforces the policy" in done.stdout
    assert read_status(site.ledger_dir).controller.stopped_at is not None

    # --log-format json: every line one object; the decisions carry their fields, naming the rule.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    squeezes = [line for line in lines if line["logger"] == "kvpolicy.decisions"
                and line["changes"].get("batch/0", {}).get("limit", [None, None])[1] == SQUEEZED]
    assert squeezes and squeezes[0]["changes"]["batch/0"]["rules"] == ["squeeze-batch"]

    # A new controller (a rollout) keeps the shrink from its first publish on: no un-squeeze.
    revision = site.slot("batch/0").revision
    second, log = site.run_process()
    slot = published_after(site, revision)
    assert slot, log.read_text()
    assert slot.limit == SQUEEZED
    rules = wait_for(lambda: (s := read_status(site.ledger_dir)) and s.controller.stopped_at is None and s.rules, HANG)
    (on,) = rules[0].instances
    assert (on.state, on.since) == ("acting", memory.acting_since)  # since when: the first controller's start of it
    assert stop(second) == 0

    # The rule renamed (and given a long grace): its old memory is dropped, the shrink ends.
    site.policy.write_text(POLICY + RULE.replace('"squeeze-batch"', '"squeeze-batch-2"').replace("grace 1s", "grace 1h"))
    revision = site.slot("batch/0").revision
    third, log = site.run_process()
    slot = published_after(site, revision)
    assert slot and slot.limit == FREE, log.read_text()
    state = wait_for(lambda: (s := read_rule_state(site.ledger_dir)) and "squeeze-batch" not in s.rules and s, HANG)
    assert set(state.rules) == {"squeeze-batch-2"}
    assert state.rules["squeeze-batch-2"]["batch/0"].shrink_to is None
    assert stop(third) == 0


def test_status_top_explain_and_metrics_name_the_rule_acting(site, capsys, caplog):
    site.policy.write_text(POLICY + RULE)
    with caplog.at_level("INFO", logger="kvpolicy.decisions"):  # before the controller's first decision
        controller = site.controller()
        base = site.serve(controller)
        site.engine("chat"), site.engine("batch")
        assert wait_for(lambda: (s := site.slot("batch/0")) is not None and s.limit == SQUEEZED, HANG)
        assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.rules and s.rules[0].instances
                        and s.rules[0].instances[0].state == "acting", HANG)
    # The decision log names the rule that moved the limit.
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kvpolicy.decisions"]
    assert any(d["changes"].get("batch/0", {}).get("rules") == ["squeeze-batch"] for d in logged)

    assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("squeeze-batch")]
    assert line.split()[:4] == ["squeeze-batch", "batch/0", "acting", "for"] and line.endswith("shrink to 4 GiB")
    assert main(["status", "--ledger-dir", str(site.ledger_dir), "--format", "json"]) == 0
    (rule,) = json.loads(capsys.readouterr().out)["rules"]
    assert rule["rule"] == "squeeze-batch" and rule["instances"][0]["shrink_to"] == SQUEEZED

    # top, on an 80-column terminal: the rule's line is there, and it fits.
    shown = in_a_terminal("top", "--ledger-dir", str(site.ledger_dir), "--iterations", "1", columns=80, timeout=HANG)
    assert shown.returncode == 0
    screen = shown.text
    rows = [row for row in strip_styles(screen.replace("\x1b[H\x1b[2J", "")).splitlines()
            if not row.startswith("policy ")]  # it names a temporary path
    assert any(row.startswith("squeeze-batch       batch/0             acting for") for row in rows), screen
    assert max(len(row) for row in rows) <= 80, screen

    # explain --live: this node's facts and the controller's rule memory.
    assert main(["explain", str(site.policy), "--live", "--ledger-dir", str(site.ledger_dir), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert f"facts ledger {site.ledger_dir} (live)" in out
    assert f'rule "squeeze-batch" ({site.policy}:' in out and "    batch/0" in out and "acting for" in out
    assert any(x.split()[:3] == ["limit", "4", "GiB"] and "lowered by a rule" in x for x in out.splitlines()), out

    # Metrics: the rule's state and its shrink, with a rule label.
    text = urllib.request.urlopen(f"{base}/metrics", timeout=HANG).read().decode()
    labels = 'engine="any",gpu="cuda:0",instance="batch/0",model="batch",rule="squeeze-batch"'
    assert f'kvpolicy_rule_state{{{labels},state="acting"}} 1.0' in text
    assert f'kvpolicy_rule_state{{{labels},state="waiting"}} 0.0' in text
    assert f"kvpolicy_rule_shrink_to_bytes{{{labels}}} 4.294967296e+09" in text


def test_an_invalid_or_missing_policy_at_start_exits_1_with_the_diagnostic(site):
    site.policy.write_text(POLICY.replace("max 60%", "max 60 GiBB"))
    proc, log = site.run_process()
    assert proc.wait(timeout=HANG) == 1
    err = log.read_text()
    assert "Traceback" not in err
    assert f"{site.policy}:3:49: KV001" in err and "no valid policy at start, so not starting" in err
    site.policy.unlink()
    proc, log = site.run_process()
    assert proc.wait(timeout=HANG) == 1
    err = log.read_text()
    assert "Traceback" not in err and "the policy file does not exist" in err
    status = read_status(site.ledger_dir)  # the refused start, as it was: stopped, its reload failed
    assert status.controller.pid == proc.pid and status.controller.stopped_at is not None
    assert not status.last_reload.ok and "does not exist" in status.last_reload.error.message
    assert status.policy is None and status.instances == []
