"""kvpolicy at the lowest versions it declares: the base install and every extra an operator installs.

pyproject.toml's ranges are the ones tested. The highest is what the suite's own venv resolves
(``.venv-test``; the engines' venvs pin lark 1.2.2 beside them); the lowest is installed here,
into a folder of its own, at each range's lower bound (``>=`` names a release that exists), with
kvpolicy built from this checkout. Every command then runs on an interpreter that sees that
folder and the standard library only (``python -S -P``), and prints what it prints in the suite's
own venv; the controller hot-reloads and serves metrics; the language server reports a
mistake; the driver calls the allocator and the GPU figures make are found in the lowest
cuda-python and nvidia-ml-py (no GPU here to make them on).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.controller.site import http_get
from tests.support.network import free_loopback_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
EXTRAS = ("runtime", "gpu", "engine", "lsp")


def declared() -> dict[str, str]:
    """Each declared dependency's name → its lowest version, from pyproject.toml's ``>=`` bounds."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [r for extra in EXTRAS for r in project["optional-dependencies"][extra]]
    lowest: dict[str, str] = {}
    for req in map(Requirement, lines):
        if req.name == "kvpolicy":
            continue  # an extra naming another (engine = kvpolicy[gpu] + ...)
        (bound,) = [s.version for s in req.specifier if s.operator == ">="]
        lowest[req.name] = bound
    return lowest


@pytest.fixture(scope="module")
def lowest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with every dependency at its lowest declared version and kvpolicy from this checkout."""
    site = tmp_path_factory.mktemp("lowest-site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-compile",
           "--target", str(site)]
    pins = [f"{name}=={version}" for name, version in declared().items()]
    # pip also judges the suite's own venv against the folder (noise about its engines): only a failure is shown.
    for args in (pins, ["--no-deps", str(ROOT)]):
        done = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    return site


ISOLATED = [sys.executable, "-S", "-P"]
"""This interpreter without site-packages or the current folder on sys.path: it sees PYTHONPATH and the stdlib."""


def environment(site: Path | None) -> dict[str, str]:
    """This process's environment without Python's or kvpolicy's settings; PYTHONPATH ``site`` when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KVPOLICY_"))}
    return env if site is None else env | {"PYTHONPATH": str(site)}


