"""A small, synchronous LSP client over a real pipe, for the tests and the benchmark.

It starts ``kvpolicy lsp`` as a subprocess and speaks JSON-RPC with Content-Length
framing on its standard input and output; messages are lsprotocol types,
converted by lsprotocol's own converter (the client shares no code with the
server's framework, pygls). A reader thread collects notifications and answers
the server's requests (``workspace/configuration`` from ``settings``). Timeouts
exist only to turn a hang into a failure.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import converters, types

HANG = 60.0
"""Seconds after which a missing answer is a hang (never a measure of speed)."""

CONVERTER = converters.get_converter()


class ResponseError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code = error.get("code")


class LspClient:
    def __init__(self, settings: dict[str, Any] | None = None, cwd: Path | None = None,
                 command: list[str] | None = None) -> None:
        self.settings = settings or {}
        """Answers to workspace/configuration, by dotted section (``kvpolicy.facts``)."""
        self.configuration_requests: list[list[str]] = []
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the server's stderr, until close()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command or [sys.executable, "-m", "kvpolicy.cli", "lsp"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=cwd, env=env,
        )
        self._ids = itertools.count(1)
        self._responses: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._notifications: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # ---- wire -------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body)
        self.process.stdin.flush()

    def _read_loop(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = None
            while True:
                header = stream.readline()
                if not header:
                    self._closed()
                    return
                header = header.strip()
                if not header:
                    break
                name, _, value = header.decode("ascii").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if length is None:
                continue
            message = json.loads(stream.read(length))
            if "method" in message and "id" in message:
                self._answer(message)
            elif "method" in message:
                with self._arrived:
                    self._notifications.append(message)
                    self._arrived.notify_all()
            else:
                with self._lock:
                    box = self._responses.get(message["id"])
                if box is not None:
                    box.put(message)

    def _closed(self) -> None:
        with self._arrived:
            self._arrived.notify_all()

    def _answer(self, request: dict[str, Any]) -> None:
        method = request["method"]
        result: Any = None
        if method == "workspace/configuration":
            sections = [item.get("section") for item in request["params"]["items"]]
            self.configuration_requests.append(sections)
            result = [self.settings.get(s) for s in sections]
        self._send({"id": request["id"], "result": result})

    # ---- requests and notifications -----------------------------------------------------------

    def request(self, method: str, params: Any, timeout: float = HANG) -> Any:
        """Send a request; the result, structured into its lsprotocol type."""
        request_id = next(self._ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._responses[request_id] = box
        self._send({"id": request_id, "method": method, "params": CONVERTER.unstructure(params)})
        try:
            message = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer to {method} in {timeout}s; server stderr:\n{self.stderr()}") from None
        finally:
            with self._lock:
                self._responses.pop(request_id, None)
        if "error" in message:
            raise ResponseError(message["error"])
        response_type = types.METHOD_TO_TYPES[method][1]
        return CONVERTER.structure(message, response_type).result

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": CONVERTER.unstructure(params)})

    def wait_for(self, method: str, where: Callable[[Any], bool] = lambda _: True, timeout: float = HANG) -> Any:
        """The first notification ``method`` not yet taken whose params satisfy ``where`` (then taken)."""
        params_type = types.METHOD_TO_TYPES[method][2]
        with self._arrived:
            while True:
                for index, message in enumerate(self._notifications):
                    if message["method"] == method:
                        params = CONVERTER.structure(message["params"], params_type)
                        if where(params):
                            del self._notifications[index]
                            return params
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited ({self.process.returncode}); stderr:\n{self.stderr()}")
                if not self._arrived.wait(timeout):
                    raise TimeoutError(f"no {method} in {timeout}s; server stderr:\n{self.stderr()}")

    def notifications(self, method: str) -> list[Any]:
        params_type = types.METHOD_TO_TYPES[method][2]
        with self._arrived:
            return [CONVERTER.structure(m["params"], params_type) for m in self._notifications if m["method"] == method]

    # ---- the usual conversation -----------------------------------------------------------------

    def initialize(self, root: Path | None = None, *, configuration: bool = True,
                   initialization_options: Any = None, encodings: list[str] | None = None) -> types.InitializeResult:
        capabilities = types.ClientCapabilities(
            workspace=types.WorkspaceClientCapabilities(configuration=configuration),
            text_document=types.TextDocumentClientCapabilities(
                synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
                hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
                publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
            ),
            general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None,
        )
        result = self.request("initialize", types.InitializeParams(
            process_id=os.getpid(),
            root_uri=root.as_uri() if root else None,
            capabilities=capabilities,
            initialization_options=initialization_options,
        ))
        self.notify("initialized", types.InitializedParams())
        return result

    def open(self, path: Path, text: str, language: str = "kvpolicy", version: int = 1) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen", types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        ))
        return uri

    def change(self, uri: str, version: int, changes: list[types.TextDocumentContentChangeEvent]) -> None:
        self.notify("textDocument/didChange", types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=changes,
        ))

    def diagnostics(self, uri: str, version: int | None = None) -> list[types.Diagnostic]:
        """The diagnostics published for ``uri`` (at ``version``, if given)."""
        params = self.wait_for(
            "textDocument/publishDiagnostics",
            lambda p: p.uri == uri and (version is None or p.version == version),
        )
        return list(params.diagnostics)

    def shutdown(self) -> int:
        """shutdown, exit; the server's exit status."""
        self.request("shutdown", None)
        self.notify("exit", None)
        try:
            return self.process.wait(timeout=HANG)
        finally:
            self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=HANG)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

    def stderr(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode("utf-8", "replace")
        except ValueError:
            return ""

