"""Fixtures of the vLLM end-to-end tests (marker ``vllm_engine``): the e2e venv and the tiny model.

The venv is ``.venv-vllm032`` at the repository root, or the one KVPOLICY_VLLM_E2E_VENV
names; scripts/vllm-e2e-env makes it (scripts/test does). Without it these tests skip;
with a venv whose kvpolicy was built from other sources than the worktree's, they fail
(they would test stale code).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vllm_e2e.source_stamp import REPO, STAMP_NAME, source_digest

HERE = Path(__file__).resolve().parent

ENV_VENV = "KVPOLICY_VLLM_E2E_VENV"
DEFAULT_VENV = REPO / ".venv-vllm032"
VLLM_VERSION = "0.32.0"


@dataclass(frozen=True)
class E2EVenv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


@pytest.fixture(scope="session")
def e2e_venv() -> E2EVenv:
    venv = E2EVenv(Path(os.environ.get(ENV_VENV) or DEFAULT_VENV))
    make = f"scripts/vllm-e2e-env {venv.root}"
    if not venv.python.exists():
        pytest.skip(f"no vLLM {VLLM_VERSION} e2e venv at {venv.root}: make it with `{make}` (scripts/test does)")
    stamp = venv.root / STAMP_NAME
    built_from = stamp.read_text().strip() if stamp.exists() else None
    if built_from != source_digest():
        pytest.fail(
            f"the kvpolicy in {venv.root} was built from other sources than this worktree's "
            f"({'no stamp' if built_from is None else 'digest ' + built_from[:12]}); run `{make}`",
            pytrace=False,
        )
    return venv


@pytest.fixture(scope="session")
def e2e_python() -> Path:
    """The e2e venv's python, for scripts that run vLLM 0.32 and import no kvpolicy (so the stamp check
    of ``e2e_venv``, which guards the kvpolicy copy installed there, does not concern them)."""
    venv = E2EVenv(Path(os.environ.get(ENV_VENV) or DEFAULT_VENV))
    if not venv.python.exists():
        pytest.skip(f"no vLLM {VLLM_VERSION} e2e venv at {venv.root}: make it with `scripts/vllm-e2e-env`")
    return venv.python


@pytest.fixture(scope="session")
def tiny_model(e2e_venv: E2EVenv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (tiny_model.py), written once per session by the e2e venv's python."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([str(e2e_venv.python), str(HERE / "tiny_model.py"), str(folder)], check=True, timeout=300)
    return folder


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.vllm_e2e.engines import FIGURES

    if FIGURES:
        terminalreporter.section("vLLM engines started (measured, not asserted)")
        for line in FIGURES:
            terminalreporter.write_line(line)
