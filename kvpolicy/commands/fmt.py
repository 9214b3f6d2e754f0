"""``kvpolicy fmt FILE...``: rewrite policy files in the canonical layout.

``--check`` writes nothing and exits 1 if a file would change; ``--diff`` prints a
unified diff and writes nothing; ``-`` reads standard input and writes standard
output (``--check``, ``--diff`` and ``--format json`` apply to it as to a file). A file
with syntax errors is left alone and its errors shown (exit 1); with ``--check`` or
``--diff``, exit 1 when a file would change. A file that cannot be read, or that would
change and cannot be written, is reported, left as it was, and exits 2.
"""

from __future__ import annotations

import argparse
import codecs
import difflib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import STDIN_NAME, UsageError, policy_inputs, read_policy_input
from kvpolicy.paths import path_kind, reason

if TYPE_CHECKING:
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.terminal import Style

Entry = dict[str, object]
"""One file's item in the JSON document's ``files``."""

OK, INVALID, USAGE = 0, 1, 2
"""Exit codes, per file; the command exits with the highest."""


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("fmt", help="format policy files", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy files, directories, or - for stdin")
    parser.add_argument("--stdin-filename", metavar="NAME",
                        help=f"with -: the name messages and the JSON output give standard input (default: {STDIN_NAME})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    mode.add_argument("--diff", action="store_true", help="print a unified diff; write nothing; exit 1 if there is one")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every file is formatted (or, with --check/--diff, already is); 1 when a file
    would change under --check/--diff or has syntax errors; 2 when a file cannot be read or written."""
    from kvpolicy.commands import style_for

    style = style_for(args, sys.stderr)
    try:
        inputs = policy_inputs(args.files, args.stdin_filename)
    except UsageError as exc:
        print(f"kvpolicy fmt: {exc}", file=sys.stderr)
        return 2
    results: list[Entry] = []
    code = OK
    for name, path in inputs:
        entry, status = _format_one(name, path, args, style)
        results.append(entry)
        code = max(code, status)
    if args.format == "json":
        print(json.dumps({"schema": 1, "files": results}, indent=2))
    elif not args.diff and (args.check or args.files != ["-"]):  # else stdout is a diff, or stdin's text
        _print_summary(results, args.check)
    return code


def _format_one(name: str, path: Path | None, args: argparse.Namespace, style: Style) -> tuple[Entry, int]:
    """Read and format one input, and act on it: its JSON entry and its exit code."""
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.lint.engine import decode_policy
    from kvpolicy.policy.fmt import format_text

    try:  # at most the size cap (+1 byte: KV026), from a file or standard input alike
        data = read_policy_input(path)
    except OSError as exc:
        return _refused(name, f"cannot read it: {reason(exc)}")
    try:
        original = decode_policy(data, name)
        formatted = format_text(original, name)
    except PolicyError as exc:
        _report_errors(name, exc, data, style)
        return {"file": name, "changed": False, "error": exc.first.render()}, INVALID
    return _act(name, path, original, formatted, args)


def _act(name: str, path: Path | None, original: str, formatted: str, args: argparse.Namespace) -> tuple[Entry, int]:
    """Do what the options say with one input's new text: show a diff, tell whether it would
    change, or write it (a file in place, standard input's to stdout)."""
    changed = formatted != original
    entry: Entry = {"file": name, "changed": changed}
    if args.diff:
        diff = "".join(difflib.unified_diff(original.splitlines(True), formatted.splitlines(True), name, f"{name} (formatted)"))
        _put(entry, "diff", diff, args.format)
        return entry, INVALID if changed else OK
    if args.check:
        if changed and args.format == "text":
            print(f"would reformat {name}")
        return entry, INVALID if changed else OK
    if path is None:
        _put(entry, "formatted", formatted, args.format)
        return entry, OK
    if changed:
        refusal = _write(path, formatted)
        if refusal is not None:
            return _refused(name, refusal)
        if args.format == "text":
            print(f"reformatted {name}")
    return entry, OK


def _put(entry: Entry, key: str, text: str, output_format: str) -> None:
    """Text meant for standard output: there as it is, or, with --format json, in the file's entry
    (stdout holds one JSON document and nothing else)."""
    if output_format == "json":
        entry[key] = text
    else:
        sys.stdout.write(text)


def _refused(name: str, reason: str) -> tuple[Entry, int]:
    """A file left as it was for a reason of the system's (a usage error): one line, and its entry."""
    print(f"kvpolicy fmt: {name}: {reason}; not formatted", file=sys.stderr)
    return {"file": name, "changed": False, "error": reason}, USAGE


def _print_summary(results: list[Entry], check: bool) -> None:
    unchanged = sum(1 for r in results if not r["changed"] and "error" not in r)
    errors = sum(1 for r in results if "error" in r)
    reformatted = len(results) - unchanged - errors
    print(f"{reformatted} file(s) {'would be ' if check else ''}reformatted, {unchanged} unchanged"
          + (f", {errors} not formatted (errors above)" if errors else ""))


def _report_errors(name: str, exc: PolicyError, data: bytes, style: Style) -> None:
    """Why a file was left alone: each error with its source line and caret."""
    from kvpolicy.lint.report import render_diagnostic

    lines = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace").split("\n")
    count = len(exc.errors)
    print(f"kvpolicy fmt: {name}: not formatted: {count} syntax error{'s' * (count != 1)}", file=sys.stderr)
    for d in exc.errors:
        print("\n".join(render_diagnostic(d, lines, style)), file=sys.stderr)


def why_not_writable(path: Path, access: Callable[[Path, int], bool] | None = None) -> str | None:
    """Why fmt may not replace ``path`` (through its links), or None. The new version is written
    beside the file and renamed over it, which needs the directory's permission only: so a file
    the user may not write (mode 0444) is refused here, not replaced. ``access`` is ``os.access``
    unless given (root passes every check of ``os.access``)."""
    try:
        kind = path_kind(path)
    except OSError as exc:
        return f"cannot write it: {reason(exc)}"
    if kind == "missing":  # removed since it was read
        return "cannot write it: it is no longer there"
    if kind != "file":  # a pipe such as <(...): read, but there is nothing to rewrite
        return "cannot write it: not a regular file (--check and --diff write nothing; - formats standard input)"
    allowed = access or os.access
    target = path.resolve()
    if not allowed(target, os.W_OK):
        return "cannot write it: the file is not writable (its permissions, or a read-only file system)"
    if not allowed(target.parent, os.W_OK | os.X_OK):
        return f"cannot write it: its directory {target.parent} is not writable (its permissions, or a read-only file system)"
    return None


def _write(path: Path, text: str) -> str | None:
    """Replace the file with ``text``; None when done, else why not (the file left as it was)."""
    refusal = why_not_writable(path)
    if refusal is not None:
        return refusal
    try:
        _write_atomically(path, text)
    except OSError as exc:  # a full disk, a read-only file system, a race with a chmod
        return f"cannot write it: {reason(exc)}"
    return None


def _write_atomically(path: Path, text: str) -> None:
    """Replace the file by rename, so a watcher never sees a half-written policy.

    A symlinked policy (a Kubernetes ConfigMap, a dotfiles link) is written through the
    link, not replaced by a plain file, and the file keeps its mode (and its owner where the
    user may give it: root). The temporary file is created anew (never an existing file or
    link of that name) and removed on failure.
    """
    target = path.resolve()
    before = os.stat(target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".kvpolicy-fmt.tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())  # the new bytes are on disk before the rename makes them the file
        os.chmod(tmp, stat.S_IMODE(before.st_mode))
        _keep_owner(tmp, before)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _keep_owner(tmp: Path, before: os.stat_result) -> None:
    """Give the new file the old one's owner where the system lets us (root formatting a
    user's policy would otherwise take it over); elsewhere it stays the user's own."""
    if (before.st_uid, before.st_gid) == (os.geteuid(), os.getegid()):
        return
    try:
        os.chown(tmp, before.st_uid, before.st_gid)
    except PermissionError:
        pass
