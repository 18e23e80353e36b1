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
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from wandb_assets.lib import fetch as fetch_rules
from wandb_assets.lib.accounting.budgets import parse_budgets
from wandb_assets.lib.accounting.prices import PriceList, parse_prices, unknown_price_keys, with_fallback
from wandb_assets.lib.accounting.teams import TeamDirectory, parse_team_directory
from wandb_assets.lib.acting.idle_policy import IdlePolicy, parse_idle_policy
from wandb_assets.lib.alerts import AlertThresholds
from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.lake import Lake, S3Options, is_lake, parse_catalog
from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.projects import ProjectSelection, parse_projects

__all__ = ["ConfigError", "Settings", "load_settings", "pipeline_settings", "resolve_wandb_settings"]

DEFAULT_SECRET_NAME = "dev/datadog/collectors/wandb"
DEFAULT_DUCKDB_PATH = "data/warehouse.duckdb"
DEFAULT_START_DATE = "2026-01-01"


def _var(
    default: Any, description: str, shown: str | None = None, malformed: str | None = None, **constraints: Any
) -> Any:
    """A setting's field: the README shows ``shown`` (else the default) and ``description``; ``malformed``: what the
    configuration error says after the variable's name when a value breaks its ``pattern`` (``{raw}``: the value)."""
    extra = {"shown": shown, "malformed": malformed}
    return Field(default, description=description, json_schema_extra=extra, **constraints)


_TH = AlertThresholds()


