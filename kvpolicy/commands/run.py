"""``kvpolicy run POLICY``: the controller. Watches the policy and the ledger, evaluates,
publishes revisioned limits, writes its status beside the ledger, serves metrics.

GPU figures come from NVML when the machine has a GPU, else from ``--gpu-capacity``
or ``--facts``; with none of them it validates and reports only. ``--observe``
computes and reports decisions without publishing. ``--once`` evaluates once and
exits. SIGTERM or SIGINT stop it cleanly; engines keep their last limits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from kvpolicy.commands import add_format_option, missing_extra
from kvpolicy.commands.common import parse_size


def add_parser(sub) -> None:
    parser = sub.add_parser("run", help="run the controller", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", metavar="POLICY")
    parser.add_argument("--ledger-dir", metavar="DIR", help="ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="share the ledger with this group (mode 0660)")
    parser.add_argument("--allow-foreign-owner", action="store_true", help="accept segments owned by another user")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port")
    parser.add_argument("--observe", action="store_true", help="compute and report decisions without publishing")
    parser.add_argument("--once", action="store_true", help="evaluate once, publish, print the decision and exit")
    parser.add_argument("--gpu-capacity", type=parse_size, metavar="SIZE", help="without NVML: every GPU has this capacity")
    parser.add_argument("--facts", metavar="FILE", help="without NVML: GPU capacity and other use from these facts")
    parser.add_argument("--tick", type=float, default=1.0, metavar="SECONDS", help="evaluate at least this often (default 1)")
    parser.add_argument("--stuck-after", type=float, default=60.0, metavar="SECONDS", help="report deferrals older than this")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    missing = missing_extra("run", "runtime")
    if missing:
        print(missing, file=sys.stderr)
        return 2

    from pathlib import Path

    from kvpolicy.facts_io import FactsError, read_facts
    from kvpolicy.runtime.controller import Controller, ControllerConfig
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.gpus import FactsSampler, StaticSampler, nvml_sampler
    from kvpolicy.runtime.metrics import ControllerMetrics

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("kvpolicy.run")
    policy = Path(args.policy)
    if not policy.parent.is_dir():
        print(f"kvpolicy run: {policy.parent}: no such directory", file=sys.stderr)
        return 2
    try:
        if args.facts:
            sampler = FactsSampler(read_facts(args.facts))
        elif args.gpu_capacity:
            sampler = StaticSampler(args.gpu_capacity)
        else:
            sampler = nvml_sampler()
    except FactsError as exc:
        print(f"kvpolicy run: {exc}", file=sys.stderr)
        return 1
    try:
        ledger = LedgerDir(args.ledger_dir, group=args.group, allow_foreign_owner=args.allow_foreign_owner or None, create=True)
    except (LedgerError, OSError) as exc:
        print(f"kvpolicy run: {exc}", file=sys.stderr)
        return 1
    log.info("ledger %s; GPU figures from %s%s", ledger.path, sampler.description if sampler else "nowhere (validate only)",
             "; observing, not publishing" if args.observe else "")
    metrics = ControllerMetrics(stuck_after=args.stuck_after)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
        log.info("metrics on :%d/metrics", args.metrics_port)
    config = ControllerConfig(policy=policy, observe=args.observe, tick=args.tick, stuck_after=args.stuck_after)
    controller = Controller(config, ledger, sampler, metrics)
    try:
        if args.once:
            decision = controller.once()
            failed = controller.watcher.last_reload
            if decision is None:
                if failed is not None and failed.error is not None:
                    print(failed.error.render(), file=sys.stderr)
                elif failed is not None:
                    print(f"kvpolicy run: {policy}: {failed.message}", file=sys.stderr)
                return 1
            if args.format == "json":
                print(decision.to_json())
            else:
                from kvpolicy.evaluate.explain import render_explain

                sys.stdout.write(render_explain(controller.watcher.current.policy, decision, f"ledger {ledger.path}"))
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        controller.run(stop)
        log.info("stopped; engines keep revision %d", controller.revision)
        return 0
    except LedgerError as exc:
        print(f"kvpolicy run: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
