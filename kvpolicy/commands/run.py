"""``kvpolicy run POLICY``: the controller. Watches the policy and the ledger, evaluates,
publishes revisioned limits, writes its status beside the ledger, serves metrics.

GPU figures come from NVML when the machine has a GPU, else from ``--gpu-capacity``
or ``--facts``; with none of them it validates and reports only. ``--observe``
computes and reports decisions without publishing. ``--once`` evaluates once and
exits. A policy that is missing or does not lint clean at start is an error (exit 1,
with the diagnostic): a crash loop is visible, a controller running on nothing is not;
later edits that fail keep the last good policy in force. A start that finds the policy
mid-save (empty, half-written, not yet renamed into place) watches it for up to
``--start-wait`` seconds (default 2) and starts as soon as the save completes it; a policy
still refused then is refused as above (``--once`` reads it once, with no wait). The policy must be a regular
file, or a symlink to one (it is read again at every change): a FIFO or a device is a
usage error (exit 2). SIGHUP reads the policy again now; SIGTERM or SIGINT stop it
cleanly, and the stop is recorded (``kvpolicy status`` says "stopped"); engines keep
their last limits. ``--log-format json`` writes one JSON object per log line.

It serves /metrics (Prometheus), /healthz (liveness) and /readyz (readiness) on
``--metrics-address`` (default 127.0.0.1:9464, this machine only; 0.0.0.0:9464 for
every interface, as in a pod; ``off`` for none). Not with ``--once``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kvpolicy.commands import Subcommands, add_format_option, missing_extra
from kvpolicy.commands.common import parse_listen_address, parse_port, parse_seconds, parse_size
from kvpolicy.commands.json_failure import report
from kvpolicy.paths import NotRegularFile, open_regular, path_kind, reason

if TYPE_CHECKING:
    from kvpolicy.commands.json_failure import Problems
    from kvpolicy.runtime.controller import Controller
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.gpus import GpuSampler
    from kvpolicy.runtime.metrics import ControllerMetrics
    from kvpolicy.runtime.watch import ReloadResult

DEFAULT_METRICS_ADDRESS = ("127.0.0.1", 9464)
_UNSET = object()  # --metrics-address not given


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("run", help="run the controller", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", metavar="POLICY", help="the policy file to enforce (watched: edits take effect when they lint clean)")
    parser.add_argument("--ledger-dir", metavar="DIR", help="ledger directory (default: $KVPOLICY_LEDGER_DIR or /dev/shm/kvpolicy)")
    parser.add_argument("--group", metavar="GROUP", help="share the ledger with this group (mode 0660)")
    parser.add_argument("--allow-foreign-owner", action="store_true", help="accept segments owned by another user")
    parser.add_argument("--metrics-address", type=_metrics_address, default=_UNSET, metavar="HOST:PORT",
                        help="serve /metrics, /healthz and /readyz here (default 127.0.0.1:9464; off: not at all)")
    parser.add_argument("--metrics-port", type=parse_port, metavar="PORT",
                        help="deprecated: the same as --metrics-address 0.0.0.0:PORT")
    parser.add_argument("--observe", action="store_true", help="compute and report decisions without publishing")
    parser.add_argument("--once", action="store_true", help="evaluate once, publish, print the decision and exit")
    parser.add_argument("--gpu-capacity", type=parse_size, metavar="SIZE", help="without NVML: every GPU has this capacity")
    parser.add_argument("--facts", metavar="FILE", help="without NVML: GPU capacity and other use from these facts (read once, at start)")
    parser.add_argument("--tick", type=parse_seconds, default=1.0, metavar="SECONDS", help="evaluate at least this often (default 1)")
    parser.add_argument("--reload-quiet", type=_quiet_seconds, metavar="SECONDS",
                        help="a policy change seen without a close-write or rename event must hold still this long "
                             "before it is read (default 0.3)")
    parser.add_argument("--start-wait", type=_start_wait_seconds, metavar="SECONDS",
                        help="a policy that cannot be loaded at start (a save under way) is watched this long for a "
                             "save that completes it before the start is refused (default 2; 0: refuse at once)")
    parser.add_argument("--stuck-after", type=parse_seconds, default=60.0, metavar="SECONDS",
                        help="report deferrals older than this (default 60)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="the least severe log messages to write to stderr (default INFO)")
    parser.add_argument("--log-format", default="text", choices=("text", "json"),
                        help="stderr log lines as text, or one JSON object per line with time, level, logger, "
                             "message and the decisions' fields (default text)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _quiet_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.01 <= value <= 3600:  # the debounce is 0.01 s; NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be between 0.01 and 3600 seconds, not {text}")
    return value


def _start_wait_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:  # as --reload-quiet's bound; NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, not {text}")
    return value


def _metrics_address(text: str) -> tuple[str, int] | None:
    return None if text.strip().lower() == "off" else parse_listen_address(text)


class _NotStarted(Exception):
    """Why the controller does not start, for stderr, with the exit status (1: the input, 2: usage);
    ``problems``: an input's, as diagnostics (a facts file's)."""

    def __init__(self, status: int, message: str, problems: Problems | None = None) -> None:
        super().__init__(message)
        self.status, self.problems = status, problems

    def say(self) -> None:
        """Print why on standard error: the input's diagnostics (reported for the error document), or the message."""
        if self.problems is not None:
            from kvpolicy.commands.json_failure import refuse_document

            refuse_document(self.problems, "run")
        else:
            print(f"kvpolicy run: {self}", file=sys.stderr)


