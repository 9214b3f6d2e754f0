"""``kvpolicy run``: watch the policy and the ledger, evaluate, publish revisioned limits.

The controller evaluates when the policy changes (the watcher wakes it), when any
GPU's ledger generation moves (an engine attached, admitted, reported or left;
polled with one 8-byte read per GPU every ``poll`` seconds, evaluations at most
every ``min_interval``), and on a timer (``tick``: grace, cooldown and idle time
move on their own). It publishes only when a limit, target, guarantee or GPU
figure changed, logs each change as one JSON line (naming the rules that act),
reclaims the slots of dead engines every step, and writes its status beside the
ledger. The rules' memory (grace timers, shrinks in force, cooldowns) is kept beside
the ledger too (``rulestate``), written before the limits it leads to are published
and read at start, so a restart does not undo a rule's shrink. A clean stop is
recorded in the status. A policy that fails to load never replaces the running
one. ``observe`` computes and reports without publishing. Without a source of GPU
figures (NVML, ``--gpu-capacity``, a facts file) it cannot know the budgets: it
validates and reports only.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.evaluate.decide import PreparedPolicy, evaluate, prepare
from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.runtime.directory import ControllerLock, LedgerDir, LedgerView
from kvpolicy.runtime.errors import ControllerRunning, LedgerError
from kvpolicy.runtime.gpus import GpuSampler, mixed_ids_note
from kvpolicy.runtime.metrics import ControllerMetrics
from kvpolicy.runtime.rulestate import read_rule_state, write_rule_state
from kvpolicy.runtime.status import (
    ControllerStatus,
    GpuStatus,
    InstanceStatus,
    LastReload,
    PolicyStatus,
    PoolStatus,
    ReloadError,
    Reserved,
    Status,
    write_status,
)
from kvpolicy.runtime.values import GpuLimits, InstanceLimits
from kvpolicy.runtime.watch import DEFAULT_QUIET, DEFAULT_START_WAIT, LoadedPolicy, PolicyWatcher, ReloadResult

log = logging.getLogger("kvpolicy.controller")
decisions_log = logging.getLogger("kvpolicy.decisions")


@dataclass(frozen=True)
class ControllerConfig:
    policy: Path
    observe: bool = False
    tick: float = 1.0
    """Evaluate at least this often (seconds): grace, cooldown and idle time move on their own."""
    poll: float = 0.005
    """How often to read the GPUs' ledger generations (seconds)."""
    min_interval: float = 0.01
    """At most one ledger-triggered evaluation per this many seconds."""
    heartbeat: float = 1.0
    stuck_after: float = 60.0
    """A deferral older than this is reported as stuck."""
    debounce: float = 0.01
    """After a close-write or a rename of the policy, read it this much later (seconds)."""
    quiet: float = DEFAULT_QUIET
    """A change seen any other way (a modify event, the poll) must hold still this long before it is read."""
    require_policy: bool = False
    """Refuse to start (``PolicyRefused``) when the policy cannot be loaded at start; else run on
    nothing and wait for a good one (the probes say so)."""
    start_wait: float = DEFAULT_START_WAIT
    """With ``require_policy``: a policy that cannot be loaded at start (a save caught half-way) is
    watched this long for a save that completes it before the start is refused (0: at once)."""


