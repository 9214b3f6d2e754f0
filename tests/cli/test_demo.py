"""``kvpolicy demo``: a real controller and simulated engines, seen through ``kvpolicy status``
as an operator would, and all of them stopped at Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.processes import read_line

pytest.importorskip("watchdog")  # the controller's extra


def status(ledger) -> dict | None:
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "status", "--ledger-dir", str(ledger), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_demo_shows_instances_in_status_and_stops_everything(tmp_path):
    ledger = tmp_path / "ledger"
    demo = subprocess.Popen([sys.executable, "-m", "kvpolicy.cli", "demo", "--ledger-dir", str(ledger),
                             "--metrics-address", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "Ctrl-C stops it.\n":
            line = read_line(demo)
            assert line, (lines, demo.stderr.read())
            lines.append(line)
        assert f"  kvpolicy status --ledger-dir {ledger}\n" in lines
        # Until the controller has published for all three engines (the guard only catches a hang).
        guard = time.monotonic() + 300
        seen = None
        while time.monotonic() < guard:
            seen = status(ledger)
            instances = {i["id"]: i for i in (seen or {}).get("instances", [])}
            if len(instances) == 3 and all(i["limit"] for i in instances.values()) and seen["controller"]:
                break
            time.sleep(0.5)
        assert set(instances) == {"chat/0", "batch-summarize/0", "batch-embed/0"}, seen
        # The policy is the file the demo named, in a directory of its own: nothing beside the ledger.
        (policy,) = [line.split("; policy ", 1)[1].strip() for line in lines if "; policy " in line]
        assert seen["policy"]["file"] == policy and os.path.dirname(policy) != str(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger"]
        controller_pid = seen["controller"]["pid"]
        # top on an 80-column terminal: bars, legends and the instance table fit.
        top = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "top", "--ledger-dir", str(ledger), "--iterations", "1"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
        assert top.returncode == 0, top.stderr
        screen = [line for line in top.stdout.splitlines() if not line.startswith("policy ")]  # it names a temp path
        assert any(line.startswith("cuda:0   [") for line in screen) and "chat/0" in top.stdout
        assert max(len(line) for line in screen) <= 80, top.stdout
    finally:
        demo.send_signal(signal.SIGINT)
        code = demo.wait(timeout=120)
    assert code == 0, demo.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(controller_pid, 0)
