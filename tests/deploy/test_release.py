"""Releases: ``python -m build`` makes an sdist that carries everything a wheel needs, and a
wheel (built from that sdist) of the one version kvpolicy declares; the changelog has it."""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from email.parser import Parser

from packaging.version import Version

import kvpolicy
from kvpolicy.lint.engine import lint_text
from kvpolicy.lint.report import render_sarif
from tests.deploy.conftest import REPO


def only(dist, pattern: str):
    (found,) = dist.glob(pattern)
    return found


def test_the_wheel_has_the_packages_version(dist):
    wheel = only(dist, "kvpolicy-*.whl")
    assert wheel.name == f"kvpolicy-{kvpolicy.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"kvpolicy-{kvpolicy.__version__}.dist-info"
        metadata = Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert metadata["Version"] == kvpolicy.__version__
    # grammar/ and adapters/ live at the top of the repository and ship inside the package
    assert "kvpolicy/grammar/kvpolicy.lark" in names
    assert "kvpolicy/adapters/vllm_adapter/plugin.py" in names and "kvpolicy/adapters/sglang_dsv4/__init__.py" in names
    assert "kvpolicy.adapters.vllm_adapter.plugin:register" in entry_points
    assert "kvpolicy.adapters.sglang_dsv4:plugin" in entry_points
    assert "kvpolicy = kvpolicy.cli:main" in entry_points


def test_the_sdist_carries_the_sources_a_wheel_is_built_from(dist):
    sdist = only(dist, "kvpolicy-*.tar.gz")
    assert sdist.name == f"kvpolicy-{kvpolicy.__version__}.tar.gz"
    top = f"kvpolicy-{kvpolicy.__version__}"
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
        grammar = tar.extractfile(f"{top}/grammar/kvpolicy.lark").read()
    assert grammar == (REPO / "grammar" / "kvpolicy.lark").read_bytes()
    for path in ("README.md", "CHANGELOG.md", "pyproject.toml", "adapters/common.py",
                 "adapters/vllm_adapter/plugin.py", "adapters/sglang_dsv4/hooks.py", "kvpolicy/__init__.py",
                 "docs/deploy.md", "deploy/kubernetes/kvpolicy.yaml", "policies/h200-dsv4-colocate.kvp"):
        assert f"{top}/{path}" in names, path


def test_the_version_is_declared_once():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert not re.search(r"^version\s*=", pyproject.split("[tool.setuptools.dynamic]")[0], re.M)
    assert 'version = {attr = "kvpolicy.__version__"}' in pyproject


def test_sarif_names_the_version():
    result = lint_text('version 1\nmodel "a" { min 4 GiBB }\n', "p.kvp")
    sarif = json.loads(render_sarif(result.diagnostics))
    assert sarif["runs"][0]["tool"]["driver"]["version"] == kvpolicy.__version__


def test_the_changelog_has_an_unreleased_section_and_this_version():
    """A release's version has a dated section; between releases the version is the next one
    in the making (``.devN``), above every released section, so a wheel built from a
    checkout is never taken for a release."""
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[0] == "Unreleased"
    version = Version(kvpolicy.__version__)
    released = [Version(h) for h in headings[1:]]
    if version.is_devrelease:
        assert all(version.base_version != str(r) and version > r for r in released), (version, released)
    else:
        assert re.search(rf"^## \[{re.escape(kvpolicy.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
