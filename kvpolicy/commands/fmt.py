"""``kvpolicy fmt FILE...``: rewrite policy files in the canonical layout.

``--check`` writes nothing and exits 1 if a file would change; ``--diff`` prints a
unified diff and writes nothing; ``-`` reads standard input and writes standard
output. A file with syntax errors is left alone and reported (exit 1).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import stat
import sys
from pathlib import Path

from kvpolicy.commands import add_format_option
from kvpolicy.commands.common import UsageError, policy_files


def add_parser(sub) -> None:
    parser = sub.add_parser("fmt", help="format policy files", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy files, directories, or - for stdin")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    mode.add_argument("--diff", action="store_true", help="print a unified diff; write nothing")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.lint.engine import decode_policy
    from kvpolicy.lint.source import read_policy_bytes, read_policy_stream
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.policy.fmt import format_text

    if args.files == ["-"]:
        try:
            sys.stdout.write(format_text(decode_policy(read_policy_stream(sys.stdin.buffer), "<stdin>"), "<stdin>"))
            return 0
        except PolicyError as exc:
            _report_errors(exc)
            return 1
    try:
        files = policy_files(args.files)
    except UsageError as exc:
        print(f"kvpolicy fmt: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, object]] = []
    failed = False
    for path in files:
        name = str(path)
        try:
            original = decode_policy(read_policy_bytes(path), name)
            formatted = format_text(original, name)
        except PolicyError as exc:
            _report_errors(exc)
            results.append({"file": name, "changed": False, "error": exc.first.render()})
            failed = True
            continue
        changed = formatted != original
        results.append({"file": name, "changed": changed})
        if not changed:
            continue
        if args.diff:
            sys.stdout.writelines(
                difflib.unified_diff(original.splitlines(True), formatted.splitlines(True), f"{name}", f"{name} (formatted)")
            )
        elif args.check:
            if args.format == "text":
                print(f"would reformat {name}")
        else:
            _write_atomically(path, formatted)
            if args.format == "text":
                print(f"reformatted {name}")
    if args.format == "json":
        print(json.dumps({"schema": 1, "files": results}, indent=2))
    elif args.format == "text" and not args.diff:
        unchanged = sum(1 for r in results if not r["changed"] and "error" not in r)
        print(f"{len(results) - unchanged} file(s) {'would be ' if args.check else ''}reformatted, {unchanged} unchanged")
    would_change = args.check and any(r["changed"] for r in results)
    return 1 if failed or would_change else 0


def _report_errors(exc) -> None:
    for d in exc.diagnostics:
        print(d.render(), file=sys.stderr)


def _write_atomically(path: Path, text: str) -> None:
    """Replace the file by rename, so a watcher never sees a half-written policy.

    A symlinked policy (a Kubernetes ConfigMap, a dotfiles link) is written through the
    link, not replaced by a plain file, and the file keeps its mode.
    """
    target = path.resolve()
    tmp = target.with_name(f".{target.name}.kvpolicy-fmt.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
    tmp.replace(target)
