"""The one way the local stand-ins serve HTTP on loopback (the W&B server, Slack, and the tests' Datadog and GitHub):
a threaded server in a daemon thread of its own, and a quiet HTTP/1.1 handler that answers JSON. No Dagster here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that logs nothing and answers with ``send_json``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access logs
        return

    def send_json(self, status: int, body: Any, content_type: str = "application/json") -> None:
        """Answer ``status`` with ``body``: bytes as they are, anything else as JSON."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class LoopbackServer:
    """``handler`` served on ``host:port`` (loopback, any free port by default) in a daemon thread, from ``start()``
    (at once unless ``start=False``) until ``stop()``; ``base`` is its URL."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        host: str = "127.0.0.1",
        port: int = 0,
        name: str | None = None,
        start: bool = True,
    ) -> None:
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._name = name
        if start:
            self.start()

    def start(self) -> LoopbackServer:
        threading.Thread(target=self._httpd.serve_forever, name=self._name, daemon=True).start()
        return self

    @property
    def base(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
