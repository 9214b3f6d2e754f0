"""The language server: LSP messages in, the language's answers out (over stdio, through pygls).

pygls keeps the open documents (incremental sync) and speaks JSON-RPC; this module
wires its requests to the feature modules, which work in characters, converting
positions at the edge. Diagnostics are computed on every change, once per burst:
a change schedules a lint of the document's *latest* text, so changes that
arrive together are linted once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from kvpolicy import __version__
from kvpolicy.lsp import actions, completion, hover
from kvpolicy.lsp.context import (
    SETTING_FACTS, SETTING_GPU_CAPACITY, SETTINGS_SECTION, CheckContext, FactsCache, Settings, facts_path_for,
)
from kvpolicy.lsp.documents import PolicyDocument, analyse, is_policy, is_test_file
from kvpolicy.lsp.findings import to_lsp
from kvpolicy.lsp.formatting import format_edits
from kvpolicy.lsp.language import FormatRefused, Policy, StatementCache, partial_policy
from kvpolicy.lsp.positions import Codec, Pos
from kvpolicy.lsp.testfiles import KvTestFile, Navigator, Place, kvtest_files_in, open_kvtest

log = logging.getLogger(__name__)

_ITEM_KINDS = {
    "keyword": types.CompletionItemKind.Keyword,
    "unit": types.CompletionItemKind.Unit,
    "value": types.CompletionItemKind.Value,
    "attribute": types.CompletionItemKind.Property,
    "code": types.CompletionItemKind.Constant,
}


class PolicyServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("kvpolicy", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = Settings()
        self.facts_cache = FactsCache()
        self.analyses: dict[str, PolicyDocument] = {}
        self.statements: dict[str, StatementCache] = {}
        """Per open policy, what its last version built: a change re-parses only its statements."""
        self.published: dict[str, int | None] = {}
        self.pending: set[str] = set()
        self.shut_down = False
        """Whether the client asked for ``shutdown`` (then ``exit`` is a clean exit, status 0)."""
        self.told: set[str] = set()
        """Problems already shown to the user (each once)."""
        self.navigator = Navigator(_Sources(self))

    # ---- documents and their analysis -------------------------------------------------------

    @property
    def encoding(self) -> str:
        return str(self.workspace.position_encoding or types.PositionEncodingKind.Utf16)

    def root(self) -> Path | None:
        root = self.workspace.root_path
        return Path(root) if root else None

    def context_for(self, path: Path | None) -> CheckContext:
        for setting_problem in self.settings.problems:
            self.tell(setting_problem)
        facts_path = facts_path_for(path, self.settings, self.root())
        facts = None
        if facts_path is not None:
            facts, problem = self.facts_cache.get(facts_path)
            if problem:
                self.tell(f"kvpolicy: facts not used: {problem}")
        capacity = self.settings.gpu_capacity
        return CheckContext(facts, facts_path if facts else None, capacity, "kvpolicy.gpuCapacity" if capacity else None)

    def analysis(self, uri: str) -> PolicyDocument:
        """The analysis of the document's current text (computed if the text changed)."""
        document = self.workspace.get_text_document(uri)
        known = self.analyses.get(uri)
        if known is not None and known.version == document.version and known.text == document.source:
            return known
        path = _path(uri)
        statements = self.statements.setdefault(uri, StatementCache())
        result = analyse(uri, path, document.version, document.source, self.context_for(path), statements)
        self.analyses[uri] = result
        return result

    def schedule_lint(self, uri: str) -> None:
        if uri in self.pending:
            return
        self.pending.add(uri)
        asyncio.get_running_loop().call_soon(self._lint_latest, uri)

    def _lint_latest(self, uri: str) -> None:
        self.pending.discard(uri)
        if uri not in self.workspace.text_documents:
            return
        doc = self.analysis(uri)
        codec = Codec(doc.text, self.encoding)
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri, version=doc.version, diagnostics=[to_lsp(d, codec) for d in doc.linted.diagnostics]
            )
        )
        self.published[uri] = doc.version

    def relint_all(self) -> None:
        self.analyses.clear()
        for uri in list(self.workspace.text_documents):
            if is_policy(uri):
                self.schedule_lint(uri)

    def tell(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        if message in self.told:
            return
        self.told.add(message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    # ---- settings ----------------------------------------------------------------------------

    async def pull_settings(self) -> None:
        """The client's ``kvpolicy.facts`` and ``kvpolicy.gpuCapacity``."""
        capabilities = self.client_capabilities.workspace
        if capabilities is None or not capabilities.configuration:
            return
        try:
            values = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[
                    types.ConfigurationItem(section=f"{SETTINGS_SECTION}.{SETTING_FACTS}"),
                    types.ConfigurationItem(section=f"{SETTINGS_SECTION}.{SETTING_GPU_CAPACITY}"),
                ])
            )
        except Exception as exc:  # noqa: BLE001 - a client that cannot answer keeps the settings it gave at start
            log.warning("workspace/configuration failed: %s", exc)
            return
        values = [*(values or []), None, None]
        self.use_settings(Settings.from_values(values[0], values[1]))

    def use_settings(self, settings: Settings) -> None:
        if settings != self.settings:
            self.settings = settings
            self.relint_all()

    # ---- conversions -------------------------------------------------------------------------

    def location(self, place: Place) -> types.Location:
        text = self.text_of(place.path) or ""
        return types.Location(uri=from_fs_path(str(place.path)) or str(place.path), range=Codec(text, self.encoding).range(place.region))

    def text_of(self, path: Path) -> str | None:
        uri = from_fs_path(str(path))
        if uri is not None and uri in self.workspace.text_documents:
            return self.workspace.text_documents[uri].source
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def policy(self, uri: str) -> tuple[PolicyDocument, Codec] | None:
        """The analysis of a policy document, and its position codec; None for other documents."""
        if not is_policy(uri):
            return None
        doc = self.analysis(uri)
        return doc, Codec(doc.text, self.encoding)

    @staticmethod
    def edit(edits: list[actions.Edit], codec: Codec) -> list[types.TextEdit]:
        return [types.TextEdit(range=codec.range(e.region), new_text=e.text) for e in edits]


