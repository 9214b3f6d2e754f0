"""The ``kvpolicy`` command.

Each subcommand lives in ``kvpolicy/commands/<name>.py`` with ``add_parser`` and
``run``; those modules import nothing heavy at module level, so ``kvpolicy lint``
starts fast (no torch, no cuda-python).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Order is the order of ``kvpolicy --help``.
COMMANDS = ("lint", "fmt", "explain", "test", "plan", "run", "status", "top", "lsp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpolicy",
        description="Declarative GPU memory policy for co-located LLM serving engines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = _command_module(name)
        if module is not None:
            module.add_parser(sub)
    return parser


def _command_module(name: str):
    try:
        return importlib.import_module(f"kvpolicy.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"kvpolicy.commands.{name}":
            return None  # not built yet
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 ok, 1 findings or errors in the input, 2 usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits 2 on usage errors
    try:
        return int(args.run(args))
    except BrokenPipeError:  # e.g. `kvpolicy explain ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
