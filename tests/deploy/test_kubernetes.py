"""The Kubernetes manifests: checked offline against the bundled Kubernetes schemas, their
parts agreeing with each other and with the ledger's rules, and the controller run as the
manifest runs it — its init container's command, then ``kvpolicy run`` as uid 10000 — on a
directory made as the kubelet makes a hostPath, until /readyz says ready and an engine of
another user, in the ledger's group, gets limits."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from kvpolicy.adapters import settings as adapter_env
from kvpolicy.lint.engine import lint_text
from kvpolicy.policy.resolve import model_settings
from kvpolicy.runtime import client as ledger_client
from kvpolicy.runtime.segment import Access
from tests.controller.site import http_get
from tests.deploy.conftest import DEPLOY, as_user, python_for

MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # a long-supported release and the newest the schemas have
ENGINE_ENV = {  # every variable the adapters and the ledger client read
    adapter_env.ENV_ENABLE, adapter_env.ENV_POLICY, adapter_env.ENV_MODEL, adapter_env.ENV_LEDGER_DIR,
    adapter_env.ENV_ENGINE_ID, ledger_client.ENV_LEDGER_GROUP, ledger_client.ENV_ALLOW_FOREIGN_OWNER,
    adapter_env.ENV_REPORT_INTERVAL, adapter_env.ENV_GIVE_BACK_INTERVAL, adapter_env.ENV_GROW_BYTES,
    adapter_env.ENV_YIELD_ABOVE_TARGET, adapter_env.ENV_GIVE_BACK_CHUNKS,
}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(kind: str, name: str | None = None) -> dict:
    (found,) = [d for p in MANIFESTS for d in documents(p)
                if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def container(pod: dict, name: str, kind: str = "containers") -> dict:
    (found,) = [c for c in pod[kind] if c["name"] == name]
    return found


def flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


CONTROLLER_POD = find("DaemonSet")["spec"]["template"]["spec"]
CONTROLLER = container(CONTROLLER_POD, "controller")
INIT = container(CONTROLLER_POD, "ledger-directory", "initContainers")
ENGINE_POD = find("Deployment")["spec"]["template"]["spec"]
ENGINE = ENGINE_POD["containers"][0]


def mount(pod: dict, c: dict, volume: str) -> str:
    (path,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == volume]
    return path


def volume(pod: dict, name: str) -> dict:
    (found,) = [v for v in pod["volumes"] if v["name"] == name]
    return found


# ---- the schema check -------------------------------------------------------------------------------------

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (the bundled Kubernetes schemas) is not installed")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_every_resource_matches_the_kubernetes_schema(manifest, version):
    resources = documents(manifest)
    assert resources
    for resource in resources:  # strict: an unknown or misspelt field is an error too
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_schema_check_rejects_a_misspelt_field():
    daemonset = find("DaemonSet")
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


# ---- the parts agree --------------------------------------------------------------------------------------

def init_command() -> tuple[str, int, int, int]:
    """The init container's ``install -d -o UID -g GID -m MODE PATH`` as (path, uid, gid, mode)."""
    command = INIT["command"]
    assert command[:2] == ["install", "-d"]
    options = dict(zip(command[2:-1:2], command[3:-1:2]))
    return command[-1], int(options["-o"]), int(options["-g"]), int(options["-m"], 8)


def test_the_init_container_prepares_the_directory_the_ledger_demands():
    path, uid, gid, mode = init_command()
    context = CONTROLLER["securityContext"]
    args = flags(CONTROLLER["args"])
    assert (uid, gid) == (context["runAsUser"], context["runAsGroup"])
    assert args["group"] == str(gid)
    assert mode == Access(group=gid).dir_mode  # what the ledger itself makes for a group: 2770
    assert path == mount(CONTROLLER_POD, INIT, "ledger") == mount(CONTROLLER_POD, CONTROLLER, "ledger") == args["ledger-dir"]
    assert volume(CONTROLLER_POD, "ledger")["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
    assert INIT["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER", "FSETID"]}
    assert context["runAsNonRoot"] is True and context["capabilities"] == {"drop": ["ALL"]}