class _Sources:
    """Open documents first, else the disk (navigation between policies and their tests)."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server

    def text(self, path: Path) -> str | None:
        return self.server.text_of(path)

    def policy_model(self, path: Path) -> Policy | None:
        uri = from_fs_path(str(path))
        if uri is not None and uri in self.server.workspace.text_documents:
            return self.server.analysis(uri).model
        text = self.text(path)
        return partial_policy(text, str(path)) if text is not None else None

    def kvtest_files(self, folder: Path) -> list[Path]:
        def open_ones() -> list[Path]:
            return [p for uri in self.server.workspace.text_documents if is_test_file(uri) and (p := _path(uri))]

        return kvtest_files_in(folder, open_ones)


def _path(uri: str) -> Path | None:
    path = to_fs_path(uri) if uri.startswith("file:") else None
    return Path(path).resolve() if path else None


def create_server() -> PolicyServer:
    """A server with every feature registered, not yet started."""
    server = PolicyServer()
    for register in (_lifecycle, _documents, _assistance, _navigation):
        register(server)
    return server


def _lifecycle(server: PolicyServer) -> None:
    """Start-up, settings and shutdown."""

    @server.feature(types.INITIALIZE)
    def initialize(ls: PolicyServer, params: types.InitializeParams) -> None:
        options = params.initialization_options
        if isinstance(options, dict):
            ls.settings = Settings.from_object(options.get(SETTINGS_SECTION, options))

    @server.feature(types.INITIALIZED)
    async def initialized(ls: PolicyServer, params: types.InitializedParams) -> None:
        await ls.pull_settings()

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: PolicyServer, params: None) -> None:
        ls.shut_down = True

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def configuration_changed(ls: PolicyServer, params: types.DidChangeConfigurationParams) -> None:
        pushed = params.settings.get(SETTINGS_SECTION) if isinstance(params.settings, dict) else None
        if isinstance(pushed, dict):
            ls.use_settings(Settings.from_object(pushed))
        else:
            await ls.pull_settings()


def _documents(server: PolicyServer) -> None:
    """A document opened, changed, saved or closed: lint it again, or forget it."""

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: PolicyServer, params: types.DidOpenTextDocumentParams) -> None:
        if is_policy(params.text_document.uri):
            ls.schedule_lint(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: PolicyServer, params: types.DidChangeTextDocumentParams) -> None:
        if is_policy(params.text_document.uri):
            ls.schedule_lint(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: PolicyServer, params: types.DidSaveTextDocumentParams) -> None:
        if is_policy(params.text_document.uri):
            ls.analyses.pop(params.text_document.uri, None)  # the facts beside it may have changed too
            ls.schedule_lint(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: PolicyServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.analyses.pop(uri, None)
        ls.statements.pop(uri, None)
        if ls.published.pop(uri, None) is not None or is_policy(uri):
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


def _assistance(server: PolicyServer) -> None:
    """Hover, completion, formatting and quick fixes in a policy file."""

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def on_hover(ls: PolicyServer, params: types.HoverParams) -> types.Hover | None:
        if (policy := ls.policy(params.text_document.uri)) is None:
            return None
        doc, codec = policy
        found = hover.hover(doc, codec.from_client(params.position))
        if found is None:
            return None
        return types.Hover(
            contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=found.markdown),
            range=codec.range(found.region),
        )

    @server.feature(
        types.TEXT_DOCUMENT_COMPLETION,
        types.CompletionOptions(trigger_characters=[".", "["]),
    )
    def on_completion(ls: PolicyServer, params: types.CompletionParams) -> types.CompletionList | None:
        if (policy := ls.policy(params.text_document.uri)) is None:
            return None
        doc, codec = policy
        found = completion.complete(doc, codec.from_client(params.position))
        replace = codec.range(found.replace)
        items = [
            types.CompletionItem(
                label=item.label,
                kind=_ITEM_KINDS[item.kind],
                detail=item.detail,
                documentation=types.MarkupContent(kind=types.MarkupKind.Markdown, value=item.documentation)
                if item.documentation else None,
                sort_text=item.sort,
                text_edit=types.TextEdit(range=replace, new_text=item.label),
            )
            for item in found.items
        ]
        return types.CompletionList(is_incomplete=False, items=items)

    @server.feature(types.TEXT_DOCUMENT_FORMATTING)
    def on_formatting(ls: PolicyServer, params: types.DocumentFormattingParams) -> list[types.TextEdit] | None:
        uri = params.text_document.uri
        if not is_policy(uri):
            return None
        document = ls.workspace.get_text_document(uri)
        path = _path(uri)
        try:
            edits = format_edits(document.source, str(path) if path else uri)
        except FormatRefused as exc:
            d = exc.diagnostic
            ls.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Warning,
                message=f"kvpolicy: not formatted: line {d.line}:{d.col}: {d.message} (fix the syntax error first)",
            ))
            return None
        return ls.edit(edits, Codec(document.source, ls.encoding))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]),
    )
    def on_code_action(ls: PolicyServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        uri = params.text_document.uri
        only = params.context.only
        if only and not any(str(k).startswith(types.CodeActionKind.QuickFix) for k in only):
            return []
        if (policy := ls.policy(uri)) is None:
            return None
        doc, codec = policy
        return [
            types.CodeAction(
                title=fix.title,
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[to_lsp(fix.diagnostic, codec)],
                is_preferred=fix.preferred or None,
                edit=types.WorkspaceEdit(changes={uri: ls.edit(list(fix.edits), codec)}),
            )
            for fix in actions.fixes(doc, codec.region(params.range))
        ]


def _navigation(server: PolicyServer) -> None:
    """Definitions and references between policy files and their test files."""

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    def on_definition(ls: PolicyServer, params: types.DefinitionParams) -> list[types.Location] | None:
        uri = params.text_document.uri
        test = _test_document(ls, uri)
        if test is None:
            return None
        offset = _offset(test.text, Codec(test.text, ls.encoding).from_client(params.position))
        return [ls.location(p) for p in ls.navigator.definition(test, offset)] or None

    @server.feature(types.TEXT_DOCUMENT_REFERENCES)
    def on_references(ls: PolicyServer, params: types.ReferenceParams) -> list[types.Location] | None:
        uri = params.text_document.uri
        declaration = params.context.include_declaration
        if is_policy(uri):
            doc = ls.analysis(uri)
            if doc.model is None or doc.path is None:
                return None
            at = Codec(doc.text, ls.encoding).from_client(params.position)
            places = ls.navigator.references_from_policy(doc.path, doc.model, at, declaration)
        else:
            test = _test_document(ls, uri)
            if test is None:
                return None
            offset = _offset(test.text, Codec(test.text, ls.encoding).from_client(params.position))
            places = ls.navigator.references_from_test(test, offset, declaration)
        return [ls.location(p) for p in places] or None


def _test_document(ls: PolicyServer, uri: str) -> KvTestFile | None:
    path = _path(uri)
    if not is_test_file(uri) or path is None:
        return None
    return open_kvtest(path, ls.workspace.get_text_document(uri).source)


def _offset(text: str, pos: Pos) -> int:
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[: pos.line]) + min(pos.col, len(lines[pos.line]) if pos.line < len(lines) else 0)


def serve() -> int:
    """Serve one client over standard input and output until it says exit; the exit
    status the protocol asks for: 0 after ``shutdown``, else 1."""
    server = create_server()
    # What start-up allocated (the grammar's tables, the protocol's converters) lives as
    # long as the server: out of the collector's sight, a full collection after an edit
    # scans only the open documents (it was the slowest tenth of change -> diagnostics).
    gc.freeze()
    server.start_io()
    return 0 if server.shut_down else 1


__all__ = ["PolicyServer", "create_server", "serve"]
