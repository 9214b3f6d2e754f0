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

from kvpolicy.evaluate.decision import State
from kvpolicy.json_text import STATE, CarriesProblems, DocumentInvalid, JsonInvalid, decode_json_text, load_document
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access
from kvpolicy.runtime.stores import read_document_bytes, write_document

STATE_FILE = "state.json"


class RuleStateInvalid(CarriesProblems, LedgerError):
    """A rule state file with ``problems`` (with their codes, ``kvpolicy.document_codes``). The message is
    their first lines, after ``kvpolicy ledger:``."""

    def __init__(self, problems: DocumentInvalid) -> None:
        super().__init__(f"kvpolicy ledger: {problems.render(hints=False)}")
        self.problems = problems


def state_path(ledger_dir: Path | str) -> Path:
    return Path(ledger_dir) / STATE_FILE


def write_rule_state(ledger_dir: Path | str, state: State, access: Access | None = None) -> Path:
    """Replace ``<ledger_dir>/state.json`` atomically and durably."""
    return write_document(state_path(ledger_dir), state.to_json() + "\n", access)


def read_rule_state(ledger_dir: Path | str) -> State | None:
    """The rules' last memory, or None if none was written; LedgerError if the file is not to be
    trusted, RuleStateInvalid if it is not a state document."""
    path = state_path(ledger_dir)
    data = read_document_bytes(path, "a rule state file")
    if data is None:
        return None
    try:
        return load_document(State, decode_json_text(data), path, kind=STATE)
    except JsonInvalid as exc:  # not UTF-8
        raise RuleStateInvalid(DocumentInvalid([exc.diagnostic(path)])) from None
    except DocumentInvalid as exc:
        raise RuleStateInvalid(exc) from None