def in_env(site: Path | None, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``python -S -P ARGS`` seeing ``site`` and the standard library only (None: the suite's own venv)."""
    python = [sys.executable] if site is None else ISOLATED
    return subprocess.run([*python, *args], env=environment(site), capture_output=True, text=True, timeout=300,
                          check=False, **kwargs)  # type: ignore[call-overload]


def kvpolicy(site: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    return in_env(site, "-m", "kvpolicy.cli", *args, cwd=ROOT)


def test_the_folder_holds_each_dependency_at_its_lowest_declared_version(lowest: Path) -> None:
    wanted = declared()
    probe = "import json, importlib.metadata as m, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    done = in_env(lowest, "-c", probe, *wanted)
    assert done.returncode == 0, done.stderr
    installed = json.loads(done.stdout)
    assert {n: Version(v) for n, v in installed.items()} == {n: Version(v) for n, v in wanted.items()}, installed
    assert {"lark", "pydantic", "regex", "watchdog", "prometheus-client", "nvidia-ml-py", "cuda-python",
            "pygls"} <= set(wanted)


COMMANDS = {
    "lint": ["lint", "policies/"],
    "fmt": ["fmt", "--check", "policies/"],
    "explain": ["explain", "policies/two-models.kvp", "--facts", "policies/two-models.facts.json", "--format", "json"],
    "test": ["test", "policies/two-models.kvtest.json"],
    "plan-vllm": ["plan", "--engine", "vllm", "--model-config", "tests/vllm/configs/qwen3-8b/config.json",
                  "--budget", "8GiB", "--max-model-len", "4096", "--vllm-version", "0.33.0", "--format", "json"],
    # A Quark checkpoint whose exclude patterns only the regex package reads so (as vLLM does): all layers excluded.
    "plan-vllm-quark": ["plan", "--engine", "vllm",
                        "--model-config", "tests/packaging/configs/qwen3-8b-quark/config.json",
                        "--budget", "8GiB", "--max-model-len", "4096", "--kv-cache-dtype", "fp8_e5m2",
                        "--vllm-version", "0.33.0", "--format", "json"],
    "plan-sglang": ["plan", "--engine", "sglang", "--model-config", "policies/models/deepseek-v4-flash.json",
                    "--budget", "40GiB", "--format", "json"],
    "lint-errors": ["lint", "tests/golden/lint/01-unknown-unit.kvp", "--format", "json"],
}


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
def test_each_command_prints_what_it_prints_at_the_highest_versions(lowest: Path, args: list[str]) -> None:
    low, high = kvpolicy(lowest, *args), kvpolicy(None, *args)
    assert (low.returncode, low.stdout) == (high.returncode, high.stdout), low.stderr
    assert low.returncode in (0, 1) and low.stdout


def test_the_lowest_regex_reads_the_quark_exclusions_as_vllm_does(lowest: Path) -> None:
    """Beyond printing what the newest versions print (both could refuse): with the oldest regex the plan reads
    the exclusions (a POSIX class, a Unicode property) and plans the fp8 cache, 1 byte an element: 36 layers ×
    16 tokens × 8 KV heads × 128 × K and V."""
    low = kvpolicy(lowest, *COMMANDS["plan-vllm-quark"])
    assert low.returncode == 0, low.stderr
    assert json.loads(low.stdout)["bytes_per_block"] == 36 * 16 * 8 * 128 * 2, low.stdout


@pytest.fixture
def controller(lowest: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, str]]:
    """``kvpolicy run`` at the lowest versions, serving its endpoints on a free loopback port."""
    policy = tmp_path / "policy.kvp"
    policy.write_text((POLICIES / "two-models.kvp").read_text())
    port = free_loopback_port()
    proc = subprocess.Popen(
        [*ISOLATED, "-m", "kvpolicy.cli", "run", str(policy), "--ledger-dir", str(tmp_path / "ledger"),
         "--gpu-capacity", "80GiB", "--metrics-address", f"127.0.0.1:{port}", "--tick", "0.2"],
        env=environment(lowest), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        yield proc, policy, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def test_the_controller_reloads_and_serves_metrics_at_the_lowest_versions(controller) -> None:  # type: ignore[no-untyped-def]
    proc, policy, base = controller
    assert wait_for(lambda: http_get(f"{base}/readyz")[0] == 200 or proc.poll() is not None, timeout=120)
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    assert "kvpolicy_policy_last_reload_successful 1.0" in http_get(f"{base}/metrics")[1]  # prometheus-client
    text = policy.read_text()
    assert "weight 300" in text
    policy.write_text(text.replace("weight 300", "weight 200"))  # watchdog sees the save: revision 2
    assert wait_for(lambda: "revision 2" in http_get(f"{base}/readyz")[1], timeout=120), http_get(f"{base}/readyz")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    output = proc.stdout.read() if proc.stdout else ""
    # Before 7, watchdog has no FileAttribEvent: naming it once ended the observer's thread at the
    # first event (a traceback), and from then on only the 1 s poll saw saves.
    assert "Traceback" not in output, output


def names_used(path: Path, module: str) -> set[str]:
    """The attribute chains ``module.NAME`` or ``module.NAME.MEMBER`` a source file reads (``module``: a pattern)."""
    pattern = rf"\b{module}\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)"
    return set(re.findall(pattern, path.read_text()))


PROBE = """
import sys
from functools import reduce
names = sys.argv[2:]
if sys.argv[1] == "cuda":
    from kvpolicy.alloc.driver import import_cuda_bindings
    module = import_cuda_bindings()
else:
    import pynvml as module
missing = [n for n in names if reduce(lambda o, a: getattr(o, a, None), n.split("."), module) is None]
print(module.__name__, missing)
"""


@pytest.mark.parametrize(("kind", "sources", "module", "expected"), [
    ("cuda", ["kvpolicy/alloc/driver.py", "adapters/ledger_port.py"], r"(?:cu|driver)", "cuda.cuda"),  # 12.6.0: the older layout
    ("nvml", ["kvpolicy/runtime/gpu_identity.py", "kvpolicy/runtime/gpus.py"], r"(?:pynvml|nvml|self\._nvml)", "pynvml"),
])
def test_the_lowest_gpu_libraries_have_every_call_kvpolicy_makes(lowest: Path, kind: str, sources: list[str],
                                                                 module: str, expected: str) -> None:
    names = sorted(set().union(*(names_used(ROOT / source, module) for source in sources)))
    assert len(names) >= 8, names  # the pattern found the calls
    done = in_env(lowest, "-c", PROBE, kind, *names)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected, "[]"], done.stdout


def test_the_language_server_reports_a_mistake_at_the_lowest_versions(lowest: Path, tmp_path: Path) -> None:
    from lsprotocol import types

    from tests.lsp.client import LspClient

    client = LspClient(command=["env", f"PYTHONPATH={lowest}", *ISOLATED, "-m", "kvpolicy.cli", "lsp"])
    try:
        client.initialize(tmp_path)
        path = tmp_path / "policy.kvp"
        text = 'version 1\nmodel "chat" {\n  reserve 4 GiBB\n}\n'
        path.write_text(text)
        (diagnostic,) = client.diagnostics(client.open(path, text), version=1)
        assert (diagnostic.code, diagnostic.range.start) == ("KV001", types.Position(line=2, character=12))
        assert client.shutdown() == 0
    finally:
        client.close()


def test_cuda_python_is_imported_in_one_place_for_both_of_its_layouts() -> None:
    # 12.6.0 has only ``cuda.cuda``; later ones ``cuda.bindings.driver``: an import of either elsewhere would
    # work at one end of the range only.
    imports = re.compile(r"^\s*(?:from cuda(?:\.bindings)? import|import cuda\b)", re.MULTILINE)
    found = sorted(str(p.relative_to(ROOT)) for folder in ("kvpolicy", "adapters") for p in (ROOT / folder).rglob("*.py")
                   if imports.search(p.read_text()))
    assert found == ["kvpolicy/alloc/driver.py"]
