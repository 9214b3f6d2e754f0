"""``kvpolicy top``: a live view of every GPU's memory, refreshed like `top`.

Each GPU is a bar: headroom (#), other use (=), each runtime-owned pool (a letter
per pool, from its name: S swa, 4 c4, 1 c128, I indexer, C compressor_state; the
legend says which), elastic memory in use (u) and free elastic budget (.); the instance
table follows, then each rule acting, waiting out its grace or cooling down on an
instance, and since when; all of it fits 80 columns (the table drops the engine, mapped bytes and
revisions below 116, which ``kvpolicy status`` always shows). ``q`` (or Ctrl-C) quits.
With ``--format json``, each refresh is one line: ``kvpolicy status``'s JSON document
(JSON Lines).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import time
from typing import Any

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.commands.common import parse_count, parse_seconds


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("top", help="live view of GPU memory", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger-dir", metavar="DIR", help="ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="the ledger's group, if shared")
    parser.add_argument("--interval", type=parse_seconds, default=1.0, metavar="SECONDS", help="seconds between refreshes (default 1)")
    parser.add_argument("--iterations", type=parse_count, default=0, metavar="N", help="stop after N refreshes (0: never)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.commands import style_for
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.view import SCREEN_WIDTH, current_status, render_bars, render_status

    try:  # as kvpolicy status opens it
        ledger = LedgerDir(args.ledger_dir, group=args.group)
        if not ledger.path.is_dir():
            print(f"kvpolicy top: no ledger at {ledger.path}", file=sys.stderr)
            return 1
    except (LedgerError, OSError) as exc:
        print(f"kvpolicy top: {exc}", file=sys.stderr)
        return 1
    style = style_for(args, sys.stdout)
    count = 0
    with _Keys() as keys:
        try:
            while True:
                try:
                    status = current_status(ledger)
                except LedgerError as exc:
                    print(f"kvpolicy top: {exc}", file=sys.stderr)
                    return 1
                if args.format == "json":
                    print(json.dumps(json.loads(status.to_json())), flush=True)  # one line per refresh
                else:
                    width = max(SCREEN_WIDTH, shutil.get_terminal_size((SCREEN_WIDTH, 24)).columns)
                    hint = "  (q quits)" if keys.active else ""
                    screen = (time.strftime("kvpolicy top  %H:%M:%S") + hint + "\n\n"
                              + render_bars(status, style, width) + "\n" + render_status(status, width))
                    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
                    sys.stdout.write(clear + screen)
                    sys.stdout.flush()
                count += 1
                if args.iterations and count >= args.iterations:
                    return 0
                if keys.wait(args.interval) in ("q", "Q"):
                    return 0
        except KeyboardInterrupt:
            return 0


class _Keys:
    """Single keys from a terminal on stdin (``q`` quits), read without Enter while top runs;
    the terminal's mode is restored on the way out. Without a terminal it only waits."""

    def __init__(self) -> None:
        self.active = False
        self._saved: list[Any] | None = None  # the terminal's attributes (termios.tcgetattr)

    def __enter__(self) -> _Keys:
        try:
            import termios
            import tty

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.active = True
        except (ImportError, OSError, ValueError):  # no termios (Windows), a closed stdin
            self.active = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)

    def wait(self, seconds: float) -> str | None:
        """Wait ``seconds``, or less when a key is pressed; the key, or None."""
        if not self.active:
            time.sleep(seconds)
            return None
        ready, _, _ = select.select([sys.stdin], [], [], seconds)
        return os.read(sys.stdin.fileno(), 1).decode(errors="replace") if ready else None
