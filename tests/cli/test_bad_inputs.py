"""Bad input on the command line never gives a traceback: each gets a clear message and the
documented exit code (1: the input is invalid; 2: a usage error, or a file that cannot be read).

Every case runs ``kvpolicy`` in its own process, since what is under test is what that
process prints and how it exits. Unreadable files are tested as a user without the right to
read them: CI runs as root, where ``chmod 000`` blocks nothing, so as root the command runs
as ``nobody`` (uid 65534).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import as_user, python_for

GiB = 1 << 30
NOBODY = 65534
POLICY = 'version 1\nmodel "chat" { min 1 GiB }\n'
TEST_FILE = {"schema": 1, "policy": "good.kvp", "cases": [{"name": "c", "facts": "good.json", "expect": {}}]}


def facts(**gpu: object) -> str:
    return json.dumps({"schema": 1, "gpus": [{"id": "cuda:0", "capacity": 80 * GiB, **gpu}]})


FILES: dict[str, str | bytes] = {
    "good.kvp": POLICY,
    "good.json": facts(),
    "good.kvtest.json": json.dumps(TEST_FILE),
    "utf8.json": b'{"schema": 1, "gpus": [{"id": "cuda:\xff0", "capacity": 1}]}',
    "deep.json": "[" * 50_000 + "]" * 50_000,
    "huge.json": facts(capacity=10**400).replace(f'"capacity": {80 * GiB}, ', ""),
    "digits.json": '{"now": ' + "9" * 5000 + "}",
    "bytes30.json": json.dumps({
        "schema": 1, "gpus": [{"id": "cuda:0", "capacity": 80 * GiB}],
        "instances": [{"id": "a/0", "model": "chat", "gpu": "cuda:0", "pools": {"c4": {"bytes": 10**30}}}],
    }),
    "bool.json": facts(capacity=True).replace(f'"capacity": {80 * GiB}, ', ""),
    "nan.json": '{"schema": 1, "now": NaN}',
    "inf.json": '{"schema": 1, "now": Infinity}',
    "e400.json": '{"schema": 1, "now": 1e400}',
    "utf8.kvtest.json": b'{"schema": 1, "policy": "good.kvp\xff", "cases": []}',
    "deep.kvtest.json": "[" * 50_000,
}


@pytest.fixture(scope="module")
def inputs() -> Iterator[Path]:
    """A directory every user may read (pytest's own temporary directories are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kvpolicy-bad-inputs-"))
    path.chmod(0o755)
    for name, content in FILES.items():
        target = path / name
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        target.chmod(0o644)
    yield path
    shutil.rmtree(path)


def environment(work: Path) -> dict[str, str]:
    return {**os.environ, "KVPOLICY_LEDGER_DIR": str(work / "ledger"), "NO_COLOR": "1", "HOME": str(work)}


def kvpolicy(work: Path, *args: str, python: str = sys.executable, run_as: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "kvpolicy.cli", *args], cwd=work, env=environment(work), capture_output=True,
                          text=True, timeout=120, **(run_as or {}))


