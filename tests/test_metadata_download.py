"""The metadata download as a careful client does it (issue 32, S1, S2 and S2b of code-review-2026-11c): the W&B key
only to the base URL's own origin, other hosts only over https and without it, redirects never followed, the proxy
of the environment honoured (NO_PROXY too), one deadline per download. Loopback servers only."""

import base64
import http.server
import json
import time

import pytest

from wandb_assets.lib.fetch import (
    DownloadPool,
    WandbFetchError,
    metadata_headers,
    metadata_url_refused,
    read_metadata_file,
)
from wandb_assets.lib.throttle import Throttle
from wandb_assets.localwandb.loopback import LoopbackServer

KEY = "local-" + "k" * 40
BASIC = {"Authorization": "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode()}
BODY = json.dumps({"gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3"}).encode()


@pytest.mark.parametrize(
    ("url", "base", "sent"),
    [
        ("https://api.wandb.ai/files/e/p/r/wandb-metadata.json", "https://api.wandb.ai", True),
        ("https://api.wandb.ai:443/files/x", "https://api.wandb.ai", True),  # the default port, written out
        ("https://API.wandb.ai/files/x", "https://api.wandb.ai/", True),
        ("http://api.wandb.ai/files/x", "https://api.wandb.ai", False),  # plain HTTP to the HTTPS server's host
        ("https://api.wandb.ai:8443/files/x", "https://api.wandb.ai", False),
        ("https://storage.googleapis.com/b/wandb-metadata.json?X-Goog-Signature=1", "https://api.wandb.ai", False),
        ("http://127.0.0.1:9/files/x", "http://127.0.0.1:8/", False),
        ("http://127.0.0.1:8/files/x", "http://127.0.0.1:8/", True),
        ("https://api.wandb.ai:x/files", "https://api.wandb.ai", False),
    ],
)
def test_the_key_goes_only_to_the_base_urls_own_origin(url, base, sent):
    assert metadata_headers(url, base, KEY) == (BASIC if sent else {})


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://wandb.example.com/files/e/p/r/wandb-metadata.json", None),
        ("http://wandb.example.com/files/x", None),  # the base URL's own origin (self-hosted over http)
        ("https://storage.example.com/bucket/wandb-metadata.json?sig=1", None),
        ("http://169.254.169.254/latest/meta-data/", "another host than W&B's, not over https"),
        ("http://wandb.example.com:8080/files/x", "another host than W&B's, not over https"),
        ("file:///etc/passwd", "another host than W&B's, not over https"),
        ("https://wandb.example.com:port/x", "its port is not a number"),
    ],
)
def test_a_file_url_elsewhere_is_fetched_only_over_https(url, refused):
    assert metadata_url_refused(url, "http://wandb.example.com") == refused


class _Files(http.server.BaseHTTPRequestHandler):
    """``/meta``: the file; ``/drip``: its bytes one at a time, 0.3 s apart; ``/redirect``: 302 to ``/meta``.
    As a proxy (an absolute URL in the request line) it answers the file too and counts the request."""

    seen: list = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.path.endswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/meta")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.path.endswith("/drip"):
            for byte in BODY:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.3)
            return
        self.wfile.write(BODY)


@pytest.fixture
def files_server():
    _Files.seen = []
    server = LoopbackServer(_Files)
    yield server.base
    server.stop()


def _read(pool, url: str, timeout_s: float = 2.0) -> dict:
    return read_metadata_file(pool, url, {}, Throttle(2), "wandb-metadata.json", timeout_s, KEY)


def test_a_dripping_download_is_cut_off_at_its_deadline_and_a_redirect_is_not_followed(files_server):
    pool = DownloadPool(2)
    assert _read(pool, files_server + "/meta") == {"status": "read", "gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3"}
    started = time.monotonic()
    with pytest.raises(WandbFetchError, match="took longer than 1 s"):
        _read(pool, files_server + "/drip", timeout_s=1.0)
    assert time.monotonic() - started < 2.5  # (the whole body would take 16 s; before: one recv timeout per byte)
    with pytest.raises(WandbFetchError, match="HTTP 302"):
        _read(pool, files_server + "/redirect")
    assert [path for path, _ in _Files.seen].count("/meta") == 1


def test_downloads_go_through_the_environments_proxy_unless_no_proxy_exempts_the_host(files_server, monkeypatch):
    """The proxy here is the same loopback server (it answers absolute-URL requests); nothing listens where the file
    URL points (127.0.0.2, port 1), so only the proxy can answer it."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", files_server)
    pool = DownloadPool(2)
    assert _read(pool, "http://127.0.0.2:1/bucket/meta")["status"] == "read"
    assert _Files.seen[-1][0] == "http://127.0.0.2:1/bucket/meta"  # the proxy got the absolute URL
    monkeypatch.setenv("NO_PROXY", "127.0.0.2")
    with pytest.raises(WandbFetchError, match="refused|Failed to establish"):  # direct now: nothing listens there
        _read(pool, "http://127.0.0.2:1/bucket/meta", timeout_s=1.0)
    assert len(_Files.seen) == 1
