"""The one notifier's rules, for every channel this project speaks to (Slack's Web API and webhook, GitHub, Datadog):
what an answer means, and text escaped for where it is shown. No Dagster, no environment reads.

Every error of a channel is one of three classes, decided here once:

- **transient** (``Outage``): a 429 (with its ``Retry-After``), a 5xx, a time-out, a connection error. What it was to
  take waits in its outbox for the next tick; only that channel pauses for the rest of this one.
- **permanent** (``Undeliverable``): the target will never take it as it is (an archived channel, a bot not in the
  channel, a user who left, a 404 or 422). The item is ``undeliverable``, said once with the reason, and the fallback
  (the alert webhook) is told why; the channel is not paused, so one bad target never silences the others.
- **auth** (``AuthRefused``, an ``Outage``): the credential is refused (401, 403, Slack's ``invalid_auth``). The item
  waits for the setting to be fixed, and the error is one sentence naming that setting.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class Outage(Exception):
    """A channel that could not be reached now (an outage, a 5xx, a rate limit): what it was to take waits in its
    outbox for the next tick. ``retry_after``: seconds the channel asked to be left alone (a 429's ``Retry-After``)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AuthRefused(Outage):
    """The channel refused the credential: nothing it is sent can go out until the setting is fixed (its items wait)."""


class Undeliverable(Exception):
    """The target will never take this item as it is (archived, not a member, gone, not found, invalid)."""


#: Slack Web API errors (``ok: false``) that say the credential is at fault, and those that say Slack is at fault now.
SLACK_AUTH_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "token_revoked",
        "token_expired",
        "missing_scope",
        "not_allowed_token_type",
        "no_permission",
        "team_access_not_granted",
        "ekm_access_denied",
        "org_login_required",
    }
)
SLACK_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "rate_limited", "service_unavailable", "fatal_error", "internal_error", "request_timeout"}
)


def slack_error(error: str | None, status: int | None, retry_after: float | None, setting: str) -> Exception:
    """The class of a Slack Web API error (``error``: its ``error`` code; ``status``: the HTTP status). A 429, a 5xx
    or a transient code: ``Outage``; a credential code or 401/403: ``AuthRefused`` naming ``setting`` (and the scope
    it lacks); any other code Slack answers for one request (``is_archived``, ``not_in_channel``,
    ``channel_not_found``, ``user_not_found``, ``account_inactive``...): ``Undeliverable``, never fixed by asking
    again."""
    said = error or f"HTTP {status}"
    if status == 429 or error in ("ratelimited", "rate_limited"):
        wait = f", retry after {retry_after:g} s" if retry_after is not None else ""
        return Outage(f"Slack is rate-limiting ({said}{wait})", retry_after)
    if (status or 0) >= 500 or error in SLACK_TRANSIENT_ERRORS:
        return Outage(f"Slack answered {said}")
    if error in SLACK_AUTH_ERRORS or status in (401, 403):
        need = (
            " (the bot lacks a scope: users.lookupByEmail needs users:read.email)" if error == "missing_scope" else ""
        )
        return AuthRefused(f"Slack refused the bot token ({said}){need}: check {setting}")
    if error is None and status is not None and status >= 400:
        return Undeliverable(f"Slack answered HTTP {status}")
    return Undeliverable(f"Slack answered {said}")


def http_error(service: str, status: int, message: str | None, what: str, setting: str) -> Exception:
    """The class of an HTTP error answer of GitHub or Datadog: 429, 5xx (and a 403 that says it is a rate limit):
    ``Outage``; 401/403: ``AuthRefused`` naming ``setting``; any other 4xx (404, 422...): ``Undeliverable``."""
    said = f"{service} answered {status}" + (f": {str(message)[:200]}" if message else "") + f" ({what})"
    if status == 429 or status >= 500 or (status == 403 and "rate limit" in (message or "").lower()):
        return Outage(said)
    if status in (401, 403):
        return AuthRefused(f"{said}: check {setting}")
    return Undeliverable(said)


def slack_escape(text: object) -> str:
    """Text Slack shows as written: ``&``, ``<`` and ``>`` are its control characters (``<!channel>`` pages a
    whole channel, ``<url|label>`` disguises a link), and run names in alert texts are anyone's to choose."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def datadog_escape(text: object) -> str:
    """Text a Datadog event shows without notifying anyone: an ``@handle`` in an event's title or text notifies
    that person, team or integration (``@pagerduty``, ``@slack-channel``), and run names are anyone's to choose.
    A zero-width space after each ``@`` keeps it readable and inert."""
    return str(text).replace("@", "@\u200b")


def slack_text(template: str, /, **values: object) -> str:
    """``template.format(**values)`` for Slack mrkdwn, every value escaped (``slack_escape``): the template is ours,
    its markup live; the values (run names and ids, users, teams, projects: anyone's to choose) show as written."""
    return template.format(**{name: slack_escape(value) for name, value in values.items()})


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
