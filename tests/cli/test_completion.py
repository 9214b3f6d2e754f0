"""``kvpolicy completion bash|zsh|fish``: scripts each shell accepts, and that complete commands,
options and option values when the shell runs them (bash and fish; zsh: its syntax check)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import COMMANDS


def script(shell: str, tmp_path: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "completion", shell], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    path = tmp_path / f"kvpolicy.{shell}"
    path.write_text(done.stdout)
    return path


def need(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed here")
    return found


def test_bash_completes_commands_options_and_their_values(tmp_path):
    bash = need("bash")
    path = script("bash", tmp_path)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        program = f"source {path}; COMP_WORDS=(kvpolicy {line}); COMP_CWORD={len(words)}; _kvpolicy; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        done = subprocess.run([bash, "--norc", "-c", program], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("li") == ["lint"]
    assert set(complete("")) >= {c for c in COMMANDS if c != "demo"} | {"--version", "--color"}
    assert complete("lint", "--str") == ["--strict"]
    assert complete("lint", "--format", "") == ["text", "json", "sarif", "github"]
    assert complete("--color", "never", "schema", "k") == ["kvtest"]
    assert complete("completion", "") == ["bash", "zsh", "fish"]


def test_fish_completes_commands_and_option_values(tmp_path):
    fish = need("fish")
    path = script("fish", tmp_path)

    def complete(line: str) -> list[str]:
        done = subprocess.run([fish, "--no-config", "-c", f"source {path}; complete -C {line!r}"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [entry.split("\t")[0] for entry in done.stdout.splitlines()]

    assert complete("kvpolicy li") == ["lint"]
    assert sorted(complete("kvpolicy lint --format ")) == ["github", "json", "sarif", "text"]
    assert complete("kvpolicy schema f") == ["facts"]


def test_zsh_accepts_the_script(tmp_path):
    zsh = need("zsh")
    path = script("zsh", tmp_path)
    assert path.read_text().startswith("#compdef kvpolicy\n")
    done = subprocess.run([zsh, "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'lint:check policy files'" in path.read_text()


def test_an_unknown_shell_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "completion", "tcsh"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr
