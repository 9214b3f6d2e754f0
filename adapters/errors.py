"""The one error an enabled adapter raises: it refuses to run the engine unbudgeted.

Anything an enabled adapter cannot do — an engine version it was not validated
against, a hook target that is missing, a setting that does not parse, an admission
the ledger refuses — is an ``AdapterError`` raised at engine start, never a silent
no-op. The message says what went wrong and how to fix it.
"""

from __future__ import annotations


class AdapterError(RuntimeError):
    """A start-up failure of an enabled adapter; the message says what and how to fix it."""
