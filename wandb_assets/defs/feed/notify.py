"""Recording alert transitions and sending the outbox: shared by ``fleet_alerts`` and the pipeline-failure job.

The warehouse is open only to record and to mark: notifications go out with it closed.
"""

from dataclasses import dataclass
from datetime import datetime

from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.alerts import Condition, Transition, drain_outbox, notification_text, reconcile
from wandb_assets.settings import ConfigError


@dataclass
class Notifier:
    """The alert lifecycle of one step: its warehouse, channels and log, and the Datadog key read once."""

    warehouse: WarehouseResource
    datadog: DatadogResource
    channels: AlertChannelsResource
    log: object

    def __post_init__(self) -> None:
        # None = no key configured anywhere. A key that is configured but unreadable right now must not stop
        # the alert itself (a Secrets Manager outage is exactly when a pipeline_failure alert matters): its
        # Datadog events are queued and wait in the outbox until the key can be read; Slack goes out now.
        self._key: str | None = None
        self._key_error: str | None = None
        self._tags: list[str] | None = None
        try:
            self._key = self.datadog.api_key()
        except ConfigError as exc:
            self._key_error = str(exc)

    def channel_names(self) -> list[str]:
        """Channels a new notification is queued for (the table and the Dagster log always get it)."""
        datadog = bool(self._key or self._key_error)
        return (["slack"] if self.channels.slack_enabled else []) + (["datadog_event"] if datadog else [])

    def record(self, con, conditions: list[Condition], evaluated: set[str], now: datetime) -> list[Transition]:
        """Open, touch and resolve alerts (``evaluated``: rule names or ``rule:subject`` keys) and log them."""
        transitions = reconcile(con, conditions, evaluated, now, self.channel_names())
        for transition in transitions:
            condition = transition.condition
            # One short line: the message goes out through the channels and into the asset's `open` table.
            line = f"Alert {transition.event}: {condition.rule} ({condition.subject}), {condition.severity}"
            (self.log.warning if transition.event == "opened" else self.log.info)(line)
        return transitions

    def deliver(self, channel: str, event: str, text: str) -> str | None:
        """Send one notification through ``channel`` now; None when it went out, else why not."""
        if channel == "slack":
            return self.channels.post_slack(text) if self.channels.slack_enabled else "slack webhook not configured"
        if channel == "datadog_event":
            if not self._key:
                return self._key_error or "DD_API_KEY not configured"
            if self._tags is None:
                self._tags = self.datadog.tags()
            title = text.split(":", 2)[-1].strip()[:100]
            result = self.datadog.send_event(self._key, title, text, event == "resolved", self._tags)
            return None if result.accepted else f"Datadog events answered {result.status or result.error}"
        return f"unknown channel {channel}"

    def send(self, now: datetime) -> tuple[int, dict[str, str]]:
        """Drain the outbox through the configured channels, the warehouse closed while sending."""
        sent, failed = drain_outbox(self.warehouse.get_connection, self.deliver, now)
        for channel, error in failed.items():
            self.log.warning(f"Alert channel {channel} is down ({error}); its notifications wait for the next tick.")
        return sent, failed

    def send_now(self, transition: Transition) -> list[str]:
        """Deliver one transition through every channel now, without the warehouse (its outbox may be what is
        down); returns the channels it could not reach (logged)."""
        failed = []
        for channel in self.channel_names():
            error = self.deliver(channel, transition.event, notification_text(transition))
            if error is not None:
                failed.append(channel)
                self.log.warning(f"Alert channel {channel} is down ({error}).")
        return failed
