"""kvpolicy diagnostics as LSP diagnostics: range, severity, code, and a link to the rule's doc."""

from __future__ import annotations

from lsprotocol import types

from kvpolicy.lsp.language import Diagnostic, rule_doc
from kvpolicy.lsp.positions import Codec, Region

SOURCE = "kvpolicy"
_SEVERITY = {"error": types.DiagnosticSeverity.Error, "warning": types.DiagnosticSeverity.Warning}
_UNNECESSARY = {"KV025"}
"""Codes whose text can simply go (the editor fades it)."""


def to_lsp(d: Diagnostic, codec: Codec) -> types.Diagnostic:
    doc = rule_doc(d.code)
    message = d.message if not d.hint else f"{d.message}\nhint: {d.hint}"
    return types.Diagnostic(
        range=codec.range(Region.of_span(d.span)),
        severity=_SEVERITY[d.severity.value],
        code=d.code,
        code_description=types.CodeDescription(href=doc.href) if doc else None,
        source=SOURCE,
        message=message,
        tags=[types.DiagnosticTag.Unnecessary] if d.code in _UNNECESSARY else None,
        data={"name": d.name, "hint": d.hint},
    )
