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

from kvpolicy import __version__
from kvpolicy.commands import plain_help, subcommands
from kvpolicy.commands.json_failure import one_document
from kvpolicy.suggest import closest
from kvpolicy.terminal import COLOR_MODES

# Order is the order of ``kvpolicy --help``.
COMMANDS = (
    "lint", "fmt", "explain", "diff", "test", "plan", "init", "schema",
    "run", "status", "top", "demo",
    "lsp", "completion",
)
NO_COLOR_OPTION = ("lsp",)
"""Commands whose output is a protocol: no ``--color``."""
FORMAT_EXEMPT = ("lsp", "completion", "demo")
"""Commands without ``--format text|json``: a protocol, a shell script, a foreground demo."""
ONE_DOCUMENT = ("lint", "fmt", "explain", "diff", "test", "plan", "init", "schema", "status")
"""Commands whose ``--format json`` is one document, an error document where they fail without
one (``kvpolicy.commands.json_failure``); ``run`` and ``top`` run on, writing as they go."""

_COLOR_HELP = "colour the output: auto (on a terminal, unless NO_COLOR is set), always, never (default: auto)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpolicy",
        description="Declarative GPU memory policy for co-located LLM serving engines.",
        epilog="Run 'kvpolicy COMMAND --help' for a command's options. Exit status: 0 ok, "
        "1 findings or errors in the input, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"kvpolicy {__version__}",
                        help="print the version and exit")
    parser.add_argument("--color", choices=COLOR_MODES, default="auto", help=_COLOR_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"kvpolicy.commands.{name}").add_parser(sub)
    for name, command in subcommands(parser).items():
        if name not in NO_COLOR_OPTION:
            # SUPPRESS: given after the command it overrides the global one, absent it leaves it alone.
            command.add_argument("--color", choices=COLOR_MODES, default=argparse.SUPPRESS, help=_COLOR_HELP)
        _plain(command)
    return parser


def _plain(parser: argparse.ArgumentParser) -> None:
    """Help as plain text: the docstrings' literal markup removed, paragraphs kept as written."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = plain_help(parser.description)
    parser.epilog = plain_help(parser.epilog)
    for group in parser._action_groups:
        group.description = plain_help(group.description)
    for action in parser._actions:
        if action.help not in (None, argparse.SUPPRESS):
            action.help = plain_help(action.help)


def _command_word(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (the first word that is neither an option nor an option's value)."""
    words = iter(argv)
    for word in words:
        if word == "--color":
            next(words, None)
        elif word == "--":
            return next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 ok, 1 findings or errors in the input, 2 usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = subcommands(parser)
    word = _command_word(argv)
    if word is not None and word not in commands:
        guess = closest(word, commands)
        parser.error(f"unknown command {word!r}" + (f"; did you mean {guess!r}?" if guess else "")
                     + f" (commands: {', '.join(commands)})")
    args, extra = parser.parse_known_args(argv)  # argparse exits 2 on usage errors
    if extra:
        _unrecognized(commands[args.command], extra)
    try:
        if args.command in ONE_DOCUMENT and getattr(args, "format", None) == "json":
            return one_document(args.run, args)
        return int(args.run(args))
    except BrokenPipeError:  # e.g. `kvpolicy explain ... | head`
        return 0
    except KeyboardInterrupt:
        return 130


def _unrecognized(command: argparse.ArgumentParser, extra: list[str]) -> None:
    """argparse's error for arguments the command does not take, with the option it was likely meant to be."""
    options = [o for o in command._option_string_actions if o.startswith("--")]
    hints = []
    for word in extra:
        name = word.split("=", 1)[0]
        if name.startswith("-"):
            guess = closest(name, options)
            if guess:
                hints.append(f"{name}: did you mean {guess}?")
    command.error(f"unrecognized arguments: {' '.join(extra)}" + ("; " + "; ".join(hints) if hints else ""))


if __name__ == "__main__":
    sys.exit(main())
