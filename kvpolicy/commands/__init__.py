"""Subcommands of ``kvpolicy``: each module has ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping

EXTRAS: Mapping[str, Mapping[str, str]] = {
    "runtime": {"watchdog": "watchdog", "prometheus_client": "prometheus-client", "pynvml": "nvidia-ml-py"},
}
"""Per optional extra of the package (pyproject.toml) that a command needs: its modules → their distributions."""


def add_format_option(parser: argparse.ArgumentParser, *choices: str) -> None:
    """The ``--format`` option every command has; ``text`` is the default."""
    parser.add_argument(
        "--format",
        choices=("text", "json", *choices),
        default="text",
        help="output format (default: text)",
    )


def missing_extra(command: str, extra: str) -> str | None:
    """The one-line message for ``kvpolicy COMMAND`` when modules of ``kvpolicy[EXTRA]`` cannot be
    imported (the command then exits 2), or None when they all can."""
    missing = []
    for module, distribution in EXTRAS[extra].items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    if not missing:
        return None
    return (
        f"kvpolicy {command}: needs the {extra} extra ({', '.join(missing)} not installed); "
        f"install it with: pip install 'kvpolicy[{extra}]'"
    )
