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
        self.api = DatadogObjects()
        capture = self

        class Handler(QuietHandler):
            def _body(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    raw = gzip.decompress(raw)
                elif encoding == "deflate":
                    raw = zlib.decompress(raw)
                return json.loads(raw) if raw else None

            def _record(self, method: str, body) -> None:
                capture.requests.append(
                    {"method": method, "path": self.path, "headers": dict(self.headers), "body": body}
                )

            def do_GET(self) -> None:  # noqa: N802
                self._record("GET", None)
                self.send_json(*capture.api.answer("GET", self.path, dict(self.headers), None))

            def do_PUT(self) -> None:  # noqa: N802
                body = self._body()
                capture.requests.append(
                    {"method": "PUT", "path": self.path, "headers": dict(self.headers), "body": body}
                )
                self.send_json(*capture.api.answer("PUT", self.path, dict(self.headers), body))

            def do_POST(self) -> None:  # noqa: N802
                body = self._body()
                capture.requests.append(
                    {"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body}
                )
                if self.path.startswith(DatadogObjects.PATHS):
                    self.send_json(*capture.api.answer("POST", self.path, dict(self.headers), body))
                    return
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
        return [r["body"] for r in self.requests if r["path"].startswith(path_prefix) and r.get("method") != "GET"]

    def writes(self, path_prefix: str) -> list[tuple[str, str]]:
        """``(method, path)`` of each POST and PUT under ``path_prefix``."""
        return [(r["method"], r["path"]) for r in self.requests if r["path"].startswith(path_prefix)
                and r["method"] in ("POST", "PUT")]  # fmt: skip


class DatadogObjects:
    """Datadog's dashboards and monitors API as the loopback answers it: ``POST`` creates (an id, creation and
    modification times, the creator, as Datadog adds), ``GET`` lists (monitors filtered by ``monitor_tags``) or reads
    one, ``PUT`` replaces what it is given; without ``DD-APPLICATION-KEY`` 403 as Datadog answers; an unknown id 404."""

    PATHS = ("/api/v1/monitor", "/api/v1/dashboard")

    def __init__(self) -> None:
        self.monitors: dict[int, dict] = {}
        self.dashboards: dict[str, dict] = {}
        #: The one application key accepted (None: any), as Datadog refuses a key it did not issue.
        self.app_key: str | None = None

    @staticmethod
    def _now() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())

    def answer(self, method: str, path: str, headers: dict, body) -> tuple[int, object]:
        from urllib.parse import parse_qs, urlsplit

        lowered = {k.lower(): v for k, v in headers.items()}
        app_key = lowered.get("dd-application-key")
        if not lowered.get("dd-api-key") or not app_key or (self.app_key and app_key != self.app_key):
            return 403, {"errors": ["Forbidden"]}
        parts = urlsplit(path)
        segments = parts.path.strip("/").split("/")  # api v1 monitor|dashboard [id]
        kind, ident = segments[2], (segments[3] if len(segments) > 3 else None)
        creator = {"email": "ops@example.com", "handle": "ops@example.com", "name": "ops"}
        if kind == "monitor":
            if method == "POST" and ident is None:
                made = {**body, "id": len(self.monitors) + 1, "created": self._now(), "modified": self._now(),
                        "creator": creator, "overall_state": "No Data", "deleted": None}  # fmt: skip
                self.monitors[made["id"]] = made
                return 200, made
            if method == "GET" and ident is None:
                wanted = parse_qs(parts.query).get("monitor_tags", [""])[0].split(",")
                return 200, [m for m in self.monitors.values() if all(t in m.get("tags", []) for t in wanted if t)]
            found = self.monitors.get(int(ident)) if ident and ident.isdigit() else None
            if found is None:
                return 404, {"errors": ["Monitor not found"]}
            if method == "PUT":
                found.update({**body, "modified": self._now()})
            return 200, found
        if kind == "dashboard":
            if method == "POST" and ident is None:
                ident = f"abc-{len(self.dashboards):03d}-xyz"
                made = {**body, "id": ident, "url": f"/dashboard/{ident}/w-b-fleet", "created_at": self._now(),
                        "modified_at": self._now(), "author_handle": "ops@example.com"}  # fmt: skip
                self.dashboards[ident] = made
                return 200, made
            if method == "GET" and ident is None:
                summary = ("id", "title", "description", "layout_type", "url", "created_at", "modified_at",
                           "author_handle")  # fmt: skip
                return 200, {"dashboards": [{k: d.get(k) for k in summary} for d in self.dashboards.values()]}
            found = self.dashboards.get(ident)
            if found is None:
                return 404, {"errors": ["Dashboard not found"]}
            if method == "PUT":
                kept = {k: found[k] for k in ("id", "url", "created_at", "author_handle")}
                found.clear()
                found.update({**body, **kept, "modified_at": self._now()})
            return 200, found
        return 404, {"errors": ["Not found"]}
