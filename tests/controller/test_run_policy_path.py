"""``kvpolicy run`` and what it is given and sent: a policy path that is not a regular file (at
start and while running), SIGHUP, a refused start's diagnostic, ``--once --format json`` on a
failure, and a ledger directory that cannot be made.

Real processes, files, FIFOs and watchdog; every wait is on a condition (a line in a log, a
field of the status file), bounded only to catch a hang.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.runtime.status import read_status
from tests.controller.site import POLICY, http_get, wait_for

HANG = 120.0  # only to catch a hang
FIFO = "is a FIFO (named pipe), not a regular file"
BAD = POLICY.replace("max 60%", "max 60 GiBB")  # KV001 at 3:49


def kvpolicy_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``kvpolicy run`` as a process that must end by itself (a hang fails the test)."""
    return subprocess.run([sys.executable, "-m", "kvpolicy.cli", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=HANG, env={**os.environ, "NO_COLOR": "1"})


def release_a_blocked_reader(fifo: Path) -> None:
    """Let a reader blocked opening ``fifo`` (a controller without the fix) go, so nothing stays hung."""
    try:
        if stat.S_ISFIFO(os.lstat(fifo).st_mode):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "link to /dev/zero", "fifo in a linked directory"])
def test_a_policy_that_is_not_a_regular_file_is_refused_at_start_with_exit_2(tmp_path, kind):
    """It used to hang for good (a FIFO, silently) or say only "the policy was refused" (/dev/zero).
    Where symlinks lead is named as the running controller's watcher names it."""
    if kind == "fifo":
        policy, said = tmp_path / "f.kvp", f"kvpolicy run: f.kvp {FIFO}"
        os.mkfifo(policy)
    elif kind == "/dev/zero":
        policy, said = Path("/dev/zero"), "kvpolicy run: /dev/zero is a character device, not a regular file"
    elif kind == "link to /dev/zero":
        policy, said = tmp_path / "f.kvp", "kvpolicy run: f.kvp leads to /dev/zero, a character device, not a regular file"
        policy.symlink_to("/dev/zero")
    else:  # the link is a directory on the way, not the file's own name
        real = tmp_path.resolve() / "real"
        real.mkdir()
        os.mkfifo(real / "f.kvp")
        (tmp_path / "linked").symlink_to(real)
        policy, said = tmp_path / "linked" / "f.kvp", f"kvpolicy run: linked/f.kvp leads to {real / 'f.kvp'}, a FIFO"
    try:
        done = kvpolicy_run(str(policy.relative_to(tmp_path)) if kind != "/dev/zero" else str(policy), "--gpu-capacity",
                            "80GiB", "--ledger-dir", str(tmp_path / "ledger"), "--metrics-address", "off", cwd=tmp_path)
    except subprocess.TimeoutExpired:
        release_a_blocked_reader(policy)
        pytest.fail(f"kvpolicy run on a {kind} did not end in {HANG:.0f} s")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(said) and "must be a regular file or a symlink to one" in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1  # one line: why, and nothing else


def test_a_fifo_in_place_of_the_running_policy_is_reported_and_a_file_put_back_is_loaded(site, capsys):
    """``rm p.kvp; mkfifo p.kvp`` under a running controller: status and /readyz name the FIFO, the last
    good policy stays, a regular file put back is loaded, and the controller still stops."""
    controller = site.controller()
    base = site.serve(controller)
    assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.policy and s.policy.revision == 1)
    site.policy.unlink()
    os.mkfifo(site.policy)
    try:
        why = f"the policy path {FIFO}"
        status = wait_for(lambda: (s := read_status(site.ledger_dir)) and s.last_reload and not s.last_reload.ok and s,
                          HANG)
        assert status, "the FIFO was never reported"
        assert status.last_reload.error.message == why and status.policy.revision == 1
        code, body = http_get(f"{base}/readyz")
        (policy_check,) = [c for c in json.loads(body)["checks"] if c["name"] == "policy"]
        assert code == 200 and policy_check["ok"]  # the last good policy is in force...
        assert policy_check["detail"].endswith(f"in force; the file on disk is rejected: {why}")  # ...and it says
        assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 1
        assert "last reload: FAILED" in (out := capsys.readouterr().out) and why in out
        site.policy.unlink()
        site.policy.write_text(POLICY.replace("max 60%", "max 50%"))
        assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.last_reload.ok and s.policy.revision == 2,
                        HANG), "the file put back was never loaded"
    finally:
        release_a_blocked_reader(site.policy)
    site.stop_controllers()  # joined, bounded: a watcher hung in open() would not let it stop