class Settings(BaseSettings):
    """Every environment variable the project reads, typed, with its default and what it does.

    The one configuration surface: docs/configuration.md's table is generated from these fields (and a test checks
    it), resources and the CLI read their values from here, and a malformed value is a ``ConfigError``
    naming the variable. Field names *are* the variable names.
    """

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore")

    WANDB_API_KEY: SecretStr | None = _var(
        None,
        "W&B API key. When unset: the key `wandb login` stored (netrc), else the AWS Secrets Manager secret.",
        "(`wandb login`'s, else the secret's)",
    )
    WANDB_ENTITY: str | None = _var(
        None, "W&B entity (team or user) that owns the project.", "the key's default entity"
    )
    WANDB_PROJECT: str | None = _var(
        None, "W&B project to mirror (unless WANDB_ASSETS_PROJECTS is set). The demo sets it for you.", "(required)"
    )
    WANDB_ASSETS_PROJECTS: str | None = _var(
        None,
        "Projects to mirror, comma-separated `entity/project` or `entity/*` (every project of the entity, listed "
        "again on every tick); one fetch budget for all, a failing project skipped and named. Unset: "
        "WANDB_ENTITY/WANDB_PROJECT.",
        "(unset)",
    )
    WANDB_BASE_URL: str | None = _var(
        None,
        "W&B API server (the wandb client's own variable): `http(s)://host[:port]`, without `/graphql`.",
        "the wandb client's default",
    )
    WANDB_ASSETS_SECRET_NAME: str = _var(
        DEFAULT_SECRET_NAME,
        "Secrets Manager secret holding the W&B settings as JSON, read only when no key is found before it. The "
        "default is the secret of the cron script this project replaced: name your own.",
    )
    AWS_ENDPOINT_URL: str | None = _var(
        None, "Secrets Manager endpoint override (boto3's own variable).", "AWS default"
    )
    AWS_REGION: str = _var("us-east-1", "Region of the secret, and of the DuckLake's S3 bucket.")
    WANDB_ASSETS_DUCKDB: str = _var(
        DEFAULT_DUCKDB_PATH,
        "The warehouse: a DuckDB file (folders are created), or a DuckLake "
        "`ducklake:postgres:<libpq conninfo>` (password in `PGPASSWORD`, never in the conninfo).",
    )
    WANDB_ASSETS_DUCKLAKE_DATA_PATH: str | None = _var(
        None,
        "DuckLake mode: where the lake's Parquet files go, a folder or `s3://bucket/prefix/` (writers need it; "
        "readers find it in the catalog).",
        "(none)",
    )
    AWS_ACCESS_KEY_ID: str | None = _var(None, "DuckLake on S3: access key id (boto3 reads it too).", "(none)")
    AWS_SECRET_ACCESS_KEY: SecretStr | None = _var(None, "DuckLake on S3: secret access key.", "(none)")
    AWS_SESSION_TOKEN: SecretStr | None = _var(None, "DuckLake on S3: session token of temporary keys.", "(none)")
    AWS_ENDPOINT_URL_S3: str | None = _var(
        None, "DuckLake on S3: endpoint override (MinIO, a proxy); else `AWS_ENDPOINT_URL`.", "AWS default"
    )
    WANDB_ASSETS_DEFAULT_GPUS_PER_RUN: int = _var(1, "GPU count assumed for a run that records none.", ge=0)
    WANDB_ASSETS_GPU_PRICES: Path | None = _var(
        None,
        "YAML file mapping GPU models to USD per GPU-hour (such as `H100-80GB: 2.99`); a model without a price "
        "costs NULL, never 0.",
        "the shipped `wandb_assets/data/gpu_prices.yaml`",
    )
    WANDB_ASSETS_BUDGETS: Path | None = _var(
        None,
        "YAML file of each team's monthly GPU budget in USD: `research: 250000`, or a list of "
        "`{from: YYYY-MM, usd: N}` each holding from its month (the `team_budget_vs_spend` mart, `team_budgets` "
        "table).",
        "(unset: no budgets)",
    )
    WANDB_ASSETS_CLOSE_AFTER_DAYS: int | None = _var(
        None,
        "Close each month automatically this many days after it ends (`closed_months`: from then on a change to it "
        "is booked as an adjustment in the first open month, docs/gpu-accounting.md). Unset: months are closed by "
        "`wandb-assets close --month YYYY-MM` only.",
        "(unset)",
        ge=0,
    )
    WANDB_ASSETS_GPU_DEFAULT_PRICE: float | None = _var(
        None,
        "USD per GPU-hour of a run whose GPU model has no price (none recorded, unknown, or missing from the list): "
        "its cost is labelled `fallback` (gpu_usage.price_basis). Unset: such runs cost NULL.",
        "(unset)",
        ge=0,
        allow_inf_nan=False,
    )
    WANDB_ASSETS_TEAMS: Path | None = _var(
        None,
        "YAML file mapping teams to lists of W&B usernames (`vision: [alice, bob]`); unmapped users are `unassigned`. "
        "A team may also name its Slack channel and its members' Slack ids (docs/alerts.md, the idle ladder).",
        "(none: everyone unassigned)",
    )
    WANDB_ASSETS_IDLE_POLICY: Path | None = _var(
        None,
        "YAML file of the idle-GPU policy: who is told when a run's GPUs sit idle, and whether the run is stopped "
        "(docs/alerts.md). Unset: nobody is told and nothing is stopped (the idle_gpus alert still opens).",
        "(none: the ladder is off)",
    )
    WANDB_ASSETS_SLACK_BOT_TOKEN: SecretStr | None = _var(
        None,
        "Slack bot token (scopes chat:write, users:read.email) of the idle ladder's messages; else the secret's "
        "`WANDB_ASSETS_SLACK_BOT_TOKEN` when the secret is in use. Without one, messages go to the alert webhook.",
        "(none)",
    )
    WANDB_ASSETS_SLACK_API_URL: str = _var(
        "https://slack.com/api/", "Slack Web API base URL (a proxy; tests use a loopback one)."
    )
    WANDB_ASSETS_GITHUB_REPO: str | None = _var(
        None,
        "GitHub repository (`owner/name`) whose pull requests' throughput verdicts go to GitHub: a check run "
        "`wandb-assets / throughput` on each judged commit and one comment per PR (docs/pr-checks.md). Unset: the "
        "verdicts stay in `pr_checks` and `wandb-assets pr-check`.",
        "(none: nothing sent to GitHub)",
    )
    WANDB_ASSETS_GITHUB_TOKEN: SecretStr | None = _var(
        None,
        "GitHub token for WANDB_ASSETS_GITHUB_REPO (an installation token makes check runs; a personal token gets "
        "commit statuses instead); else the secret's `WANDB_ASSETS_GITHUB_TOKEN`. The GitHub App settings win.",
        "(none)",
    )
    WANDB_ASSETS_GITHUB_APP_ID: int | None = _var(
        None,
        "GitHub App id: the pipeline signs a JWT with the App's private key and exchanges it for an installation "
        "token of WANDB_ASSETS_GITHUB_REPO (permissions: checks write, pull requests write, contents read).",
        "(none)",
        gt=0,
    )
    WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY: SecretStr | None = _var(
        None,
        "The GitHub App's private key: the PEM text or the path of its `.pem` file; else the secret's "
        "`WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY`.",
        "(none)",
    )
    WANDB_ASSETS_GITHUB_API_URL: str = _var(
        "https://api.github.com",
        "GitHub REST API base URL (GitHub Enterprise: `https://<host>/api/v3`; tests use a loopback one).",
    )
    WANDB_ASSETS_PR_GATE: bool = _var(
        True,
        "A pull request whose throughput regressed gets a failing check (`failure`); false: `neutral`, reported "
        "without blocking a merge.",
        "true",
    )
    WANDB_ASSETS_GITHUB_MAX_AGE_DAYS: int = _var(
        7,
        "GitHub hears of a pull request's verdicts only when one of its runs ended within this many days: a "
        "backfill's history, judged once, is kept in pr_checks and never sent (no check runs or comments on old, "
        "closed pull requests).",
        "7",
        ge=1,
    )
    WANDB_ASSETS_PR_MIN_CHANGE_PCT: float = _var(
        2.0,
        "A pull request's throughput is a regression or an improvement only beyond this change against main's mean "
        "(percent), however tight main's spread: the boundary is never narrower.",
        "2",
        ge=0,
        le=100,
    )
    WANDB_ASSETS_FETCH_METADATA: bool = _var(
        True,
        "Read W&B's wandb-metadata.json (GPU count and model) once for each run first seen finished, crashed or "
        "failed: each page of runs also says where their files are (no extra request); then one download per run.",
        "true",
    )
    WANDB_ASSETS_FETCH_HISTORY: bool = _var(
        True,
        "Read each run's curves (sampled history of WANDB_ASSETS_HISTORY_KEYS and its GPUs' system stream) once after "
        "it ends, and at most every WANDB_ASSETS_HISTORY_REFRESH_MINUTES while it runs: one request per 20 runs, by "
        "the curves job between the ticks (never on a tick's or a backfill's path), into run_history and "
        "run_gpu_samples.",
        "true",
    )
    WANDB_ASSETS_ANALYTICS: bool = _var(
        True,
        "Build the analysts' dbt project (analytics/) in the warehouse after each feed and backfill run, in a run "
        "of its own (the analytics job): staging views and marts in the warehouse's analytics schema, dbt tests "
        "as asset checks.",
        "true",
    )
    WANDB_ASSETS_HISTORY_KEYS: str = _var(
        ",".join(SPS_KEYS),
        "History keys whose curves are read (comma-separated); the system stream's GPU metrics always are.",
        "the five SPS keys (`overview/sps`, ...)",
    )
    WANDB_ASSETS_HISTORY_SAMPLES: int = _var(
        500, "Samples per curve (1-1000; W&B has answered 500 to larger values).", ge=1, le=1000
    )
    WANDB_ASSETS_HISTORY_REFRESH_MINUTES: float = _var(
        60.0, "A running run's curves are read again at most this often (minutes).", gt=0
    )
    WANDB_ASSETS_HISTORY_RUNS_PER_TICK: int = _var(
        2000,
        "Most runs whose curves one run of the curves job reads (20-100000; its schedule runs every 15 minutes, "
        "between the ticks): the runs due beyond it wait for the next ones, the newest ended first. "
        "`wandb-assets curves` reads the whole backlog at once.",
        ge=20,
        le=100000,
    )
    WANDB_ASSETS_METADATA_DOWNLOADS: int = _var(
        32,
        "Most wandb-metadata.json downloads in flight (1-64). They go to W&B's file storage (signed URLs), not its "
        "API: apart from WANDB_ASSETS_FETCH_CONCURRENCY; an HTTP 429 halves them too.",
        ge=1,
        le=64,
    )
    WANDB_ASSETS_FILE_HOSTS: str = _var(
        "",
        "Hosts (comma-separated) of a self-hosted W&B's file storage on a private network: metadata downloads go to "
        "them although they resolve to a private address (any other host that does, and any IP literal, is refused).",
        "(none)",
    )
    WANDB_ASSETS_GPU_COUNT_KEYS: str = _var(
        "compute.gpu_count",
        "Config keys (comma-separated dotted paths, nested objects or flat dotted keys alike) holding a run's GPU "
        "count, first match wins; then W&B's metadata, the GPUs in its system metrics, the default.",
    )
    WANDB_ASSETS_OFFLINE_DIRS: str = _var(
        "",
        "Folders (separated by `:`) searched recursively for offline `.wandb` run logs by the `offline_runs` "
        "asset and its sensor; empty: no offline ingestion.",
        "(none)",
    )
    WANDB_ASSETS_START_DATE: date = _var(
        date.fromisoformat(DEFAULT_START_DATE), "First day (UTC) of the daily `runs` partitions."
    )
    WANDB_ASSETS_HTTP_TIMEOUT: float = _var(60.0, "Seconds one W&B request may take before it is retried.", "60", ge=1)
    WANDB_ASSETS_HTTP_RETRIES: int = _var(
        4, "Retries of a page at the smallest page size after a 5xx, a timeout or a connection error.", ge=0
    )
    WANDB_ASSETS_RETRY_WAIT_MAX: float = _var(
        30.0, "Longest back-off between retries, and longest pause after a 429 (Retry-After up to it).", "30", ge=0.1
    )
    WANDB_ASSETS_PAGE_SIZE: int = _var(
        1000,
        "Runs per W&B page to start with (25 or more); halved (down to 25) for the rest of a fetch when a page fails.",
        ge=1,
    )
    WANDB_ASSETS_FETCH_CONCURRENCY: int = _var(
        4, "Most W&B requests in flight while fetching (1-8); halved on HTTP 429, grown back after.", ge=1, le=8
    )
    WANDB_ASSETS_STAGING_PROCESSES: int = _var(
        2,
        "Worker processes that normalise fetched runs beside the fetch once it has passed 1,000 runs (0: all in "
        "the fetching process, whose Python computes on one core at a time).",
        ge=0,
        le=16,
    )
    WANDB_ASSETS_STAGING_DIR: Path | None = _var(
        None,
        "Folder of the staged runs files (one NDJSON file per day) the `runs` asset loads.",
        "`staging/` beside the warehouse",
    )
    WANDB_ASSETS_STAGING_RETENTION_DAYS: int = _var(
        0,
        "Staged day files of runs created more than this many days ago are deleted after a load (the warehouse "
        "holds their rows; a `runs`-only reload of such days needs staged_runs again); the files a load just read "
        "are always kept. 0 keeps every file.",
        ge=0,
    )
    WANDB_ASSETS_PROJECT_METRICS_DAYS: int = _var(
        400,
        "Per-project gauge snapshots (`project_metrics`: 24 gauges x projects x 96 snapshots a day) older than this "
        "many days are deleted at each snapshot; the fleet-wide `fleet_metrics` are kept. 0 keeps every one.",
        ge=0,
    )
    WANDB_ASSETS_LAKE_SNAPSHOT_RETENTION_DAYS: int = _var(
        7,
        "DuckLake: the daily maintenance expires snapshots older than this many days (time travel reaches that "
        "far back) after merging small files.",
        ge=1,
    )
    WANDB_ASSETS_LOCK_WAIT: float = _var(
        60.0, "Seconds a writer retries (with back-off) while another process locks the warehouse.", "60", ge=0
    )
    WANDB_ASSETS_DUCKDB_MEMORY_LIMIT: str | None = _var(
        None,
        "DuckDB's `memory_limit` for each connection to the warehouse file (`4GB`, `1500MB`): past it DuckDB spills to "
        "disk instead of growing. Unset, DuckDB takes up to 80 % of the machine's RAM per process (a tick on ten "
        "million runs peaked at 11-14 GiB; benchmarks/README.md).",
        "(DuckDB's: 80 % of RAM)",
        "must be a size like 4GB or 1500MB (got {raw}); unset it to use DuckDB's default.",
        pattern=r"^[0-9]+(\.[0-9]+)? ?(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$",
    )
    WANDB_ASSETS_UNFINISHED_WINDOW_DAYS: int = _var(
        1,
        "A tick re-reads whole the days back to its oldest unfinished run, but at most this many (1: yesterday and "
        "today only); older unfinished runs are refreshed by id, 500 a request.",
        ge=1,
    )
    DAGSTER_HOME: str | None = _var(
        None, "Dagster instance folder (`dagster.yaml`); storage goes to `.dagster/`.", "the repository root"
    )
    DD_API_KEY: SecretStr | None = _var(
        None, "Datadog API key; else the secret's `DD_API_KEY` when the secret is in use.", "(none: dry run)"
    )
    DD_APP_KEY: SecretStr | None = _var(
        None,
        "Datadog application key: only `wandb-assets datadog --apply` uses it (creating the dashboard and monitors "
        "needs one; the feed does not).",
        "(none)",
    )
    DD_SITE: str = _var("datadoghq.com", "Datadog site (datadoghq.eu, us5.datadoghq.com, ...).")
    DD_ENV: str | None = _var(None, "Adds the tag `env:<DD_ENV>` to every point and event.", "(none)")
    WANDB_ASSETS_DATADOG_URL: str | None = _var(
        None, "Datadog base URL override: a proxy, or a capture server.", "(from DD_SITE)"
    )
    WANDB_ASSETS_PROJECT_RECHECK_HOURS: float = _var(
        6.0,
        "With WANDB_ASSETS_PROJECTS, a tick reads only the projects with something new (one request per 25 "
        "projects asks each for its newest run heartbeat) or an alive run; a project is read whole at least this "
        "often anyway (edits that move no heartbeat).",
        "6",
        gt=0,
    )
    WANDB_ASSETS_DATADOG_PROJECT_SERIES: int = _var(
        20,
        "With WANDB_ASSETS_PROJECTS: how many projects get their own Datadog series (tagged `scope:project`, "
        "`entity:`, `project:`; those with the most GPU-hours in the last 24 h) beside the fleet-wide series "
        "(`scope:fleet`); 0: fleet-wide only. At most this many + 1 tag sets per gauge and snapshot.",
        ge=0,
        le=1000,
    )
    WANDB_ASSETS_SLACK_WEBHOOK_URL: SecretStr | None = _var(
        None, "Slack-compatible incoming webhook for alert notifications.", "(none)"
    )
    WANDB_ASSETS_REPORT_PROJECT: str | None = _var(
        None, "W&B project of the fleet report run (`publish`, the feed job).", "(none: no report)"
    )
    WANDB_ASSETS_REPORT_ENTITY: str | None = _var(None, "W&B entity of the report project.", "WANDB_ENTITY")
    WANDB_ASSETS_REPORT_RUN_ID: str = _var(
        "fleet-report", "Stable id of the long-lived report run (resumed each time)."
    )
    WANDB_ASSETS_REPORT_MODE: str | None = _var(
        None, "`offline` writes the report run locally (sync it later).", "(wandb's default)"
    )
    WANDB_ASSETS_REPORT_RAW: bool = _var(
        False, "`1` keeps the raw `config`/`summary` JSON of every run in the published warehouse artifact.", "0"
    )
    WANDB_ASSETS_REPORT_ARTIFACT_TTL_DAYS: float = _var(
        30.0, "Days W&B keeps each published warehouse artifact version (published at most once a day).", "30", gt=0
    )
    WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_PCT: float = _var(
        _TH.success_rate_min_pct, "push_to_main_success_rate_low fires below this rate."
    )
    WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_RUNS: int = _var(
        _TH.success_rate_min_runs, "... when at least this many push-to-main runs finished, failed or crashed.", ge=0
    )
    WANDB_ASSETS_SPS_METRIC: str = _var(
        _TH.sps_metric,
        "Summary key whose value sps_regression watches on main (RL code often logs `charts/SPS`, `training/sps`).",
    )
    WANDB_ASSETS_ALERT_FAILURE_SPIKE_PCT: float = _var(
        _TH.failure_spike_pct, "failure_spike fires above this share of failed/crashed."
    )
    WANDB_ASSETS_ALERT_FAILURE_SPIKE_MIN_ENDED: int = _var(
        _TH.failure_spike_min_ended, "... when at least this many runs ended.", ge=0
    )
    WANDB_ASSETS_ALERT_STALL_HEARTBEAT_MINUTES: float = _var(
        _TH.stall_heartbeat_minutes, "stalled_run: heartbeat older than this (any number of minutes, e.g. 0.5).", gt=0
    )
    WANDB_ASSETS_ALERT_STALL_STEP_MINUTES: float = _var(
        _TH.stall_step_minutes, "stalled_run: summary `_step` unchanged for this long.", gt=0
    )
    WANDB_ASSETS_ALERT_CI_SILENT_HOURS: float = _var(
        _TH.ci_silent_hours, "ci_silent: no push-to-main run created for this long.", gt=0
    )
    WANDB_ASSETS_ALERT_LONG_RUNNING_HOURS: float = _var(
        _TH.long_running_hours, "long_running: a run running, pending or preempting for longer than this.", gt=0
    )
    WANDB_ASSETS_IDLE_GPU_PCT: float = _var(
        _TH.idle_gpu_pct, "A GPU below this utilisation (percent) in a system sample is idle.", ge=0, le=100
    )
    WANDB_ASSETS_ALERT_IDLE_GPU_MINUTES: float = _var(
        _TH.idle_gpu_minutes,
        "idle_gpus: a running run whose GPUs were all idle on every sample for this long (a run without system "
        "metrics is never idle).",
        gt=0,
    )

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, *args, **kwargs):
        """Only what ``load_settings`` passes: it reads the environment (or a given mapping) itself."""
        return (init_settings,)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every setting from ``environ`` (default: the process environment); one-sentence ``ConfigError``.

    Values are stripped; an empty value counts as unset.
    """
    source = os.environ if environ is None else environ
    known = {name: source[name].strip() for name in Settings.model_fields if (source.get(name) or "").strip()}
    try:
        settings = Settings(**known)
    except ValidationError as exc:
        raise ConfigError(_sentence(exc, known)) from None
    _check_base_url(settings.WANDB_BASE_URL)
    return settings


def _check_base_url(url: str | None) -> None:
    """``WANDB_BASE_URL`` as the wandb client needs it, or one sentence saying what to set (the client would give a
    traceback, or blame the API key)."""
    if url is None:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"WANDB_BASE_URL must start with http:// or https:// (got {url!r}): "
            f"for example WANDB_BASE_URL=http://{url.split('://')[-1].rstrip('/')}."
        )
    if parts.path.rstrip("/").endswith("/graphql"):
        raise ConfigError(
            f"WANDB_BASE_URL is the server's address, without /graphql (got {url!r}): set it to "
            f"{url.rstrip('/').removesuffix('/graphql')}."
        )


def _sentence(exc: ValidationError, source: Mapping[str, str]) -> str:
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "a setting"
    raw = source.get(name)
    field_type = Settings.model_fields[name].annotation if name in Settings.model_fields else None
    low, high = _bounds(name)
    ctx = error.get("ctx", {})
    if any(bound in ctx for bound in ("ge", "gt", "le", "lt")):
        if low is not None and high is not None:
            return f"{name} must be from {low} to {high} (got {raw!r}); unset it to use the default."
        if low is not None:
            return f"{name} must be at least {low} (got {raw!r}); unset it to use the default."
        return f"{name} must be at most {high} (got {raw!r}); unset it to use the default."
    if field_type is date:
        return f"{name} must be a date like 2026-01-01 (got {raw!r})."
    if field_type in (int, float):
        return f"{name} must be a number (got {raw!r}); unset it to use the default."
    field = Settings.model_fields.get(name)
    malformed = (field.json_schema_extra or {}).get("malformed") if field else None
    if malformed and "pattern" in ctx:
        return f"{name} {malformed.format(raw=repr(raw))}"
    return f"{name} is not valid (got {raw!r}): {error['msg']}."


def _bounds(name: str) -> tuple[Any, Any]:
    """A numeric setting's lowest and highest value (None: unbounded), as its field declares them."""
    low = high = None
    for rule in Settings.model_fields[name].metadata if name in Settings.model_fields else ():
        low = getattr(rule, "ge", getattr(rule, "gt", low))
        high = getattr(rule, "le", getattr(rule, "lt", high))
    return low, high