def check(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    for word in words:
        assert word in done.stderr, (word, done.stderr)


BAD_FACTS = [
    ("utf8.json", "utf8.json:1:37: KVD001 error: not UTF-8 (byte 0xff)"),
    ("deep.json", "deep.json:1:33: KVD004 error: nested more than 32 levels deep"),
    ("huge.json", "huge.json:1:53: KVD008 error: gpus.0.capacity: must be 1152921504606846976 or less"),
    ("digits.json", "digits.json:1:9: KVD005 error: a number with more than 4300 digits"),
    ("bytes30.json", "bytes30.json:1:156: KVD008 error: instances.0.pools.c4.bytes"),
    ("bool.json", "bool.json:1:53: KVD008 error: gpus.0.capacity: true is not a size"),
    ("nan.json", "nan.json:1:22: KVD008 error: now: must be a finite number, not NaN"),
    ("inf.json", "inf.json:1:22: KVD008 error: now: must be a finite number, not Infinity"),
    ("e400.json", "e400.json:1:22: KVD008 error: now: must be a finite number"),
]


COMMANDS = {
    "lint": ["lint", "good.kvp", "--facts"],
    "explain": ["explain", "good.kvp", "--facts"],
    "run": ["run", "good.kvp", "--once", "--facts"],
}
# Every bad file through lint; explain and run read facts the same way (kvpolicy.facts_io), so
# a few of them there, to keep this a few seconds of CI.
FACTS_CASES = [("lint", *case) for case in BAD_FACTS] + [
    (command, *case) for command in ("explain", "run") for case in BAD_FACTS if case[0] in ("utf8.json", "nan.json")
]


@pytest.mark.parametrize(("command", "name", "words"), FACTS_CASES, ids=[f"{c}-{n}" for c, n, _ in FACTS_CASES])
def test_invalid_facts_are_an_error_in_the_input(inputs: Path, command: str, name: str, words: str) -> None:
    check(kvpolicy(inputs, *COMMANDS[command], name), 1, name, words)


@pytest.mark.parametrize(("name", "words"), [("utf8.kvtest.json", "utf8.kvtest.json:1:34: KVD001 error: not UTF-8"),
                                             ("deep.kvtest.json", "deep.kvtest.json:1:33: KVD004 error: nested more")])
def test_invalid_test_files_are_an_error_in_the_input(inputs: Path, name: str, words: str) -> None:
    done = kvpolicy(inputs, "test", name)
    check(done, 1)
    assert words in done.stdout, done.stdout


USAGE = [
    (["run", "good.kvp", "--metrics-port", "99999999"], "out of range"),
    (["run", "good.kvp", "--metrics-port", "²"], "not a port number"),
    (["run", "good.kvp", "--tick", "0"], "--tick"),
    (["run", "good.kvp", "--tick", "nan"], "--tick"),
    (["run", "good.kvp", "--stuck-after", "-1"], "--stuck-after"),
    (["top", "--interval", "nan"], "--interval"),
    (["top", "--interval", "inf"], "--interval"),
    (["top", "--iterations", "-3"], "--iterations"),
    (["status", "--stale-after", "nan"], "--stale-after"),
    (["lint", "good.kvp", "--gpu-capacity", "80"], "needs a unit"),
    (["lint", "good.kvp", "--gpu-capacity", "20000000TiB"], "too large"),
    (["lint", "good.kvp", "--gpu-capacity", "9" * 5000 + "GiB"], "too large"),
    (["run", "good.kvp", "--gpu-capacity", "1e400"], "--gpu-capacity"),
    (["run", "good.kvp", "--metrics-port", "9464", "--metrics-address", "off"], "give only one"),
    (["run", "nowhere/good.kvp", "--gpu-capacity", "80GiB"], "nowhere: no such directory"),
    (["lint", "good.kvp", "--work-budget", "0"], "--work-budget"),
    (["lint", "good.kvp", "--work-budget", "-5"], "--work-budget"),
    (["explain", "."], "is a directory"),
]


@pytest.mark.parametrize(("args", "words"), USAGE, ids=[" ".join(a)[:40] for a, _ in USAGE])
def test_bad_option_values_are_usage_errors(inputs: Path, args: list[str], words: str) -> None:
    check(kvpolicy(inputs, *args), 2, words)


@pytest.fixture(scope="module")
def reader(inputs: Path) -> tuple[str, dict]:
    """A Python and the user to run it as, for whom a file of mode 0600 that we own cannot be
    read: ourselves with chmod 000, or as root (whom no mode stops) uid 65534."""
    if os.geteuid() != 0:
        return sys.executable, {}
    run_as = as_user(NOBODY, NOBODY)
    python = python_for(run_as, environment(inputs), inputs)
    if python is None:
        pytest.skip(f"no Python here that uid {NOBODY} may run with this checkout's kvpolicy")
    return python, run_as


UNREADABLE = [
    ["lint", "secret.kvp"],
    ["fmt", "secret.kvp"],
    ["fmt", "--check", "secret.kvp"],
    ["explain", "secret.kvp", "--facts", "good.json"],
    ["explain", "good.kvp", "--facts", "secret.json"],
    ["explain", "good.kvp", "--facts", "good.json", "--state", "secret.json"],
    ["lint", "good.kvp", "--facts", "secret.json"],
    ["run", "secret.kvp", "--once", "--gpu-capacity", "80GiB"],
    ["run", "good.kvp", "--once", "--facts", "secret.json"],
    ["test", "secret.kvtest.json"],
]


@pytest.mark.parametrize("args", UNREADABLE, ids=[" ".join(a) for a in UNREADABLE])
def test_an_unreadable_file_is_a_usage_error(inputs: Path, reader: tuple[str, dict], args: list[str]) -> None:
    python, run_as = reader
    for name, content in {"secret.kvp": POLICY, "secret.json": facts(), "secret.kvtest.json": json.dumps(TEST_FILE)}.items():
        (inputs / name).write_text(content)
        (inputs / name).chmod(0o600 if run_as else 0o000)
    secret = next(a for a in args if a.startswith("secret"))
    done = kvpolicy(inputs, *args, python=python, run_as=run_as)
    check(done, 2)
    said = done.stdout + done.stderr if args[0] == "test" else done.stderr  # test reports on stdout
    for word in (secret, "cannot read", "Permission denied"):
        assert word in said, (word, said)


LONG = "a" * 300  # longer than a file name may be (255 bytes)
TOO_LONG = [
    ["lint", f"{LONG}.kvp"],
    ["fmt", f"{LONG}.kvp"],
    ["explain", f"{LONG}.kvp"],
    ["diff", f"{LONG}.kvp", "good.kvp", "--facts", "good.json"],
    ["test", f"{LONG}.kvtest.json"],
    ["init", f"{LONG}.kvp"],
    ["plan", "--policy", f"{LONG}.kvp", "--model", "chat", "--model-config", "c.json"],
]


@pytest.mark.parametrize("args", TOO_LONG, ids=[a[0] for a in TOO_LONG])
def test_a_name_too_long_is_a_usage_error(inputs: Path, args: list[str]) -> None:
    done = kvpolicy(inputs, *args)
    check(done, 2)
    assert "File name too long" in done.stdout + done.stderr


def test_a_directory_that_cannot_be_read_is_a_usage_error_not_skipped(reader: tuple[str, dict]) -> None:
    """``lint DIR`` with a subdirectory it cannot read said "0 files" and passed; a file in a
    directory that cannot be entered ended in a traceback."""
    python, run_as = reader
    root = Path(tempfile.mkdtemp(prefix="kvpolicy-locked-"))
    try:
        root.chmod(0o755)
        (root / "ok.kvp").write_text(POLICY)
        locked = root / "locked"
        locked.mkdir()
        (locked / "p.kvp").write_text(POLICY)
        (locked / "p.kvtest.json").write_text(json.dumps({**TEST_FILE, "policy": "p.kvp"}))
        locked.chmod(0o700 if run_as else 0o000)
        for args in (["lint", "."], ["fmt", "--check", "."], ["test", "."]):
            done = kvpolicy(root, *args, python=python, run_as=run_as)
            check(done, 2, "locked", "Permission denied")
        for args in (["lint", "locked/p.kvp"], ["lint", "./locked/p.kvp"], ["explain", "locked/p.kvp"],
                     ["fmt", "locked/p.kvp"],
                     ["plan", "--policy", "locked/p.kvp", "--model", "chat", "--model-config", "c.json"]):
            done = kvpolicy(root, *args, python=python, run_as=run_as)
            check(done, 2, "locked/p.kvp: cannot read it: Permission denied")
        for args, status in ((["init", "locked/new.kvp"], 2), (["top", "--ledger-dir", "locked/ledger", "--iterations", "1"], 1)):
            check(kvpolicy(root, *args, python=python, run_as=run_as), status, "locked/", "Permission denied")
    finally:
        (root / "locked").chmod(0o700)
        shutil.rmtree(root)


def test_facts_and_test_files_are_read_to_a_limit(inputs: Path) -> None:
    """/dev/zero as facts was read until memory ran out."""
    zero = inputs / "zero.json"
    zero.unlink(missing_ok=True)
    zero.symlink_to("/dev/zero")
    for args in (["explain", "good.kvp", "--facts", "zero.json"], ["lint", "good.kvp", "--facts", "zero.json"]):
        check(kvpolicy(inputs, *args), 1, f"zero.json:1:{64 * (1 << 20) + 1}: KVD003 error: over 64 MiB: not read further")


def test_a_high_size_limit_reads_only_what_is_there(inputs: Path) -> None:
    """The read reserved the whole limit at once: 1000 GiB was a MemoryError."""
    check(kvpolicy(inputs, "lint", "--max-size", "1000GiB", "good.kvp"), 0)
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "explain", "good.kvp", "--facts", "good.json"],
                          cwd=inputs, capture_output=True, text=True, timeout=120,
                          env={**environment(inputs), "KVPOLICY_MAX_POLICY_SIZE": "99999999999999999999 TiB"})
    check(done, 0)


