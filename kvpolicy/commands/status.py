"""``kvpolicy status``: the policy in force, the last reload, and per GPU and instance the
facts, limits and acknowledgements — from the controller's status file and the live ledger —
then which rule acts on which instance (or waits out its grace, or cools down) and since
when. Works from any process that can read the ledger. Exit 1 when something needs
attention: no controller, a stopped or stale one, a rejected policy, a stuck deferral, a GPU
whose ledger segment cannot be used.
Its JSON output can be given back as facts (``explain --facts``, ``diff --facts``).
"""

from __future__ import annotations

import argparse
import sys

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import parse_seconds


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("status", help="show the controller's and engines' state", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger-dir", metavar="DIR", help="ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="the ledger's group, if shared")
    parser.add_argument("--stale-after", type=parse_seconds, default=10.0, metavar="SECONDS",
                        help="call the controller stale when its heartbeat is older than this (default 10)")
    parser.add_argument("--stuck-after", type=parse_seconds, default=60.0, metavar="SECONDS",
                        help="report deferrals older than this (default 60)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.view import current_status, problems, render_status

    try:
        ledger = LedgerDir(args.ledger_dir, group=args.group)
        if not ledger.path.is_dir():
            print(f"kvpolicy status: no ledger at {ledger.path}", file=sys.stderr)
            return 1
        status = current_status(ledger, args.stale_after, args.stuck_after)
    except (LedgerError, OSError) as exc:
        print(f"kvpolicy status: {exc}", file=sys.stderr)
        return 1
    attention = problems(status)
    if args.format == "json":  # the same lines as the text output: what needs attention, then the notes
        print(status.model_copy(update={"problems": [*attention, *status.problems]}).to_json())
    else:
        sys.stdout.write(render_status(status))
        for problem in attention:
            print(f"ATTENTION: {problem}")
    return 1 if attention else 0
