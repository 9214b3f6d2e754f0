"""A refusal of the plan as a problem of the model's ``config.json``, at the value it is about.

The plan reads a config with its class's defaults, and a multimodal config's ``text_config`` lifted beside the
wrapper's keys (``load_config``); a ``ModelSpecError`` names the key it read. ``FilledConfig.source`` says where
that value is in the file, so the refusal becomes the diagnostic the other documents' problems are
(``kvpolicy.document_codes``): ``config.json:9:26: KVD007 error: ...``. A value the file does not set, its
class's default, has no place in the file: it is placed at ``model_type`` (the key that chose the class), and
the message says so; one missing for an engine version whose class does not fill it (vLLM 0.32's DeepSeek-V4),
at the object that lacks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.document_codes import MISSING_FIELD
from kvpolicy.json_text import DocumentInvalid

from .class_defaults import FilledConfig
from .config_values import ConfigInvalid, ModelSpecError


def refusal(exc: ModelSpecError, config: Mapping[str, Any] | None) -> DocumentInvalid | None:
    """``exc`` as the diagnostics of the file ``config`` was read from (None: ``exc`` is about no value of the
    config, a flag alone, or ``config`` was not read from a file)."""
    if isinstance(exc, ConfigInvalid):
        return exc.problems
    if exc.key is None or not isinstance(config, FilledConfig) or config.document is None:
        return None
    source = config.source(exc.key)
    if source.default_of is None:
        return DocumentInvalid([config.document.diagnostic(exc.code, source.path, str(exc), exc.hint)])
    if exc.code is MISSING_FIELD:  # a key the table's class fills, missing for a version without that class
        return DocumentInvalid([config.document.diagnostic(exc.code, (*config.home, *exc.key), str(exc), exc.hint)])
    key = ".".join(map(str, exc.key))
    message = f"{exc}; {key} is {source.default_of}'s default, which the file does not set"
    return DocumentInvalid([config.document.diagnostic(exc.code, source.model_type, message, exc.hint)])
