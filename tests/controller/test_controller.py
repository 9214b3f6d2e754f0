"""The controller with real files, a real ledger and real engine processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.runtime.controller import Controller, ControllerConfig
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.gpus import StaticSampler
from kvpolicy.runtime.metrics import ControllerMetrics
from kvpolicy.runtime.status import read_status

GiB = 1 << 30
POLICY = """version 1
defaults { headroom 2 GiB }
model "chat" { priority 100; min 10 GiB; max 60%; weight 300 }
model "batch" { priority 10; min 4 GiB; weight 100 }
"""

ENGINE = textwrap.dedent("""
    import sys, time, kvpolicy
    model, ledger = sys.argv[1], sys.argv[2]
    inst = kvpolicy.attach(model=model, gpu="cuda:0", ledger_dir=ledger, elastic=True, id=model + "/0")
    print("attached", flush=True)
    last = None
    while True:  # an engine's loop: apply each new revision and say so
        reading = inst.read()
        if reading != last:
            last = reading
            inst.acknowledge(reading.revision, "applied")
        time.sleep(0.002)
""")


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    return predicate()


@pytest.fixture()
def setup(tmp_path):
    policy = tmp_path / "policy.kvp"
    policy.write_text(POLICY)
    ledger_dir = tmp_path / "ledger"
    return policy, ledger_dir


def start_controller(policy: Path, ledger_dir: Path, **config):
    ledger = LedgerDir(ledger_dir, create=True)
    metrics = ControllerMetrics()
    controller = Controller(ControllerConfig(policy=policy, tick=0.2, **config), ledger, StaticSampler(80 * GiB), metrics)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    assert wait_for(lambda: controller.decision is not None or controller.watcher.last_reload is not None)
    return controller, stop, thread


def start_engine(model: str, ledger_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, model, str(ledger_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "attached"
    return proc


def slot(ledger_dir: Path, instance: str):
    view = LedgerDir(ledger_dir).read()
    return view.find(instance)


def test_engines_get_limits_and_a_policy_save_moves_them(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat, batch = start_engine("chat", ledger_dir), start_engine("batch", ledger_dir)
    try:
        # A = 80 - 2 = 78. chat: g 10, l = min(48, 78 - 4) = 48. batch: g 4, l = 78 - 10 = 68.
        assert wait_for(lambda: (s := slot(ledger_dir, "chat/0")) and s.limit == 48 * GiB)
        assert wait_for(lambda: slot(ledger_dir, "batch/0").limit == 68 * GiB)
        assert wait_for(lambda: slot(ledger_dir, "chat/0").ack_revision == slot(ledger_dir, "chat/0").revision)
        policy.write_text(POLICY.replace("min 10 GiB", "min 20 GiB"))
        # batch: l = 78 - 20 = 58
        assert wait_for(lambda: slot(ledger_dir, "batch/0").limit == 58 * GiB)
        status = wait_for(lambda: (st := read_status(ledger_dir)) and st.policy.revision == 2 and st)
        assert status and status.last_reload.ok
        assert {i.id for i in status.instances} == {"chat/0", "batch/0"}
    finally:
        stop.set()
        thread.join(5)
        for p in (chat, batch):
            p.kill()
            p.wait()


def test_a_rejected_policy_keeps_the_limits_and_status_names_the_error(setup, capsys):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat = start_engine("chat", ledger_dir)
    try:
        assert wait_for(lambda: slot(ledger_dir, "chat/0").limit == 48 * GiB)
        revision = slot(ledger_dir, "chat/0").revision
        policy.write_text(POLICY.replace("max 60%", "max 60 GiBB"))
        assert wait_for(lambda: (s := read_status(ledger_dir)) and s.last_reload and not s.last_reload.ok)
        status = read_status(ledger_dir)
        error = status.last_reload.error
        assert (error.line, error.col, error.code) == (3, 49, "KV001") and "GiBB" in error.message
        assert status.policy.revision == 1
        time.sleep(0.3)
        assert slot(ledger_dir, "chat/0").limit == 48 * GiB and slot(ledger_dir, "chat/0").revision == revision
        assert main(["status", "--ledger-dir", str(ledger_dir)]) == 1  # needs attention
        out = capsys.readouterr().out
        assert "last reload: FAILED" in out and ":3:49: KV001" in out
    finally:
        stop.set()
        thread.join(5)
        chat.kill()
        chat.wait()


def test_a_killed_engine_is_reclaimed_within_one_tick(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat, batch = start_engine("chat", ledger_dir), start_engine("batch", ledger_dir)
    try:
        assert wait_for(lambda: slot(ledger_dir, "batch/0").limit == 68 * GiB)
        os.kill(chat.pid, signal.SIGKILL)
        chat.wait()
        # chat's guarantee goes back: batch may take 78 GiB.
        assert wait_for(lambda: slot(ledger_dir, "chat/0") is None, timeout=1.0)
        assert wait_for(lambda: slot(ledger_dir, "batch/0").limit == 78 * GiB, timeout=1.0)
        assert controller.metrics.reclaimed._value.get() == 1
    finally:
        stop.set()
        thread.join(5)
        batch.kill()
        batch.wait()


def test_observe_computes_without_publishing(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir, observe=True)
    chat = start_engine("chat", ledger_dir)
    try:
        assert wait_for(lambda: controller.decision is not None and controller.decision.instances)
        assert controller.decision.instance("chat/0").limit == 48 * GiB
        time.sleep(0.3)
        s = slot(ledger_dir, "chat/0")
        assert (s.revision, s.limit) == (0, 0)  # nothing published: the limit is the attach guarantee (0)
        status = read_status(ledger_dir)
        assert status.controller.observe and status.instances[0].limit == 48 * GiB
    finally:
        stop.set()
        thread.join(5)
        chat.kill()
        chat.wait()


def test_restart_continues_above_the_published_revision_and_engines_keep_limits(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat = start_engine("chat", ledger_dir)
    try:
        assert wait_for(lambda: slot(ledger_dir, "chat/0").limit == 48 * GiB)
        old_revision = slot(ledger_dir, "chat/0").revision
        stop.set()
        thread.join(5)
        time.sleep(0.2)
        assert slot(ledger_dir, "chat/0").limit == 48 * GiB  # the controller is gone; the limit stays
        policy.write_text(POLICY.replace("max 60%", "max 50%"))
        controller, stop, thread = start_controller(policy, ledger_dir)
        assert wait_for(lambda: slot(ledger_dir, "chat/0").limit == 40 * GiB)
        assert slot(ledger_dir, "chat/0").revision > old_revision
    finally:
        stop.set()
        thread.join(5)
        chat.kill()
        chat.wait()


def test_one_controller_per_ledger(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    try:
        second = Controller(ControllerConfig(policy=policy), LedgerDir(ledger_dir), StaticSampler(80 * GiB))
        from kvpolicy.runtime.errors import LedgerError

        with pytest.raises(LedgerError, match="another controller"):
            second.once()
    finally:
        stop.set()
        thread.join(5)


def test_metrics_endpoint(setup):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat = start_engine("chat", ledger_dir)
    server, _ = controller.metrics.serve(0, addr="127.0.0.1")
    port = server.server_port
    try:
        assert wait_for(lambda: slot(ledger_dir, "chat/0").limit == 48 * GiB)
        controller._wake.set()
        time.sleep(0.3)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'kvpolicy_gpu_elastic_budget_bytes{gpu="cuda:0"} 8.3751862272e+10' in text
        assert 'kvpolicy_instance_limit_bytes{engine="any",gpu="cuda:0",instance="chat/0",model="chat"} 5.1539607552e+10' in text
        assert "kvpolicy_evaluation_seconds_count" in text
        assert 'kvpolicy_policy_reloads_total{result="ok"}' in text
    finally:
        server.shutdown()
        stop.set()
        thread.join(5)
        chat.kill()
        chat.wait()


def test_run_once_as_a_command(setup, tmp_path):
    policy, ledger_dir = setup
    out = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(policy), "--ledger-dir", str(ledger_dir),
         "--gpu-capacity", "80GiB", "--once", "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema"] == 1
    policy.write_text("version 1\nmodel \"a\" { min 4 GiBB }\n")
    out = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(policy), "--ledger-dir", str(ledger_dir),
         "--gpu-capacity", "80GiB", "--once"], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1 and "policy.kvp:2:19: KV001" in out.stderr


def test_top_and_status_show_the_live_ledger(setup, capsys):
    policy, ledger_dir = setup
    controller, stop, thread = start_controller(policy, ledger_dir)
    chat = start_engine("chat", ledger_dir)
    try:
        assert wait_for(lambda: slot(ledger_dir, "chat/0").limit == 48 * GiB)
        assert wait_for(lambda: (s := read_status(ledger_dir)) and s.instances)
        assert main(["top", "--ledger-dir", str(ledger_dir), "--iterations", "2", "--interval", "0.05"]) == 0
        screen = capsys.readouterr().out
        assert screen.count("kvpolicy top") == 2
        assert "cuda:0   [##" in screen and "80 GiB" in screen  # the bar starts with the 2 GiB headroom
        assert "chat/0" in screen and "48 GiB" in screen
        assert main(["status", "--ledger-dir", str(ledger_dir), "--format", "json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["schema"] == 1 and status["policy"]["revision"] == 1
        (inst,) = status["instances"]
        assert (inst["id"], inst["limit"], inst["elastic"]["used"]) == ("chat/0", 48 * GiB, 0)
        assert status["gpus"][0]["elastic_budget"] == 78 * GiB
    finally:
        stop.set()
        thread.join(5)
        chat.kill()
        chat.wait()
