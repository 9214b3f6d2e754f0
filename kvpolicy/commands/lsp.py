"""``kvpolicy lsp``: the language server for policy files, over standard input and output.

Editors start it and speak the Language Server Protocol to it: diagnostics as you
type, hover, completion, formatting, quick fixes, and navigation from
``.kvtest.json`` files (docs/editors.md). It needs the ``lsp`` extra:
``pip install 'kvpolicy[lsp]'``. It has no ``--format``: its output is the protocol.
"""

from __future__ import annotations

import argparse
import sys

from kvpolicy.commands import Subcommands, missing_extra


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("lsp", help="serve the language server protocol over stdio (editors)", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stdio", action="store_true", help="accepted for editors that pass it; stdio is the only transport")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    missing = missing_extra("lsp", "lsp")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from kvpolicy.lsp.server import serve

    return serve()
