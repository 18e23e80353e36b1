"""A loopback GitHub REST API for the pull-request checks (issue 45): one repository, its commits and pull requests,
check runs, commit statuses, issue comments and a GitHub App's token exchange, each call recorded.

What it checks as GitHub does: a token or an installation token it issued (else 401); the App's JWT (RS256, signed by
the App's private key, ``iss`` the app id, at most 10 minutes) on the App's own endpoints; check runs created with an
installation token only (a personal token gets GitHub's 403); a commit named by a prefix resolved to its full SHA (422
when none). ``outage``: the next that many requests answer 502."""

import itertools
import json
import re
import secrets
import threading
import time
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from wandb_assets.localwandb.loopback import LoopbackServer, QuietHandler


def app_private_key() -> str:
    """A fresh RSA private key in PEM, as GitHub hands an App's."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()


class LocalGitHub(LoopbackServer):
    def __init__(self, repo: str = "acme/trainer", token: str = "", app_id: int = 0, private_key: str = "") -> None:
        self.repo, self.token, self.app_id = repo, token, app_id
        self.public_key = (
            serialization.load_pem_private_key(private_key.encode(), None).public_key() if private_key else None
        )
        self.installation_id = 4242
        self.issued: set[str] = set()
        self.commits: list[str] = []
        self.pulls: dict[int, str] = {}
        #: each pull request's commits (GET /pulls/N/commits), its head among them
        self.pull_commits: dict[int, list[str]] = {}
        #: the App's slug (its comments' author is ``<slug>[bot]``) and the personal token's user
        self.app_slug, self.token_user = "wandb-assets", "ci-user"
        self.check_runs: dict[int, dict] = {}
        self.statuses: list[dict] = []
        self.comments: dict[int, dict] = {}
        self.calls: list[dict] = []
        self.outage = 0
        self._ids = itertools.count(1001)
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def _serve(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                with server._lock:
                    status, answer = server.answer(self.command, self.path, self.headers.get("Authorization", ""), body)
                self.send_json(status, answer, "application/json; charset=utf-8")

            do_GET = do_POST = do_PATCH = _serve  # noqa: N815

        super().__init__(Handler)

    # -- what the tests set up and read ------------------------------------------------------------------------------

    def add_commit(self, sha: str, pr: int | None = None) -> str:
        """A commit of the repository (40 hex digits); ``pr``: that pull request's head is now this commit."""
        assert re.fullmatch(r"[0-9a-f]{40}", sha), sha
        self.commits.append(sha)
        if pr is not None:
            self.pulls[pr] = sha
            self.pull_commits.setdefault(pr, []).append(sha)
        return sha

    def calls_to(self, method: str, pattern: str) -> list[dict]:
        return [c for c in self.calls if c["method"] == method and re.fullmatch(pattern, c["path"])]

    def sent_texts(self) -> str:
        """Everything the server received (paths, bodies), for the secret greps."""
        return json.dumps(self.calls)

    # -- GitHub ------------------------------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base}{path}"

    def _who(self, authorization: str) -> str | None:
        """``token``, ``installation``, ``app`` (a valid JWT of the App) or None."""
        kind, _, credential = authorization.partition(" ")
        if kind.lower() == "bearer" and self.public_key is not None and credential.count(".") == 2:
            try:
                claims = jwt.decode(credential, self.public_key, algorithms=["RS256"], options={"require": ["exp"]})
            except jwt.PyJWTError:
                return None
            if str(claims.get("iss")) == str(self.app_id) and claims["exp"] - time.time() <= 600:
                return "app"
            return None
        if credential in self.issued:
            return "installation"
        if self.token and credential == self.token:
            return "token"
        return None

    def add_comment(self, pr: int, body: str, login: str) -> int:
        """A comment someone else wrote on a pull request."""
        comment_id = next(self._ids)
        self.comments[comment_id] = {"id": comment_id, "issue": pr, "body": body, "user": {"login": login}}
        return comment_id

    def answer(self, method: str, target: str, authorization: str, body) -> tuple[int, object]:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        who = self._who(authorization)
        self.calls.append({"method": method, "path": path, "query": parts.query, "who": who, "body": body})
        if self.outage > 0:
            self.outage -= 1
            return 502, {"message": "Server Error"}
        if who is None:
            return 401, {"message": "Bad credentials"}
        repo = f"/repos/{self.repo}"
        if path == f"{repo}/installation" and method == "GET":
            if who != "app":
                return 401, {"message": "A JSON web token could not be decoded"}
            owner = self.repo.split("/")[0]
            return 200, {"id": self.installation_id, "app_id": self.app_id, "account": {"login": owner}}
        if path == f"/app/installations/{self.installation_id}/access_tokens" and method == "POST":
            if who != "app":
                return 401, {"message": "A JSON web token could not be decoded"}
            token = "ghs_" + secrets.token_hex(18)
            self.issued.add(token)
            return 201, {"token": token, "expires_at": "2099-01-01T00:00:00Z", "permissions": {"checks": "write"}}
        if path == "/app" and method == "GET":
            if who != "app":
                return 401, {"message": "A JSON web token could not be decoded"}
            return 200, {"id": self.app_id, "slug": self.app_slug, "name": self.app_slug}
        if who == "app":
            return 403, {"message": "An App's JWT cannot do this: use an installation token"}
        if path == "/user" and method == "GET":
            if who != "token":
                return 403, {"message": "Resource not accessible by integration"}
            return 200, {"login": self.token_user, "id": 7}
        if path == repo and method == "GET":
            owner, name = self.repo.split("/")
            return 200, {
                "id": 1,
                "name": name,
                "full_name": self.repo,
                "owner": {"login": owner},
                "url": self._url(repo),
            }
        if not path.startswith(repo + "/"):
            return 404, {"message": "Not Found"}
        rest = path[len(repo) :]
        if m := re.fullmatch(r"/commits/([^/]+)", rest):
            found = [sha for sha in self.commits if sha.startswith(m[1])]
            if len(found) != 1:
                return 422, {"message": f"No commit found for SHA: {m[1]}"}
            return 200, {"sha": found[0], "url": self._url(f"{repo}/commits/{found[0]}")}
        if m := re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", rest):
            name = (query.get("check_name") or [None])[0]
            runs = [r for r in self.check_runs.values() if r["head_sha"] == m[1] and name in (None, r["name"])]
            return 200, {"total_count": len(runs), "check_runs": runs}
        if rest == "/check-runs" and method == "POST":
            if who != "installation":
                return 403, {"message": "Resource not accessible by personal access token"}
            if body["head_sha"] not in self.commits:
                return 422, {"message": "No commit found for SHA"}
            run_id = next(self._ids)
            self.check_runs[run_id] = {
                **body,
                "id": run_id,
                "url": self._url(f"{repo}/check-runs/{run_id}"),
                "html_url": f"https://github.example/{self.repo}/runs/{run_id}",
            }
            return 201, self.check_runs[run_id]
        if (m := re.fullmatch(r"/check-runs/(\d+)", rest)) and method == "PATCH":
            run = self.check_runs.get(int(m[1]))
            if run is None:
                return 404, {"message": "Not Found"}
            run.update(body)
            return 200, run
        if (m := re.fullmatch(r"/statuses/([0-9a-f]{40})", rest)) and method == "POST":
            self.statuses.append({**body, "sha": m[1]})
            return 201, {**body, "id": next(self._ids), "url": self._url(path)}
        if m := re.fullmatch(r"/pulls/(\d+)/commits", rest):
            if int(m[1]) not in self.pulls:
                return 404, {"message": "Not Found"}
            return 200, [
                {"sha": sha, "url": self._url(f"{repo}/commits/{sha}")} for sha in self.pull_commits[int(m[1])]
            ]
        if m := re.fullmatch(r"/pulls/(\d+)", rest):
            head = self.pulls.get(int(m[1]))
            if head is None:
                return 404, {"message": "Not Found"}
            return 200, {"number": int(m[1]), "url": self._url(path), "head": {"sha": head, "ref": f"pr{m[1]}"}}
        if (m := re.fullmatch(r"/issues/(\d+)", rest)) and method == "GET":
            if int(m[1]) not in self.pulls:
                return 404, {"message": "Not Found"}
            return 200, {"number": int(m[1]), "url": self._url(path), "comments_url": self._url(path + "/comments")}
        if m := re.fullmatch(r"/issues/(\d+)/comments", rest):
            number = int(m[1])
            if number not in self.pulls:
                return 404, {"message": "Not Found"}
            if method == "GET":
                return 200, [c for c in self.comments.values() if c["issue"] == number]
            comment_id = next(self._ids)
            self.comments[comment_id] = {
                "id": comment_id,
                "issue": number,
                "body": body["body"],
                "user": {"login": f"{self.app_slug}[bot]" if who == "installation" else self.token_user},
                "url": self._url(f"{repo}/issues/comments/{comment_id}"),
                "html_url": f"https://github.example/{self.repo}/pull/{number}#issuecomment-{comment_id}",
            }
            return 201, self.comments[comment_id]
        if (m := re.fullmatch(r"/issues/comments/(\d+)", rest)) and method == "PATCH":
            comment = self.comments.get(int(m[1]))
            if comment is None:
                return 404, {"message": "Not Found"}
            comment["body"] = body["body"]
            return 200, comment
        return 404, {"message": "Not Found"}