def test_a_nul_in_a_test_files_policy_name_is_said_so(inputs: Path) -> None:
    (inputs / "nul.kvtest.json").write_text(json.dumps({**TEST_FILE, "policy": "good.kvp\u0000x"}))
    done = kvpolicy(inputs, "test", "nul.kvtest.json")
    check(done, 2)
    assert "a file name cannot contain a NUL character" in done.stdout


def test_a_tree_is_walked_once_and_a_link_to_nothing_in_it_is_said(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume (policy.kvp -> ..data/policy.kvp, ..data -> ..2026_...) gave each
    policy twice; a dangling link was skipped without a word."""
    volume = tmp_path / "volume"
    (volume / "..2026_12_06").mkdir(parents=True)
    (volume / "..2026_12_06" / "policy.kvp").write_text(POLICY)
    (volume / "..data").symlink_to("..2026_12_06")
    (volume / "policy.kvp").symlink_to("..data/policy.kvp")
    done = kvpolicy(tmp_path, "lint", "volume")
    check(done, 0)
    assert done.stdout.strip().endswith("in 1 file"), done.stdout
    (volume / "gone.kvp").symlink_to("nowhere.kvp")
    check(kvpolicy(tmp_path, "lint", "volume"), 2, "volume: cannot read volume/gone.kvp in it: a link to nothing")
