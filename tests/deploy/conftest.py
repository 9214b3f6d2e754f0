"""Fixtures of the deployment tests: the repository, its release build, and the tools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis", ".whl", ".device")


@pytest.fixture
def node():
    """A scratch directory that every user may enter (pytest's tmp_path is root's alone): the
    filesystem of a node or host, for processes run as other users."""
    base = Path(tempfile.mkdtemp(prefix="kvpolicy-node-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def tool(name: str) -> str | None:
    """A command-line tool from this test environment (beside its python) or the PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Path:
    """``python -m build`` of a copy of the checkout: the sdist, and the wheel built from that sdist.

    Without build isolation (this environment's setuptools serves as the backend), so no index
    is asked; the backend and its configuration are the ones a release build uses.
    """
    root = tmp_path_factory.mktemp("release")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    out = root / "dist"
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def as_user(uid: int, gid: int, groups: list[int] = ()) -> dict:
    return {"user": uid, "group": gid, "extra_groups": list(groups)}


def python_for(run_as: dict, env: dict[str, str], scratch: Path) -> str | None:
    """A Python that the user of ``run_as`` can run with this checkout's kvpolicy: this one, or else
    (when it lives where that user may not look, e.g. under /root) the system's python3 of the same
    version in a venv that reads this environment's packages. None if neither can."""
    probe = ["-c", "import kvpolicy.cli, kvpolicy.runtime.endpoints, kvpolicy.adapters.common"]

    def works(python: str) -> bool:
        try:
            done = subprocess.run([python, *probe], cwd=scratch, env=env, capture_output=True, timeout=120, **run_as)
        except PermissionError:
            return False
        return done.returncode == 0

    if works(sys.executable):
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if system is None or subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                        text=True).stdout.strip() != str(sys.version_info[:2]):
        return None
    venv = scratch / "python"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    packages = [p for p in sys.path if p.endswith("site-packages")]
    (venv / "lib" / f"python{version}" / "site-packages" / "kvpolicy-checkout.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in packages))
    python = str(venv / "bin" / "python")
    return python if works(python) else None