def _shown_default(name: str) -> str:
    info = Settings.model_fields[name]
    shown = (info.json_schema_extra or {}).get("shown")
    return shown if shown is not None else str(info.default)


#: Every environment variable the project reads: name -> (default as documented, what it does). docs/configuration.md's
#: table is checked against this, which is generated from ``Settings``.
ENV_VARS: dict[str, tuple[str, str]] = {
    name: (_shown_default(name), info.description or "") for name, info in Settings.model_fields.items()
}


def readme_table() -> str:
    """The configuration table of docs/configuration.md, generated from ``Settings``."""
    lines = ["| variable | default | what it does |", "|---|---|---|"]
    lines += [f"| `{name}` | {default} | {text} |" for name, (default, text) in ENV_VARS.items()]
    return "\n".join(lines)


@dataclass(frozen=True)
class WandbSettings:
    """Where the runs come from. ``repr`` never shows the key."""

    api_key: str = field(repr=False)
    project: str | None  # None only when WANDB_ASSETS_PROJECTS names the projects
    entity: str | None
    base_url: str | None


@dataclass(frozen=True)
class PipelineSettings:
    """Settings of the warehouse side."""

    warehouse: Path | Lake
    default_gpus_per_run: int
    start_date: date
    http_timeout_s: float
    http_retries: int
    retry_wait_max_s: float
    page_size: int
    lock_wait_s: float
    unfinished_window_days: int = 1
    fetch_concurrency: int = 4
    staging_dir: Path = Path("staging")
    #: Worker processes that normalise a big fetch's pages (``WANDB_ASSETS_STAGING_PROCESSES``); 0: none.
    staging_processes: int = 2
    #: Staged day files older than this many days are pruned after a load (``WANDB_ASSETS_STAGING_RETENTION_DAYS``);
    #: 0 keeps them all.
    staging_retention_days: int = 0
    #: DuckLake snapshots older than this are expired by the daily maintenance.
    lake_snapshot_retention: timedelta = timedelta(days=7)
    #: ``project_metrics`` rows older than this many days are deleted at each snapshot; 0 keeps them all.
    project_metrics_days: int = 400
    offline_dirs: tuple[str, ...] = ()
    #: ``WANDB_ASSETS_PROJECTS`` parsed; None: the one project of WANDB_ENTITY/WANDB_PROJECT.
    projects: ProjectSelection | None = None
    #: With ``projects``: a tick reads a quiet project whole at least this often.
    project_recheck: timedelta = timedelta(hours=6)
    #: Config keys holding a run's GPU count (``WANDB_ASSETS_GPU_COUNT_KEYS``), first match wins.
    gpu_count_keys: tuple[str, ...] = ("compute.gpu_count",)
    #: The price file's periods (``WANDB_ASSETS_GPU_PRICES``), the fallback price as the model ``FALLBACK_PRICE``'s
    #: (``WANDB_ASSETS_GPU_DEFAULT_PRICE``), and team by username (``WANDB_ASSETS_TEAMS``).
    gpu_prices: PriceList = ()
    #: Months close automatically this many days after they end (``WANDB_ASSETS_CLOSE_AFTER_DAYS``); None: by hand.
    close_after_days: int | None = None
    #: Each team's monthly budget (``WANDB_ASSETS_BUDGETS``): ``(team, first month, USD)``.
    budgets: tuple[tuple[str, date, float], ...] = ()
    #: Curves (``WANDB_ASSETS_FETCH_HISTORY``, ``..._HISTORY_KEYS``, ``..._HISTORY_SAMPLES``, ``..._REFRESH_MINUTES``,
    #: ``..._RUNS_PER_TICK``).
    fetch_history: bool = True
    #: Build the analysts' dbt models after each feed and backfill run (``WANDB_ASSETS_ANALYTICS``).
    analytics: bool = True
    history_keys: tuple[str, ...] = ()
    history_samples: int = 500
    history_refresh: timedelta = timedelta(hours=1)
    history_runs_per_tick: int = 2000
    #: Price keys naming no GPU model this project knows (``gpus.unknown_price_keys``): warned about by name.
    unknown_price_keys: tuple[str, ...] = ()
    #: Read each ended run's wandb-metadata.json once (``WANDB_ASSETS_FETCH_METADATA``).
    fetch_metadata: bool = True
    #: Most metadata file downloads in flight (``WANDB_ASSETS_METADATA_DOWNLOADS``): storage, not the API.
    metadata_downloads: int = 32
    #: File storage hosts allowed on a private network (``WANDB_ASSETS_FILE_HOSTS``).
    file_hosts: tuple[str, ...] = ()
    teams: dict[str, str] = field(default_factory=dict)
    #: ``WANDB_ASSETS_TEAMS`` whole: the teams, and each member's Slack user and each team's channel where given.
    team_directory: TeamDirectory = field(default_factory=TeamDirectory)