def test_probes_and_scraping_use_the_address_the_controller_serves():
    host, port = flags(CONTROLLER["args"])["metrics-address"].rsplit(":", 1)
    assert host == "0.0.0.0"  # the kubelet and Prometheus reach the pod's own address
    (named,) = [p for p in CONTROLLER["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == int(port)
    assert CONTROLLER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert CONTROLLER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = find("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == port and annotations["prometheus.io/path"] == "/metrics"


def policies() -> dict[str, str]:
    return {d["metadata"]["namespace"]: d["data"]["policy.kvp"] for p in MANIFESTS for d in documents(p)
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kvpolicy-policy"}


def test_every_namespace_gets_the_same_valid_policy():
    copies = policies()
    assert set(copies) == {find("DaemonSet")["metadata"]["namespace"], find("Deployment")["metadata"]["namespace"]}
    (text,) = set(copies.values())
    result = lint_text(text, "policy.kvp")
    assert result.policy is not None and not result.diagnostics, [d.render() for d in result.diagnostics]
    policy_file = CONTROLLER["args"][0]
    assert os.path.dirname(policy_file) == mount(CONTROLLER_POD, CONTROLLER, "policy")
    model = {e["name"]: e["value"] for e in ENGINE["env"]}[adapter_env.ENV_MODEL]
    assert model_settings(result.policy, model).reserve  # vLLM's KV cache is sized from it


def test_an_engine_pod_joins_the_node_ledger():
    env = {e["name"]: e["value"] for e in ENGINE["env"]}
    assert set(env) <= ENGINE_ENV, set(env) - ENGINE_ENV
    ledger_dir, _, gid, _ = init_command()
    assert env[adapter_env.ENV_ENABLE] == "1"
    assert env[adapter_env.ENV_LEDGER_DIR] == mount(ENGINE_POD, ENGINE, "ledger") == ledger_dir
    assert env[ledger_client.ENV_LEDGER_GROUP] == str(gid) and gid in ENGINE_POD["securityContext"]["supplementalGroups"]
    assert volume(ENGINE_POD, "ledger")["hostPath"] == {"path": ledger_dir, "type": "Directory"}
    assert os.path.dirname(env[adapter_env.ENV_POLICY]) == mount(ENGINE_POD, ENGINE, "policy")


# ---- the controller as the manifest runs it ---------------------------------------------------------------

ENGINE_SCRIPT = textwrap.dedent("""
    import sys, time, kvpolicy
    inst = kvpolicy.attach(model=sys.argv[1], gpu="cuda:0", elastic=True, id=sys.argv[1] + "/0")
    deadline = time.monotonic() + 300  # only to catch a hang
    while inst.read().revision == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("revision", inst.read().revision, flush=True)
""")


def host_path(node: Path, path: str) -> Path:
    return node / path.lstrip("/")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the init step as root and the controller as uid 10000: needs root")
def test_the_controller_starts_as_the_manifest_runs_it_and_turns_ready(node):
    path, uid, gid, mode = init_command()
    context = CONTROLLER["securityContext"]
    run_as = as_user(context["runAsUser"], context["runAsGroup"])
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent",
           **{e["name"]: e["value"] for e in CONTROLLER.get("env", [])}}
    python = python_for(run_as, env, node)
    if python is None:
        pytest.skip(f"no Python here that uid {uid} may run with this checkout's kvpolicy")

    # The kubelet's DirectoryOrCreate: root, 0755.
    ledger = host_path(node, path)
    ledger.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    ledger.mkdir(mode=0o755)
    policy = host_path(node, CONTROLLER["args"][0])
    policy.parent.mkdir(parents=True, mode=0o755)
    (text,) = set(policies().values())
    policy.write_text(text)
    args = [str(host_path(node, a)) if a.startswith("/") else a for a in CONTROLLER["args"]]
    args = [f"--ledger-dir={ledger}" if a.startswith("--ledger-dir=") else a for a in args]
    args = [a for a in args if not a.startswith("--metrics-address=")]
    command = [python, "-m", "kvpolicy.cli", "run", *args, "--gpu-capacity=80GiB"]  # no NVML here

    # Without the init step the controller refuses the kubelet's directory.
    refused = subprocess.run([*command, "--once"], cwd=node, env=env, capture_output=True, text=True, timeout=60,
                             **run_as)
    assert refused.returncode == 1 and "is owned by uid 0" in refused.stderr

    # The init container: its own command, as root with only the capabilities it keeps.
    caps = INIT["securityContext"]["capabilities"]
    keep = ",".join(f"+{c.lower()}" for c in caps["add"])
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot run the init step with the manifest's capabilities")
    init = [str(ledger) if a == path else a for a in INIT["command"]]
    subprocess.run([setpriv, "--no-new-privs", "--inh-caps=-all", f"--bounding-set=-all,{keep}", "--", *init],
                   check=True, timeout=60)
    st = ledger.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode)

    # The controller, as uid 10000, until /readyz says ready.
    proc = subprocess.Popen([*command, "--metrics-address=127.0.0.1:0", "--tick=0.2"], cwd=node, env=env,
                            stderr=subprocess.PIPE, text=True, **run_as)
    log: list[str] = []
    port: list[int] = []

    def read_log() -> None:
        for line in proc.stderr:
            log.append(line)
            if found := re.search(r"serving /metrics, /healthz and /readyz on http://127\.0\.0\.1:(\d+)", line):
                port.append(int(found[1]))

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60  # only to catch a hang
        while not port and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port, "".join(log)
        base = f"http://127.0.0.1:{port[0]}"
        deadline = time.monotonic() + 60  # only to catch a hang, again for the readiness
        while http_get(f"{base}/readyz")[0] != 200 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code, body = http_get(f"{base}/readyz")
        assert code == 200, body + "".join(log)
        assert http_get(f"{base}/healthz")[0] == 200

        # An engine of another user in the ledger's group, as engine-example.yaml runs one.
        engine_env = {e["name"]: e["value"] for e in ENGINE["env"]}
        engine_env[adapter_env.ENV_LEDGER_DIR] = str(ledger)
        engine = subprocess.run([python, "-c", ENGINE_SCRIPT, engine_env[adapter_env.ENV_MODEL]], cwd=node,
                                env={**env, **engine_env}, capture_output=True, text=True, timeout=360,
                                **as_user(20000, 20000, ENGINE_POD["securityContext"]["supplementalGroups"]))
        assert engine.returncode == 0, engine.stderr
        assert int(engine.stdout.split()[1]) > 0  # the controller published into the engine's segment
        (segment,) = ledger.glob("*.ledger")
        seg = segment.stat()
        assert (seg.st_uid, seg.st_gid, seg.st_mode & 0o777) == (20000, gid, Access(group=gid).file_mode)
        status = (ledger / "status.json").stat()
        assert (status.st_uid, status.st_gid, status.st_mode & 0o777) == (uid, gid, 0o660)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "".join(log)
        reader.join(timeout=10)
    st = ledger.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode)  # the controller left it as it was
