"""Notification channels that need nothing but the standard library: a Slack-compatible webhook."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def post_webhook(url: str, text: str, timeout_s: float = 10.0) -> str | None:
    """POST ``{"text": text}``; None on a 2xx answer, else one sentence (without the URL, which is a secret)."""
    request = urllib.request.Request(
        url, data=json.dumps({"text": text}).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            return None
    except urllib.error.HTTPError as exc:
        return f"webhook answered HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"webhook unreachable ({type(reason).__name__}: {str(reason)[:120]})"
