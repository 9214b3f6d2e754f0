"""``state.json``, the rules' memory beside the ledger: written crash-safely with the ledger's
modes, and read only when it can be trusted (as ``status.json``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.evaluate.decision import RuleMemory, State
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.rulestate import STATE_FILE, RuleStateInvalid, read_rule_state, write_rule_state
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
    (lambda p: p.write_text('{"schema": 1, "rules": {"r": {"i/0": {"shrink_to": "lots"}}}}'),
     r"kvpolicy ledger: \S+/state\.json:1:52: KVD007 error: rules\.r\.i/0\.shrink_to: must be a whole number, not \"lots\"$"),
    (lambda p: p.write_bytes(b'{"schema": 1,\n "rules": {"\xff": {}}}'), r"state\.json:2:13: KVD001 error: not UTF-8 \(byte 0xff\)$"),
    (lambda p: p.write_text('{"schema": 2, "rules": {}}'),
     r"state\.json:1:12: KVD006 error: state schema 2 is not supported: this kvpolicy reads schema 1$"),
    (lambda p: p.write_text('{"schema": 1, "gpus": [], "instances": []}'),
     r"state\.json:1:1: KVD006 error: this is facts, not a rule state$"),
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
    assert any("state.json:1:2: KVD002 error: not valid JSON: Expecting property name enclosed in double quotes; "
               "starting with no rule memory (grace periods start again)" in r.getMessage() for r in caplog.records)


def test_a_state_file_with_problems_has_each_with_its_code_and_place(tmp_path):
    """Every problem of the file, at the text it is about, with a hint; the message names them one a line."""
    text = '{"schema": 1,\n "rules": {"r": {"i/0": {"shrink_to": "lots",\n                        "holding_sinse": 5}}}}\n'
    (tmp_path / STATE_FILE).write_text(text)
    (tmp_path / STATE_FILE).chmod(0o600)
    with pytest.raises(RuleStateInvalid) as caught:
        read_rule_state(tmp_path)
    found = [(d.line, d.col, d.code, d.message, d.hint) for d in caught.value.diagnostics]
    assert found == [
        (2, 39, "KVD007", 'rules.r.i/0.shrink_to: must be a whole number, not "lots"',
         "shrink_to: The shrink in force, in bytes (null: none)."),
        (3, 25, "KVD010", "rules.r.i/0.holding_sinse: unknown field 'holding_sinse'", "did you mean 'holding_since'?"),
    ]
    rows = text.split("\n")
    assert rows[1][38:].startswith('"lots"') and rows[2][24:].startswith('"holding_sinse"')
    assert str(caught.value) == (f"kvpolicy ledger: {tmp_path / STATE_FILE}:2:39: KVD007 error: {found[0][3]}\n"
                                 f"{tmp_path / STATE_FILE}:3:25: KVD010 error: {found[1][3]}")
    assert isinstance(caught.value, LedgerError) and caught.value.more == 0


def test_explain_live_shows_a_damaged_state_file_s_problems_with_their_hints(tmp_path, capsys):
    """explain --live reads state.json as the controller does, and says its problems as diagnostics (exit 1)."""
    ledger = tmp_path / "ledger"
    ledger.mkdir(mode=0o700)
    (ledger / STATE_FILE).write_text('{"schema": 1, "rules": {"r": {"i/0": {"shrink_to": "lots"}}}}')
    (ledger / STATE_FILE).chmod(0o600)
    (tmp_path / "p.kvp").write_text("version 1\n")
    assert main(["explain", str(tmp_path / "p.kvp"), "--live", "--ledger-dir", str(ledger)]) == 1
    assert capsys.readouterr().err == (f"{ledger / STATE_FILE}:1:52: KVD007 error: rules.r.i/0.shrink_to: must be a "
                                       'whole number, not "lots"\n  hint: shrink_to: The shrink in force, in bytes '
                                       "(null: none).\n")


def test_the_controller_and_explain_take_state_files_of_the_same_sizes(tmp_path, capsys):
    """A rule state file is read to the one cap of every document (64 MiB), by the controller when it starts and
    by ``explain --state`` alike: one padded past the controller's old 16 MiB cap is read by both, one a byte over
    the cap is refused by both."""
    from kvpolicy.paths import MAX_INPUT_BYTES

    policy = Path(__file__).parents[2] / "policies" / "two-models.kvp"
    path = tmp_path / STATE_FILE
    text = STATE.to_json()
    for size, readable in ((20 << 20, True), (MAX_INPUT_BYTES + 1, False)):
        path.write_text(text + " " * (size - len(text)))  # trailing whitespace: still the same document
        path.chmod(0o600)
        assert path.stat().st_size == size
        if readable:
            assert read_rule_state(tmp_path) == STATE
        else:
            with pytest.raises(LedgerError, match="refusing to read it"):
                read_rule_state(tmp_path)
        assert main(["explain", str(policy), "--state", str(path)]) == (0 if readable else 1)
        err = capsys.readouterr().err
        assert ("KVD003" in err) != readable, err


def test_a_document_no_reader_would_take_is_not_written_and_the_last_one_stays(tmp_path):
    """The controller never replaces a readable state file by one over the read cap (a restart would refuse it and
    start without the rules' memory): the write is refused, and the file and directory are as they were."""
    from kvpolicy.runtime.stores import MAX_DOCUMENT_BYTES, write_document

    path = write_rule_state(tmp_path, STATE)
    with pytest.raises(LedgerError, match=f"is over the {MAX_DOCUMENT_BYTES} B a reader takes; the last one written"):
        write_document(path, " " * (MAX_DOCUMENT_BYTES + 1))
    assert read_rule_state(tmp_path) == STATE
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]
    write_document(path, STATE.to_json() + " " * (MAX_DOCUMENT_BYTES - len(STATE.to_json())))  # at the cap: written
    assert read_rule_state(tmp_path) == STATE and path.stat().st_size == MAX_DOCUMENT_BYTES
