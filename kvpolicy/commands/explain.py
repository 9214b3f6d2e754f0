"""``kvpolicy explain POLICY [--facts FILE]``: the decision, and why each number is what it is.

Without ``--facts`` it reads the sample facts shipped beside the policy
(``NAME.facts.json`` next to ``NAME.kvp``). Exit 0 on any valid policy and facts:
violations and shortfalls are part of the decision, not errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpolicy.commands import Subcommands, add_format_option

FACTS_SUFFIX = ".facts.json"


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("explain", help="show the decision for a policy and facts", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", metavar="POLICY", help="the policy file")
    parser.add_argument("--facts", metavar="FILE", help="facts JSON (default: POLICY's sample facts)")
    parser.add_argument("--state", metavar="FILE", help="evaluator state JSON from an earlier evaluation")
    add_format_option(parser)
    parser.set_defaults(run=run)


def sample_facts_path(policy: Path) -> Path:
    return policy.with_name(policy.name.removesuffix(".kvp") + FACTS_SUFFIX)


def run(args: argparse.Namespace) -> int:
    """Exit 0 with the decision; 1 when the policy, facts or state are invalid; 2 when a file
    is missing or cannot be read."""
    from pydantic import ValidationError

    from kvpolicy.commands import style_for
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.evaluate.decide import evaluate, prepare
    from kvpolicy.evaluate.decision import State
    from kvpolicy.evaluate.explain import render_explain
    from kvpolicy.facts_io import FactsError, FactsUnreadable, read_facts
    from kvpolicy.lint.load import load_policy
    from kvpolicy.validation import describe

    policy_path = Path(args.policy)
    if not policy_path.is_file():
        print(f"kvpolicy explain: {policy_path}: no such file", file=sys.stderr)
        return 2
    facts_path = Path(args.facts) if args.facts else sample_facts_path(policy_path)
    if not args.facts and not facts_path.is_file():
        print(f"kvpolicy explain: no --facts given and no sample facts at {facts_path}", file=sys.stderr)
        return 2
    try:
        policy = load_policy(policy_path)
    except OSError as exc:
        print(f"kvpolicy explain: {policy_path}: cannot read it: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        for d in exc.errors:
            print(d.render(), file=sys.stderr)
        return 1
    try:
        facts = read_facts(facts_path)
        state_text = Path(args.state).read_bytes() if args.state else None
    except (FactsUnreadable, OSError) as exc:
        reason = str(exc) if isinstance(exc, FactsError) else f"{args.state}: cannot read it: {exc.strerror or exc}"
        print(f"kvpolicy explain: {reason}", file=sys.stderr)
        return 2
    except FactsError as exc:
        print(f"kvpolicy explain: {exc}", file=sys.stderr)
        return 1
    try:
        state = State.model_validate_json(state_text) if state_text is not None else None
    except ValidationError as exc:
        print(f"kvpolicy explain: {args.state}: invalid state: {describe(exc, State)}", file=sys.stderr)
        return 1
    decision, _ = evaluate(prepare(policy), facts, state)
    if args.format == "json":
        sys.stdout.write(decision.to_json() + "\n")
    else:
        sys.stdout.write(render_explain(policy, decision, str(facts_path), style_for(args, sys.stdout)))
    return 0
