"""What ``explain`` and ``diff`` evaluate a policy against: facts from a file (facts JSON or a
``kvpolicy status --format json`` document), the sample facts beside the policy, or the
live ledger (``--live``: the facts ``kvpolicy status`` shows, and the rules' memory the
controller keeps beside the ledger); and the rules' state (``--state``).

Each reader prints its own error and raises ``InputFailed`` with the exit code: 1 for
input that is invalid (a document's problems as diagnostics with their codes,
``kvpolicy.document_codes``, reported for ``--format json``'s error document too), 2 for a
file that is missing or cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from kvpolicy.commands.common import UsageError, check_readable
from kvpolicy.commands.json_failure import Problems, refuse_document, report
from kvpolicy.evaluate.decision import State
from kvpolicy.facts import Facts
from kvpolicy.paths import path_kind, reason
from kvpolicy.policy.model import Policy

class InputFailed(Exception):
    """An input could not be used; the message was printed, ``code`` is the exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Inputs:
    facts: Facts
    state: State | None
    source: str
    """Where the facts came from, as the output names it."""


def add_facts_options(parser: argparse.ArgumentParser, default: str) -> None:
    """``--facts FILE`` or ``--live`` (with ``--ledger-dir``, ``--group``), and ``--state FILE``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--facts", metavar="FILE",
                        help=f"facts JSON, or a 'kvpolicy status --format json' document (default: {default})")
    source.add_argument("--live", action="store_true",
                        help="the facts in the ledger now, as 'kvpolicy status' shows them, and the controller's "
                             "rule state")
    parser.add_argument("--ledger-dir", metavar="DIR",
                        help="with --live: the ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="with --live: the ledger's group, if shared")
    parser.add_argument("--state", metavar="FILE",
                        help="evaluator state JSON from an earlier evaluation (with --live: instead of the controller's)")


def load(command: str, path: Path) -> Policy:
    """The policy at ``path``, or its errors printed (exit 1; 2 if it cannot be read)."""
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.lint.load import load_policy

    try:
        check_readable(command, path)
    except UsageError as exc:
        _fail(command, str(exc), 2)
    try:
        return load_policy(path)
    except OSError as exc:
        _fail(command, f"{path}: cannot read it: {reason(exc)}", 2)
    except PolicyError as exc:
        for d in exc.errors:
            print(d.render(), file=sys.stderr)
        report(exc.errors)
        raise InputFailed(1) from None


def inputs(command: str, args: argparse.Namespace, beside: Path) -> Inputs:
    """The facts and state ``args`` ask for; without ``--facts`` or ``--live``, the sample facts
    beside the policy ``beside``."""
    if not args.live and (args.ledger_dir or args.group):
        _fail(command, "--ledger-dir and --group say where the live facts are: give them with --live", 2)
    if args.live:
        facts, state, source = _live(command, args)
    else:
        facts, source = _facts_file(command, args, beside)
        state = None
    if args.state:
        state = _state_file(command, Path(args.state))
    return Inputs(facts, state, source)


def _facts_file(command: str, args: argparse.Namespace, beside: Path) -> tuple[Facts, str]:
    from kvpolicy.facts_io import FactsError, FactsUnreadable, read_facts, sample_facts_path

    path = Path(args.facts) if args.facts else sample_facts_path(beside)
    if not args.facts and _kind(path) != "file":
        _fail(command, f"no --facts or --live given and no sample facts at {path}", 2)
    try:
        return read_facts(path), str(path)
    except FactsUnreadable as exc:
        _fail(command, str(exc), 2)
    except FactsError as exc:
        _refuse(command, exc)


def _live(command: str, args: argparse.Namespace) -> tuple[Facts, State | None, str]:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.rulestate import RuleStateInvalid, read_rule_state

    try:
        ledger = LedgerDir(args.ledger_dir, group=args.group)
        if not ledger.path.is_dir():
            _fail(command, f"no ledger at {ledger.path}", 1)
        with ledger:
            facts, notes = ledger.read().facts()
            state = read_rule_state(ledger.path)
    except RuleStateInvalid as exc:
        _refuse(command, exc)
    except (LedgerError, OSError) as exc:
        _fail(command, str(exc), 1)
    for note in notes:
        print(f"kvpolicy {command}: note: {note}", file=sys.stderr)
    return facts, state, f"ledger {ledger.path} (live)"


def _state_file(command: str, path: Path) -> State:
    from kvpolicy.json_text import STATE, DocumentInvalid, load_document, read_document_text

    try:
        return load_document(State, read_document_text(path), path, kind=STATE)
    except OSError as exc:
        _fail(command, f"{path}: cannot read it: {reason(exc)}", 2)
    except DocumentInvalid as exc:
        _refuse(command, exc)


def _refuse(command: str, problems: Problems) -> NoReturn:
    """An input with problems: its diagnostics printed (and reported for the error document), exit 1."""
    refuse_document(problems, command)
    raise InputFailed(1)


def _fail(command: str, message: str, code: int) -> NoReturn:
    print(f"kvpolicy {command}: {message}", file=sys.stderr)
    raise InputFailed(code)


def _kind(path: Path) -> str:
    """``path_kind``, with what cannot be looked at counted as missing (the caller says what it looked for)."""
    try:
        return path_kind(path)
    except OSError:
        return "missing"
