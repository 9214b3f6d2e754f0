"""``kvpolicy run`` started while the policy is being saved: the start waits for the save
(``--start-wait``) instead of refusing a half-written file, and a policy that stays broken is
refused with the diagnostic and the exit status a start without the wait gives.

Real processes, files and watchdog. Where the save must land inside the wait, the wait is an
hour and the test completes the save once the controller says it is waiting, so no machine is
too slow for it; every other wait is on a condition, bounded only to catch a hang.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal

import pytest

from kvpolicy.runtime.status import read_status
from tests.controller.site import POLICY, wait_for
from tests.controller.test_run_policy_path import BAD, HANG, run_once_json

FOREVER = "3600"  # the longest --start-wait: a save the test completes always lands inside it
WAITING = "cannot be loaded as it is now"
HALF = POLICY[: POLICY.index("min 10 GiB") + len("min 10 G")]  # cut inside a block: it does not lint


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("save", ["in place, half written", "in place, truncated", "renamed into place"])
def test_a_start_that_catches_a_save_half_way_runs_with_the_saved_policy(site, save):
    """Editors truncate and write, or write a temporary file and rename it: a controller started
    between the two steps used to refuse to start (exit 1) with a syntax error or a missing file."""
    writer = None
    if save == "renamed into place":
        site.policy.unlink()
        why = "the policy file does not exist"
    else:
        writer = open(site.policy, "w")  # noqa: SIM115 - held open across the start, as a slow save would
        writer.write(HALF if save == "in place, half written" else "")
        writer.flush()
        why = "KV" if save == "in place, half written" else "KV003 at 1:1"  # an empty file has no version
    try:
        proc, log = site.run_process("--start-wait", FOREVER)
        assert wait_for(lambda: WAITING in log.read_text() or proc.poll() is not None, HANG), log.read_text()
        assert proc.poll() is None, log.read_text()
        assert f"{WAITING} ({why}" in log.read_text() and "watching it up to 3600s" in log.read_text()
        if writer is not None:
            writer.write(POLICY[len(HALF):] if save == "in place, half written" else POLICY)
            writer.close()  # the close-write ends the save
        else:
            temporary = site.policy.with_name(".policy.kvp.tmp")
            temporary.write_text(POLICY)
            os.replace(temporary, site.policy)
        assert wait_for(lambda: "revision 1 loaded" in log.read_text() or proc.poll() is not None, HANG), log.read_text()
        status = wait_for(lambda: (s := read_status(site.ledger_dir)) and s.controller.pid == proc.pid
                          and s.policy and s, HANG)
        assert status and status.policy.sha256 == sha256(POLICY) and status.controller.stopped_at is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG) == 0, log.read_text()
        text = log.read_text()
        assert " ERROR " not in text and "no valid policy" not in text, text  # a save under way is no error
    finally:
        if writer is not None and not writer.closed:
            writer.close()


def without_times(text: str) -> list[str]:
    """The log's lines without their timestamps."""
    return [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", line) for line in text.splitlines()]


def test_a_broken_policy_that_does_not_change_is_refused_as_without_the_wait(site):
    """The same lines and exit status as ``--start-wait 0``, the refusal at once (the behaviour before
    the wait), once the default wait (2 s) is over; at INFO the wait says why it waits, once."""
    site.policy.write_text(BAD)
    refusals = []
    for wait in (("--start-wait", "0"), ()):
        proc, log = site.run_process("--log-level", "ERROR", *wait)
        assert proc.wait(timeout=HANG) == 1
        refusals.append(without_times(log.read_text()))
    assert refusals[0] == refusals[1], refusals
    assert refusals[1][-1] == f"kvpolicy run: no valid policy at start, so not starting (kvpolicy lint {site.policy} lists every finding)"
    proc, log = site.run_process()
    assert proc.wait(timeout=HANG) == 1
    text = log.read_text()
    assert text.count(WAITING) == 1 and f"{WAITING} (KV001 at 3:49); watching it up to 2s" in text, text
    assert text.count(f"{site.policy}:3:49: KV001 error: unknown unit 'GiBB'") == 1, text
    assert text.index(WAITING) < text.index(" ERROR "), "information while it waits, the error once it gives up"


def test_a_stop_while_the_start_waits_ends_the_wait(site):
    site.policy.unlink()
    proc, log = site.run_process("--start-wait", FOREVER)
    assert wait_for(lambda: WAITING in log.read_text() or proc.poll() is not None, HANG), log.read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG) == 1, log.read_text()  # HANG is far below the hour it would otherwise wait
    text = log.read_text()
    assert f"policy {site.policy}: the policy file does not exist; no policy in force" in text
    assert text.splitlines()[-1] == "kvpolicy run: no valid policy at start, so not starting"


def test_run_once_reads_the_policy_once_without_waiting(site):
    site.policy.write_text(BAD)
    done = run_once_json(site, "--start-wait", FOREVER)  # ended within HANG, far below the hour
    assert done.returncode == 1, done.stderr
    assert WAITING not in done.stderr and ":3:49: KV001 error: unknown unit 'GiBB'" in done.stderr


@pytest.mark.parametrize("value", ["-1", "3601", "nan", "soon"])
def test_a_start_wait_out_of_range_is_a_usage_error(site, value, capsys):
    from kvpolicy.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", str(site.policy), "--start-wait", value])
    assert exc.value.code == 2 and "--start-wait" in capsys.readouterr().err
