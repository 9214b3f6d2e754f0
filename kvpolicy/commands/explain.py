"""``kvpolicy explain POLICY [--facts FILE | --live]``: the decision, and why each number is what it is.

Without ``--facts`` it reads the sample facts shipped beside the policy
(``NAME.facts.json`` next to ``NAME.kvp``). ``--facts`` also takes the document
``kvpolicy status --format json`` prints. ``--live`` reads the facts from the ledger, as
``kvpolicy status`` does, and the rules' memory the controller keeps beside it: what
this policy would decide on this node now. Every rule is listed with where it stands on each
instance (waiting out grace, acting, cooling down). Exit 0 on any valid policy and
facts: violations and shortfalls are part of the decision, not errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.inputs import add_facts_options


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("explain", help="show the decision for a policy and facts", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", metavar="POLICY", help="the policy file")
    add_facts_options(parser, "POLICY's sample facts")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 with the decision; 1 when the policy, facts, state or ledger are invalid; 2 when a
    file is missing or cannot be read."""
    from kvpolicy.commands import style_for
    from kvpolicy.commands.inputs import InputFailed, inputs, load
    from kvpolicy.evaluate.decide import evaluate, prepare
    from kvpolicy.evaluate.explain import render_explain

    policy_path = Path(args.policy)
    try:
        policy = load("explain", policy_path)
        given = inputs("explain", args, policy_path)
    except InputFailed as failed:
        return failed.code
    decision, _ = evaluate(prepare(policy), given.facts, given.state)
    if args.format == "json":
        sys.stdout.write(decision.to_json() + "\n")
    else:
        sys.stdout.write(render_explain(policy, decision, given.source, style_for(args, sys.stdout)))
    return 0