def _listen_address(args: argparse.Namespace) -> tuple[str, int] | None:
    """Where to serve the endpoints (None: nowhere); ``--metrics-port`` keeps its old meaning."""
    if args.metrics_port is not None:
        if args.metrics_address is not _UNSET:
            raise _NotStarted(2, "--metrics-port is the deprecated spelling of --metrics-address: give only one")
        return ("0.0.0.0", args.metrics_port)
    return DEFAULT_METRICS_ADDRESS if args.metrics_address is _UNSET else args.metrics_address


def run(args: argparse.Namespace) -> int:
    if args.once and args.format == "json":  # one document, a failure's too (docs/json.md); a running one streams
        from kvpolicy.commands.json_failure import one_document

        return one_document(_logged_run, args)
    return _logged_run(args)


def _logged_run(args: argparse.Namespace) -> int:
    missing = missing_extra("run", "runtime")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from kvpolicy.runtime.logs import stderr_logging

    with stderr_logging(args.log_level, args.log_format):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from kvpolicy.runtime.controller import Controller, ControllerConfig, PolicyRefused
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.metrics import ControllerMetrics

    log = logging.getLogger("kvpolicy.run")
    policy = Path(args.policy)
    try:
        listen = None if args.once else _listen_address(args)
        if args.metrics_port is not None:
            log.warning("--metrics-port is deprecated: use --metrics-address 0.0.0.0:%d (or 127.0.0.1:%d for this "
                        "machine only)", args.metrics_port, args.metrics_port)
        _check_policy_path(policy)
        sampler = _sampler(args)
        ledger = _open_ledger(args)
    except _NotStarted as exc:
        exc.say()
        return exc.status
    log.info("ledger %s; GPU figures from %s%s", ledger.path, sampler.description if sampler else "nowhere (validate only)",
             "; observing, not publishing" if args.observe else "")
    metrics = ControllerMetrics(stuck_after=args.stuck_after)
    config = ControllerConfig(policy=policy, observe=args.observe, tick=args.tick, stuck_after=args.stuck_after,
                              require_policy=True,
                              **({} if args.reload_quiet is None else {"quiet": args.reload_quiet}),
                              **({} if args.start_wait is None else {"start_wait": args.start_wait}))
    controller = Controller(config, ledger, sampler, metrics)
    try:
        if listen is not None:
            _serve_endpoints(listen, metrics, controller, log)
        if args.once:
            return _once(controller, policy, args.format, f"ledger {ledger.path}")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        # SIGHUP, a daemon's "read your configuration again" (and what a closed terminal sends), would
        # otherwise end the controller without a word. The watcher's thread reads and logs: a handler
        # that logged could re-enter a stderr write it interrupted.
        signal.signal(signal.SIGHUP, lambda *_: controller.watcher.reread())
        controller.run(stop)
        log.info("stopped; engines keep revision %d", controller.revision)
        return 0
    except _NotStarted as exc:
        exc.say()
        return exc.status
    except PolicyRefused as exc:
        _refused(policy, exc.result, "at start, so not starting")
        return 1
    except LedgerError as exc:
        print(f"kvpolicy run: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()


def _check_policy_path(policy: Path) -> None:
    """A policy that is missing is the controller's to report (a refused start); a directory that
    is missing, a file that cannot be read, or a path that is not a regular file, is a usage error."""
    try:
        kind = path_kind(policy.parent)
    except OSError as exc:
        raise _NotStarted(2, f"{policy.parent}: cannot read it: {reason(exc)}") from None
    if kind != "dir":
        raise _NotStarted(2, f"{policy.parent}: no such directory")
    try:
        with open_regular(policy):  # never blocks, even on a FIFO no one writes to
            pass
    except FileNotFoundError:
        pass
    except NotRegularFile as exc:
        raise _NotStarted(2, _not_regular(policy, exc)) from None
    except OSError as exc:
        raise _NotStarted(2, f"{policy}: cannot read it: {reason(exc)}") from None


def _not_regular(policy: Path, exc: NotRegularFile) -> str:
    """Why a policy path that is a FIFO, a device... cannot be watched, in the watcher's words."""
    from kvpolicy.runtime.links import resolve_chain
    from kvpolicy.runtime.watch import not_regular_file

    return (f"{not_regular_file(str(policy), resolve_chain(policy), exc)}: the controller reads its policy again at "
            "every change, so it must be a regular file or a symlink to one (kvpolicy lint and explain read a pipe once)")


def _sampler(args: argparse.Namespace) -> GpuSampler | None:
    """Where the GPU figures come from: ``--facts``, ``--gpu-capacity`` or NVML (None: nowhere)."""
    from kvpolicy.facts_io import FactsError, FactsUnreadable, read_facts
    from kvpolicy.runtime.errors import LedgerError
    from kvpolicy.runtime.gpus import FactsSampler, StaticSampler, nvml_sampler

    try:
        if args.facts:
            return FactsSampler(read_facts(args.facts))
        if args.gpu_capacity:
            return StaticSampler(args.gpu_capacity)
        return nvml_sampler()
    except FactsUnreadable as exc:
        raise _NotStarted(2, str(exc)) from exc
    except FactsError as exc:
        raise _NotStarted(1, str(exc), exc) from exc
    except LedgerError as exc:  # a figure the ledger cannot hold: a bad facts file (1) or flag (2)
        raise _NotStarted(1 if args.facts else 2, str(exc)) from exc


def _open_ledger(args: argparse.Namespace) -> LedgerDir:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.errors import LedgerError

    try:
        return LedgerDir(args.ledger_dir, group=args.group, allow_foreign_owner=args.allow_foreign_owner or None, create=True)
    except LedgerError as exc:
        raise _NotStarted(1, str(exc)) from exc
    except OSError as exc:  # creating it, or looking at it: say which path and why, without the errno
        raise _NotStarted(1, _ledger_path_problem(exc)) from exc


def _ledger_path_problem(exc: OSError) -> str:
    """Why the ledger directory could not be created or looked at, worded as the other path errors."""
    if exc.filename is None:
        return f"cannot use the ledger directory: {reason(exc)}"
    path = Path(exc.filename)
    if isinstance(exc, FileNotFoundError) and not path.parent.is_dir():
        return f"{path}: cannot create the ledger directory: {path.parent} does not exist (only the last name is created)"
    return f"{path}: cannot use it as the ledger directory: {reason(exc)}"


def _serve_endpoints(listen: tuple[str, int], metrics: ControllerMetrics, controller: Controller,
                     log: logging.Logger) -> None:
    from kvpolicy.runtime.endpoints import serve
    from kvpolicy.runtime.health import ControllerHealth

    host, port = listen
    try:
        server, _ = serve(host, port, metrics.registry, ControllerHealth(controller))
    except OSError as exc:
        raise _NotStarted(1, f"cannot listen on {_show(host, port)} ({reason(exc)}): pass "
                             "--metrics-address HOST:PORT with a free port, or --metrics-address off") from exc
    log.info("serving /metrics, /healthz and /readyz on http://%s", _show(host, server.server_port))


def _once(controller: Controller, policy: Path, output: str, where: str) -> int:
    """``--once``: decide, publish and print the decision (1: no valid policy to decide with)."""
    decision = controller.once()
    if decision is None:
        _refused(policy, controller.watcher.last_reload, "to decide with")
        return 1
    if output == "json":
        print(decision.to_json())
        return 0
    from kvpolicy.evaluate.explain import render_explain

    current = controller.watcher.current
    assert current is not None  # the decision was made under it
    sys.stdout.write(render_explain(current.policy, decision, where))
    return 0


def _refused(policy: Path, result: ReloadResult | None, what: str) -> None:
    """The last words of a controller that has no valid policy (``what``: for what). Why is in the
    watcher's log just above, once: the first error with its source line and caret, or why the
    file could not be read (an error, shown at any --log-level). A supervisor restarts it, and the
    restarts are visible."""
    if result is None:  # nothing recorded: the one read found the file moving
        print(f"kvpolicy run: {policy}: the file changed while it was read (a save under way?)", file=sys.stderr)
    hint = ""
    if result is not None and result.error is not None:
        hint = f" (kvpolicy lint {policy} lists every finding)"
        report((result.error,))  # --once --format json: the error document carries it
    print(f"kvpolicy run: no valid policy {what}{hint}", file=sys.stderr)


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
