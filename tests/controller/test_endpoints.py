"""The controller's HTTP endpoints (/metrics, /healthz, /readyz) and ``--metrics-address``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from kvpolicy.cli import build_parser, main
from kvpolicy.commands import run as run_command
from kvpolicy.runtime.controller import Controller
from kvpolicy.runtime.health import ControllerHealth
from tests.controller.site import POLICY, http_get, wait_for


def probe(url: str) -> tuple[int, dict[str, dict]]:
    """Status code and the checks of a probe, by name."""
    code, body = http_get(url)
    answer = json.loads(body)
    checks = {c["name"]: c for c in answer["checks"]}
    assert answer["ok"] == (code == 200) == all(c["ok"] for c in checks.values())
    return code, checks


def test_ready_only_with_a_valid_policy_and_it_follows_reloads(site):
    site.policy.write_text(POLICY.replace("max 60%", "max 60 GiBB"))
    controller = site.controller()
    base = site.serve(controller)
    code, checks = probe(f"{base}/readyz")
    assert code == 503 and not checks["policy"]["ok"]
    assert "no valid policy loaded" in checks["policy"]["detail"] and ":3:49: KV001" in checks["policy"]["detail"]
    assert checks["ledger"]["ok"] and checks["gpu_figures"]["ok"]
    assert probe(f"{base}/healthz")[0] == 200  # a bad policy is not cured by a restart
    assert "kvpolicy_policy_last_reload_successful 0.0" in http_get(f"{base}/metrics")[1]

    site.policy.write_text(POLICY)  # hot reload: ready without a restart
    assert wait_for(lambda: probe(f"{base}/readyz")[0] == 200)
    assert "revision 1" in probe(f"{base}/readyz")[1]["policy"]["detail"]
    assert wait_for(lambda: "kvpolicy_policy_last_reload_successful 1.0" in http_get(f"{base}/metrics")[1])

    site.policy.write_text(POLICY.replace("max 60%", "max 60 GiBB"))  # rejected: the last good one stays in force
    assert wait_for(lambda: "rejected" in probe(f"{base}/readyz")[1]["policy"]["detail"])
    code, checks = probe(f"{base}/readyz")
    assert code == 200 and "revision 1" in checks["policy"]["detail"]
    # The watcher records the rejection (what /readyz reads) just before it tells the metrics.
    assert wait_for(lambda: "kvpolicy_policy_last_reload_successful 0.0" in http_get(f"{base}/metrics")[1])


def test_not_ready_when_the_ledger_directory_becomes_unsafe(site):
    base = site.serve(site.controller())
    assert probe(f"{base}/readyz")[0] == 200
    site.ledger_dir.chmod(0o777)
    try:
        code, checks = probe(f"{base}/readyz")
    finally:
        site.ledger_dir.chmod(0o700)
    assert code == 503 and not checks["ledger"]["ok"] and "writable by every user" in checks["ledger"]["detail"]
    assert probe(f"{base}/readyz")[0] == 200


def test_not_ready_without_a_source_of_gpu_figures(site):
    base = site.serve(site.controller(sampler=None))
    code, checks = probe(f"{base}/readyz")
    assert code == 503 and checks["policy"]["ok"] and checks["ledger"]["ok"]
    assert "no source of GPU figures" in checks["gpu_figures"]["detail"]


def test_liveness_fails_when_the_heartbeat_is_stale(site):
    controller = site.controller()
    assert wait_for(lambda: controller.heartbeat_at is not None)
    # Stopped, so its last heartbeat stays put and the ages below are exact. Running, it may beat
    # between the clock's read of the heartbeat and the probe's: after a stall over 1 s, "11 s" is < 10.
    site.stop_controllers()
    beat = controller.heartbeat_at
    assert ControllerHealth(controller, stale_after=10.0, clock=lambda: beat + 9.0).liveness().ok
    later = ControllerHealth(controller, stale_after=10.0, clock=lambda: beat + 11.0)
    (check,) = later.liveness().checks
    assert not check.ok and "not running" in check.detail
    idle = Controller(controller.config, controller.ledger, None)  # made, never run
    assert ControllerHealth(idle, clock=lambda: idle.started_at + 9.0).liveness().ok  # no heartbeat yet, not stale
    assert not ControllerHealth(idle, clock=lambda: idle.started_at + 11.0).liveness().ok


def test_metrics_and_unknown_paths(site):
    base = site.serve(site.controller())
    code, text = http_get(f"{base}/metrics")
    assert code == 200 and "kvpolicy_controller_heartbeat_timestamp_seconds" in text
    assert http_get(f"{base}/nope")[0] == 404
    code, index = http_get(f"{base}/")
    assert code == 200 and "/readyz" in index


def parse_run(*args: str):
    return build_parser().parse_args(["run", "policy.kvp", *args])


def test_metrics_address_default_and_forms():
    assert run_command._listen_address(parse_run()) == ("127.0.0.1", 9464)
    assert run_command._listen_address(parse_run("--metrics-address", "0.0.0.0:9500")) == ("0.0.0.0", 9500)
    assert run_command._listen_address(parse_run("--metrics-address", "[::1]:9500")) == ("::1", 9500)
    assert run_command._listen_address(parse_run("--metrics-address", "off")) is None
    # the deprecated flag keeps what it meant: every interface
    assert run_command._listen_address(parse_run("--metrics-port", "9464")) == ("0.0.0.0", 9464)


@pytest.mark.parametrize("value, message", [
    ("0.0.0.0:99999999", "port 99999999 is out of range"),
    ("9464", "is not HOST:PORT"),
    (":9464", "has no host"),
    ("::1:9464", "IPv6 address in brackets"),
    ("127.0.0.1:http", "'http' is not a port number"),
])
def test_a_bad_metrics_address_is_a_usage_error(value, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "policy.kvp", "--metrics-address", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --metrics-address" in err and message in err


def test_metrics_port_and_address_together_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "p.kvp").write_text(POLICY)
    code = main(["run", str(tmp_path / "p.kvp"), "--metrics-port", "9464", "--metrics-address", "127.0.0.1:9464"])
    assert code == 2 and "give only one" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "policy.kvp", "--metrics-port", "99999999"])
    assert exit_.value.code == 2


def test_a_busy_address_fails_the_start_naming_the_flag(tmp_path):
    (tmp_path / "p.kvp").write_text(POLICY)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "kvpolicy.cli", "run", str(tmp_path / "p.kvp"), "--ledger-dir",
             str(tmp_path / "ledger"), "--gpu-capacity", "80GiB", "--metrics-address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60,
        )
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--metrics-address" in out.stderr


@pytest.mark.gpu
def test_ready_with_nvml_figures(site):
    from kvpolicy.runtime.gpus import nvml_sampler

    sampler = nvml_sampler()
    if sampler is None:
        pytest.skip("no NVML GPU here (nvidia-ml-py and a driver)")
    base = site.serve(site.controller(sampler=sampler))
    code, checks = probe(f"{base}/readyz")
    assert code == 200, checks
    assert checks["gpu_figures"]["detail"].startswith("from NVML (")
