"""Co-located tenants under a live policy vs static partitioning, measured on one GPU (issue 8).

Runs one mode per call, so that each is one command of a few minutes on the GPU, and combines them:

    python3 benchmarks/colocate/colocate.py --mode static   --out OUT        # ≈ 4.5 min on the H200
    python3 benchmarks/colocate/colocate.py --mode kvpolicy --out OUT
    python3 benchmarks/colocate/colocate.py --mode kvpolicy-old --out OUT    # optional: the allocator's old give-back
    python3 benchmarks/colocate/colocate.py --combine OUT [--update-readme]  # results.json + memory.png

A mode: the DeepSeek-V4 tenant builds its pools (admitted and reported in the ledger);
in kvpolicy mode the controller starts (``kvpolicy run`` with the GPU's figures pinned
so that the tenants' elastic budget is exactly the parameters' budget); the tenant
processes build their pools and warm up; then all of them follow the trace from one
start time to its end, each on its clock (``clock.py``: wall time on a GPU run,
one ``step_ms`` per step in CI). In kvpolicy mode the driver samples the ledger every
50 ms and, once every tenant's clock has passed ``reload.at_s``, edits the policy
file (the parameters say which settings of which two models it swaps). Each mode
writes ``OUT/<mode>.json``.

``--params`` picks the parameter file (default ``default.toml`` beside this script;
``cpu.toml`` is the same trace on the host driver); ``--duration-scale 0.25`` shortens
every duration of the trace for a smoke run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # imported (tests) rather than run as a script
    sys.path.append(str(HERE))

from analysis import budget_check, reclaim_transitions, reload_metrics
from params import Params, load_params
from policyedit import idle_rule, swap_settings

LEDGER_EVERY_S = 0.05


class Child:
    """A process of the run: its stdout read line by line in a thread, its stderr in a log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._log_file = open(self.log, "wb")  # noqa: SIM115  (the child writes to it until stop() closes it)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file, text=True,
            cwd=log_dir, env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word: str, timeout: float) -> str:
        """The rest of the first stdout line starting with ``word``; raises with the log's tail if it never comes."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.01, left))
            except queue.Empty:
                line = ""
                if left <= 0:
                    raise RuntimeError(f"{self.name}: no '{word}' within {timeout:.0f} s\n{self.tail()}") from None
                continue
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"{self.name} exited with {code} before '{word}'\n{self.tail()}")
            if line == word or line.startswith(word + " "):
                return line[len(word):].strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def tail(self, n: int = 40) -> str:
        self._log_file.flush()
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(f"  {self.name}| {s}" for s in text[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


def _policy_figures(params: Params, policy_path: Path) -> tuple[Any, int, int]:
    from kvpolicy.lint.load import load_policy
    from kvpolicy.policy.resolve import gpu_settings, model_settings

    policy = load_policy(policy_path)
    settings = gpu_settings(policy, params.device.ledger_id, params.device.gpu)
    if settings.headroom is not None and not hasattr(settings.headroom, "bytes"):
        raise SystemExit("colocate: give the policy's headroom as a size: the budget arithmetic needs it before the capacity")
    headroom = settings.headroom_bytes(0)
    reserve = model_settings(policy, params.dsv4.model).reserve or 0
    return policy, headroom, reserve


def _write_facts(path: Path, gpu: str, name: str, capacity: int) -> None:
    gpus = [{"id": gpu, "name": name, "capacity": capacity, "other_used": 0}]
    path.write_text(json.dumps({"schema": 1, "now": 0.0, "gpus": gpus, "instances": []}))


def _wait_published(ledger_dir: Path, gpu: str, timeout: float) -> Any:
    from kvpolicy.runtime import LedgerDir

    deadline = time.monotonic() + timeout
    led = LedgerDir(ledger_dir)
    try:
        while time.monotonic() < deadline:
            view = led.read()
            state = view.gpus.get(gpu)
            if state is not None and state.figures.source == "published" and state.figures.elastic_budget is not None:
                return state.figures
            time.sleep(0.02)
    finally:
        led.close()
    raise RuntimeError(f"the controller published no figures for {gpu} within {timeout:.0f} s")


class LedgerSampler(threading.Thread):
    """Reads the ledger every 50 ms from ``t0`` until ``stop`` is set: per tenant mapped/used/limit/target,
    and the GPU's committed elastic bytes."""

    def __init__(self, ledger_dir: Path, gpu: str, t0: float) -> None:
        super().__init__(daemon=True)
        self.ledger_dir, self.gpu, self.t0 = ledger_dir, gpu, t0
        self.stop = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None

    def run(self) -> None:
        from kvpolicy.runtime import LedgerDir, LedgerError

        led = LedgerDir(self.ledger_dir)
        try:
            while not self.stop.is_set():
                view = led.read()
                state = view.gpus.get(self.gpu)
                if state is not None and time.time() >= self.t0:
                    elastic = [v for v in state.instances if v.elastic]
                    self.samples.append({
                        "t": round(view.now - self.t0, 3),
                        "elastic_committed": state.totals.elastic_mapped + state.totals.elastic_pending,
                        "sum_mapped": sum(v.mapped for v in elastic),
                        "budget": state.figures.elastic_budget,
                        "tenants": {v.model: [v.mapped, v.used, v.limit, v.target, v.revision, v.ack_revision] for v in elastic},
                    })
                self.stop.wait(LEDGER_EVERY_S)
        except (LedgerError, OSError) as exc:  # reported in the result; the run goes on
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            led.close()


