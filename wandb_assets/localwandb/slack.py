"""A local Slack Web API on loopback (``chat.postMessage``, ``users.lookupByEmail``, ``auth.test``) that records
every call, for ``slack_sdk``'s ``WebClient(base_url=...)``: the demo's Slack and the tests'. ``down``: every call
answers 503 (an outage); ``users``: e-mail -> Slack user id."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

from wandb_assets.localwandb.loopback import LoopbackServer, QuietHandler


class LocalSlack(LoopbackServer):
    def __init__(self, token: str = "xoxb-test-token", users: dict[str, str] | None = None) -> None:
        self.token = token
        self.users = dict(users or {})
        self.down = False
        #: every call: ``{"method", "args", "auth", "ok"}`` (``ok``: answered ``ok: true``)
        self.calls: list[dict] = []
        slack = self

        class Handler(QuietHandler):
            def _reply(self, status: int, body: dict) -> None:
                self.call["ok"] = status == 200 and body.get("ok", False)
                self.send_json(status, body)

            def _handle(self, args: dict) -> None:
                method = urlparse(self.path).path.rsplit("/", 1)[-1]
                auth = self.headers.get("Authorization") or ""
                self.call = {"method": method, "args": args, "auth": auth}
                slack.calls.append(self.call)
                if slack.down:
                    self._reply(503, {"ok": False, "error": "service_unavailable"})
                elif auth != f"Bearer {slack.token}":
                    self._reply(200, {"ok": False, "error": "invalid_auth"})
                elif method == "chat.postMessage":
                    self._reply(200, {"ok": True, "channel": args.get("channel"), "ts": f"{len(slack.calls)}.0001"})
                elif method == "auth.test":
                    self._reply(200, {"ok": True, "team": "local", "user": "wandb-assets", "user_id": "U0BOT"})
                elif method == "users.lookupByEmail":
                    user = slack.users.get(args.get("email", ""))
                    if user is None:
                        self._reply(200, {"ok": False, "error": "users_not_found"})
                    else:
                        self._reply(200, {"ok": True, "user": {"id": user}})
                else:
                    self._reply(200, {"ok": False, "error": "unknown_method"})

            def do_GET(self) -> None:  # noqa: N802
                query = parse_qs(urlparse(self.path).query)
                self._handle({k: v[0] for k, v in query.items()})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if (self.headers.get("Content-Type") or "").startswith("application/json"):
                    args = json.loads(raw or "{}")
                else:
                    args = {k: v[0] for k, v in parse_qs(raw).items()}
                args.update({k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()})
                self._handle(args)

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return f"{self.base}/api/"

    def messages(self) -> list[dict]:
        """The messages posted: ``{"channel", "text"}``."""
        return [c["args"] for c in self.calls if c["method"] == "chat.postMessage" and c.get("ok")]
