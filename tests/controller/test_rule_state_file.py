"""``state.json``, the rules' memory beside the ledger: written crash-safely with the ledger's
modes, and read only when it can be trusted (as ``status.json``)."""

from __future__ import annotations

import os
import stat

import pytest

from kvpolicy.evaluate.decision import RuleMemory, State
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.rulestate import STATE_FILE, read_rule_state, write_rule_state
from tests.support.waiting import wait_for

STATE = State(rules={"idle-reclaim": {"batch/0": RuleMemory(holding_since=10.0, shrink_to=1 << 30, acting_since=40.0)}})


def test_round_trip_private_and_no_temporary_left(tmp_path):
    assert read_rule_state(tmp_path) is None
    path = write_rule_state(tmp_path, STATE)
    assert path == tmp_path / STATE_FILE and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_rule_state(tmp_path) == STATE
    write_rule_state(tmp_path, State())
    assert read_rule_state(tmp_path) == State()
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.chmod(0o644), "open to every user"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/hostname")), "is a symlink"),
    (lambda p: p.write_text('{"schema": 1, "rules": {"r": {"i/0": {"shrink_to": "lots"}}}}'), r"state\.json:1:52: invalid rule state file \(schema 1\): rules\.r\.i/0\.shrink_to: must be a whole number, not \"lots\""),
    (lambda p: p.write_bytes(b"\xff\xfe"), "not UTF-8"),
])
def test_a_state_file_that_cannot_be_trusted_is_refused(tmp_path, damage, message):
    path = write_rule_state(tmp_path, STATE)
    damage(path)
    with pytest.raises(LedgerError, match=message):
        read_rule_state(tmp_path)


def test_the_controller_starts_fresh_on_a_damaged_state_file(site, caplog):
    (site.ledger_dir).mkdir(mode=0o700)
    (site.ledger_dir / STATE_FILE).write_text("{not json")
    os.chmod(site.ledger_dir / STATE_FILE, 0o600)
    with caplog.at_level("WARNING", logger="kvpolicy.controller"):
        controller = site.controller()
        assert wait_for(lambda: controller.decision is not None, 120.0)  # it runs, with no rule memory
    assert controller.state == State()  # the site's policy has no rules: nothing remembered
    assert wait_for(lambda: read_rule_state(site.ledger_dir) == State(), 120.0)  # and the damaged file is replaced
    assert any("state.json:1:2: not valid JSON: Expecting property name" in r.getMessage() and "grace periods start again" in r.getMessage()
               for r in caplog.records)
