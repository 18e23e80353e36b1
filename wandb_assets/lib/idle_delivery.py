"""Sending what the idle ladder's ledger holds (rows claimed by ``lib/idle_actions.claim_pending``): the stops first,
then the messages (a stop step's messages say what became of the stop), then the Datadog events. The channels are
given (``IdleChannels``: Slack's Web API, the alert webhook, Datadog, W&B); this module only decides who hears what and
what each outcome is. No Dagster, no warehouse.

The owner is the run's W&B user: the Slack user the teams file names for them, else the Slack user with the W&B
user's e-mail (Slack ``users.lookupByEmail``), else the alert webhook with the reason in the ledger. The team is the
team's channel in the teams file, else the webhook likewise. A channel that fails (an outage, a 5xx, a rate limit)
leaves the row pending for the next tick; nothing is sent twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from wandb_assets.lib.channels import Outage, slack_escape
from wandb_assets.lib.idle_actions import (
    DIGEST,
    NOT_STOPPED,
    PENDING,
    REFUSED,
    SENT,
    SKIPPED,
    STOPPED,
    UNDELIVERABLE,
)
from wandb_assets.lib.idle_policy import DATADOG, OWNER, STOP, TEAM


@dataclass(frozen=True)
class StopAnswer:
    outcome: str  # STOPPED | NOT_STOPPED | REFUSED
    reason: str | None = None


class IdleChannels(Protocol):
    def slack_missing(self) -> str | None:
        """None when Slack's Web API can be used (a bot token is configured), else why not."""

    def post_slack(self, channel: str, text: str) -> None:
        """Post ``text`` to a Slack channel or user id; ``Outage`` when Slack cannot take it now."""

    def slack_user_by_email(self, email: str) -> str | None:
        """The Slack user id with this e-mail, None when Slack has none; ``Outage`` when Slack cannot answer now."""

    def webhook_missing(self) -> str | None:
        """None when the alert webhook is configured, else why not."""

    def post_webhook(self, text: str) -> None:
        """``Outage`` when the webhook cannot take it now."""

    def datadog_missing(self) -> str | None: ...

    def send_event(self, title: str, text: str) -> None:
        """``Outage`` when Datadog cannot take it now."""

    def stop_run(self, path: str) -> StopAnswer:
        """Ask W&B to stop the run ``entity/project/run_id`` through the official client; ``Outage`` when W&B
        cannot answer now."""


def _hours(minutes: float) -> str:
    return f"{minutes:.0f} minutes" if minutes < 180 else f"{minutes / 60:.1f} hours"


def _clock(iso: str | None) -> str:
    return f"{datetime.fromisoformat(iso):%H:%M} UTC" if iso else ""


def _run_words(row: dict) -> str:
    d = row["details"]
    name = slack_escape(d.get("run_name") or row["run_id"])
    where = f"{row['entity']}/{row['project']}, id {row['run_id']}"
    return f"<{d['url']}|{name}> ({slack_escape(where)})" if d.get("url") else f"{name} ({slack_escape(where)})"


def _burn(row: dict) -> str:
    d = row["details"]
    if d.get("usd_per_hour") is None:
        return "its price is unknown (no GPU price for its model)"
    so_far = f"${row['idle_usd']:,.2f} idle so far, " if row.get("idle_usd") is not None else ""
    return f"{so_far}${d['usd_per_hour']:,.2f} an hour for its {d['gpu_count']} GPUs"


def _exempt_how(row: dict) -> str:
    d = row["details"]
    ways = [f"tag it `{t}`" for t in d.get("exempt_tags") or []][:1]
    ways += [f"set `{k}: true` in its config" for k in d.get("exempt_config_keys") or []][:1]
    return f"To exempt such a run, {' or '.join(ways)}." if ways else "Ask the platform team to exempt it."


def _next(row: dict) -> str:
    d = row["details"]
    if not d.get("next_step"):
        return "This was the last step."
    does = d["next_step_does"]
    if "stop" in does and not d.get("stop_runs"):
        does += " (stopping is off: it would only be recorded)"
    return f"Next, if it stays idle: {does} at {_clock(d.get('next_at'))}."


