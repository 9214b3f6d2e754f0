"""``kvpolicy fmt FILE...``: rewrite policy files in the canonical layout.

``--check`` writes nothing and exits 1 if a file would change; ``--diff`` prints a
unified diff and writes nothing; ``-`` reads standard input and writes standard
output. A file with syntax errors is left alone and its errors shown (exit 1); with
``--check`` or ``--diff``, exit 1 when a file would change. A file that cannot be read
is reported and exits 2.
"""

from __future__ import annotations

import argparse
import codecs
import difflib
import json
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import UsageError, policy_files

if TYPE_CHECKING:
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.terminal import Style


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("fmt", help="format policy files", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy files, directories, or - for stdin")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    mode.add_argument("--diff", action="store_true", help="print a unified diff; write nothing; exit 1 if there is one")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every file is formatted (or, with --check/--diff, already is); 1 when a file
    would change under --check/--diff or has syntax errors; 2 when a file cannot be read."""
    from kvpolicy.commands import style_for
    from kvpolicy.lint.source import read_policy_bytes, read_policy_stream
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.lint.engine import decode_policy
    from kvpolicy.policy.fmt import format_text

    style = style_for(args, sys.stderr)
    if args.files == ["-"]:
        data = read_policy_stream(sys.stdin.buffer)
        try:
            sys.stdout.write(format_text(decode_policy(data, "<stdin>"), "<stdin>"))
            return 0
        except PolicyError as exc:
            _report_errors("<stdin>", exc, data, style)
            return 1
    try:
        files = policy_files(args.files)
    except UsageError as exc:
        print(f"kvpolicy fmt: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, object]] = []
    failed = unreadable = False
    for path in files:
        name = str(path)
        try:
            data = read_policy_bytes(path)  # at most the size cap (+1 byte: KV026)
        except OSError as exc:
            reason = f"cannot read it: {exc.strerror or exc}"
            print(f"kvpolicy fmt: {name}: {reason}; not formatted", file=sys.stderr)
            results.append({"file": name, "changed": False, "error": reason})
            unreadable = True
            continue
        try:
            original = decode_policy(data, name)
            formatted = format_text(original, name)
        except PolicyError as exc:
            _report_errors(name, exc, data, style)
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
        errors = sum(1 for r in results if "error" in r)
        reformatted = len(results) - unchanged - errors
        print(f"{reformatted} file(s) {'would be ' if args.check else ''}reformatted, {unchanged} unchanged"
              + (f", {errors} not formatted (errors above)" if errors else ""))
    if unreadable:
        return 2
    would_change = (args.check or args.diff) and any(r["changed"] for r in results)
    return 1 if failed or would_change else 0


def _report_errors(name: str, exc: PolicyError, data: bytes, style: Style) -> None:
    """Why a file was left alone: each error with its source line and caret."""
    from kvpolicy.lint.report import render_diagnostic

    lines = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace").split("\n")
    count = len(exc.errors)
    print(f"kvpolicy fmt: {name}: not formatted: {count} syntax error{'s' * (count != 1)}", file=sys.stderr)
    for d in exc.errors:
        print("\n".join(render_diagnostic(d, lines, style)), file=sys.stderr)


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
