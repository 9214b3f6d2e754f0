"""Subcommands of ``kvpolicy``: each module has ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse


def add_format_option(parser: argparse.ArgumentParser, *choices: str) -> None:
    """The ``--format`` option every command has; ``text`` is the default."""
    parser.add_argument(
        "--format",
        choices=("text", "json", *choices),
        default="text",
        help="output format (default: text)",
    )
