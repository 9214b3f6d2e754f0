"""The command line as people meet it: --version, help, did-you-mean, colour (through a pty)."""

from __future__ import annotations

import argparse
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.cli import COMMANDS as REGISTERED
from kvpolicy.cli import FORMAT_EXEMPT, NO_COLOR_OPTION, ONE_DOCUMENT, build_parser
from kvpolicy.commands import subcommands
from tests.support.terminal import in_a_terminal

BAD_POLICY = 'version 1\nmodel "a" { reserve 4 GiBB }\n'


def kvpolicy_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpolicy.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_version():
    done = kvpolicy_cli("--version")
    assert (done.returncode, done.stdout) == (0, f"kvpolicy {kvpolicy.__version__}\n")


def test_python_dash_m_kvpolicy_is_the_command():
    done = subprocess.run([sys.executable, "-m", "kvpolicy", "--version"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"kvpolicy {kvpolicy.__version__}\n")


def test_a_mistyped_command_gets_a_did_you_mean():
    done = kvpolicy_cli("lnit", "x.kvp")
    assert done.returncode == 2
    assert "unknown command 'lnit'; did you mean 'lint'?" in done.stderr


def test_a_mistyped_option_gets_a_did_you_mean(tmp_path):
    (tmp_path / "p.kvp").write_text("version 1\n")
    done = kvpolicy_cli("lint", str(tmp_path / "p.kvp"), "--strcit")
    assert done.returncode == 2 and "--strcit: did you mean --strict?" in done.stderr


PARSER = build_parser()
COMMANDS = subcommands(PARSER)


def test_every_command_module_is_registered_and_nothing_else():
    """A module in kvpolicy/commands/ with ``add_parser`` is a command only once cli.COMMANDS names it;
    the lists of exceptions name registered commands (a renamed command cannot keep a stale entry)."""
    folder = Path(kvpolicy.__file__).parent / "commands"
    modules = {p.stem for p in folder.glob("*.py") if "\ndef add_parser(" in p.read_text(encoding="utf-8")}
    assert modules == set(REGISTERED) == set(COMMANDS)
    assert set(FORMAT_EXEMPT) | set(NO_COLOR_OPTION) | set(ONE_DOCUMENT) <= set(REGISTERED)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help_in_plain_text(name):
    command = COMMANDS[name]
    missing = [a.option_strings or a.dest for a in command._actions if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"kvpolicy {name}: no help for {missing}"
    text = command.format_help()
    assert not re.findall(r"``|:[a-z]+:`|`[^`'\n]+`", text), text


def test_a_literal_that_is_only_punctuation_stays_quoted_in_help():
    """``-`` alone at a line's start would read as a list bullet."""
    assert "\n'-' lints standard input" in COMMANDS["lint"].format_help()
    assert "; '-' reads standard input" in " ".join(COMMANDS["fmt"].format_help().split())


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_but_the_exempt_has_format_text_and_json(name):
    formats = [a for a in COMMANDS[name]._actions if "--format" in a.option_strings]
    if name in FORMAT_EXEMPT:
        assert not formats
    else:
        (action,) = formats
        assert {"text", "json"} <= set(action.choices)


def _choices(command: str, option: str) -> tuple[str, ...]:
    return tuple(COMMANDS[command]._option_string_actions[option].choices)


def test_choices_written_out_for_a_lean_start_are_the_types_that_take_them():
    """The parser writes these choices out rather than import the modules that define them."""
    from typing import get_args

    from kvpolicy.adapters.vllm_adapter.planning.platform import Platform
    from kvpolicy.runtime.logs import LogFormat

    assert _choices("plan", "--platform") == get_args(Platform)
    assert _choices("run", "--log-format") == get_args(LogFormat)


def test_lint_colours_a_terminal_unless_no_color(tmp_path):
    policy = tmp_path / "bad.kvp"
    policy.write_text(BAD_POLICY)
    assert "\x1b[1;31merror\x1b[0m" in in_a_terminal("lint", str(policy)).text
    assert "\x1b[" not in in_a_terminal("lint", str(policy), env={"NO_COLOR": "1"}).text
    assert "\x1b[" not in in_a_terminal("lint", str(policy), "--color", "never").text
    # Not a terminal: no colour, unless asked for.
    assert "\x1b[" not in kvpolicy_cli("lint", str(policy)).stdout
    assert "\x1b[1;31merror\x1b[0m" in kvpolicy_cli("--color", "always", "lint", str(policy), env={"NO_COLOR": "1"}).stdout


def test_top_quits_on_q_in_a_terminal(tmp_path):
    from kvpolicy.runtime.directory import LedgerDir

    ledger = LedgerDir(tmp_path / "ledger", create=True)
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    # An hour between refreshes: only the key can end it before the hang guard below.
    process = subprocess.Popen([sys.executable, "-m", "kvpolicy.cli", "top", "--ledger-dir", str(ledger.path),
                                "--interval", "3600"], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    screen = b""
    while b"(q quits)" not in screen:
        screen += os.read(leader, 65536)
    os.write(leader, b"q")
    assert process.wait(timeout=60) == 0
    os.close(leader)
    assert b"policy: none loaded" in screen