SecretLoader = Callable[[str], Mapping[str, str]]


def pipeline_settings(environ: Mapping[str, str] | None = None) -> PipelineSettings:
    """The warehouse-side settings; ``ConfigError`` for a malformed value."""
    s = load_settings(environ)
    price_file = s.WANDB_ASSETS_GPU_PRICES or SHIPPED_GPU_PRICES
    price_document = _yaml(price_file, "WANDB_ASSETS_GPU_PRICES")
    prices = parse_prices(price_document, f"WANDB_ASSETS_GPU_PRICES ({price_file})")
    if s.WANDB_ASSETS_PAGE_SIZE < fetch_rules.MIN_PAGE_SIZE:  # read here, not in the field: a test may lower it
        raise ConfigError(
            f"WANDB_ASSETS_PAGE_SIZE must be at least {fetch_rules.MIN_PAGE_SIZE} (got '{s.WANDB_ASSETS_PAGE_SIZE}'); "
            "unset it to use the default."
        )
    prices = with_fallback(prices, s.WANDB_ASSETS_GPU_DEFAULT_PRICE)
    directory = (
        parse_team_directory(_yaml(s.WANDB_ASSETS_TEAMS, "WANDB_ASSETS_TEAMS"), "WANDB_ASSETS_TEAMS")
        if s.WANDB_ASSETS_TEAMS
        else TeamDirectory()
    )
    return PipelineSettings(
        warehouse=warehouse_location(s),
        default_gpus_per_run=s.WANDB_ASSETS_DEFAULT_GPUS_PER_RUN,
        fetch_metadata=s.WANDB_ASSETS_FETCH_METADATA,
        fetch_history=s.WANDB_ASSETS_FETCH_HISTORY,
        analytics=s.WANDB_ASSETS_ANALYTICS,
        history_keys=tuple(dict.fromkeys(k.strip() for k in s.WANDB_ASSETS_HISTORY_KEYS.split(",") if k.strip())),
        history_samples=s.WANDB_ASSETS_HISTORY_SAMPLES,
        history_refresh=timedelta(minutes=s.WANDB_ASSETS_HISTORY_REFRESH_MINUTES),
        history_runs_per_tick=s.WANDB_ASSETS_HISTORY_RUNS_PER_TICK,
        metadata_downloads=s.WANDB_ASSETS_METADATA_DOWNLOADS,
        file_hosts=tuple(h.strip() for h in s.WANDB_ASSETS_FILE_HOSTS.split(",") if h.strip()),
        gpu_count_keys=tuple(k.strip() for k in s.WANDB_ASSETS_GPU_COUNT_KEYS.split(",") if k.strip()),
        gpu_prices=prices,
        close_after_days=s.WANDB_ASSETS_CLOSE_AFTER_DAYS,
        budgets=tuple(
            parse_budgets(_yaml(s.WANDB_ASSETS_BUDGETS, "WANDB_ASSETS_BUDGETS"), "WANDB_ASSETS_BUDGETS")
            if s.WANDB_ASSETS_BUDGETS
            else ()
        ),
        unknown_price_keys=tuple(unknown_price_keys(price_document)),
        teams=directory.teams,
        team_directory=directory,
        start_date=s.WANDB_ASSETS_START_DATE,
        http_timeout_s=s.WANDB_ASSETS_HTTP_TIMEOUT,
        http_retries=s.WANDB_ASSETS_HTTP_RETRIES,
        retry_wait_max_s=s.WANDB_ASSETS_RETRY_WAIT_MAX,
        page_size=s.WANDB_ASSETS_PAGE_SIZE,
        lock_wait_s=s.WANDB_ASSETS_LOCK_WAIT,
        unfinished_window_days=s.WANDB_ASSETS_UNFINISHED_WINDOW_DAYS,
        fetch_concurrency=s.WANDB_ASSETS_FETCH_CONCURRENCY,
        staging_dir=s.WANDB_ASSETS_STAGING_DIR or _default_staging_dir(s),
        staging_retention_days=s.WANDB_ASSETS_STAGING_RETENTION_DAYS,
        staging_processes=s.WANDB_ASSETS_STAGING_PROCESSES,
        lake_snapshot_retention=timedelta(days=s.WANDB_ASSETS_LAKE_SNAPSHOT_RETENTION_DAYS),
        project_metrics_days=s.WANDB_ASSETS_PROJECT_METRICS_DAYS,
        offline_dirs=tuple(d for d in s.WANDB_ASSETS_OFFLINE_DIRS.split(os.pathsep) if d.strip()),
        projects=parse_projects(s.WANDB_ASSETS_PROJECTS) if s.WANDB_ASSETS_PROJECTS is not None else None,
        project_recheck=timedelta(hours=s.WANDB_ASSETS_PROJECT_RECHECK_HOURS),
    )