def test_sighup_reads_the_policy_again_and_the_controller_keeps_running(site):
    """SIGHUP used to end the controller silently (and systemd's Restart=on-failure does not restart that)."""
    proc, log = site.run_process()
    assert wait_for(lambda: "revision 1 loaded" in log.read_text() or proc.poll() is not None, HANG)
    assert proc.poll() is None, log.read_text()
    proc.send_signal(signal.SIGHUP)
    said = f"policy {site.policy} read again on SIGHUP: unchanged; keeping revision 1"
    assert wait_for(lambda: said in log.read_text() or proc.poll() is not None, HANG)
    assert proc.poll() is None and said in log.read_text(), log.read_text()
    site.policy.write_text(POLICY.replace("max 60%", "max 50%"))
    proc.send_signal(signal.SIGHUP)  # whatever notices this save first, the controller loads it once
    assert wait_for(lambda: "revision 2 loaded" in log.read_text() or proc.poll() is not None, HANG)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG) == 0, log.read_text()
    assert "revision 3" not in log.read_text()


@pytest.mark.parametrize("level", ["INFO", "ERROR"])
def test_a_refused_start_shows_the_first_error_once_with_its_line_and_caret(site, level):
    site.policy.write_text(BAD)
    proc, log = site.run_process("--log-level", level)
    assert proc.wait(timeout=HANG) == 1
    err = log.read_text()
    assert err.count(f"{site.policy}:3:49: KV001 error: unknown unit 'GiBB'") == 1, err
    lines = err.splitlines()
    at = lines.index(f"{site.policy}:3:49: KV001 error: unknown unit 'GiBB'")
    assert lines[at + 1] == '   3 | model "chat" { priority 100; min 10 GiB; max 60 GiBB; weight 300 }'
    assert lines[at + 2] == "     |" + " " * 49 + "^^^^"
    assert lines[-1] == f"kvpolicy run: no valid policy at start, so not starting (kvpolicy lint {site.policy} lists every finding)"


def run_once_json(site, *args: str) -> subprocess.CompletedProcess[str]:
    return kvpolicy_run(str(site.policy), "--once", "--format", "json", "--gpu-capacity", "80GiB",
                        "--ledger-dir", str(site.ledger_dir), *args, cwd=site.policy.parent)


@pytest.mark.parametrize(("make", "status", "said"), [
    (lambda p: p.write_text(BAD), 1, ":3:49: KV001 error: unknown unit 'GiBB'"),
    (lambda p: p.unlink(), 1, "the policy file does not exist"),
    (lambda p: (p.unlink(), os.mkfifo(p)), 2, FIFO),
], ids=["invalid", "missing", "fifo"])
def test_run_once_format_json_prints_an_error_document_on_failure(site, make, status, said):
    """docs/json.md: a command whose JSON is one document prints an error document when it fails."""
    make(site.policy)
    try:
        done = run_once_json(site)
    finally:
        release_a_blocked_reader(site.policy)
    assert done.returncode == status, done.stderr
    document = json.loads(done.stdout)  # the whole of stdout: one document
    error = document["error"]
    assert document == {"schema": 1, "error": {"status": status, "message": error["message"],
                                               "diagnostics": error["diagnostics"], "more": 0}}
    assert said in error["message"] and said in done.stderr
    # the policy's error with its place and code; a file that cannot be read has none
    expected = [("KV001", 3, 49)] if status == 1 and "KV001" in said else []
    assert [(d["code"], d["line"], d["col"]) for d in error["diagnostics"]] == expected


def test_run_once_format_json_still_prints_the_decision(site):
    done = run_once_json(site)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == 1 and "error" not in document and "gpus" in document


def test_a_ledger_directory_that_cannot_be_made_is_worded_as_a_path_error(tmp_path, capsys):
    """Not ``[Errno 20] Not a directory: '...'``: the path, what could not be done, and why."""
    policy = tmp_path / "p.kvp"
    policy.write_text(POLICY)
    cases = [
        (policy / "ledger", f"kvpolicy run: {policy / 'ledger'}: cannot use it as the ledger directory: Not a directory"),
        (tmp_path / "nowhere" / "ledger",
         f"kvpolicy run: {tmp_path / 'nowhere' / 'ledger'}: cannot create the ledger directory: "
         f"{tmp_path / 'nowhere'} does not exist (only the last name is created)"),
    ]
    if os.path.isdir("/proc/self"):  # procfs: mkdir there fails with ENOENT though /proc exists
        cases.append((Path("/proc/x"), "kvpolicy run: /proc/x: cannot use it as the ledger directory: "
                                       "No such file or directory"))
    for ledger, said in cases:
        assert main(["run", str(policy), "--once", "--gpu-capacity", "80GiB", "--ledger-dir", str(ledger)]) == 1
        err = capsys.readouterr().err
        assert said in err.splitlines() and "Errno" not in err, err
