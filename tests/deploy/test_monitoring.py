"""The Prometheus alerts and the Grafana dashboard: well formed, every alert unit-tested,
checked by promtool where it is installed, and naming only metrics that a real controller
with a real engine process exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.site import POLICY, Site, http_get, wait_for
from tests.deploy.conftest import DEPLOY, tool
from tests.support.processes import read_line

PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "kvpolicy-alerts.yaml"
ALERT_TESTS = PROMETHEUS / "kvpolicy-alerts.test.yaml"
SCRAPE = PROMETHEUS / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "kvpolicy-dashboard.json"
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself for every target


def rules() -> list[dict]:
    (group,) = yaml.safe_load(ALERTS.read_text())["groups"]
    assert group["name"] == "kvpolicy"
    return group["rules"]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


# ---- the alert rules --------------------------------------------------------------------------------------

def test_every_alert_rule_is_complete():
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"Kvpolicy[A-Z][A-Za-z]+", n) for n in names)
    for rule in rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert DURATION.match(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert set(rule["annotations"]) == {"summary", "description"}
    # what the issue asks to be alerted on: controller stale, reload failed, over limit, shortfall
    assert {"KvpolicyControllerStale", "KvpolicyPolicyRejected", "KvpolicyInstanceOverLimit",
            "KvpolicyShortfall"} <= set(names)


def test_every_alert_has_a_unit_test_that_fires_it():
    spec = yaml.safe_load(ALERT_TESTS.read_text())
    assert spec["rule_files"] == [ALERTS.name]
    fired = {case["alertname"] for test in spec["tests"] for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert fired == {r["alert"] for r in rules()}


def promtool() -> str:
    found = tool("promtool")
    if found is None:
        pytest.skip("promtool is not installed (no PyPI package; Debian's `prometheus` package has it)")
    return found


def test_promtool_checks_the_rules():
    done = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_runs_the_alerts_unit_tests():
    done = subprocess.run([promtool(), "test", "rules", ALERT_TESTS.name], cwd=PROMETHEUS, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_scrape_configuration_matches_the_alerts_and_the_daemonset():
    config = yaml.safe_load(SCRAPE.read_text())
    assert config["rule_files"] == [ALERTS.name]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    (down,) = [r["expr"] for r in rules() if r["alert"] == "KvpolicyControllerDown"]
    (pattern,) = re.findall(r'up\{job=~"([^"]+)"\}', down)
    assert all(re.fullmatch(pattern, job) for job in jobs)
    assert all(j["honor_labels"] is True for j in jobs.values())  # keep kvpolicy's own `instance` label
    (keep,) = [r for r in jobs["kvpolicy"]["relabel_configs"] if r.get("action") == "keep"]
    manifest = yaml.safe_load_all((DEPLOY / "kubernetes" / "kvpolicy.yaml").read_text())
    (daemonset,) = [d for d in manifest if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]
    label = pod["metadata"]["labels"]["app.kubernetes.io/name"]
    (port,) = [p["name"] for c in pod["spec"]["containers"] for p in c["ports"]]
    assert re.fullmatch(keep["regex"], f"{label};{port}")
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in \
        jobs["kvpolicy"]["relabel_configs"]


# ---- the dashboard ----------------------------------------------------------------------------------------

def test_the_dashboard_is_well_formed():
    board = dashboard()
    assert board["uid"] == "kvpolicy" and board["schemaVersion"] >= 36
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:  # on the 24-column grid, no two panels overlap
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    defined = {v["name"] for v in board["templating"]["list"]}
    used = {m for q in dashboard_queries() for m in re.findall(r"\$(\w+)", q)}
    assert used <= defined, used - defined


# ---- every metric named is one kvpolicy exports -----------------------------------------------------------

ENGINE = textwrap.dedent("""
    import sys, time, kvpolicy
    from kvpolicy.facts import PoolFacts
    MiB = 1 << 20
    inst = kvpolicy.attach(model="chat", gpu="cuda:0", ledger_dir=sys.argv[1], elastic=True, id="chat/0")
    while inst.read().revision == 0:  # the controller's figures first: static admission needs them
        time.sleep(0.01)
    inst.admit_static(512 * MiB, reserve=512 * MiB)
    inst.report_pools({"swa": PoolFacts(owner="runtime", bytes=512 * MiB)})
    assert inst.admit(64 * MiB)
    inst.commit(64 * MiB)
    inst.report(used=16 * MiB, mapped=64 * MiB)
    print("ready", flush=True)
    last = None
    while True:
        reading = inst.read()
        if reading != last:
            last = reading
            inst.acknowledge(reading.revision, "applied")
        time.sleep(0.01)
""")


RULE = 'rule "squeeze-chat" {\n  when model.name == "chat"\n  shrink to min\n  grace 0s\n}\n'


@pytest.fixture
def exported(tmp_path) -> set[str]:
    """The sample names of a real controller's /metrics, with an engine reporting pools and elastic use."""
    site = Site(tmp_path)
    site.policy.write_text(POLICY + RULE)  # a rule in force, for the rule series
    engine = None
    try:
        controller = site.controller()
        base = site.serve(controller)
        engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(site.ledger_dir)], stdout=subprocess.PIPE, text=True)
        assert read_line(engine).strip() == "ready"
        controller._wake.set()
        assert wait_for(lambda: (s := site.slot("chat/0")) and s.mapped and s.ack_revision == s.revision)

        def scrape() -> str:
            return http_get(f"{base}/metrics")[1]

        text = wait_for(lambda: (t := scrape()) and "kvpolicy_gpu_reserved_bytes{" in t and
                        "kvpolicy_instance_mapped_bytes{" in t and "kvpolicy_rule_shrink_to_bytes{" in t and t)
        assert text
    finally:
        if engine is not None:
            engine.kill()
            engine.wait()
        site.close()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def named_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\bkvpolicy_[a-z0-9_]+\b", expr))


def test_alerts_and_dashboard_name_only_exported_metrics(exported):
    exprs = [r["expr"] for r in rules()] + dashboard_queries()
    named = set().union(*map(named_metrics, exprs))
    assert len(named) >= 25  # nearly everything kvpolicy exports is on the dashboard
    assert named <= exported, sorted(named - exported)
    selectors = {m for e in exprs for m in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", e)}
    assert selectors <= named | PROMETHEUS_OWN, selectors - named - PROMETHEUS_OWN


def test_a_misspelt_metric_would_be_caught(exported):
    assert "kvpolicy_instance_mapped_bytes" in exported and "kvpolicy_instance_maped_bytes" not in exported