#: The default GPU prices (see docs/gpu-accounting.md).
SHIPPED_GPU_PRICES = Path(__file__).resolve().parent / "data" / "gpu_prices.yaml"


def _yaml(path: Path, variable: str) -> Any:
    """A YAML file's document; a one-sentence ``ConfigError`` naming ``variable`` when it cannot be read."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(
            f"{variable} names {path}, which cannot be read ({exc.strerror or type(exc).__name__})."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{variable} names {path}, which is not valid YAML{where}.") from None


def _default_staging_dir(s: Settings) -> Path:
    if is_lake(s.WANDB_ASSETS_DUCKDB):
        return Path(DEFAULT_DUCKDB_PATH).parent / "staging"
    return Path(s.WANDB_ASSETS_DUCKDB).parent / "staging"


def warehouse_label(s: Settings | None = None) -> str:
    """How an instance, a run's tag and every materialization name the warehouse this process writes: the file's
    absolute path or the lake's catalog, never a password (``lib.lake.warehouse_name``)."""
    from wandb_assets.lib.lake import warehouse_name

    return warehouse_name(warehouse_location(s))


def warehouse_location(s: Settings | None = None, value: str | None = None) -> Path | Lake:
    """The warehouse file, or the DuckLake (catalog, data path, S3 options) named by ``WANDB_ASSETS_DUCKDB``
    (or by ``value``, e.g. a resource's ``database``)."""
    s = s or load_settings()
    value = value or s.WANDB_ASSETS_DUCKDB
    if not is_lake(value):
        return Path(value)
    try:
        catalog = parse_catalog(value)
    except ValueError as exc:
        raise ConfigError(f"WANDB_ASSETS_DUCKDB: {exc}.") from None
    data_path = s.WANDB_ASSETS_DUCKLAKE_DATA_PATH
    s3 = None
    if data_path and data_path.startswith("s3://"):
        s3 = S3Options(
            key_id=s.AWS_ACCESS_KEY_ID,
            secret=_secret_text(s.AWS_SECRET_ACCESS_KEY),
            session_token=_secret_text(s.AWS_SESSION_TOKEN),
            region=s.AWS_REGION,
            endpoint_url=s.AWS_ENDPOINT_URL_S3 or s.AWS_ENDPOINT_URL,
        )
    elif data_path:
        data_path = str(Path(data_path).resolve()) + "/"
    return Lake(catalog=catalog, data_path=data_path, s3=s3)


