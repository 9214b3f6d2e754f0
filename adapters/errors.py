"""The one error an enabled adapter raises: it refuses to run the engine unbudgeted.

Anything an enabled adapter cannot do — an engine version it was not validated
against, a hook target that is missing, a setting that does not parse, an admission
the ledger refuses — is an ``AdapterError`` raised at engine start, never a silent
no-op. The message says what went wrong and how to fix it. An enabled plugin has an
``AdapterError`` that ends the process printed as that message alone (``report_briefly``).
"""

from __future__ import annotations

import sys
from types import TracebackType


class AdapterError(RuntimeError):
    """A start-up failure of an enabled adapter; the message says what and how to fix it."""


_BRIEF = "__kvpolicy_brief__"  # marks the hook report_briefly installs


def report_briefly() -> None:
    """Print an ``AdapterError`` that ends the process as its message alone, without the traceback.

    The message says what went wrong and how to fix it; the engine's call stack in front of it
    says nothing more (the error is raised ``from None``) and would bury it. Any other uncaught
    exception goes to the hook that was there before. Idempotent.
    """
    previous = sys.excepthook
    if getattr(previous, _BRIEF, False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, AdapterError):
            print(f"{kind.__module__}.{kind.__qualname__}: {error}", file=sys.stderr, flush=True)
        else:
            previous(kind, error, tb)

    setattr(hook, _BRIEF, True)
    sys.excepthook = hook
