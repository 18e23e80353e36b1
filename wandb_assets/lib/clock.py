"""Time as the warehouse stores it: naive UTC, whatever the host's time zone. No Dagster here."""

from __future__ import annotations

from datetime import UTC, datetime

from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.normalize import parse_timestamp


def utc_now() -> datetime:
    """Now, as a naive UTC datetime truncated to the second (how the warehouse stores time)."""
    return datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def utc_instant() -> datetime:
    """Now, as a naive UTC datetime to the microsecond: when the warehouse orders two of its own writes (a run
    lifecycle mark against an alert evaluation in the same second)."""
    return datetime.now(UTC).replace(tzinfo=None)


def configured_time(text: str, setting: str) -> datetime | None:
    """A configured time (run config, CLI): ISO-8601 with ``Z``, any offset, or none (= UTC), as naive UTC.

    Empty means "now" (None); anything else that is not a time is a ``ConfigError`` naming ``setting``.
    """
    if not text or not text.strip():
        return None
    parsed = parse_timestamp(text)
    if parsed is None:
        raise ConfigError(f"{setting} must be an ISO-8601 time such as 2026-06-10T12:00:00Z (got {text!r}).")
    return parsed