def _edit_policy(path: Path, params: Params) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    edited = swap_settings(text, *params.reload.swap, params.reload.fields, file=str(path))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(edited, encoding="utf-8")
    os.replace(tmp, path)  # an editor's atomic save
    saved = time.time()
    return {
        "saved_at": saved, "swap": list(params.reload.swap), "fields": list(params.reload.fields),
        "sha256": hashlib.sha256(edited.encode("utf-8")).hexdigest(),
    }


def _decisions(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if "kvpolicy.decisions" in line and "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except json.JSONDecodeError:
                continue
    return out


def _wait_for_publish(controller: Child, sha256: str, timeout: float) -> None:
    """Until the controller's decision log shows the policy with ``sha256`` published (then it is in the ledger)."""
    deadline = time.monotonic() + timeout
    while not any(d.get("published") and d.get("policy_sha256") == sha256[:12] for d in _decisions(controller.log)):
        if controller.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the controller did not publish the edited policy\n{controller.tail()}")
        time.sleep(0.05)


def run_mode(params: Params, mode: str, out: Path, scale: float, keep: bool, profile: bool = False,
             old: bool = False) -> dict[str, Any]:
    """Run one mode end to end; returns (and writes to ``out/<label>.json``) everything it measured.

    ``old``: kvpolicy mode with the allocator's old give-back (``Params.old_allocator``), labelled
    ``kvpolicy-old``, so one run directory holds the old and the new behaviour beside static."""
    from kvpolicy.policy.resolve import model_settings

    label = "kvpolicy-old" if old else mode
    if old:
        if mode != "kvpolicy":
            raise ValueError("the old allocator is a kvpolicy mode setting")
        params = params.old_allocator()
    out.mkdir(parents=True, exist_ok=True)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    run_dir = Path(tempfile.mkdtemp(prefix=f"kvpolicy-colocate-{mode}-", dir=base))
    ledger_dir = run_dir / "ledger"
    policy_path = run_dir / "policy.kvp"
    shutil.copyfile(params.policy, policy_path)
    policy, headroom, reserve = _policy_figures(params, policy_path)
    rule = idle_rule(policy)
    provisional = params.budget.elastic + headroom + reserve  # the stand-in's admission, before any controller
    guarantees = {n: model_settings(policy, n).min_bytes(provisional) for n in params.tenants}
    py = sys.executable
    source = str(params.source)
    children: list[Child] = []
    timeline: dict[str, float] = {"start": time.time()}
    result: dict[str, Any] = {"mode": mode, "label": label, "params": json.loads(params.model_dump_json()), "duration_scale": scale}
    try:
        v4 = Child("dsv4", [py, str(HERE / "dsv4.py"), "--params", source, "--policy", str(policy_path),
                            "--ledger-dir", str(ledger_dir), "--capacity", str(provisional), "--headroom", str(headroom),
                            "--out", str(run_dir / "dsv4.json")],
                   run_dir, env={"KVPOLICY_POLICY": str(policy_path), "KVPOLICY_LEDGER_DIR": str(ledger_dir)})
        children.append(v4)
        tenants = []
        for i, name in enumerate(params.tenants):
            argv = [py, str(HERE / "tenant.py"), "--params", source, "--mode", mode, "--index", str(i),
                    "--guarantee", str(guarantees[name]), "--scale", str(scale), "--out", str(run_dir / f"{name}.json")]
            if mode == "kvpolicy":
                argv += ["--ledger-dir", str(ledger_dir)]
            if old:
                argv.append("--old-allocator")
            if profile:
                argv.append("--profile")
            tenants.append(Child(name, argv, run_dir))
        children += tenants
        for t in tenants:
            t.wait_for("loaded", 300)
        timeline["tenants_loaded"] = time.time()
        v4_ready = json.loads(v4.wait_for("ready", 600))
        timeline["dsv4_ready"] = time.time()
        runtime = v4_ready["runtime_reserved"]
        budget: dict[str, Any] = {"runtime_reserved": runtime, "headroom": headroom}
        controller = None
        if mode == "kvpolicy":
            capacity = params.budget.elastic + headroom + runtime
            facts = run_dir / "gpu-figures.json"
            _write_facts(facts, params.device.ledger_id, params.device.gpu, capacity)
            controller = Child("controller", [py, "-c", "import sys; from kvpolicy.cli import main; sys.exit(main(sys.argv[1:]))",
                                              "run", str(policy_path), "--ledger-dir", str(ledger_dir), "--facts", str(facts),
                                              "--tick", "0.1", "--metrics-address", "off", "--log-level", "INFO"],
                               run_dir)
            children.append(controller)
            figures = _wait_published(ledger_dir, params.device.ledger_id, 60)
            timeline["controller_published"] = time.time()
            budget.update(capacity=capacity, other_used=0, elastic_budget=figures.elastic_budget,
                          exact=figures.elastic_budget == params.budget.elastic)
        else:
            budget.update(static_shares=params.budget.static_share * len(params.tenants))
        for t in tenants:  # after the V4 pools exist (and the controller runs): its sizing sees a quiet GPU
            t.send("build")
        ready = {t.name: json.loads(t.wait_for("ready", 600)) for t in tenants}
        timeline["tenants_ready"] = time.time()
        t0 = time.time() + 2.0
        for t in tenants:
            t.send(f"go {t0!r}")
        v4.send(f"go {t0!r}")  # serves its own trace if it has one (dsv4.py)
        sampler = None
        # Hang catchers only: with the `steps` clock a loaded machine takes longer, never fewer steps.
        patience = 600 + 4 * params.trace.duration_s
        if controller is not None:
            sampler = LedgerSampler(ledger_dir, params.device.ledger_id, t0)
            sampler.start()
            for t in tenants:  # every tenant's clock has passed the edit's time (wall clock: within a step of it)
                t.wait_for("reload-time", patience)
            result["reload"] = _edit_policy(policy_path, params)
            result["reload"]["at_s"] = round(result["reload"]["saved_at"] - t0, 3)
            if params.engine.clock == "steps":
                # The step clock stands still while the tenants wait: the edit is published at the
                # same trace time however long the controller takes on this machine.
                _wait_for_publish(controller, result["reload"]["sha256"], patience)
                for t in tenants:
                    t.send("resume")
        for t in tenants:
            t.wait_for("done", patience)
        timeline["tenants_done"] = time.time()
        v4.send("stop")
        v4.wait_for("done", 60)
        if sampler is not None:
            sampler.stop.set()
            sampler.join(5)
        for child in children:
            child.stop()
        result.update(
            t0=t0, budget=budget, ready=ready, timeline={k: round(v - t0, 3) for k, v in timeline.items()},
            dsv4=json.loads((run_dir / "dsv4.json").read_text()),
            tenants={n: json.loads((run_dir / f"{n}.json").read_text()) for n in params.tenants},
            idle_rule={"name": rule.name, "below": rule.below, "grace": rule.grace, "cooldown": rule.cooldown},
            guarantees=guarantees,
        )
        result["machine"] = result["tenants"][params.tenants[0]].get("device")
        if controller is not None:
            decisions = _decisions(controller.log)
            result["decisions"] = decisions
            result["controller_exit"] = controller.proc.returncode
            result["reload"].update(reload_metrics(result["reload"], decisions, result["tenants"]))
            result["ledger_samples"] = sampler.samples if sampler else []
            result["ledger_sampler_error"] = sampler.error if sampler else None
            result["budget_check"] = budget_check(result["ledger_samples"], params.budget.elastic)
            result["reclaim"] = {
                n: reclaim_transitions(result["tenants"][n], rule.below, guarantees[n], rule.grace) for n in params.tenants
            }
        else:
            result["budget_check"] = _static_budget_check(result["tenants"], params.budget.elastic)
    except BaseException:
        for child in children:
            if child.proc.poll() is not None and child.proc.returncode:
                print(f"--- {child.name} exited with {child.proc.returncode}:\n{child.tail()}", file=sys.stderr)
        raise
    finally:
        for child in children:
            child.stop()
        with open(out / f"logs-{label}.txt", "w") as logs:  # one file: fewer files to copy back from the GPU host
            for child in children:
                logs.write(f"===== {child.name} (exit {child.proc.returncode}) =====\n")
                logs.write(child.log.read_text(errors="replace"))
        if keep:
            print(f"run directory kept: {run_dir}", file=sys.stderr)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    (out / f"{label}.json").write_text(json.dumps(result))
    _print_mode(result)
    return result


def _static_budget_check(tenants: dict[str, Any], budget: int) -> dict[str, Any]:
    """Static mode: the pools' held bytes, summed per sampling instant, never above the budget."""
    buckets: dict[int, dict[str, int]] = {}
    for name, t in tenants.items():
        col = {c: i for i, c in enumerate(t["samples"]["columns"])}
        for row in t["samples"]["rows"]:
            buckets.setdefault(round(row[col["t"]] * 10), {})[name] = row[col["held"]]
    sums = [sum(v.values()) for v in buckets.values() if len(v) == len(tenants)]
    return {"samples": len(sums), "budget": budget, "max_committed": max(sums, default=0),
            "over_budget": sum(s > budget for s in sums)}


def _print_mode(result: dict[str, Any]) -> None:
    print(f"mode {result['mode']}: budget {result['budget']}")
    for name, t in result["tenants"].items():
        s = t["summary"]
        print(f"  {name}: tokens {s['tokens']:,}  completed {s['completed']}/{s['arrived']}  queued {s['queued']}  "
              f"preempted {s['preempted']}  abandoned {s['abandoned']}  corrupted {s['corrupted']}  oom {s['oom']}  "
              f"step p50 {s['step_ms_p50']:.2f} ms p99 {s['step_ms_p99']:.2f} ms  peak {t['peak_held'] / 2**30:.2f} GiB")
        phases = "  ".join(f"{k} {v:.1f}" for k, v in s["phase_seconds"].items())
        print(f"    {s['steps']:,} steps; seconds in {phases}{' (profiled)' if s['profiled'] else ''}")
        print(f"    step start to start p50 {s['interval_ms_p50']:.2f} ms p99 {s['interval_ms_p99']:.2f} ms; step p99 "
              f"{s['step_ms_p99_within_bound']:.2f} ms over the {s['steps_within_bound']:,} steps within a static share's KV; "
              f"chunk groups mapped between steps: {s['groups_grown_between']:,} for admission, {s['groups_topped_up']:,} reserve")
    d = result["dsv4"]
    print(f"  dsv4 ({d['build']}): runtime-owned {d['ledger_runtime_reserved'] / 2**30:.3f} GiB")
    if "reload" in result:
        r = result["reload"]
        print(f"  reload at {r.get('at_s')} s: published +{r.get('publish_ms')} ms, acked by all +{r.get('reload_to_acked_ms')} ms, "
              f"applied +{r.get('reload_to_applied_ms')} ms")
    print(f"  budget check: {result['budget_check']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--params", default=str(HERE / "default.toml"), help="parameter file (default: default.toml)")
    ap.add_argument("--mode", choices=("static", "kvpolicy", "kvpolicy-old"),
                    help="kvpolicy-old: kvpolicy with the allocator's old give-back (no reserve, no hold), for --combine to compare")
    ap.add_argument("--out", help="directory for <mode>.json and logs-<mode>.txt (every process's stderr)")
    ap.add_argument("--duration-scale", type=float, default=1.0, metavar="F", help="multiply every duration of the trace by F")
    ap.add_argument("--keep-run-dir", action="store_true", help="keep the ledger and policy copy of the run")
    ap.add_argument("--profile", action="store_true",
                    help="tenants wait for the GPU after each phase of their work, so the phase times are GPU times (a diagnosis: it slows the steps)")
    ap.add_argument("--combine", metavar="DIR", help="build results.json and memory.png from DIR/static.json and DIR/kvpolicy.json")
    ap.add_argument("--results", metavar="DIR", help="where --combine writes (default: DIR itself)")
    ap.add_argument("--update-readme", action="store_true", help="with --combine: rewrite the results section of README.md")
    args = ap.parse_args(argv)
    if args.combine:
        from report import combine

        return combine(Path(args.combine), Path(args.results or args.combine), update_readme=args.update_readme)
    if not args.mode or not args.out:
        ap.error("give --mode and --out (or --combine DIR)")
    params = load_params(args.params).scaled(args.duration_scale)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: children are stopped in run_mode's finally
    old = args.mode == "kvpolicy-old"
    run_mode(params, "kvpolicy" if old else args.mode, Path(args.out), args.duration_scale, args.keep_run_dir, args.profile, old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