def idle_policy(environ: Mapping[str, str] | None = None) -> IdlePolicy | None:
    """The idle-GPU policy of ``WANDB_ASSETS_IDLE_POLICY`` (None: unset, the ladder is off); ``ConfigError`` of one
    sentence for a file that cannot be read or a field that is wrong."""
    s = load_settings(environ)
    if s.WANDB_ASSETS_IDLE_POLICY is None:
        return None
    where = f"WANDB_ASSETS_IDLE_POLICY ({s.WANDB_ASSETS_IDLE_POLICY})"
    return parse_idle_policy(
        _yaml(s.WANDB_ASSETS_IDLE_POLICY, "WANDB_ASSETS_IDLE_POLICY"), where, s.WANDB_ASSETS_IDLE_GPU_PCT
    )


@dataclass(frozen=True)
class GitHubTarget:
    """Where the pull requests' verdicts go (``WANDB_ASSETS_GITHUB_*``): the credentials stay ``SecretStr`` until the
    client is made; None where they come from the secret (read at run time)."""

    repo: str
    api_url: str
    gate: bool
    token: SecretStr | None
    app_id: int | None
    private_key: SecretStr | None


def github_target(environ: Mapping[str, str] | None = None) -> GitHubTarget | None:
    """The GitHub repository the verdicts go to (None: ``WANDB_ASSETS_GITHUB_REPO`` unset, nothing is sent);
    ``ConfigError`` of one sentence for a repository that is not ``owner/name``, an API URL that is not http(s), an
    App id without its key (or the key without the id), or no credential where no secret can supply one."""
    import re
    from urllib.parse import urlsplit

    s = load_settings(environ)
    if s.WANDB_ASSETS_GITHUB_REPO is None:
        return None
    repo = s.WANDB_ASSETS_GITHUB_REPO
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise ConfigError(f"WANDB_ASSETS_GITHUB_REPO must be owner/name, like acme/trainer (got {repo!r}).")
    url = s.WANDB_ASSETS_GITHUB_API_URL.rstrip("/")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError(
            f"WANDB_ASSETS_GITHUB_API_URL must start with http:// or https:// (got {url!r}); GitHub's is "
            "https://api.github.com."
        )
    key = s.WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY
    if key is not None and s.WANDB_ASSETS_GITHUB_APP_ID is None:
        raise ConfigError(
            "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY is set without WANDB_ASSETS_GITHUB_APP_ID: set the App's id."
        )
    if key is not None:
        key = SecretStr(pem_text(key.get_secret_value().strip()))
    secret_can = s.WANDB_API_KEY is None  # the secret is read at run time: it may hold the token or the key
    if s.WANDB_ASSETS_GITHUB_APP_ID is not None and key is None and not secret_can:
        raise ConfigError(
            "WANDB_ASSETS_GITHUB_APP_ID is set without WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY: set the App's private key "
            "(its PEM text or the path of its .pem file)."
        )
    if s.WANDB_ASSETS_GITHUB_APP_ID is None and s.WANDB_ASSETS_GITHUB_TOKEN is None and not secret_can:
        raise ConfigError(
            f"WANDB_ASSETS_GITHUB_REPO is {repo}, but no credential is set: set WANDB_ASSETS_GITHUB_APP_ID and "
            "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY (a GitHub App), or WANDB_ASSETS_GITHUB_TOKEN."
        )
    return GitHubTarget(
        repo, url, s.WANDB_ASSETS_PR_GATE, s.WANDB_ASSETS_GITHUB_TOKEN, s.WANDB_ASSETS_GITHUB_APP_ID, key
    )


