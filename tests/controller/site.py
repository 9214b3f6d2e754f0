"""A controller test site: a policy file, a ledger directory, and the controllers and real
engine processes a test starts there (the ``site`` fixture stops them all)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from pathlib import Path

from kvpolicy.runtime.controller import Controller, ControllerConfig
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.endpoints import serve
from kvpolicy.runtime.gpus import GpuSampler, StaticSampler
from kvpolicy.runtime.health import ControllerHealth
from kvpolicy.runtime.metrics import ControllerMetrics
from tests.support.waiting import wait_for  # the controller tests import it from here
from tests.support.processes import read_line

GiB = 1 << 30
EIGHTY_GIB = StaticSampler(80 * GiB)  # the controller's default source of GPU figures
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


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET; (0, "") while nothing listens there yet."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


class Site:
    """A policy file, a ledger directory, and the controllers and engine processes a test
    starts there; everything started is stopped when the test ends."""

    def __init__(self, root: Path) -> None:
        self.policy = root / "policy.kvp"
        self.policy.write_text(POLICY)
        self.ledger_dir = root / "ledger"
        self._running: list[tuple[threading.Event, threading.Thread]] = []
        self._engines: list[subprocess.Popen] = []
        self._servers: list = []
        self._processes: list[subprocess.Popen] = []
        self._steps: dict[Controller, int] = {}
        self._root = root

    def controller(self, sampler: GpuSampler | None = EIGHTY_GIB, **config) -> Controller:
        """A controller running on a thread; GPU figures from ``sampler`` (None: no source of figures)."""
        ledger = LedgerDir(self.ledger_dir, create=True)
        config = {"tick": 0.2, **config}
        controller = Controller(ControllerConfig(policy=self.policy, **config), ledger, sampler, ControllerMetrics())
        self._count_steps(controller)
        stop = threading.Event()
        thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
        thread.start()
        self._running.append((stop, thread))
        assert wait_for(lambda: controller.decision is not None or controller.watcher.last_reload is not None)
        return controller

    def _count_steps(self, controller: Controller) -> None:
        self._steps[controller] = 0
        step = controller.step

        def counted(reason: str):  # type: ignore[no-untyped-def]
            try:
                return step(reason)
            finally:
                self._steps[controller] += 1

        controller.step = counted  # type: ignore[method-assign]

    def after_steps(self, controller: Controller, n: int = 2) -> None:
        """Wait until ``controller`` has finished ``n`` more steps (one at least every tick): a
        check that nothing changed then means what it says, however slow the machine."""
        target = self._steps[controller] + n
        assert wait_for(lambda: self._steps[controller] >= target, 120), "the controller stopped stepping"

    def serve(self, controller: Controller) -> str:
        """Serve the controller's endpoints (metrics and probes) on a free loopback port; returns the base URL."""
        server, _ = serve("127.0.0.1", 0, controller.metrics.registry, ControllerHealth(controller))
        self._servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    def stop_controllers(self) -> None:
        for stop, thread in self._running:
            stop.set()
            thread.join(120)
            assert not thread.is_alive(), "a controller did not stop in 120 s (hung?)"
        self._running.clear()

    def run_process(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """``kvpolicy run`` on this site as a real process (GPU figures: an 80 GiB GPU); returns
        it and the file its stderr goes to. SIGTERM it to stop it cleanly."""
        log = self._root / f"controller-{len(self._processes)}.log"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvpolicy.cli", "run", str(self.policy), "--ledger-dir", str(self.ledger_dir),
                 "--gpu-capacity", "80GiB", "--metrics-address", "off", "--tick", "0.2", *args],
                stderr=err, text=True,
            )
        self._processes.append(proc)
        return proc, log

    def engine(self, model: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", ENGINE, model, str(self.ledger_dir)], stdout=subprocess.PIPE,
                                text=True)
        self._engines.append(proc)
        assert read_line(proc).strip() == "attached"
        return proc

    def slot(self, instance: str):
        return LedgerDir(self.ledger_dir).read().find(instance)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self.stop_controllers()
        for proc in self._processes:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for proc in self._engines:
            proc.kill()
            proc.wait()
