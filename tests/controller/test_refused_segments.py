"""A GPU whose ledger segment the controller cannot use is reported everywhere an operator looks:
a warning in the log when first seen, ATTENTION and exit 1 in ``kvpolicy status``, the metric the
shipped alert watches; its engines are out of reach, not gone; and the recovery is logged."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

from kvpolicy.cli import main
from kvpolicy.runtime import layout as L
from kvpolicy.runtime.directory import LedgerDir
from tests.controller.site import http_get, wait_for
from tests.support.processes import read_line

NEWER = L.LAYOUT_VERSION + 1

QUIET_ENGINE = textwrap.dedent("""
    import sys, time, kvpolicy
    inst = kvpolicy.attach(model="batch", gpu="cuda:1", ledger_dir=sys.argv[1], elastic=True, id="batch/0")
    print("attached", flush=True)
    time.sleep(3600)  # holds its slot and never touches the mapping (a truncated one would be SIGBUS)
""")


def newer_layout_segment(ledger_dir, gpu: str) -> None:
    """A segment of ``gpu`` as a newer kvpolicy writes it: refused, and never moved aside."""
    with LedgerDir(ledger_dir, create=True) as ledger:
        ledger.gpu(gpu, create=True)
    path = ledger_dir / f"{gpu}.ledger"
    with open(path, "r+b") as f:
        f.seek(8)  # layout_version (docs/ledger.md's table)
        f.write(NEWER.to_bytes(4, "little"))


def refused_metric(text: str, gpu: str) -> str | None:
    prefix = f'kvpolicy_ledger_segment_refused{{gpu="{gpu}"}} '
    return next((line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)), None)


def test_a_segment_of_another_layout_is_reported_until_it_is_replaced(site, caplog, capsys):
    caplog.set_level(logging.INFO, logger="kvpolicy.controller")
    newer_layout_segment(site.ledger_dir, "cuda:1")
    controller = site.controller()
    base = site.serve(controller)
    site.engine("chat")  # on cuda:0, which works
    assert wait_for(lambda: (s := site.slot("chat/0")) and s.limit > 0)
    site.after_steps(controller, 3)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (warning,) = [w for w in warnings if w.startswith("cuda:1: its ledger segment cannot be used")]
    assert f"layout version {NEWER}" in warning, "logged once, with the reason"

    assert main(["status", "--ledger-dir", str(site.ledger_dir)]) == 1
    out = capsys.readouterr().out
    assert "ATTENTION: cuda:1: its ledger segment cannot be used, so engines on it get no new limits" in out
    assert main(["status", "--ledger-dir", str(site.ledger_dir), "--format", "json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert list(status["refused_segments"]) == ["cuda:1"] and f"layout version {NEWER}" in status["refused_segments"]["cuda:1"]

    metrics = wait_for(lambda: (t := http_get(f"{base}/metrics")[1]) and refused_metric(t, "cuda:1") and t)
    assert (refused_metric(metrics, "cuda:1"), refused_metric(metrics, "cuda:0")) == ("1.0", "0.0")

    (site.ledger_dir / "cuda:1.ledger").unlink()  # the operator replaced it (upgraded the other side)
    assert wait_for(lambda: any(r.getMessage() == "cuda:1: its ledger segment can be used again" for r in caplog.records))
    # the log line comes first; the metric and the status file follow within the step
    assert wait_for(lambda: refused_metric(http_get(f"{base}/metrics")[1], "cuda:1") is None)
    assert wait_for(lambda: main(["status", "--ledger-dir", str(site.ledger_dir)]) == 0), capsys.readouterr().out


def test_engines_on_a_truncated_segment_are_unreachable_not_gone(site, caplog):
    caplog.set_level(logging.INFO, logger="kvpolicy.decisions")
    controller = site.controller()
    engine = subprocess.Popen([sys.executable, "-c", QUIET_ENGINE, str(site.ledger_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(engine).strip() == "attached"
        assert wait_for(lambda: (s := site.slot("batch/0")) and s.limit > 0)
        os.truncate(site.ledger_dir / "cuda:1.ledger", L.HEADER_SIZE + 100)
        controller._wake.set()

        def records() -> list[dict]:
            return [json.loads(r.getMessage()) for r in caplog.records if r.name == "kvpolicy.decisions"]

        left = wait_for(lambda: [r for r in records() if r["gone"] or r["unreachable"]])
        assert left[0]["unreachable"] == ["batch/0"] and left[0]["gone"] == [], left
        assert engine.poll() is None, "the engine lives on (it holds its slot: the segment is not moved aside)"
        assert (site.ledger_dir / "cuda:1.ledger").exists()
    finally:
        engine.kill()
        engine.wait()
