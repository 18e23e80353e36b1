"""Configuration from the environment (and AWS Secrets Manager for the W&B credentials). No Dagster here.

Environment variables always win. When ``WANDB_API_KEY`` is not set, the secret named by
``WANDB_ASSETS_SECRET_NAME`` is read; it holds JSON with any of ``WANDB_API_KEY``, ``WANDB_ENTITY``,
``WANDB_PROJECT`` (and ``DD_API_KEY`` for the Datadog feed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

DEFAULT_SECRET_NAME = "dev/datadog/collectors/wandb"
DEFAULT_DUCKDB_PATH = "data/warehouse.duckdb"
DEFAULT_START_DATE = "2026-01-01"

#: Every environment variable the project reads: name -> (default, what it does). The README table
#: is generated from / checked against this.
ENV_VARS: dict[str, tuple[str, str]] = {
    "WANDB_API_KEY": ("(from the secret)", "W&B API key. When unset, read from AWS Secrets Manager."),
    "WANDB_ENTITY": ("the key's default entity", "W&B entity (team or user) that owns the project."),
    "WANDB_PROJECT": ("(required)", "W&B project to mirror. The demo sets it for you."),
    "WANDB_BASE_URL": ("the wandb client's default", "W&B API server (the wandb client's own variable)."),
    "WANDB_ASSETS_SECRET_NAME": (DEFAULT_SECRET_NAME, "Secrets Manager secret holding the W&B settings as JSON."),
    "AWS_ENDPOINT_URL": ("AWS default", "Secrets Manager endpoint override (boto3's own variable)."),
    "AWS_REGION": ("us-east-1", "Region of the secret."),
    "WANDB_ASSETS_DUCKDB": (DEFAULT_DUCKDB_PATH, "Path of the DuckDB warehouse file; folders are created."),
    "WANDB_ASSETS_DEFAULT_GPUS_PER_RUN": ("1", "GPU count assumed for a run that records none."),
    "WANDB_ASSETS_START_DATE": (DEFAULT_START_DATE, "First day (UTC) of the daily `runs` partitions."),
    "WANDB_ASSETS_HTTP_TIMEOUT": ("60", "Seconds one W&B request may take before it is retried."),
    "WANDB_ASSETS_HTTP_RETRIES": ("4", "Retries of a W&B request after 429, 5xx or a connection error."),
    "WANDB_ASSETS_RETRY_WAIT_MAX": ("30", "Longest back-off between retries, in seconds (Retry-After wins)."),
    "WANDB_ASSETS_PAGE_SIZE": ("1000", "Runs per W&B page."),
    "WANDB_ASSETS_LOCK_WAIT": (
        "60",
        "Seconds a writer retries (with back-off) while another process locks the warehouse.",
    ),
    "DAGSTER_HOME": ("the repository root", "Dagster instance folder (`dagster.yaml`); storage goes to `.dagster/`."),
    "DD_API_KEY": ("(none: dry run)", "Datadog API key; else the secret's `DD_API_KEY` when the secret is in use."),
    "DD_SITE": ("datadoghq.com", "Datadog site (datadoghq.eu, us5.datadoghq.com, ...)."),
    "DD_ENV": ("(none)", "Adds the tag `env:<DD_ENV>` to every point and event."),
    "WANDB_ASSETS_DATADOG_URL": ("(from DD_SITE)", "Datadog base URL override: a proxy, or a capture server."),
    "WANDB_ASSETS_SLACK_WEBHOOK_URL": ("(none)", "Slack-compatible incoming webhook for alert notifications."),
    "WANDB_ASSETS_REPORT_PROJECT": (
        "(none: no report)",
        "W&B project of the fleet report run (`publish`, the feed job).",
    ),
    "WANDB_ASSETS_REPORT_ENTITY": ("WANDB_ENTITY", "W&B entity of the report project."),
    "WANDB_ASSETS_REPORT_RUN_ID": ("fleet-report", "Stable id of the long-lived report run (resumed each time)."),
    "WANDB_ASSETS_REPORT_MODE": ("(wandb's default)", "`offline` writes the report run locally (sync it later)."),
    "WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_PCT": ("80.0", "push_to_main_success_rate_low fires below this rate."),
    "WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_RUNS": ("5", "... when at least this many push-to-main runs ended."),
    "WANDB_ASSETS_ALERT_SPS_DROP_PCT": ("10.0", "sps_regression fires when SPS is this much below the median."),
    "WANDB_ASSETS_ALERT_SPS_BASELINE_RUNS": ("10", "The median is over this many previous main runs."),
    "WANDB_ASSETS_ALERT_SPS_MIN_BASELINE_RUNS": ("5", "... and needs at least this many."),
    "WANDB_ASSETS_ALERT_FAILURE_SPIKE_PCT": ("50.0", "failure_spike fires above this share of failed/crashed."),
    "WANDB_ASSETS_ALERT_FAILURE_SPIKE_MIN_ENDED": ("10", "... when at least this many runs ended."),
    "WANDB_ASSETS_ALERT_STALL_HEARTBEAT_MINUTES": ("30.0", "stalled_run: heartbeat older than this."),
    "WANDB_ASSETS_ALERT_STALL_STEP_MINUTES": ("60.0", "stalled_run: summary `_step` unchanged for this long."),
    "WANDB_ASSETS_ALERT_CI_SILENT_HOURS": ("12.0", "ci_silent: no push-to-main run created for this long."),
}


class ConfigError(RuntimeError):
    """A setting is missing or wrong. The message is one sentence naming the setting and the fix."""


@dataclass(frozen=True)
class WandbSettings:
    """Where the runs come from. ``repr`` never shows the key."""

    api_key: str = field(repr=False)
    project: str
    entity: str | None
    base_url: str | None


@dataclass(frozen=True)
class PipelineSettings:
    """Settings of the warehouse side."""

    duckdb_path: Path
    default_gpus_per_run: int
    start_date: date
    http_timeout_s: float
    http_retries: int
    retry_wait_max_s: float
    page_size: int
    lock_wait_s: float


SecretLoader = Callable[[str], Mapping[str, str]]


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value.strip() if value and value.strip() else None


def _number(environ: Mapping[str, str], name: str, kind: type, minimum: float) -> float:
    raw = _env(environ, name) or ENV_VARS[name][0]
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number (got {raw!r}); unset it to use the default.") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum} (got {raw!r}).")
    return value


def pipeline_settings(environ: Mapping[str, str] | None = None) -> PipelineSettings:
    """Read the warehouse-side settings; raise ``ConfigError`` for a malformed value."""
    environ = os.environ if environ is None else environ
    raw_start = _env(environ, "WANDB_ASSETS_START_DATE") or DEFAULT_START_DATE
    try:
        start = date.fromisoformat(raw_start)
    except ValueError:
        raise ConfigError(f"WANDB_ASSETS_START_DATE must be a date like 2026-01-01 (got {raw_start!r}).") from None
    return PipelineSettings(
        duckdb_path=Path(_env(environ, "WANDB_ASSETS_DUCKDB") or DEFAULT_DUCKDB_PATH),
        default_gpus_per_run=int(_number(environ, "WANDB_ASSETS_DEFAULT_GPUS_PER_RUN", int, 0)),
        start_date=start,
        http_timeout_s=_number(environ, "WANDB_ASSETS_HTTP_TIMEOUT", float, 1),
        http_retries=int(_number(environ, "WANDB_ASSETS_HTTP_RETRIES", int, 0)),
        retry_wait_max_s=_number(environ, "WANDB_ASSETS_RETRY_WAIT_MAX", float, 0.1),
        page_size=int(_number(environ, "WANDB_ASSETS_PAGE_SIZE", int, 1)),
        lock_wait_s=_number(environ, "WANDB_ASSETS_LOCK_WAIT", float, 0),
    )


def resolve_wandb_settings(
    environ: Mapping[str, str] | None = None,
    load_secret: SecretLoader | None = None,
    secret_name: str | None = None,
) -> WandbSettings:
    """Combine the environment with the Secrets Manager secret (read only when the key is not in the env)."""
    environ = os.environ if environ is None else environ
    values = {name: _env(environ, name) for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT")}
    if values["WANDB_API_KEY"] is None:
        secret_name = secret_name or _env(environ, "WANDB_ASSETS_SECRET_NAME") or DEFAULT_SECRET_NAME
        if load_secret is None:
            raise ConfigError(
                "WANDB_API_KEY is not set: export it, or set WANDB_ASSETS_SECRET_NAME to a secret holding it."
            )
        secret = load_secret(secret_name)
        for name in values:
            if values[name] is None and secret.get(name):
                values[name] = str(secret[name]).strip()
        if values["WANDB_API_KEY"] is None:
            raise ConfigError(
                f"WANDB_API_KEY is neither in the environment nor in the secret {secret_name!r}: "
                "export it or add it to the secret."
            )
    if values["WANDB_PROJECT"] is None:
        raise ConfigError("WANDB_PROJECT is not set: export the W&B project to mirror (or run `wandb-assets demo`).")
    return WandbSettings(
        api_key=values["WANDB_API_KEY"],
        project=values["WANDB_PROJECT"],
        entity=values["WANDB_ENTITY"],
        base_url=_env(environ, "WANDB_BASE_URL"),
    )


def parse_secret_string(secret_name: str, secret_string: str | None) -> dict[str, str]:
    """Decode the secret's JSON; a clear ``ConfigError`` (without the content) when it is not a JSON object."""
    try:
        parsed = json.loads(secret_string or "")
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError(f'The secret {secret_name!r} must hold a JSON object such as {{"WANDB_API_KEY": "..."}}.')
    return {str(k): str(v) for k, v in parsed.items() if v is not None}
