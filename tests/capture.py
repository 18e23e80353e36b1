"""A loopback HTTP capture server standing in for Datadog's intake and for a Slack-compatible webhook."""

import gzip
import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    """An HTTP server on loopback in a thread of its own, serving ``handler``; ``base`` is its URL."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def base(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class CaptureServer(LoopbackServer):
    """Records every request. ``answer`` is an HTTP status to reply with, or "hang" to stall ``hang_s``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answer: int | str = 202
        self.hang_s = 5.0
        capture = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    raw = gzip.decompress(raw)
                elif encoding == "deflate":
                    raw = zlib.decompress(raw)
                capture.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(raw)})
                if capture.answer == "hang":
                    time.sleep(capture.hang_s)
                    status = 202
                else:
                    status = int(capture.answer)
                body = b'{"errors": []}' if status < 300 else b'{"errors": ["refused"]}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return self.base

    def bodies(self, path_prefix: str) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"].startswith(path_prefix)]
