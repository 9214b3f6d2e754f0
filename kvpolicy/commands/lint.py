"""``kvpolicy lint FILE...``: check policy files; exit 1 on errors (and warnings with --strict).

``-`` lints standard input (an editor's unsaved buffer), named ``--stdin-filename`` in
the diagnostics.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option, style_for
from kvpolicy.commands.common import (
    STDIN_NAME,
    UsageError,
    parse_positive_count,
    parse_size,
    policy_inputs,
    read_policy_input,
)
from kvpolicy.paths import reason

if TYPE_CHECKING:
    from kvpolicy.diagnostics import Diagnostic


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("lint", help="check policy files", description=__doc__)
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy files, directories of .kvp files, or - for stdin")
    parser.add_argument("--stdin-filename", metavar="NAME",
                        help=f"with -: the name diagnostics give standard input (default: {STDIN_NAME})")
    add_format_option(parser, "sarif", "github")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument("--gpu-capacity", type=parse_size, metavar="SIZE", help="check over-commitment on GPUs of this capacity")
    parser.add_argument("--facts", metavar="FILE", help="check over-commitment against these facts (JSON)")
    parser.add_argument("--max-size", type=parse_size, metavar="SIZE",
                        help="refuse larger policies (KV026; default: $KVPOLICY_MAX_POLICY_SIZE, else 1MiB)")
    parser.add_argument("--work-budget", type=parse_positive_count, metavar="UNITS",
                        help="stop checking past this much work, as a hot reload does (KV027; the controller allows 20000000)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.facts_io import FactsError, FactsUnreadable, read_facts
    from kvpolicy.lint import report
    from kvpolicy.lint.engine import lint_bytes

    try:
        inputs = policy_inputs(args.files, args.stdin_filename)
        facts = read_facts(args.facts) if args.facts else None
    except (UsageError, FactsUnreadable) as exc:
        print(f"kvpolicy lint: {exc}", file=sys.stderr)
        return 2
    except FactsError as exc:
        from kvpolicy.commands.json_failure import refuse_document

        refuse_document(exc, "lint")
        return 1
    diagnostics: list[Diagnostic] = []
    sources: dict[str, list[str]] = {}
    for name, path in inputs:
        try:
            data = read_policy_input(path, args.max_size)
        except OSError as exc:
            print(f"kvpolicy lint: cannot read {name}: {reason(exc)}", file=sys.stderr)
            return 2
        result = lint_bytes(data, name, gpu_capacity=args.gpu_capacity, facts=facts,
                            max_bytes=args.max_size, budget=args.work_budget)
        diagnostics.extend(result.diagnostics)
        text = result.text if result.text is not None else data.decode("utf-8", errors="replace")
        sources[result.file] = text.split("\n")
    if args.format == "json":
        sys.stdout.write(report.render_json(diagnostics, len(inputs)))
    elif args.format == "sarif":
        sys.stdout.write(report.render_sarif(diagnostics))
    elif args.format == "github":
        sys.stdout.write(report.render_github(diagnostics))
    else:
        sys.stdout.write(report.render_text(diagnostics, sources, len(inputs), style_for(args, sys.stdout)))
    failing = [d for d in diagnostics if d.is_error or args.strict]
    return 1 if failing else 0
