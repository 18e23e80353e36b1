"""Notification channels that need nothing but the standard library: a Slack-compatible webhook."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class Outage(Exception):
    """A channel that could not be reached now (an outage, a 5xx, a rate limit): what it was to take waits in its
    outbox for the next tick."""


def slack_escape(text: str) -> str:
    """Text Slack shows as written: ``&``, ``<`` and ``>`` are its control characters (``<!channel>`` pages a
    whole channel, ``<url|label>`` disguises a link), and run names in alert texts are anyone's to choose."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def datadog_escape(text: str) -> str:
    """Text a Datadog event shows without notifying anyone: an ``@handle`` in an event's title or text notifies
    that person, team or integration (``@pagerduty``, ``@slack-channel``), and run names are anyone's to choose.
    A zero-width space after each ``@`` keeps it readable and inert."""
    return text.replace("@", "@\u200b")


def post_webhook(url: str, text: str, timeout_s: float = 10.0, markup: bool = False) -> str | None:
    """POST ``{"text": text}`` (escaped for Slack, unless ``markup``: text already escaped, its links Slack's own
    ``<url|label>``); None on a 2xx answer, else one sentence (without the URL, which is a secret)."""
    body = json.dumps({"text": text if markup else slack_escape(text)}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            return None
    except urllib.error.HTTPError as exc:
        return f"webhook answered HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"webhook unreachable ({type(reason).__name__}: {str(reason)[:120]})"
