"""``kvpolicy test [PATH...]``: run policy unit tests (``*.kvtest.json``, see docs/policy-tests.md).

Exit 0 when every case passes, 1 when a case fails or a test file is invalid (its problems
are listed as file:line:col: CODE, docs/document-errors.md, and so are those that stop a case:
a bad state, an id a step names that the facts lack), 2 when a test file or its policy
cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import UsageError, named_files
from kvpolicy.paths import TEST_SUFFIX

if TYPE_CHECKING:
    from kvpolicy.evaluate.policytest import CaseResult


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("test", help="run policy unit tests", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="test files or directories (default: .)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.evaluate.policytest import TestFileError, TestFileUnreadable, run_test_file

    try:
        files = named_files(args.paths, TEST_SUFFIX)
    except UsageError as exc:
        print(f"kvpolicy test: {exc}", file=sys.stderr)
        return 2
    results: list[CaseResult] = []
    refused: list[TestFileError] = []
    unreadable = False
    for path in files:
        try:
            results.extend(run_test_file(path))
        except TestFileError as exc:
            refused.append(exc)
            unreadable |= isinstance(exc, TestFileUnreadable)
    errors = [str(error) for error in refused]
    failed = [r for r in results if not r.passed]
    if args.format == "json":
        print(json.dumps({
            "schema": 1,
            "results": [r.model_dump(mode="json") for r in results],
            "errors": errors,
            "diagnostics": [d.model_dump(mode="json") for error in refused for d in error.diagnostics],
            "more": sum(error.more for error in refused),
            "summary": {"files": len(files), "cases": len(results), "passed": len(results) - len(failed), "failed": len(failed)},
        }, indent=2))
    else:
        for r in results:
            print(f"{'PASS' if r.passed else 'FAIL'}  {r.file} :: {r.case}")
            for line in _failure_lines(r):
                print(f"      {line}")
        for error in refused:  # a malformed file's problems as diagnostics, file:line:col first
            print(str(error) if error.diagnostics else f"ERROR {error}")
        print(f"{len(results) - len(failed)} passed, {len(failed)} failed, {len(errors)} file error(s) in {len(files)} file(s)")
    if unreadable:
        return 2
    return 1 if failed or errors or not files else 0


def _failure_lines(result: CaseResult) -> list[str]:
    """A case's failures; a placed problem that stopped it with its hint under it, as lint prints one."""
    rendered = (d.render().split("\n") for d in result.diagnostics)
    below = {f"cannot run: {first}": rest for first, *rest in rendered}  # a failure is a problem's first line
    return [line for failure in result.failures for line in (failure, *below.get(failure, []))]
