"""Subcommands of ``kvpolicy``: each module has ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Mapping
from typing import IO, Any, Protocol

from kvpolicy.terminal import Style

EXTRAS: Mapping[str, Mapping[str, str]] = {
    "runtime": {"watchdog": "watchdog", "prometheus_client": "prometheus-client", "pynvml": "nvidia-ml-py"},
    "lsp": {"pygls": "pygls"},
}
"""Per optional extra of the package (pyproject.toml) that a command needs: its modules → their distributions."""


class Subcommands(Protocol):
    """What each command's ``add_parser`` is given: the ``kvpolicy`` parser's subcommands
    (what ``ArgumentParser.add_subparsers`` returns)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


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


def style_for(args: argparse.Namespace, stream: IO[str]) -> Style:
    """How to colour what a command writes to ``stream``, by ``--color`` and the environment."""
    return Style.for_stream(stream, getattr(args, "color", "auto"))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of ``parser``'s subcommands by name, in the order of its help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_INTERPRETED = re.compile(r"(?<![`\w])`([^`]+)`(?![`\w])")


def plain_help(text: str | None) -> str | None:
    """Help text for a terminal: a docstring's ``literals`` and :role:`targets` as plain words,
    `interpreted text` and literals without a letter or digit (``-``) in quotes, which alone
    would read as punctuation."""
    if not text:
        return text
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: m[1] if any(c.isalnum() for c in m[1]) else f"'{m[1]}'", text)
    return _INTERPRETED.sub(r"'\1'", text)
