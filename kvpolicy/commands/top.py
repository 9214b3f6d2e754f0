"""``kvpolicy top``: a live view of every GPU's memory, refreshed like `top`.

Each GPU is a bar: headroom (#), other use (=), each runtime-owned pool (a letter
per pool), elastic memory in use (u) and free elastic budget (.); the instance
table follows. Ctrl-C quits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvpolicy.commands import add_format_option
from kvpolicy.commands.common import parse_count, parse_seconds


def add_parser(sub) -> None:
    parser = sub.add_parser("top", help="live view of GPU memory", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger-dir", metavar="DIR", help="ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="the ledger's group, if shared")
    parser.add_argument("--interval", type=parse_seconds, default=1.0, metavar="SECONDS", help="seconds between refreshes (default 1)")
    parser.add_argument("--iterations", type=parse_count, default=0, metavar="N", help="stop after N refreshes (0: never)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.view import current_status, render_bars, render_status

    ledger = LedgerDir(args.ledger_dir, group=args.group)
    if not ledger.path.is_dir():
        print(f"kvpolicy top: no ledger at {ledger.path}", file=sys.stderr)
        return 1
    count = 0
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
                screen = time.strftime("kvpolicy top  %H:%M:%S") + "\n\n" + render_bars(status) + "\n" + render_status(status)
                clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
                sys.stdout.write(clear + screen)
                sys.stdout.flush()
            count += 1
            if args.iterations and count >= args.iterations:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
