"""The controller's HTTP endpoints, all on one address (``kvpolicy run --metrics-address``).

| path | answer |
| --- | --- |
| ``/metrics`` | the Prometheus exposition of the controller's registry (prometheus-client's own app: content negotiation, gzip) |
| ``/healthz`` | liveness: 200 or 503 with a JSON body (``health.Probe``) |
| ``/readyz`` | readiness: 200 or 503 with a JSON body |
| ``/`` | one line per endpoint |

Anything else is 404. Requests are served on daemon threads, so a slow scraper never
holds up the controller, and are not logged (probes every few seconds would drown the
decision log).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from kvpolicy.runtime.health import ControllerHealth, Probe

INDEX = b"kvpolicy controller\n/metrics  Prometheus metrics\n/healthz  liveness\n/readyz   readiness\n"

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
"""A WSGI application."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def make_app(registry: CollectorRegistry, health: ControllerHealth | None = None) -> App:
    """The WSGI application behind the endpoints; without ``health`` only ``/metrics`` and ``/``."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics(environ, start_response)
        if health is not None and path == "/healthz":
            return _probe(health.liveness(), start_response)
        if health is not None and path == "/readyz":
            return _probe(health.readiness(), start_response)
        if path == "/":
            return _reply("200 OK", "text/plain; charset=utf-8", INDEX, start_response)
        return _reply("404 Not Found", "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /readyz\n",
                      start_response)

    return app


def _probe(probe: Probe, start_response: StartResponse) -> list[bytes]:
    status = "200 OK" if probe.ok else "503 Service Unavailable"
    return _reply(status, "application/json", probe.to_json().encode(), start_response)


def _reply(status: str, content_type: str, body: bytes, start_response: StartResponse) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store")])
    return [body]


def serve(host: str, port: int, registry: CollectorRegistry,
          health: ControllerHealth | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Serve the endpoints on ``host:port`` (port 0: any free port, see ``server.server_port``).

    Raises ``OSError`` when the address cannot be bound (in use, not this machine's).
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("Server", (_Server,), {"address_family": family})
    server: WSGIServer = make_server(host, port, make_app(registry, health), server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="kvpolicy-http", daemon=True)
    thread.start()
    return server, thread
