"""``kvpolicy diff OLD NEW [--facts FILE | --live]``: what a policy change would do, before it is saved.

Both policies are decided on the same facts and rule state: the sample facts beside NEW
(``NAME.facts.json``), a facts file (or a ``kvpolicy status --format json`` document)
with ``--facts``, or the live ledger with ``--live`` (the facts ``kvpolicy status``
shows and the rules' memory the controller keeps). For each instance it shows the
guarantee, limit and target, ``old -> new`` where they move, and the rules acting on
it; for each GPU its elastic budget. ``*`` marks what changes.

Exit 0 when the new policy decides the same as the old, 1 when a figure differs (as
``fmt --diff`` does) or an input is invalid, 2 when a file is missing or cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.inputs import add_facts_options


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("diff", help="preview a policy change: old and new limits on the same facts",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", metavar="OLD", help="the policy in force (or any baseline)")
    parser.add_argument("new", metavar="NEW", help="the changed policy")
    add_facts_options(parser, "NEW's sample facts")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.commands.inputs import InputFailed, inputs, load
    from kvpolicy.evaluate.decide import evaluate, prepare
    from kvpolicy.evaluate.diff import diff_decisions, render_diff

    new_path = Path(args.new)
    try:
        old = load("diff", Path(args.old))
        new = load("diff", new_path)
        given = inputs("diff", args, new_path)
    except InputFailed as failed:
        return failed.code
    old_decision, _ = evaluate(prepare(old), given.facts, given.state)
    new_decision, _ = evaluate(prepare(new), given.facts, given.state)
    diff = diff_decisions(old_decision, new_decision, given.source)
    sys.stdout.write(diff.to_json() + "\n" if args.format == "json" else render_diff(diff))
    return 1 if diff.changed else 0