class PolicyRefused(Exception):
    """The policy could not be loaded when the controller started (``require_policy``)."""

    def __init__(self, result: ReloadResult | None) -> None:
        super().__init__(result.message if result is not None and result.message else "the policy was refused")
        self.result = result


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        ledger: LedgerDir,
        sampler: GpuSampler | None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.sampler = sampler
        self.metrics = metrics
        self.state = State()
        self._saved_state: State | None = None
        """The rule state last written beside the ledger."""
        self.stopped_at: float | None = None
        self.revision = 0
        self.decision: Decision | None = None
        self.prepared: PreparedPolicy | None = None
        """The policy in force, ready to evaluate: prepared again when a new one loads."""
        self.started_at = time.time()
        self._published: tuple[dict, dict, dict] | None = None
        self._published_policy: int | None = None
        self._wake = threading.Event()
        self._generations: dict[str, int] = {}
        self._last_step = 0.0
        self._last_beat = 0.0
        self._refused: dict[str, str] = {}
        """GPUs whose segment could not be used at the last look, and why (logged when it changes)."""
        self._status_failure: str | None = None
        """Why the status file could not be written last time (logged once, not at every step)."""
        self._lock: ControllerLock | None = None
        """The directory's controller lock, while ``run`` or ``once`` holds it."""
        self._directory: tuple[int, int] | None = None
        """The identity of the ledger directory the last step read (``LedgerView.directory``)."""
        self.watcher = PolicyWatcher(
            config.policy,
            on_change=self._policy_changed,
            on_reload=self._reloaded,
            debounce=config.debounce,
            quiet=config.quiet,
        )

    @property
    def publishing(self) -> bool:
        return not self.config.observe and self.sampler is not None

    @property
    def heartbeat_at(self) -> float | None:
        """When the loop last wrote its heartbeat (wall clock), None before its first step."""
        return self._last_beat or None

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; holds the directory's controller lock throughout (``LedgerError``
        when another controller takes the directory over: see ``_hold_lock``)."""
        with self._locked():
            self.revision = self.ledger.read().revision  # a restart continues above what engines hold
            self._restore_state()
            in_force = self.watcher.start(wait=self.config.start_wait if self.config.require_policy else 0.0, stop=stop)
            try:
                if self.config.require_policy and not in_force:
                    self.stopped_at = time.time()
                    self._beat()  # status says this start failed, not what the run before did
                    raise PolicyRefused(self.watcher.last_reload)
                self.step("start")
                next_tick = time.monotonic() + self.config.tick
                while not stop.is_set():
                    woke = self._wake.wait(self.config.poll)
                    now = time.monotonic()
                    reason = None
                    if woke:
                        self._wake.clear()
                        reason = "policy"
                    elif now >= next_tick:
                        reason = "timer"
                    elif now - self._last_step >= self.config.min_interval and self.ledger.generations() != self._generations:
                        reason = "ledger"
                    if reason is not None:
                        self.step(reason)
                        next_tick = time.monotonic() + self.config.tick
                    elif time.time() - self._last_beat >= self.config.heartbeat:
                        self._beat()
                self.stopped_at = time.time()  # only a clean stop gets here: status says "stopped"
                self._beat()
            finally:
                self.watcher.stop()

    def once(self) -> Decision | None:
        """Load, evaluate and publish once (``--once``)."""
        with self._locked():
            self.revision = self.ledger.read().revision
            self._restore_state()
            self.watcher.check_now()
            self.step("once")
        return self.decision

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock = self.ledger.claim_controller()
        try:
            yield
        finally:
            self._lock.release()
            self._lock = None

    def _hold_lock(self) -> None:
        """Stay the directory's one controller. Its lock file removed (or the whole directory), a second
        controller could lock a new one and both would publish: lock the new file first, or, if another
        controller already has, stop (``LedgerError``) so that one alone decides."""
        if self._lock is None or self._lock.still_named():
            return
        try:
            fresh = self.ledger.claim_controller()
        except ControllerRunning as exc:
            raise LedgerError(
                f"kvpolicy ledger: {self._lock.path} was removed under this controller and another controller "
                f"(pid {exc.holder}) has locked it since; this one stops so that one alone publishes"
            ) from None
        self._lock.release()
        self._lock = fresh
        log.warning("%s was removed while this controller ran; it locked a new one (one controller per ledger "
                    "directory: do not remove the lock file)", fresh.path)

    def _policy_changed(self, loaded: LoadedPolicy) -> None:
        if self.metrics:
            self.metrics.reloads.labels("ok").inc()
        self._wake.set()

    def _reloaded(self, result: ReloadResult) -> None:
        if not result.ok:
            self._wake.set()  # a step now: the status file names the rejection at once
        if self.metrics:
            self.metrics.last_reload_ok.set(int(result.ok))
            if not result.ok:
                self.metrics.reloads.labels("failed").inc()

    # ---- one step ---------------------------------------------------------------------------------

    def step(self, reason: str) -> Decision | None:
        """Reclaim, read, evaluate, publish if anything changed, write status."""
        self._hold_lock()  # before anything is written
        self._last_step = time.monotonic()
        reclaimed = self.ledger.reclaim_dead()
        for slot in reclaimed:
            log.info("reclaimed %s on %s (pid %d is gone)", slot.id, slot.gpu, slot.pid)
        if reclaimed and self.metrics:
            self.metrics.reclaimed.inc(len(reclaimed))
        view = self.ledger.read()
        self._generations = view.generations
        self._same_directory(view)
        loaded = self.watcher.current
        if loaded is None:
            self.decision = None
            self._write_status(view, [])
            return None
        samples = self.sampler.sample(view.gpus) if self.sampler is not None else None
        facts, notes = view.facts(samples)
        mixed = mixed_ids_note(view.gpus)
        if mixed:
            notes.append(mixed)
        started = time.perf_counter()
        if self.prepared is None or self.prepared.policy is not loaded.policy:
            self.prepared = prepare(loaded.policy)
        decision, self.state = evaluate(self.prepared, facts, self.state)
        if self.metrics:
            self.metrics.evaluation.observe(time.perf_counter() - started)
        self._save_state()  # before the limits it leads to are published: a crash between keeps the shrink
        if self.publishing:
            self._publish(view, decision, loaded, reason)
        elif self.decision is None or _limits_of(decision) != _limits_of(self.decision):
            self._log_change(decision, view, reason, published=False)
        self.decision = decision
        self._write_status(view, notes)
        return decision

    def _same_directory(self, view: LedgerView) -> None:
        """A ledger directory removed (and made again) since the last step has none of what this controller
        wrote there: publish to the new one's segments even if the decision is the same, and write the
        rules' memory there again."""
        if view.directory != self._directory:
            if self._directory is not None:
                self._published = None
                self._saved_state = None
            self._directory = view.directory

    def _publish(self, view: LedgerView, decision: Decision, loaded: LoadedPolicy, reason: str) -> None:
        instances, gpus = _limits_of(decision)
        slots = {v.id: (v.gpu, v.index, v.epoch) for v in view.instances()}  # a re-attached id needs its limits again
        if self._published == (instances, gpus, slots) and self._published_policy == loaded.revision:
            return
        self.revision = max(self.revision, view.revision) + 1
        gpu_limits, instance_limits, refused = _checked_limits(gpus, instances)
        skipped = refused + self.ledger.publish(view, self.revision, gpu_limits, instance_limits)
        for note in skipped:
            log.info("publish %d: %s", self.revision, note)
        self._published = (instances, gpus, slots)
        self._published_policy = loaded.revision
        if self.metrics:
            self.metrics.publishes.inc()
        self._log_change(decision, view, reason, published=True)

    def _log_change(self, decision: Decision, view: LedgerView, reason: str, published: bool) -> None:
        before = {i.id: i for i in self.decision.instances} if self.decision else {}
        changes = {}
        for inst in decision.instances:
            old = before.get(inst.id)
            fields = {
                name: [getattr(old, name) if old else None, getattr(inst, name)]
                for name in ("guarantee", "limit", "target")
                if old is None or getattr(old, name) != getattr(inst, name)
            }
            if fields:
                fields["rules"] = [a.rule for a in inst.actions]  # the rules holding it down, if any
                changes[inst.id] = fields
        left = set(before) - {i.id for i in decision.instances}
        # an instance on a GPU whose segment cannot be read now has not left: it is out of reach
        unreachable = sorted(i for i in left if before[i].gpu in view.refused)
        gone = sorted(left - set(unreachable))
        record = {
            "event": "decision",
            "at": round(time.time(), 3),
            "reason": reason,
            "revision": self.revision if published else None,
            "published": published,
            "policy_sha256": decision.policy.sha256[:12],
            "changes": changes,
            "gone": gone,
            "unreachable": unreachable,
        }
        decisions_log.info(json.dumps(record, sort_keys=True), extra={"fields": record})

    # ---- the rules' memory ------------------------------------------------------------------

    def _restore_state(self) -> None:
        """The rule state the last controller left beside the ledger (none, or unreadable: a fresh one)."""
        try:
            saved = read_rule_state(self.ledger.path)
        except LedgerError as exc:
            log.warning("%s; starting with no rule memory (grace periods start again)", exc)
            return
        if saved is not None:
            self.state = self._saved_state = saved
            remembered = sum(len(m) for m in saved.rules.values())
            log.info("rule state restored: %d rule(s), %d instance memory(ies)", len(saved.rules), remembered)

    def _save_state(self) -> None:
        if self.state == self._saved_state:
            return
        try:
            write_rule_state(self.ledger.path, self.state, self.ledger.access)
            self._saved_state = self.state
        except (LedgerError, OSError) as exc:
            log.warning("cannot write the rule state: %s (a restart would start grace periods again)", exc)

    def _beat(self) -> None:
        self._hold_lock()
        self._write_status(self.ledger.read(), [])

    # ---- status ------------------------------------------------------------------------------------

    def _note_refused(self, refused: dict[str, str]) -> None:
        """Log a GPU whose segment cannot be used once (again if the reason changes), and its recovery."""
        for gpu, why in sorted(refused.items()):
            if self._refused.get(gpu) != why:
                log.warning("%s: its ledger segment cannot be used, so engines on it get no new limits: %s", gpu, why)
        for gpu in sorted(set(self._refused) - set(refused)):
            log.info("%s: its ledger segment can be used again", gpu)
        self._refused = dict(refused)

    def _write_status(self, view: LedgerView, notes: list[str]) -> None:
        self._note_refused(view.refused)
        now = time.time()
        self._last_beat = now
        self.ledger.heartbeat(now)
        status = self.status(view, notes, now)
        try:
            write_status(self.ledger.path, status, self.ledger.access)
        except (LedgerError, OSError) as exc:
            if str(exc) != self._status_failure:
                log.warning("cannot write the status file: %s (kvpolicy status shows an old state until it can)", exc)
            self._status_failure = str(exc)
        else:
            if self._status_failure is not None:
                log.info("the status file is written again")
            self._status_failure = None
        if self.metrics:
            self.metrics.update(
                decision=self.decision, view=view, policy_revision=self.watcher.current.revision if self.watcher.current else 0,
                published_revision=self.revision, heartbeat=now,
            )

    def status(self, view: LedgerView, notes: list[str], now: float) -> Status:
        """The status document (``kvpolicy status``'s JSON, docs/json.md), as this controller sees it."""
        loaded = self.watcher.current
        decided = {i.id: i for i in self.decision.instances} if self.decision else {}
        gpus = []
        for gpu in self.decision.gpus if self.decision else ():
            gpus.append(GpuStatus(
                id=gpu.id, name=gpu.name, elastic_budget=gpu.elastic_budget, free=gpu.free,
                reserved=Reserved(total=gpu.reserved.total, by_pool=gpu.reserved.by_pool),
                capacity=gpu.capacity, headroom=gpu.headroom, other_used=gpu.other_used,
                figures="published" if self.publishing else "none",
            ))
        instances = []
        for slot in view.instances():
            facts = slot.facts(view.now)
            mine = decided.get(slot.id)
            instances.append(InstanceStatus(
                id=slot.id, model=slot.model, engine=slot.engine, gpu=slot.gpu, pid=slot.pid,
                pools={n: PoolStatus(owner=p.owner, bytes=p.bytes) for n, p in facts.pools.items()},
                elastic=facts.elastic,
                limit=mine.limit if mine else slot.limit,
                target=mine.target if mine else slot.target,
                guarantee=mine.guarantee if mine else slot.guarantee,
                revision=slot.revision, acked_revision=slot.ack_revision, ack=slot.ack,
                stuck=slot.stuck(view.now, self.config.stuck_after), deferred_since=slot.deferred_since,
                idle_seconds=facts.idle_seconds, engine_id=facts.engine_id, rank=facts.rank,
            ))
        last = self.watcher.last_reload
        problems = list(notes)
        if self.sampler is None:
            problems.append("no source of GPU figures (NVML, --gpu-capacity, --facts): validating and reporting only")
        return Status(
            written_at=now,
            policy=PolicyStatus(
                file=str(self.config.policy), sha256=loaded.sha256, revision=loaded.revision, loaded_at=loaded.loaded_at,
            ) if loaded else None,
            last_reload=_last_reload(last, self.config.policy) if last else None,
            controller=ControllerStatus(
                pid=os.getpid(), started_at=self.started_at, heartbeat_at=now, tick_seconds=self.config.tick,
                observe=not self.publishing, stopped_at=self.stopped_at,
            ),
            gpus=gpus,
            instances=instances,
            rules=list(self.decision.rules) if self.decision else [],
            problems=problems,
            refused_segments=dict(view.refused),
        )


