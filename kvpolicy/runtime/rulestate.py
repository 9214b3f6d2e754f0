"""The rules' memory beside the ledger (``<ledger-dir>/state.json``): grace timers, shrinks in
force, cooldowns.

The controller writes it whenever the evaluator's ``State`` changes, before it publishes
the limits that state led to, and reads it when it starts, so a restarted controller (a
rollout, a crash) keeps squeezing what the last one squeezed and does not restart grace
periods. The file is the evaluator's State document (``docs/state.schema.json``), so
``kvpolicy explain --state`` reads it too. The memory of a rule the policy no longer has
(renamed or removed) is dropped: by the evaluator at the next step, and on reading.
"""

from __future__ import annotations

from pathlib import Path

from kvpolicy.evaluate.decision import STATE_SCHEMA, State
from kvpolicy.json_text import DocumentInvalid, load_document
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access
from kvpolicy.runtime.stores import read_document, write_document

STATE_FILE = "state.json"


def state_path(ledger_dir: Path | str) -> Path:
    return Path(ledger_dir) / STATE_FILE


def write_rule_state(ledger_dir: Path | str, state: State, access: Access | None = None) -> Path:
    """Replace ``<ledger_dir>/state.json`` atomically and durably."""
    return write_document(state_path(ledger_dir), state.to_json() + "\n", access)


def read_rule_state(ledger_dir: Path | str) -> State | None:
    """The rules' last memory, or None if none was written; LedgerError if the file is not
    to be trusted or not a state document."""
    path = state_path(ledger_dir)
    text = read_document(path, "a rule state file")
    if text is None:
        return None
    try:
        return load_document(State, text, path, expected="a rule state file", what=f"rule state file (schema {STATE_SCHEMA})")
    except DocumentInvalid as exc:
        raise LedgerError(f"kvpolicy ledger: {exc}") from None