def pem_text(value: str) -> str:
    """A private key's PEM text from the setting (the text itself, or the path of its file); the sentence of a
    ``ConfigError`` never quotes the value (it may be the key)."""
    if value.startswith("-----BEGIN"):
        text = value
    else:
        try:
            text = Path(value).expanduser().read_text().strip()
        except (OSError, ValueError):
            raise ConfigError(
                "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY is neither PEM text nor the path of a readable .pem file."
            ) from None
    if not text.startswith("-----BEGIN") or "PRIVATE KEY-----" not in text:
        raise ConfigError(
            "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY is not a PEM private key (-----BEGIN ... PRIVATE KEY-----)."
        )
    return text


def alert_thresholds(environ: Mapping[str, str] | None = None) -> AlertThresholds:
    """The alert rules' knobs from the ``WANDB_ASSETS_ALERT_*`` variables."""
    s = load_settings(environ)
    return AlertThresholds(
        **{
            name: getattr(s, _threshold_variable(name))
            for name in AlertThresholds.__dataclass_fields__
            if name != "by_project"
        },
        by_project=True,  # one project or several: the same alert keys (entity/project in each)
    )


def _threshold_variable(field_name: str) -> str:
    if field_name in ("sps_metric", "idle_gpu_pct"):
        return f"WANDB_ASSETS_{field_name.upper()}"
    return f"WANDB_ASSETS_ALERT_{field_name.upper()}"