def _checked_limits(gpus: dict, instances: dict) -> tuple[dict[str, GpuLimits], dict[str, InstanceLimits], list[str]]:
    """The decision's figures as the ledger's values; one the ledger cannot hold is left out and named."""
    gpu_limits: dict[str, GpuLimits] = {}
    instance_limits: dict[str, InstanceLimits] = {}
    refused: list[str] = []
    for g, figures in gpus.items():
        try:
            gpu_limits[g] = GpuLimits(**figures)
        except LedgerError as exc:
            refused.append(f"{g}: not published: {exc}")
    for i, values in instances.items():
        try:
            instance_limits[i] = InstanceLimits(*values)
        except LedgerError as exc:
            refused.append(f"{i}: not published: {exc}")
    return gpu_limits, instance_limits, refused


def _limits_of(decision: Decision) -> tuple[dict, dict]:
    instances = {i.id: (i.limit, i.target, i.guarantee) for i in decision.instances}
    gpus = {
        g.id: {"capacity": g.capacity, "headroom": g.headroom, "other_used": g.other_used, "elastic_budget": g.elastic_budget}
        for g in decision.gpus
    }
    return instances, gpus


def _last_reload(result: ReloadResult, policy: Path) -> LastReload:
    error = None
    if result.error is not None:
        d = result.error
        error = ReloadError(file=d.file, line=d.line, col=d.col, code=d.code, message=d.message, hint=d.hint)
    elif result.message is not None:  # the file itself could not be read: no position, no code
        error = ReloadError(file=str(policy), line=0, col=0, code="", message=result.message)
    return LastReload(ok=result.ok, at=result.at, sha256=result.sha256, error=error)
