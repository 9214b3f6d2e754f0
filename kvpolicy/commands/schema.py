"""``kvpolicy schema NAME``: print the JSON Schema of a document kvpolicy reads or writes.

``facts`` (facts files, ``explain --facts``), ``kvtest`` (``.kvtest.json`` policy
tests), ``decision`` and ``state`` (what ``explain --format json`` and the controller
write). They are the files published under docs/ (``docs/NAME.schema.json``), with a
description of every field; point an editor's JSON support at them.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvpolicy.commands import Subcommands, add_format_option

NAMES = ("facts", "kvtest", "decision", "state")


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("schema", help="print the JSON Schema of facts, .kvtest.json and other documents",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=NAMES, metavar="NAME", help=f"one of: {', '.join(NAMES)}")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """text: the schema document itself, as published; json: it inside the usual envelope."""
    from kvpolicy.evaluate.schemas import SCHEMAS, render

    file = f"{args.name}.schema.json"
    text = render(SCHEMAS[file])
    if args.format == "json":
        print(json.dumps({"schema": 1, "name": args.name, "file": f"docs/{file}", "json_schema": json.loads(text)}))
    else:
        sys.stdout.write(text)
    return 0
