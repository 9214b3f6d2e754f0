"""Prometheus metrics of the controller (``kvpolicy run --metrics-address``; served with
``/healthz`` and ``/readyz`` by ``endpoints``).

Figures that describe the present (per GPU and per instance) come from one
collector over the latest decision and ledger view, so an instance that goes
away takes its series with it; counters and the evaluation-latency histogram are
ordinary prometheus-client metrics in the same registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvpolicy.evaluate.decision import Decision, RuleStateName

if TYPE_CHECKING:
    from kvpolicy.runtime.directory import LedgerView

EVALUATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class _Snapshot(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decision: Decision | None = None
        self.view: LedgerView | None = None
        self.policy_revision = 0
        self.published_revision = 0
        self.heartbeat = 0.0
        self.stuck_after = 60.0

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            decision, view = self.decision, self.view
            policy_revision, published, heartbeat = self.policy_revision, self.published_revision, self.heartbeat
        yield _gauge("kvpolicy_policy_revision", "Revision of the policy in force (1 = first load).", policy_revision)
        yield _gauge("kvpolicy_published_revision", "Revision of the limits last published to the ledger.", published)
        yield _gauge("kvpolicy_controller_heartbeat_timestamp_seconds", "When the controller last ran its loop.", heartbeat)
        if decision is not None:
            yield from _gpu_families(decision)
            yield from _instance_families(decision)
            yield from _rule_families(decision)
        if view is not None:
            yield from _ledger_families(view, self.stuck_after)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _gpu_families(decision: Decision) -> Iterator[Metric]:
    specs = (
        ("kvpolicy_gpu_capacity_bytes", "GPU capacity (policy override or measured).", lambda g: g.capacity),
        ("kvpolicy_gpu_headroom_bytes", "Headroom never handed out.", lambda g: g.headroom),
        ("kvpolicy_gpu_other_used_bytes", "Memory in use that no instance accounts for.", lambda g: g.other_used),
        ("kvpolicy_gpu_elastic_budget_bytes", "Elastic budget A = C - H - U - R.", lambda g: g.elastic_budget),
        ("kvpolicy_gpu_free_bytes", "Elastic budget not in use.", lambda g: g.free),
        ("kvpolicy_gpu_guaranteed_bytes", "Sum of guarantees.", lambda g: g.guaranteed),
    )
    for name, doc, value in specs:
        family = GaugeMetricFamily(name, doc, labels=["gpu"])
        for gpu in decision.gpus:
            family.add_metric([gpu.id], value(gpu))
        yield family
    # The display name as an info metric (join on gpu), so the value series keep one label per GPU.
    info = GaugeMetricFamily("kvpolicy_gpu_info", "The GPU's display name (cuda:N on the controller's machine); gpu is its UUID.",
                             labels=["gpu", "name"])
    for gpu in decision.gpus:
        info.add_metric([gpu.id, gpu.name or gpu.id], 1)
    yield info
    reserved = GaugeMetricFamily("kvpolicy_gpu_reserved_bytes", "Runtime-owned reservations by pool.", labels=["gpu", "pool"])
    for gpu in decision.gpus:
        for pool, size in gpu.reserved.by_pool.items():
            reserved.add_metric([gpu.id, pool], size)
    yield reserved


def _instance_families(decision: Decision) -> Iterator[Metric]:
    labels = ["instance", "model", "engine", "gpu"]
    specs = (
        ("kvpolicy_instance_limit_bytes", "Published hard cap on elastic memory.", lambda i: i.limit),
        ("kvpolicy_instance_target_bytes", "Fair target for elastic memory.", lambda i: i.target),
        ("kvpolicy_instance_guarantee_bytes", "Guaranteed elastic memory.", lambda i: i.guarantee),
        ("kvpolicy_instance_shortfall", "1 if the guarantee is below the model's min.", lambda i: int(i.shortfall)),
        ("kvpolicy_instance_violations", "Runtime pools over their max, reserve exceeded.", lambda i: len(i.violations)),
        ("kvpolicy_instance_rule_actions", "Rules in force on the instance.", lambda i: len(i.actions)),
    )
    for name, doc, value in specs:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for inst in decision.instances:
            family.add_metric([inst.id, inst.model, inst.engine, inst.gpu], value(inst))
        yield family


RULE_STATES: tuple[str, ...] = get_args(RuleStateName)


def _rule_families(decision: Decision) -> Iterator[GaugeMetricFamily]:
    """Per rule and instance: its state (one series per state, 1 for the one it is in), and
    the shrink in force."""
    where = {i.id: i for i in decision.instances}
    labels = ["rule", "instance", "model", "engine", "gpu"]
    state = GaugeMetricFamily("kvpolicy_rule_state", "1 for the state a rule is in on an instance "
                              "(waiting out grace, acting, cooling down, holding but not needed).",
                              labels=[*labels, "state"])
    shrink = GaugeMetricFamily("kvpolicy_rule_shrink_to_bytes", "The limit a rule in force holds an instance to.",
                               labels=labels)
    for rule in decision.rules:
        for on in rule.instances:
            inst = where.get(on.instance)
            key = [rule.rule, on.instance, inst.model if inst else "", inst.engine if inst else "", inst.gpu if inst else ""]
            for name in RULE_STATES:
                state.add_metric([*key, name], int(on.state == name))
            if on.shrink_to is not None:
                shrink.add_metric(key, on.shrink_to)
    yield state
    yield shrink


def _ledger_families(view: LedgerView, stuck_after: float) -> Iterator[Metric]:
    labels = ["instance", "model", "engine", "gpu"]
    used = GaugeMetricFamily("kvpolicy_instance_used_bytes", "Elastic bytes in live blocks.", labels=labels)
    mapped = GaugeMetricFamily("kvpolicy_instance_mapped_bytes", "Elastic bytes mapped on the GPU.", labels=labels)
    waiting = GaugeMetricFamily(
        "kvpolicy_instance_waiting_bytes", "Elastic growth refused in the pool's last period: what its work waits for.",
        labels=labels,
    )
    pools = GaugeMetricFamily(
        "kvpolicy_instance_pool_bytes", "Runtime-owned reservations by pool.", labels=[*labels, "pool"]
    )
    stuck = GaugeMetricFamily("kvpolicy_instance_stuck", "1 if a deferral is older than the stuck time.", labels=labels)
    acked = GaugeMetricFamily("kvpolicy_instance_acked_revision", "Revision the instance last acknowledged.", labels=labels)
    for v in view.instances():
        key = [v.id, v.model, v.engine, v.gpu]
        facts = v.facts(view.now)
        if facts.elastic is not None:
            used.add_metric(key, facts.elastic.used)
            mapped.add_metric(key, facts.elastic.mapped)
            waiting.add_metric(key, facts.elastic.waiting)
        for name, pool in facts.pools.items():
            pools.add_metric([*key, name], pool.bytes)
        stuck.add_metric(key, int(v.stuck(view.now, stuck_after)))
        acked.add_metric(key, v.ack_revision)
    yield from (used, mapped, waiting, pools, stuck, acked)
    refusals = CounterMetricFamily(
        "kvpolicy_gpu_elastic_refusals", "Elastic admissions the GPU's budget refused (pools then give back).", labels=["gpu"]
    )
    for gpu, state in view.gpus.items():
        refusals.add_metric([gpu], state.pressure)
    yield refusals
    refused = GaugeMetricFamily(
        "kvpolicy_ledger_segment_refused",
        "1 for a GPU whose ledger segment cannot be used (damaged, another layout): its engines get no new limits.",
        labels=["gpu"],
    )
    for gpu in sorted({*view.gpus, *view.refused}):
        refused.add_metric([gpu], int(gpu in view.refused))
    yield refused


class ControllerMetrics:
    """The controller's registry; ``endpoints.serve`` exposes it over HTTP."""

    def __init__(self, stuck_after: float = 60.0) -> None:
        self.registry = CollectorRegistry()
        self._snapshot = _Snapshot()
        self._snapshot.stuck_after = stuck_after
        self.registry.register(self._snapshot)
        self.reloads = Counter("kvpolicy_policy_reloads", "Policy reloads by result.", ["result"], registry=self.registry)
        self.last_reload_ok = Gauge(
            "kvpolicy_policy_last_reload_successful",
            "1 if the policy file's last load succeeded, 0 if it was rejected (the last good policy stays in force).",
            registry=self.registry,
        )
        self.publishes = Counter("kvpolicy_publishes", "Revisions published to the ledger.", registry=self.registry)
        self.reclaimed = Counter("kvpolicy_reclaimed_instances", "Slots of dead engines reclaimed.", registry=self.registry)
        self.evaluation = Histogram(
            "kvpolicy_evaluation_seconds", "Time to evaluate the policy against the facts.",
            buckets=EVALUATION_BUCKETS, registry=self.registry,
        )

    def update(self, *, decision: Decision | None, view: LedgerView | None, policy_revision: int, published_revision: int, heartbeat: float) -> None:
        with self._snapshot._lock:
            self._snapshot.decision = decision
            self._snapshot.view = view
            self._snapshot.policy_revision = policy_revision
            self._snapshot.published_revision = published_revision
            self._snapshot.heartbeat = heartbeat
