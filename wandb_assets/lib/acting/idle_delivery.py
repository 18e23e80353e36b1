"""Sending what the idle ladder's ledger holds (rows claimed by ``acting/idle_actions.claim_pending``): the stops first,
then the messages (a stop step's messages say what became of the stop), then the Datadog events. The channels are
given (``IdleChannels``: Slack's Web API, the alert webhook, Datadog, W&B); this module only decides who hears what and
what each outcome is. No Dagster, no warehouse.

The owner is the run's W&B user: the Slack user the teams file names for them, else the Slack user with the W&B
user's e-mail (Slack ``users.lookupByEmail``), else the alert webhook with the reason in the ledger. The team is the
team's channel in the teams file, else the webhook likewise. Only a message in Slack to the owner or the team's channel
counts as told (the webhook is on-call's, not the owner's): a run nobody can reach in Slack is never stopped.

Errors are the notifier's classes (``lib/acting/channels``): a transient one (an outage, a 5xx, a 429) leaves the row
pending for the next tick and pauses that channel for the rest of this one; a permanent one (an archived channel, a
bot not in it, a user gone) makes the row ``undeliverable``, said once, and tells the webhook why; it pauses nothing,
so one bad target never silences the others. Nothing is sent twice.

A stop is an action, not a message: decided at a tick, it is re-validated when it is sent, against the run as W&B
holds it then (``SendTimeCheck``: still running, the same run, not exempt by its tags or config now), and it never
waits: W&B unreachable, it is withdrawn and decided again from scratch at the next tick, never sent late on an old
decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from wandb_assets.lib.acting.channels import Outage, Undeliverable, slack_escape
from wandb_assets.lib.acting.idle_actions import (
    DIGEST,
    NOT_STOPPED,
    PENDING,
    REFUSED,
    SENT,
    SKIPPED,
    STOPPED,
    UNDELIVERABLE,
    WITHDRAWN,
)
from wandb_assets.lib.acting.idle_policy import DATADOG, OWNER, STOP, TEAM, Exemptions, exempt_by_run


@dataclass(frozen=True)
class StopAnswer:
    outcome: str  # STOPPED | NOT_STOPPED | REFUSED
    reason: str | None = None


@dataclass(frozen=True)
class SendTimeCheck:
    """What a stop decided at a tick must still hold when it is sent, read from W&B then: the run is running, it is
    the run the decision was about (the same creation time: a run deleted and made again under its id is another),
    and neither its tags nor its config exempt it now (its owner may have tagged it after the message)."""

    created_at: datetime | None
    exempt: Exemptions

    def __call__(
        self, state: str | None, created_at: datetime | None = None, tags: tuple[str, ...] = (), config: Any = None
    ) -> str | None:
        """Why the stop must not be sent now (one phrase), or None, of the run as W&B holds it now."""
        if state != "running":
            return f"the run had ended ({state}) before its stop"
        if self.created_at is not None and created_at is not None and created_at != self.created_at:
            return (
                f"W&B's run at that path was created at {created_at:%Y-%m-%d %H:%M} UTC, not "
                f"{self.created_at:%Y-%m-%d %H:%M}: another run, left alone"
            )
        exempt = exempt_by_run(self.exempt, tags, config)
        return f"the run is exempt now ({exempt})" if exempt else None


def send_time_check(row: dict) -> SendTimeCheck:
    """The ``SendTimeCheck`` of a stop row (its run's creation time; the policy's tags and config keys, as decided)."""
    d = row["details"]
    exempt = Exemptions(
        tags=frozenset(d.get("exempt_tags") or ()), config_keys=tuple(d.get("exempt_config_keys") or ())
    )
    return SendTimeCheck(row.get("run_created_at"), exempt)


class IdleChannels(Protocol):
    def slack_missing(self) -> str | None:
        """None when Slack's Web API can be used (a bot token is configured), else why not."""

    def post_slack(self, channel: str, text: str) -> None:
        """Post ``text`` to a Slack channel or user id; ``Outage`` when Slack cannot take it now, ``Undeliverable``
        when it never will (archived, not in the channel, the user gone)."""

    def slack_user_by_email(self, email: str) -> str | None:
        """The Slack user id with this e-mail, None when Slack has none; ``Outage`` when Slack cannot answer now."""

    def webhook_missing(self) -> str | None:
        """None when the alert webhook is configured, else why not."""

    def post_webhook(self, text: str) -> None:
        """``Outage`` when the webhook cannot take it now."""

    def datadog_missing(self) -> str | None: ...

    def send_event(self, title: str, text: str) -> None:
        """``Outage`` when Datadog cannot take it now (``AuthRefused``: the key), ``Undeliverable`` when it never will
        (a 4xx other than 401/403/429). The resource escapes the text (``channels.datadog_escape``)."""

    def stop_run(self, path: str, check: SendTimeCheck) -> StopAnswer:
        """Read the run ``entity/project/run_id`` from W&B and, unless ``check`` of it gives a reason (then
        ``NOT_STOPPED`` with it), ask W&B to stop it through the official client; ``Outage`` when W&B cannot answer
        now."""


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
    # the episode's start, as in the ladder's messages: a run stopped, busy again and idle again is told of each stop
    idle, since = _hours(row["details"]["idle_minutes"]), f"since {row['episode_started_at']:%Y-%m-%d %H:%M} UTC"
    if outcome == STOPPED:
        return f":octagonal_sign: {whose} {_run_words(row)} was stopped after {idle} idle ({since}). {_exempt_how(row)}"
    if outcome == REFUSED:
        return (
            f":warning: {whose} {_run_words(row)} has been idle for {idle} ({since}) and should have been stopped, "
            f"but W&amp;B refused: {slack_escape(reason or 'no reason given')}. Please stop it yourself. "
            f"{_exempt_how(row)}"
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
        if row["decided_at"] != now:  # an intent is valid for the tick that decided it alone
            stops[step_key(row)] = (WITHDRAWN, "decided at an earlier tick: decided again from scratch")
            outcomes.append(_outcome(row, WITHDRAWN, now, reason=stops[step_key(row)][1]))
            continue
        if "wandb" in down:
            answer = StopAnswer(
                WITHDRAWN, f"W&B could not be reached ({down['wandb']}): not stopped; decided again at the next tick"
            )
        else:
            try:
                answer = channels.stop_run(row["recipient"], send_time_check(row))
            except Outage as exc:
                down["wandb"] = str(exc)
                answer = StopAnswer(
                    WITHDRAWN, f"W&B could not be reached ({exc}): not stopped; decided again at the next tick"
                )
        stops[step_key(row)] = (answer.outcome, answer.reason)
        outcomes.append(_outcome(row, answer.outcome, now, reason=answer.reason))

    for row in (r for r in rows if r["audience"] in (OWNER, TEAM)):
        if row["details"].get("stop_step"):
            answer = stops.get(step_key(row))
            if answer is None:  # its stop is not known yet (it is being sent by another): what it says waits
                outcomes.append(_outcome(row, PENDING, now))
                continue
            if answer[0] == WITHDRAWN:
                outcomes.append(_outcome(row, WITHDRAWN, now, reason="its stop was withdrawn: " + (answer[1] or "")))
                continue
            text = stop_text(row, answer)
            if text is None:
                why = f"not stopped: {answer[1]}" if answer[0] == NOT_STOPPED and answer[1] else "nothing to say"
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
            continue
        said, error = _through("datadog", lambda row=row: channels.send_event(event_title(row), event_text(row)), down)
        if said == "ok":
            outcomes.append(_outcome(row, SENT, now, channel="datadog_event"))
        elif said == "wait":
            outcomes.append(_outcome(row, PENDING, now, error=error))
        else:  # Datadog will never take it as it is: said once, nothing paused
            outcomes.append(_outcome(row, UNDELIVERABLE, now, channel="none", reason=error))
    return outcomes


def _through(channel: str, call: Callable[[], Any], down: dict[str, str]) -> tuple[str, Any]:
    """``call()`` of ``channel`` (``slack``, ``datadog``), by the notifier's classes: ``("ok", value)``;
    ``("wait", error)`` (transient: the channel is paused for the rest of this delivery); ``("undeliverable", error)``
    (permanent: nothing is paused)."""
    if channel in down:
        return "wait", down[channel]
    try:
        return "ok", call()
    except Undeliverable as exc:
        return "undeliverable", str(exc)
    except Outage as exc:
        down[channel] = str(exc)
        return "wait", str(exc)


def _tell_digest(row: dict, channels: IdleChannels, down: dict[str, str], now: datetime) -> dict:
    """A weekly digest to its Slack user or channel (from the teams file); nobody to send it to is recorded, never
    sent to the webhook (a digest is not an alert)."""
    missing = channels.slack_missing()
    if missing:  # a setting to fix (wandb-assets refuses to start without it): the digest waits, as for an outage
        return _outcome(row, PENDING, now, error=missing)
    if not row["recipient"]:
        who = row["run_id"].replace(":", " ", 1)
        why = f"the teams file gives {who} no Slack {'user' if who.startswith('user') else 'channel'}"
        return _outcome(row, UNDELIVERABLE, now, channel="none", reason=why)
    said, error = _through("slack", lambda: channels.post_slack(row["recipient"], row["details"]["text"]), down)
    if said == "wait":
        return _outcome(row, PENDING, now, error=error)
    if said == "undeliverable":
        return _outcome(row, UNDELIVERABLE, now, channel="none", reason=f"{error} for {row['recipient']}")
    return _outcome(row, SENT, now, channel="slack")


def _tell(row: dict, text: str, channels: IdleChannels, down: dict[str, str], now: datetime) -> dict:
    """Post ``text`` to the row's audience: its Slack user or channel; else (nobody in Slack, or Slack refusing that
    target for good) the webhook, the reason recorded. Only ``sent`` with channel ``slack`` counts as told."""
    d = row["details"]
    recipient, reason = None, None
    slack_missing = channels.slack_missing()
    if slack_missing:  # a setting to fix, not a target's fault (the CLI refuses to start without it): the row waits
        return _outcome(row, PENDING, now, error=slack_missing)
    if row["audience"] == OWNER:
        recipient = d.get("owner_slack")
        if not recipient and d.get("email"):
            said, found = _through("slack", lambda: channels.slack_user_by_email(d["email"]), down)
            if said == "wait":
                return _outcome(row, PENDING, now, error=found)
            recipient = found if said == "ok" else None
            if not recipient:
                reason = f"no Slack user for {d.get('user')}: not in the teams file, and Slack has none with its e-mail"
        elif not recipient:
            reason = f"no Slack user for {d.get('user')}: not in the teams file, and W&B gave no e-mail"
    else:
        recipient = d.get("team_channel")
        if not recipient:
            team = d.get("team")
            reason = f"team {team} has no channel in the teams file" if team else f"{d.get('user')} is in no team"
    refused = None
    if recipient:
        said, error = _through("slack", lambda: channels.post_slack(recipient, text), down)
        if said == "ok":
            return _outcome(row, SENT, now, channel="slack", recipient=recipient)
        if said == "wait":
            return _outcome(row, PENDING, now, error=error)
        refused = reason = f"{error} for {recipient}: Slack will not take it"
    webhook_missing = channels.webhook_missing()
    if webhook_missing:
        return _outcome(
            row, UNDELIVERABLE, now, channel="none", recipient=recipient, reason=f"{reason}; {webhook_missing}"
        )
    if "webhook" in down:
        return _outcome(row, PENDING, now, error=down["webhook"])
    try:
        channels.post_webhook(f"(for the {row['audience']}; {slack_escape(reason or '')}) {text}")
    except Outage as exc:
        if refused:  # the owner's target is refused for good; the webhook only hears why: nothing waits for it
            return _outcome(row, UNDELIVERABLE, now, channel="none", recipient=recipient, reason=refused)
        down["webhook"] = str(exc)
        return _outcome(row, PENDING, now, error=str(exc))
    if refused:
        return _outcome(row, UNDELIVERABLE, now, channel="webhook", recipient=recipient, reason=refused)
    return _outcome(row, SENT, now, channel="webhook", recipient="alert webhook", reason=reason)
