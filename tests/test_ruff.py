"""The repository passes its own lint configuration (pyproject.toml's ``[tool.ruff]``).

``python -m ruff check`` runs over every Python folder with ruff pinned in
requirements/test.txt; a finding fails this test with ruff's own report. Every ``# noqa``
names its codes and says why, and every per-file ignore in pyproject.toml has its reason
above it, so an exception to a rule is always explained where it is made.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["kvpolicy", "adapters", "grammar", "tests", "benchmarks", "scripts"]
# A suppression comment names its codes, then the reason after " - " (or in parentheses, or after a dash).
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$", re.IGNORECASE)
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*\s*(?:-|—|\()\s*\S")


def ruff_or_skip() -> None:
    if importlib.util.find_spec("ruff") is None:
        message = "ruff is not installed (pip install -r requirements/test.txt)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def ruff_check(root: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    """``python -m ruff check`` from ``root`` (so its pyproject.toml is the configuration), no cache written."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "full", *paths],
                          cwd=root, capture_output=True, text=True, timeout=300)


def noqa_without_reason(text: str) -> list[int]:
    """The line numbers of ``# noqa`` comments that name no code or give no reason (comments only, not strings)."""
    comments = (t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT)
    return [t.start[0] for t in comments if (m := NOQA.search(t.string)) and not NOQA_WITH_REASON.match(m.group("rest"))]


def python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_repository_passes_ruff() -> None:
    ruff_or_skip()
    done = ruff_check(ROOT, *FOLDERS)
    assert done.returncode == 0, f"ruff check found problems (fix them, or noqa with the reason):\n{done.stdout}{done.stderr}"


def test_ruff_is_the_pinned_version() -> None:
    ruff_or_skip()
    (pin,) = re.findall(r"^ruff==(\S+)", (ROOT / "requirements" / "test.txt").read_text(), re.MULTILINE)
    done = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["ruff", pin], done.stdout + done.stderr


def test_a_finding_fails_the_check(tmp_path: Path) -> None:
    """The same configuration over a file with findings: ruff exits non-zero and names them."""
    ruff_or_skip()
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "kvpolicy").mkdir()
    (tmp_path / "kvpolicy" / "bad.py").write_text(
        "import os\n\n\ndef f(xs=[]):\n    try:\n        return xs\n    except Exception:\n        return None\n")
    (tmp_path / "kvpolicy" / "good.py").write_text("def f(xs: list[int]) -> int:\n    return len(xs)\n")
    done = ruff_check(tmp_path, "kvpolicy")
    assert done.returncode == 1, done.stdout + done.stderr
    for code in ("F401", "B006", "BLE001"):  # unused import, mutable default, blind except
        assert f"{code} " in done.stdout, (code, done.stdout)
    assert "good.py" not in done.stdout
    (tmp_path / "kvpolicy" / "bad.py").unlink()
    assert ruff_check(tmp_path, "kvpolicy").returncode == 0


def test_every_noqa_names_its_codes_and_gives_its_reason() -> None:
    texts = {p: p.read_text() for p in python_files()}
    missing = [f"{p.relative_to(ROOT)}:{n}" for p, text in texts.items() if "noqa" in text.lower()
               for n in noqa_without_reason(text)]
    assert missing == [], f"write `# noqa: CODE - why` on these lines: {missing}"


def test_the_noqa_check_finds_a_missing_reason() -> None:
    text = "\n".join([
        "import a  # noqa: F401 - imported for its registration",
        "import b  # noqa: F401  (the heavy import, once)",
        "import c  # noqa: F401",
        "import d  # noqa",
        "import e  # noqa: - why",
        "x = 1  # no noqa here",
        "f = lambda: 0  # noqa: E731, B023 — both, on purpose",
    ])
    assert noqa_without_reason(text) == [3, 4, 5]


def test_every_per_file_ignore_has_its_reason() -> None:
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    start = lines.index("[tool.ruff.lint.per-file-ignores]")
    block = []
    for line in lines[start + 1:]:
        if line.startswith("["):
            break
        block.append(line)
    entries = [i for i, line in enumerate(block) if re.match(r'^"[^"]+"\s*=\s*\[', line)]
    assert entries, "the per-file-ignores table is empty or unreadable"
    for i in entries:
        above = next((block[j] for j in range(i - 1, -1, -1) if not re.match(r'^"[^"]+"\s*=', block[j])), "")
        assert above.startswith("#"), f"no reason above {block[i]!r} in pyproject.toml"
