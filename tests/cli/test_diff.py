"""``kvpolicy diff OLD NEW``: both policies on the same facts, what moves marked, exit 1 when
something does (as ``fmt --diff``); and ``explain`` listing every rule with its state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvpolicy.cli import main
from kvpolicy.evaluate.diff import PolicyDiff

GiB = 1 << 30
OLD = """version 1
defaults { headroom 2 GiB }
model "chat" { priority 100; min 10 GiB; max 60%; weight 300 }
model "batch" { priority 10; min 4 GiB; weight 100 }
"""
FACTS = {
    "schema": 1, "now": 1000.0,
    "gpus": [{"id": "cuda:0", "capacity": "80 GiB", "other_used": 0}],
    "instances": [
        {"id": "chat/0", "model": "chat", "gpu": "cuda:0", "elastic": {"used": GiB, "mapped": GiB}},
        {"id": "batch/0", "model": "batch", "gpu": "cuda:0", "elastic": {"used": GiB, "mapped": GiB}},
    ],
}


def files(tmp_path: Path, new: str) -> tuple[str, str, str]:
    (tmp_path / "old.kvp").write_text(OLD)
    (tmp_path / "new.kvp").write_text(new)
    (tmp_path / "f.json").write_text(json.dumps(FACTS))
    return str(tmp_path / "old.kvp"), str(tmp_path / "new.kvp"), str(tmp_path / "f.json")


def test_a_change_is_marked_old_to_new_and_exits_1(tmp_path, capsys):
    old, new, facts = files(tmp_path, OLD.replace("min 10 GiB", "min 20 GiB"))
    assert main(["diff", old, new, "--facts", facts]) == 1
    out = capsys.readouterr().out.splitlines()
    # A = 78 GiB. batch: limit 78 - 10 = 68 -> 78 - 20 = 58; chat's guarantee 10 -> 20.
    (batch,) = [line for line in out if "batch/0" in line]
    (chat,) = [line for line in out if "chat/0" in line]
    assert batch.startswith("* batch/0") and "68 GiB -> 58 GiB" in batch
    assert chat.startswith("* chat/0") and "10 GiB -> 20 GiB" in chat
    (gpu,) = [line for line in out if "cuda:0" in line]
    assert gpu.startswith("  cuda:0") and "->" not in gpu  # the budget does not move
    assert out[-1] == "2 change(s)"


def test_no_change_exits_0(tmp_path, capsys):
    old, new, facts = files(tmp_path, "# reworded, the same policy\n" + OLD)
    assert main(["diff", old, new, "--facts", facts]) == 0
    out = capsys.readouterr().out
    assert "->" not in out.split("\n", 1)[1] and "no changes" in out and "*" not in out


def test_json_is_the_model_and_names_the_rules(tmp_path, capsys):
    rule = 'rule "squeeze" {\n  when model.name == "batch"\n  shrink to min\n}\n'
    old, new, facts = files(tmp_path, OLD + rule)
    assert main(["diff", old, new, "--facts", facts, "--format", "json"]) == 1
    diff = PolicyDiff.model_validate_json(capsys.readouterr().out)
    assert (diff.schema_, diff.changed, diff.facts) == (1, 1, facts)
    batch = {i.id: i for i in diff.instances}["batch/0"]
    assert (batch.limit.old, batch.limit.new) == (68 * GiB, 4 * GiB) and batch.changed
    assert (batch.rules.old, batch.rules.new) == ((), ("squeeze",))
    assert not {i.id: i for i in diff.instances}["chat/0"].changed


def test_bad_inputs(tmp_path):
    old, new, facts = files(tmp_path, OLD.replace("min 10 GiB", "min 10 GiBB"))
    run = [sys.executable, "-m", "kvpolicy.cli", "diff"]
    done = subprocess.run([*run, old, new, "--facts", facts], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "new.kvp:3:37: KV001" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([*run, old, str(tmp_path / "none.kvp"), "--facts", facts], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "none.kvp: no such file" in done.stderr
    done = subprocess.run([*run, old, old, "--facts", facts, "--live"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    done = subprocess.run([*run, old, old, "--facts", facts, "--ledger-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "give them with --live" in done.stderr


def test_explain_lists_every_rule_with_its_state(tmp_path, capsys):
    rules = "".join(
        f'rule "{name}" {{\n  when model.name == "{model}"\n  shrink to min\n  grace 60s\n  cooldown 30s\n}}\n'
        for name, model in (("acting", "batch"), ("waiting", "batch"), ("cooling", "batch"), ("idle", "nobody"))
    )
    policy = tmp_path / "p.kvp"
    policy.write_text(OLD + rules)
    (tmp_path / "f.json").write_text(json.dumps(FACTS))
    # now 1000: "acting" shrinks since 990; "waiting" holds since 980 (grace to 1040); "cooling" until 1020.
    state = {"schema": 1, "rules": {
        "acting": {"batch/0": {"holding_since": 900.0, "shrink_to": 4 * GiB, "acting_since": 990.0}},
        "waiting": {"batch/0": {"holding_since": 980.0}},
        "cooling": {"batch/0": {"holding_since": 900.0, "cooldown_until": 1020.0}},
    }}
    (tmp_path / "s.json").write_text(json.dumps(state))
    args = ["explain", str(policy), "--facts", str(tmp_path / "f.json"), "--state", str(tmp_path / "s.json")]
    assert main(args) == 0
    out = capsys.readouterr().out
    section = out[out.index("\nrules\n"):].splitlines()[2:]
    assert section == [
        f'  rule "acting" ({policy}:5): grace 60s, cooldown 30s',
        "    batch/0               acting for 10.0s, shrink to 4 GiB",
        f'  rule "waiting" ({policy}:11): grace 60s, cooldown 30s',
        "    batch/0               waiting out grace: acts in 40.0s",
        f'  rule "cooling" ({policy}:17): grace 60s, cooldown 30s',
        "    batch/0               cooling down: may act in 20.0s",
        f'  rule "idle" ({policy}:23): grace 60s, cooldown 30s; idle (its condition holds on no instance)',
    ]
    assert main([*args, "--format", "json"]) == 0
    rules_out = {r["rule"]: r for r in json.loads(capsys.readouterr().out)["rules"]}
    assert list(rules_out) == ["acting", "waiting", "cooling", "idle"]
    assert rules_out["acting"]["instances"] == [
        {"instance": "batch/0", "state": "acting", "since": 990.0, "until": None, "shrink_to": 4 * GiB}]
    assert rules_out["waiting"]["instances"][0]["until"] == 1040.0
    assert rules_out["cooling"]["instances"][0]["state"] == "cooling_down"
    assert rules_out["idle"]["instances"] == []