def _secret_text(value: SecretStr | None) -> str | None:
    return value.get_secret_value().strip() or None if value is not None else None


def resolve_wandb_settings(
    environ: Mapping[str, str] | None = None,
    load_secret: SecretLoader | None = None,
    secret_name: str | None = None,
) -> WandbSettings:
    """Combine the environment with the Secrets Manager secret (read only when the key is not in the env)."""
    source = os.environ if environ is None else environ
    s = load_settings(environ)
    values = {
        "WANDB_API_KEY": _secret_text(s.WANDB_API_KEY),
        "WANDB_ENTITY": s.WANDB_ENTITY,
        "WANDB_PROJECT": s.WANDB_PROJECT,
    }
    if values["WANDB_API_KEY"] is None:  # `wandb login` wrote it to the netrc file the wandb client reads
        values["WANDB_API_KEY"] = netrc_key(s.WANDB_BASE_URL, source)
    if values["WANDB_API_KEY"] is None:
        secret_name = secret_name or s.WANDB_ASSETS_SECRET_NAME
        if load_secret is None:
            raise ConfigError(
                "WANDB_API_KEY is not set: export it, run `wandb login`, or set WANDB_ASSETS_SECRET_NAME to a secret "
                "holding it."
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
    if values["WANDB_PROJECT"] is None and s.WANDB_ASSETS_PROJECTS is None:
        raise ConfigError("WANDB_PROJECT is not set: export the W&B project to mirror (or run `wandb-assets demo`).")
    return WandbSettings(
        api_key=values["WANDB_API_KEY"],
        project=values["WANDB_PROJECT"],
        entity=values["WANDB_ENTITY"],
        base_url=s.WANDB_BASE_URL,
    )


#: W&B's cloud API, whose key `wandb login` stores when no WANDB_BASE_URL is set.
WANDB_CLOUD_URL = "https://api.wandb.ai"


def netrc_key(base_url: str | None, environ: Mapping[str, str]) -> str | None:
    """The API key `wandb login` stored for ``base_url``'s host (W&B's cloud when None) in the netrc file the wandb
    client reads (``NETRC``, else ``~/.netrc``); None when there is none or it cannot be read (nothing of the file
    is ever shown)."""
    import netrc
    from urllib.parse import urlsplit

    path = Path(environ.get("NETRC") or "~/.netrc").expanduser()
    host = urlsplit(base_url or WANDB_CLOUD_URL).netloc
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return (found[2] or "").strip() or None if found else None


def parse_secret_string(secret_name: str, secret_string: str | None) -> dict[str, str]:
    """Decode the secret's JSON; a clear ``ConfigError`` (without the content) when it is not a JSON object."""
    try:
        parsed = json.loads(secret_string or "")
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError(f'The secret {secret_name!r} must hold a JSON object such as {{"WANDB_API_KEY": "..."}}.')
    return {str(k): str(v) for k, v in parsed.items() if v is not None}
