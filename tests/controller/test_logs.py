"""The controller's stderr log: text or JSON lines, written to the stderr of the moment, and
no handler left behind when ``kvpolicy run`` returns."""

from __future__ import annotations

import io
import json
import logging
import sys

from kvpolicy.cli import main
from kvpolicy.runtime.logs import JsonFormatter, StderrHandler, stderr_logging
from tests.controller.site import POLICY


def record(message: str, **extra) -> logging.LogRecord:
    logger = logging.getLogger("kvpolicy.test")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, (), None, extra=extra)


def test_a_json_line_per_record_with_the_decision_s_fields():
    line = JsonFormatter().format(record("policy rejected:\n  min 4 GiBB\n      ^"))
    assert "\n" not in line
    doc = json.loads(line)
    assert (doc["level"], doc["logger"], doc["message"]) == ("WARNING", "kvpolicy.test", "policy rejected:\n  min 4 GiBB\n      ^")
    assert doc["time"].endswith("+00:00")
    fields = {"event": "decision", "changes": {"a/0": {"limit": [1, 2], "rules": ["r"]}}}
    doc = json.loads(JsonFormatter().format(record(json.dumps(fields), fields=fields)))
    assert doc["message"] == "decision" and doc["changes"] == fields["changes"]


def test_the_handler_writes_to_the_stderr_of_the_moment_and_is_quiet_when_it_is_closed(monkeypatch):
    handler = StderrHandler()
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    handler.emit(record("one"))
    monkeypatch.setattr(sys, "stderr", second)
    handler.emit(record("two"))
    assert (first.getvalue(), second.getvalue()) == ("one\n", "two\n")
    second.close()  # a captured stream gone under a thread that still logs
    handler.emit(record("three"))  # no "--- Logging error ---", no exception


def test_run_leaves_the_logging_as_it_found_it(tmp_path, capsys):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    (tmp_path / "p.kvp").write_text(POLICY)
    assert main(["run", str(tmp_path / "p.kvp"), "--once", "--gpu-capacity", "80GiB", "--ledger-dir",
                 str(tmp_path / "ledger"), "--log-format", "json"]) == 0
    assert (root.handlers, root.level) == (handlers, level)
    err = capsys.readouterr().err
    assert err and all(json.loads(line)["logger"].startswith("kvpolicy") for line in err.splitlines())
    with stderr_logging("INFO", "text"):
        assert len(root.handlers) == len(handlers) + 1 and root.level == logging.INFO
    assert (root.handlers, root.level) == (handlers, level)
