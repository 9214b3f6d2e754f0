"""``kvpolicy demo``: a controller and three simulated engines on one simulated GPU, so that
``status``, ``top`` and the metrics show something on a machine without a GPU.

The engines run the elastic allocator on its host driver (process memory standing in
for a 4 GiB GPU) and attach to the ledger as real engines do; their load rises and falls,
and the controller, enforcing a demo policy written to a new temporary directory (the
policy line of its output names the file, to edit while it runs), moves memory
between them. The demo prints the commands to watch it with, then runs until Ctrl-C
(or ``--duration``), and stops everything it started. It has no ``--format``: it runs
in the foreground and prints only those instructions.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kvpolicy.commands import Subcommands
from kvpolicy.commands.common import parse_listen_address, parse_seconds

POLICY = """\
# The policy of `kvpolicy demo`: three models sharing one simulated 4 GiB GPU.
version 1

gpu * {
  headroom 256 MiB
}

model "chat" {
  priority 100
  min 1 GiB
  max 70%
  weight 300
}

model "batch-*" {
  priority 10
  min 256 MiB
  weight 100
}

rule "idle-reclaim" {
  when gpu.free < 256 MiB and model.idle > 30s
  shrink to min
  grace 10s
}
"""
ENGINES = (("chat", 0.0), ("batch-summarize", 0.33), ("batch-embed", 0.66))
"""Models and the phase of their load (a third of a period apart)."""


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("demo", help="run a controller and simulated engines (no GPU needed)", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger-dir", metavar="DIR", help="the demo's ledger (default: beside the demo's policy, in a new temporary directory)")
    parser.add_argument("--metrics-address", type=_address, default=("127.0.0.1", 9464), metavar="HOST:PORT",
                        help="serve the controller's /metrics here (default 127.0.0.1:9464; off: not at all)")
    parser.add_argument("--duration", type=parse_seconds, metavar="SECONDS", help="stop after this long (default: at Ctrl-C)")
    parser.set_defaults(run=run)


def _address(text: str) -> tuple[str, int] | None:
    return None if text.strip().lower() == "off" else parse_listen_address(text)


def run(args: argparse.Namespace) -> int:
    from kvpolicy.commands import missing_extra
    from kvpolicy.commands.demo_engine import DEMO_CAPACITY
    from kvpolicy.units import format_bytes

    missing = missing_extra("demo", "runtime")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    # The policy goes in a directory of its own: beside a ledger the user named (its parent
    # may be /dev/shm) it could replace someone's file.
    home = Path(tempfile.mkdtemp(prefix="kvpolicy-demo-"))
    ledger = Path(args.ledger_dir) if args.ledger_dir else home / "ledger"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    policy = home / "demo.kvp"
    policy.write_text(POLICY, encoding="utf-8")
    metrics = "off" if args.metrics_address is None else "{}:{:d}".format(*args.metrics_address)
    python = sys.executable
    controller = subprocess.Popen([python, "-m", "kvpolicy.cli", "run", str(policy), "--ledger-dir", str(ledger),
                                   "--gpu-capacity", f"{DEMO_CAPACITY}B", "--metrics-address", metrics, "--tick", "0.5",
                                   "--log-level", "WARNING"])
    children: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = [controller]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for model, phase in ENGINES:
            engine = subprocess.Popen([python, "-m", "kvpolicy.commands.demo_engine", model, str(ledger), str(phase)],
                                      stdout=subprocess.PIPE, text=True)
            children.append(engine)
            assert engine.stdout is not None  # stdout=PIPE
            if engine.stdout.readline().strip() != "attached":
                print(f"kvpolicy demo: the simulated engine {model!r} did not start", file=sys.stderr)
                return 1
        flag = f"--ledger-dir {ledger}"
        print(f"kvpolicy demo: a controller and {len(ENGINES)} simulated engines on one simulated "
              f"{format_bytes(DEMO_CAPACITY)} GPU; policy {policy}\n"
              f"  kvpolicy status {flag}\n  kvpolicy top {flag}\n"
              + (f"  curl http://{metrics}/metrics\n" if args.metrics_address else "")
              + "Ctrl-C stops it.", flush=True)
        while not stop.wait(0.5):
            if controller.poll() is not None:
                print(f"kvpolicy demo: the controller stopped (exit {controller.returncode})", file=sys.stderr)
                return 1
            if args.duration is not None:
                args.duration -= 0.5
                if args.duration <= 0:
                    break
        return 0
    finally:
        for child in reversed(children):  # engines first, so the controller sees them go
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
