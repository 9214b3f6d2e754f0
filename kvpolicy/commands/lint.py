"""``kvpolicy lint FILE...``: check policy files; exit 1 on errors (and warnings with --strict)."""

from __future__ import annotations

import argparse
import sys

from kvpolicy.commands import add_format_option
from kvpolicy.commands.common import UsageError, parse_size, policy_files


def add_parser(sub) -> None:
    parser = sub.add_parser("lint", help="check policy files", description=__doc__)
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy files or directories of .kvp files")
    add_format_option(parser, "sarif", "github")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument("--gpu-capacity", type=parse_size, metavar="SIZE", help="check over-commitment on GPUs of this capacity")
    parser.add_argument("--facts", metavar="FILE", help="check over-commitment against these facts (JSON)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.evaluate.facts_io import FactsError, read_facts
    from kvpolicy.lint import report
    from kvpolicy.lint.engine import lint_file

    try:
        files = policy_files(args.files)
        facts = read_facts(args.facts) if args.facts else None
    except UsageError as exc:
        print(f"kvpolicy lint: {exc}", file=sys.stderr)
        return 2
    except FactsError as exc:
        print(f"kvpolicy lint: {exc}", file=sys.stderr)
        return 1
    diagnostics = []
    sources: dict[str, list[str]] = {}
    for path in files:
        result = lint_file(path, gpu_capacity=args.gpu_capacity, facts=facts)
        diagnostics.extend(result.diagnostics)
        try:
            sources[result.file] = path.read_text(encoding="utf-8", errors="replace").split("\n")
        except OSError:
            pass
    if args.format == "json":
        sys.stdout.write(report.render_json(diagnostics, len(files)))
    elif args.format == "sarif":
        sys.stdout.write(report.render_sarif(diagnostics))
    elif args.format == "github":
        sys.stdout.write(report.render_github(diagnostics))
    else:
        sys.stdout.write(report.render_text(diagnostics, sources, len(files)))
    failing = [d for d in diagnostics if d.is_error or args.strict]
    return 1 if failing else 0
