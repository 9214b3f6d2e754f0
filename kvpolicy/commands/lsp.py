"""``kvpolicy lsp``: the language server for policy files, over standard input and output.

Editors start it and speak the Language Server Protocol to it: diagnostics as you
type, hover, completion, formatting, quick fixes, and navigation from
``.kvtest.json`` files (docs/editors.md). It needs the ``lsp`` extra:
``pip install 'kvpolicy[lsp]'``. It has no ``--format``: its output is the protocol.
"""

from __future__ import annotations

import argparse
import sys

from kvpolicy.commands import Subcommands

EXTRA_HINT = "kvpolicy lsp: needs pygls, which the 'lsp' extra installs: pip install 'kvpolicy[lsp]'"


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("lsp", help="serve the language server protocol over stdio (editors)", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stdio", action="store_true", help="accepted for editors that pass it; stdio is the only transport")
    parser.set_defaults(run=run)


_LIBRARIES = ("pygls", "lsprotocol")


def run(args: argparse.Namespace) -> int:
    try:
        from kvpolicy.lsp.server import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _LIBRARIES:
            raise
        print(EXTRA_HINT, file=sys.stderr)
        return 2
    return serve()
