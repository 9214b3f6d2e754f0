"""The controller with real files, a real ledger and real engine processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.runtime.controller import Controller, ControllerConfig
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.endpoints import serve
from kvpolicy.runtime.gpus import StaticSampler
from kvpolicy.runtime.status import read_status
from kvpolicy.runtime.values import SlotView
from tests.controller.site import POLICY, GiB, http_get, wait_for

RECLAIM_UNLESS_WAITING = """
rule "idle-reclaim" {
  when model.used < 1 GiB and model.waiting == 0
  shrink to min
  grace 0s
  cooldown 1h
}
"""


def test_engines_get_limits_and_a_policy_save_moves_them(site):
    site.controller()
    site.engine("chat"), site.engine("batch")
    # A = 80 - 2 = 78. chat: g 10, l = min(48, 78 - 4) = 48. batch: g 4, l = 78 - 10 = 68.
    assert wait_for(lambda: (s := site.slot("chat/0")) and s.limit == 48 * GiB)
    assert wait_for(lambda: site.slot("batch/0").limit == 68 * GiB)
    assert wait_for(lambda: site.slot("chat/0").ack_revision == site.slot("chat/0").revision)
    site.policy.write_text(POLICY.replace("min 10 GiB", "min 20 GiB"))
    # batch: l = 78 - 20 = 58
    assert wait_for(lambda: site.slot("batch/0").limit == 58 * GiB)
    status = wait_for(lambda: (st := read_status(site.ledger_dir)) and st.policy.revision == 2 and st)
    assert status and status.last_reload.ok
    assert {i.id for i in status.instances} == {"chat/0", "batch/0"}


def test_a_shrink_on_low_use_ends_when_the_engine_reports_work_waiting(site):
    """The ledger's ``waiting`` through the running controller: an idle engine is shrunk to its min on
    low use; once it reports a refused growth (a request that needs more than the shrink leaves, as its
    pool's sync reports it) the controller's next decision ends the shrink and publishes the limit back."""
    from kvpolicy.runtime.client import attach

    site.policy.write_text(POLICY + RECLAIM_UNLESS_WAITING)
    site.controller()
    site.engine("chat")
    batch = attach(model="batch", gpu="cuda:0", ledger_dir=site.ledger_dir, elastic=True, id="batch/0",
                   handle_signals=False)
    try:
        batch.limit_source().report(0, 0, 0)  # nothing in use, nothing waits: the rule shrinks it to its min
        assert wait_for(lambda: site.slot("batch/0").limit == 4 * GiB)
        batch.report(0, 0, 6 * GiB)  # a 6 GiB prompt was refused at the 4 GiB limit
        assert site.slot("batch/0").waiting == 6 * GiB
        assert wait_for(lambda: site.slot("batch/0").limit == 68 * GiB)  # A 78 - chat's 10 GiB guarantee
    finally:
        batch.detach()


def test_a_rejected_policy_keeps_the_limits_and_status_names_the_error(site, capsys):
    controller = site.controller()
    site.engine("chat")
    assert wait_for(lambda: site.slot("chat/0").limit == 48 * GiB)
    revision = site.slot("chat/0").revision
    site.policy.write_text(POLICY.replace("max 60%", "max 60 GiBB"))
    assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.last_reload and not s.last_reload.ok)
    status = read_status(site.ledger_dir)
    error = status.last_reload.error
    assert (error.line, error.col, error.code) == (3, 49, "KV001") and "GiBB" in error.message
    assert error.hint == "did you mean 'GiB'?"
    assert status.policy.revision == 1
    site.after_steps(controller)
    assert site.slot("chat/0").limit == 48 * GiB and site.slot("chat/0").revision == revision
    assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 1  # needs attention
    out = capsys.readouterr().out
    assert "last reload: FAILED" in out and ":3:49: KV001" in out and "\n  hint: did you mean 'GiB'?\n" in out
    site.policy.unlink()
    assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.last_reload.error.line == 0)
    assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 1
    assert "last reload: FAILED" in (out := capsys.readouterr().out) and f": {site.policy}: " in out, out


def test_a_killed_engine_is_reclaimed_within_one_tick(site):
    controller = site.controller()
    chat = site.engine("chat")
    site.engine("batch")
    assert wait_for(lambda: site.slot("batch/0").limit == 68 * GiB)
    reclaims: list[int] = []  # per step of the controller, in order: the slots it reclaimed
    reclaim_dead = controller.ledger.reclaim_dead

    def counted_reclaim() -> list[SlotView]:
        gone = reclaim_dead()
        reclaims.append(len(gone))
        return gone

    controller.ledger.reclaim_dead = counted_reclaim
    # A step under way at the line above may have called the uncounted method, and could reclaim the
    # slot unseen: once a counted call has returned, that step is over and every later one counts.
    assert wait_for(lambda: reclaims)
    os.kill(chat.pid, signal.SIGKILL)
    chat.wait()
    steps_before_death = len(reclaims)
    # Wait for the reclaim itself (counted after it returns), not for what follows from the death: a
    # read already leaves a dead engine out, so chat/0 vanishes from reads and batch may get 78 GiB
    # from the step that saw the death, a step before the one that frees the slot.
    assert wait_for(lambda: controller.metrics.reclaimed._value.get() >= 1)
    with LedgerDir(site.ledger_dir) as ledger:
        view = ledger.read()
    assert view.find("chat/0") is None and not any(g.dead for g in view.gpus.values()), "the slot is free"
    # chat's guarantee goes back: batch may take 78 GiB.
    assert wait_for(lambda: site.slot("batch/0").limit == 78 * GiB)
    assert controller.metrics.reclaimed._value.get() == 1
    # Counted in steps, not seconds: the step under way at the death, or the next one, reclaimed it.
    (reclaimed_by,) = [i for i, n in enumerate(reclaims) if n]
    assert reclaimed_by <= steps_before_death + 1, reclaims


def test_observe_computes_without_publishing(site):
    controller = site.controller(observe=True)
    site.engine("chat")
    assert wait_for(lambda: controller.decision is not None and controller.decision.instances)
    assert controller.decision.instance("chat/0").limit == 48 * GiB
    site.after_steps(controller)
    s = site.slot("chat/0")
    assert (s.revision, s.limit) == (0, 0)  # nothing published: the limit is the attach guarantee (0)
    status = read_status(site.ledger_dir)
    assert status.controller.observe and status.instances[0].limit == 48 * GiB


def test_restart_continues_above_the_published_revision_and_engines_keep_limits(site):
    site.controller()
    site.engine("chat")
    assert wait_for(lambda: site.slot("chat/0").limit == 48 * GiB)
    old_revision = site.slot("chat/0").revision
    site.stop_controllers()  # joined: no controller writes from here on
    assert site.slot("chat/0").limit == 48 * GiB  # the controller is gone; the limit stays
    site.policy.write_text(POLICY.replace("max 60%", "max 50%"))
    site.controller()
    assert wait_for(lambda: site.slot("chat/0").limit == 40 * GiB)
    assert site.slot("chat/0").revision > old_revision


def test_one_controller_per_ledger(site):
    from kvpolicy.runtime.errors import LedgerError

    site.controller()
    second = Controller(ControllerConfig(policy=site.policy), LedgerDir(site.ledger_dir), StaticSampler(80 * GiB))
    with pytest.raises(LedgerError, match="another controller"):
        second.once()


def test_metrics_endpoint(site):
    controller = site.controller()
    site.engine("chat")
    server, _ = serve("127.0.0.1", 0, controller.metrics.registry)
    try:
        assert wait_for(lambda: site.slot("chat/0").limit == 48 * GiB)
        limit_line = 'kvpolicy_instance_limit_bytes{engine="any",gpu="cuda:0",instance="chat/0",model="chat"} 5.1539607552e+10'
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        # The gauges are set after the publish: the scrape that shows the limit shows the rest of that step.
        text = wait_for(lambda: limit_line in (t := http_get(url)[1]) and t, timeout=120)
    finally:
        server.shutdown()
    assert 'kvpolicy_gpu_elastic_budget_bytes{gpu="cuda:0"} 8.3751862272e+10' in text
    assert limit_line in text
    assert "kvpolicy_evaluation_seconds_count" in text
    assert 'kvpolicy_policy_reloads_total{result="ok"}' in text
    assert 'kvpolicy_gpu_elastic_refusals_total{gpu="cuda:0"} 0.0' in text


def test_run_once_as_a_command(site):
    command = [sys.executable, "-m", "kvpolicy.cli", "run", str(site.policy), "--ledger-dir", str(site.ledger_dir),
               "--gpu-capacity", "80GiB", "--once"]
    out = subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema"] == 1
    site.policy.write_text("version 1\nmodel \"a\" { min 4 GiBB }\n")
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "policy.kvp:2:19: KV001" in out.stderr


def test_top_and_status_show_the_live_ledger(site, capsys):
    site.controller()
    site.engine("chat")
    assert wait_for(lambda: site.slot("chat/0").limit == 48 * GiB)
    assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.instances)
    assert main(["top", "--ledger-dir", str(site.ledger_dir), "--iterations", "2", "--interval", "0.05"]) == 0
    screen = capsys.readouterr().out
    assert screen.count("kvpolicy top") == 2
    assert "cuda:0   [##" in screen and "80 GiB" in screen  # the bar starts with the 2 GiB headroom
    assert "chat/0" in screen and "48 GiB" in screen
    # --format json: JSON Lines, one status document per refresh (docs/json.md)
    assert main(["top", "--ledger-dir", str(site.ledger_dir), "--iterations", "2", "--interval", "0.05",
                 "--format", "json"]) == 0
    refreshes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(refreshes) == 2 and all(r["schema"] == 1 and r["instances"][0]["id"] == "chat/0" for r in refreshes)
    assert main(["status", "--ledger-dir", str(site.ledger_dir), "--format", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["schema"] == 1 and status["policy"]["revision"] == 1
    (inst,) = status["instances"]
    assert (inst["id"], inst["limit"], inst["elastic"]["used"]) == ("chat/0", 48 * GiB, 0)
    assert status["gpus"][0]["elastic_budget"] == 78 * GiB


def test_a_removed_lock_file_is_locked_again_and_a_second_controller_still_refused(site):
    first, log = site.run_process()
    lock = site.ledger_dir / "controller.lock"
    assert wait_for(lambda: read_status(site.ledger_dir) is not None)
    lock.unlink()
    assert wait_for(lambda: "was removed while this controller ran; it locked a new one" in log.read_text()), log.read_text()
    second, second_log = site.run_process()
    assert second.wait(120) == 1
    assert "another controller (pid" in second_log.read_text()
    assert first.poll() is None, "the first controller goes on"
    first.send_signal(signal.SIGTERM)
    assert first.wait(120) == 0


def test_a_ledger_directory_made_again_is_read_afresh_and_the_old_segments_let_go_of(site):
    """``rm -rf`` of the ledger under a running controller: it kept the removed segments mapped, and
    went on reading the removed ``cuda:0.ledger`` in place of the new directory's file of that name,
    so an engine attached there got no limits."""
    controller, log = site.run_process()
    old = site.engine("chat")
    assert wait_for(lambda: (v := site.slot("chat/0")) and v.pid == old.pid and v.limit == 48 * GiB)
    segment = site.ledger_dir / "cuda:0.ledger"
    maps = Path(f"/proc/{controller.pid}/maps")
    assert str(segment) in maps.read_text()

    first = os.stat(site.ledger_dir).st_ino

    def removed():  # the controller may write its status there while it goes: until that directory is gone
        shutil.rmtree(site.ledger_dir, ignore_errors=True)
        try:
            return os.stat(site.ledger_dir).st_ino != first  # the controller made it again already
        except FileNotFoundError:
            return True

    assert wait_for(removed)
    new = site.engine("chat")  # the same instance id on the same GPU, in a new segment of the same name
    assert wait_for(lambda: (v := site.slot("chat/0")) and v.pid == new.pid and v.limit == 48 * GiB), log.read_text()
    assert f"{segment} (deleted)" not in maps.read_text(), "the controller still maps the removed segment"
    assert not any(os.readlink(f) == f"{segment} (deleted)" for f in Path(f"/proc/{controller.pid}/fd").iterdir()
                   if f.is_symlink())
    status = wait_for(lambda: (s := read_status(site.ledger_dir)) and s.instances and s)
    assert [(i.id, i.pid) for i in status.instances] == [("chat/0", new.pid)]
    assert wait_for(lambda: (site.ledger_dir / "state.json").exists()), "the rules' memory is written there again"
    assert controller.poll() is None
    controller.send_signal(signal.SIGTERM)
    assert controller.wait(120) == 0
    assert log.read_text().count(f"the ledger directory {site.ledger_dir} was removed") == 1, log.read_text()


def test_a_controller_whose_lock_was_taken_over_stops(site):
    first, log = site.run_process()
    lock = site.ledger_dir / "controller.lock"
    assert wait_for(lambda: read_status(site.ledger_dir) is not None)
    ledger = LedgerDir(site.ledger_dir)

    def take_over():  # remove the lock and lock a new file before the first controller does
        from kvpolicy.runtime.errors import ControllerRunning

        lock.unlink(missing_ok=True)
        try:
            return ledger.claim_controller()
        except ControllerRunning:
            return None  # it locked the new file first: remove that one too

    mine = wait_for(take_over)
    try:
        assert first.wait(120) == 1
        text = log.read_text()
        assert "was removed under this controller and another controller" in text and f"(pid {os.getpid()})" in text
    finally:
        mine.release()


def test_a_start_refused_for_its_policy_is_what_status_shows(site, capsys):
    first, _ = site.run_process()
    assert wait_for(lambda: read_status(site.ledger_dir) is not None)
    first.send_signal(signal.SIGTERM)
    assert first.wait(120) == 0
    site.policy.write_text("version 1\nmodel \"a\" { min 4 GiBB }\n")
    second, _ = site.run_process()
    assert second.wait(120) == 1
    assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 1
    out = capsys.readouterr().out
    assert f"controller: pid {second.pid}, stopped" in out, "the refused start, not the clean stop before it"
    assert "last reload: FAILED" in out and "policy.kvp:2:19: KV001" in out


def test_status_knows_at_once_that_a_controller_died(site, capsys):
    controller, _ = site.run_process()
    assert wait_for(lambda: (s := read_status(site.ledger_dir)) and s.controller.pid == controller.pid)
    assert main(["status", "--ledger-dir", str(site.ledger_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["controller"]["running"] is True
    controller.kill()
    controller.wait()
    # a long --stale-after: the heartbeat alone would say it is fine for an hour
    assert main(["status", "--ledger-dir", str(site.ledger_dir), "--stale-after", "3600"]) == 1
    out = capsys.readouterr().out
    assert f"controller: pid {controller.pid}, heartbeat" in out and "(NOT RUNNING)" in out
    assert f"ATTENTION: controller pid {controller.pid} is not running: it ended without a clean stop" in out


def test_a_status_file_that_cannot_be_written_is_logged_once(site, caplog, monkeypatch):
    import logging

    from kvpolicy.runtime import controller as controller_module

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    caplog.set_level(logging.INFO, logger="kvpolicy.controller")
    monkeypatch.setattr(controller_module, "write_status", refuse)
    controller = site.controller()
    site.after_steps(controller, 4)
    failures = [r for r in caplog.records if r.getMessage().startswith("cannot write the status file")]
    assert len(failures) == 1 and "No space left on device" in failures[0].getMessage()
    monkeypatch.undo()
    assert wait_for(lambda: any(r.getMessage() == "the status file is written again" for r in caplog.records))
