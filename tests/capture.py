"""A loopback HTTP capture server standing in for Datadog's intake and for a Slack-compatible webhook."""

import gzip
import json
import time
import zlib

from wandb_assets.localwandb.loopback import LoopbackServer, QuietHandler


class CaptureServer(LoopbackServer):
    """Records every request. ``answer`` is an HTTP status to reply with, or "hang" to stall ``hang_s``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answer: int | str = 202
        self.hang_s = 5.0
        capture = self

        class Handler(QuietHandler):
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
                self.send_json(status, {"errors": []} if status < 300 else {"errors": ["refused"]})

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return self.base

    def bodies(self, path_prefix: str) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"].startswith(path_prefix)]
