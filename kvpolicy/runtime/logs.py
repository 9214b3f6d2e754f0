"""The controller's log on stderr: text lines, or one JSON object per line (``--log-format json``).

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; a record
logged with ``extra={"fields": {...}}`` (the decisions) carries those fields as well, as
JSON values rather than text, so a log system can query them. A message of several lines
(a rejected policy with its caret) stays one JSON line.

The handler writes to whatever ``sys.stderr`` is when a record is emitted, and
``stderr_logging`` removes it again when the command ends: a handler bound to a stream
that was later closed (an in-process run whose captured stderr is gone) would otherwise
print "--- Logging error ---" for every record of the threads still logging.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc["message"] = str(fields.get("event", doc["message"]))
            doc.update((k, v) for k, v in fields.items() if k not in doc)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class StderrHandler(logging.StreamHandler):
    """A stream handler on the current ``sys.stderr``, looked up at every record."""

    @property
    def stream(self) -> TextIO:  # logging's attribute (a property here)
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:  # StreamHandler.__init__ assigns it; stderr is looked up instead
        pass

    def handleError(self, record: logging.LogRecord) -> None:
        if sys.stderr is None or getattr(sys.stderr, "closed", False):
            return  # nowhere to write, and nowhere to complain: the record is dropped quietly
        super().handleError(record)


@contextmanager
def stderr_logging(level: str, log_format: LogFormat = "text") -> Iterator[StderrHandler]:
    """Log records of ``level`` and above to stderr in ``log_format`` while the block runs."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