def ladder_text(row: dict) -> str:
    """The message of a telling step, to the owner (``you``) or the team."""
    d = row["details"]
    whose = "Your run" if row["audience"] == OWNER else f"Run of {slack_escape(d.get('user') or 'an unknown user')}:"
    idle = f"{d['idle_gpus']:g} of {d['gpu_count']} {d.get('gpu_model') or ''} GPUs".replace("  ", " ")
    return (
        f":hourglass: {whose} {_run_words(row)} has had {idle} idle for {_hours(d['idle_minutes'])} "
        f"(since {row['episode_started_at']:%Y-%m-%d %H:%M} UTC): {_burn(row)}. {_next(row)} {_exempt_how(row)}"
    )


def stop_text(row: dict, answer: tuple[str, str | None]) -> str | None:
    """The message of a stop step, once the stop's outcome is known (None: nothing to say)."""
    outcome, reason = answer
    whose = "Your run" if row["audience"] == OWNER else f"Run of {slack_escape(row['details'].get('user') or '?')}:"
    idle = _hours(row["details"]["idle_minutes"])
    if outcome == STOPPED:
        return f":octagonal_sign: {whose} {_run_words(row)} was stopped after {idle} idle. {_exempt_how(row)}"
    if outcome == REFUSED:
        return (
            f":warning: {whose} {_run_words(row)} has been idle for {idle} and should have been stopped, but W&amp;B "
            f"refused: {slack_escape(reason or 'no reason given')}. Please stop it yourself. {_exempt_how(row)}"
        )
    return None


def event_title(row: dict) -> str:
    return f"Idle GPUs, step {row['step']}: {row['entity']}/{row['project']}/{row['run_id']}"[:100]


def event_text(row: dict) -> str:
    d = row["details"]
    return (
        f"Step {row['step']} ({d['step_does']}) for run {d.get('run_name') or row['run_id']} of "
        f"{d.get('user') or 'unknown user'}: {d['idle_gpus']:g} of {d['gpu_count']} GPUs idle for "
        f"{_hours(d['idle_minutes'])}; {row.get('idle_gpu_hours') or 0:.2f} idle GPU-hours"
        + (f", ${row['idle_usd']:,.2f}" if row.get("idle_usd") is not None else "")
        + (f". {d['url']}" if d.get("url") else "")
    )


def _outcome(row: dict, outcome: str, now: datetime, **fields) -> dict:
    return {**row, "outcome": outcome, "acted_at": None if outcome == PENDING else now, **fields}


def deliver(
    rows: list[dict],
    channels: IdleChannels,
    now: datetime,
    known_stops: dict[tuple, tuple[str, str | None]] | None = None,
) -> list[dict]:
    """Send the claimed ``rows``; returns each row's outcome (``record_outcomes``). ``known_stops``: the outcomes of
    stops decided earlier whose messages are claimed now, by ``(entity, project, run_id, episode_started_at, step)``.
    A channel found down is not tried again in this call."""
    stops = dict(known_stops or {})
    down: dict[str, str] = {}
    outcomes: list[dict] = []

    def step_key(row: dict) -> tuple:
        return (row["entity"], row["project"], row["run_id"], row["episode_started_at"], row["step"])

    for row in (r for r in rows if r["audience"] == STOP):
        if "wandb" in down:
            outcomes.append(_outcome(row, PENDING, now, error=down["wandb"]))
            continue
        try:
            answer = channels.stop_run(row["recipient"])
        except Outage as exc:
            down["wandb"] = str(exc)
            outcomes.append(_outcome(row, PENDING, now, error=str(exc)))
            continue
        stops[step_key(row)] = (answer.outcome, answer.reason)
        outcomes.append(_outcome(row, answer.outcome, now, reason=answer.reason))

    for row in (r for r in rows if r["audience"] in (OWNER, TEAM)):
        if row["details"].get("stop_step"):
            answer = stops.get(step_key(row))
            if answer is None:  # its stop waits (W&B down): so does what it will say
                outcomes.append(_outcome(row, PENDING, now))
                continue
            text = stop_text(row, answer)
            if text is None:
                why = "the run had ended before its stop" if answer[0] == NOT_STOPPED else "nothing to say"
                outcomes.append(_outcome(row, SKIPPED, now, reason=why))
                continue
        else:
            text = ladder_text(row)
        outcomes.append(_tell(row, text, channels, down, now))

    for row in (r for r in rows if r["audience"] == DIGEST):
        outcomes.append(_tell_digest(row, channels, down, now))

    for row in (r for r in rows if r["audience"] == DATADOG):
        missing = channels.datadog_missing()
        if missing:
            outcomes.append(_outcome(row, UNDELIVERABLE, now, reason=missing))
        elif "datadog" in down:
            outcomes.append(_outcome(row, PENDING, now, error=down["datadog"]))
        else:
            try:
                channels.send_event(event_title(row), event_text(row))
                outcomes.append(_outcome(row, SENT, now, channel="datadog_event"))
            except Outage as exc:
                down["datadog"] = str(exc)
                outcomes.append(_outcome(row, PENDING, now, error=str(exc)))
    return outcomes


def _tell_digest(row: dict, channels: IdleChannels, down: dict[str, str], now: datetime) -> dict:
    """A weekly digest to its Slack user or channel (from the teams file); nobody to send it to is recorded, never
    sent to the webhook (a digest is not an alert)."""
    missing = channels.slack_missing()
    if missing or not row["recipient"]:
        who = row["run_id"].replace(":", " ", 1)
        why = missing or f"the teams file gives {who} no Slack {'user' if who.startswith('user') else 'channel'}"
        return _outcome(row, UNDELIVERABLE, now, channel="none", reason=why)
    if "slack" in down:
        return _outcome(row, PENDING, now, error=down["slack"])
    try:
        channels.post_slack(row["recipient"], row["details"]["text"])
    except Outage as exc:
        down["slack"] = str(exc)
        return _outcome(row, PENDING, now, error=str(exc))
    return _outcome(row, SENT, now, channel="slack")


def _tell(row: dict, text: str, channels: IdleChannels, down: dict[str, str], now: datetime) -> dict:
    """Post ``text`` to the row's audience: its Slack user or channel, else the webhook (the reason recorded)."""
    d = row["details"]
    recipient, reason = None, None
    slack_missing = channels.slack_missing()
    if slack_missing:
        reason = slack_missing
    elif row["audience"] == OWNER:
        recipient = d.get("owner_slack")
        if not recipient and d.get("email"):
            if "slack" in down:
                return _outcome(row, PENDING, now, error=down["slack"])
            try:
                recipient = channels.slack_user_by_email(d["email"])
            except Outage as exc:
                down["slack"] = str(exc)
                return _outcome(row, PENDING, now, error=str(exc))
            if not recipient:
                reason = f"no Slack user for {d.get('user')}: not in the teams file, and Slack has none with its e-mail"
        elif not recipient:
            reason = f"no Slack user for {d.get('user')}: not in the teams file, and W&B gave no e-mail"
    else:
        recipient = d.get("team_channel")
        if not recipient:
            team = d.get("team")
            reason = f"team {team} has no channel in the teams file" if team else f"{d.get('user')} is in no team"
    if recipient:
        if "slack" in down:
            return _outcome(row, PENDING, now, error=down["slack"])
        try:
            channels.post_slack(recipient, text)
        except Outage as exc:
            down["slack"] = str(exc)
            return _outcome(row, PENDING, now, error=str(exc))
        return _outcome(row, SENT, now, channel="slack", recipient=recipient)
    webhook_missing = channels.webhook_missing()
    if webhook_missing:
        return _outcome(row, UNDELIVERABLE, now, channel="none", reason=f"{reason}; {webhook_missing}")
    if "webhook" in down:
        return _outcome(row, PENDING, now, error=down["webhook"])
    try:
        channels.post_webhook(f"(for the {row['audience']}; {slack_escape(reason or '')}) {text}")
    except Outage as exc:
        down["webhook"] = str(exc)
        return _outcome(row, PENDING, now, error=str(exc))
    return _outcome(row, SENT, now, channel="webhook", recipient="alert webhook", reason=reason)
