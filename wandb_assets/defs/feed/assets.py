"""After each fleet snapshot: push it to Datadog (``datadog_feed``) and evaluate the alerts (``fleet_alerts``)."""

from datetime import datetime

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)

from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.fleet.assets import fleet_snapshot, utc_now
from wandb_assets.defs.wandb_runs.assets import markdown_table
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.alerts import (
    PIPELINE_FAILURE,
    RULES,
    AlertThresholds,
    Condition,
    drain_outbox,
    evaluate_rules,
    reconcile,
    sps_regression,
    success_rate_low,
)
from wandb_assets.lib.datadog_feed import deliver_pending, enqueue_snapshots, feed_tags, record_dry_run
from wandb_assets.settings import pipeline_settings

FEED = {"group_name": "feed", "owners": ["team:ml-platform"], "deps": [fleet_snapshot], "pool": WAREHOUSE_POOL}


class ClockConfig(Config):
    """``now`` (ISO-8601, UTC) pins the clock, for checks and tests; empty means now."""

    now: str = ""

    def resolve(self) -> datetime:
        return datetime.fromisoformat(self.now.replace("Z", "")) if self.now else utc_now()


def latest_snapshot_at(con) -> datetime | None:
    return con.execute("SELECT max(snapshot_at) FROM fleet_metrics").fetchone()[0]


def project_tags(datadog: DatadogResource) -> list[str]:
    entity, project, _ = datadog.wandb.project_path(pipeline_settings())
    return feed_tags(entity, project, datadog.env)


def alert_channels(datadog: DatadogResource, channels: AlertChannelsResource) -> list[str]:
    """Channels a new notification is queued for (the table and the Dagster log always get it)."""
    return (["slack"] if channels.slack_enabled else []) + (["datadog_event"] if datadog.api_key() else [])


def send_notifications(
    con, datadog: DatadogResource, channels: AlertChannelsResource, now: datetime, log
) -> tuple[int, dict[str, str]]:
    """Drain the outbox through the configured channels."""
    key = datadog.api_key()

    def deliver(channel: str, event: str, text: str) -> str | None:
        if channel == "slack":
            return channels.post_slack(text) if channels.slack_enabled else "slack webhook not configured"
        if channel == "datadog_event":
            if not key:
                return "DD_API_KEY not configured"
            result = datadog.send_event(
                key, text.split(":", 2)[-1].strip()[:100], text, event == "resolved", project_tags(datadog)
            )
            return None if result.accepted else f"Datadog events answered {result.status or result.error}"
        return f"unknown channel {channel}"

    sent, failed = drain_outbox(con, deliver, now)
    for channel, error in failed.items():
        log.warning(f"Alert channel {channel} is down ({error}); its notifications wait for the next tick.")
    return sent, failed


def record_transitions(
    con,
    conditions: list[Condition],
    evaluated: set[str],
    now: datetime,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
    log,
):
    transitions = reconcile(con, conditions, evaluated, now, alert_channels(datadog, channels))
    for transition in transitions:
        condition = transition.condition
        line = f"Alert {transition.event}: {condition.rule} ({condition.subject}): {condition.message}"
        (log.warning if transition.event == "opened" else log.info)(line)
    return transitions


@asset(
    description="Datadog delivery ledger (datadog_deliveries): each fleet snapshot sent once as v2 gauges; "
    "pending snapshots retried oldest first, expired after one hour; dry run without DD_API_KEY.",
    kinds={"duckdb", "datadog"},
    **FEED,
)
def datadog_feed(
    context: AssetExecutionContext, config: ClockConfig, warehouse: WarehouseResource, datadog: DatadogResource
) -> MaterializeResult:
    now = config.resolve()
    key = datadog.api_key()
    tags = project_tags(datadog)
    with warehouse.get_connection() as con:
        new = enqueue_snapshots(con, now, dry_run=key is None)
        if key is None:
            report = record_dry_run(con, new, tags, context.log.info)
        else:
            report = deliver_pending(con, lambda payload: datadog.submit_series(key, payload), now, tags)
        ledger = dict(con.execute("SELECT status, count(*) FROM datadog_deliveries GROUP BY 1").fetchall())
    if report.problem:
        context.log.error(report.problem)
    return MaterializeResult(
        metadata={
            "mode": "dry_run" if key is None else "live",
            "delivered_now": len(report.delivered),
            "expired_now": len(report.expired),
            "pending": len(report.still_pending),
            "problem": report.problem or "",
            "ledger": MetadataValue.json(ledger),
        }
    )


@asset(
    description="Alert lifecycle (alerts, alert_notifications): rules evaluated at the latest snapshot; "
    "an alert notifies when it opens and when it resolves, through an outbox that survives channel outages.",
    kinds={"duckdb"},
    **FEED,
)
def fleet_alerts(
    context: AssetExecutionContext,
    config: ClockConfig,
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
) -> MaterializeResult:
    now = config.resolve()
    thresholds = AlertThresholds.from_env()
    with warehouse.get_connection() as con:
        at = latest_snapshot_at(con)
        conditions = evaluate_rules(con, at, thresholds) if at else []
        # This evaluation follows a successful tick, so an open pipeline_failure alert resolves too.
        transitions = record_transitions(con, conditions, set(RULES), now, datadog, channels, context.log)
        sent, failed = send_notifications(con, datadog, channels, now, context.log)
        open_rows = con.execute(
            "SELECT rule, subject, severity, strftime(opened_at, '%Y-%m-%d %H:%M') FROM alerts "
            "WHERE resolved_at IS NULL ORDER BY opened_at"
        ).fetchall()
        waiting = con.execute("SELECT count(*) FROM alert_notifications WHERE status = 'pending'").fetchone()[0]
    return MaterializeResult(
        metadata={
            "evaluated_at_snapshot": at.isoformat() if at else "",
            "open_alerts": len(open_rows),
            "opened": len([t for t in transitions if t.event == "opened"]),
            "resolved": len([t for t in transitions if t.event == "resolved"]),
            "notifications_sent": sent,
            "notifications_waiting": waiting,
            "open": MetadataValue.md(markdown_table(["rule", "subject", "severity", "opened (UTC)"], open_rows)),
        }
    )


def _check(rule, description: str):
    @asset_check(
        asset=fleet_snapshot,
        name=f"{rule.__name__}_check",
        description=description,
        blocking=False,
        pool=WAREHOUSE_POOL,
    )
    def _snapshot_check(warehouse: WarehouseResource) -> AssetCheckResult:
        with warehouse.get_connection() as con:
            at = latest_snapshot_at(con)
            conditions = rule(con, at, AlertThresholds.from_env()) if at else []
        return AssetCheckResult(
            passed=not conditions,
            severity=AssetCheckSeverity.WARN,
            metadata={"findings": MetadataValue.md("\n".join(f"- {c.message}" for c in conditions) or "none")},
        )

    return _snapshot_check


success_rate_check = _check(success_rate_low, "Push-to-main success rate is not below its threshold.")
sps_regression_check = _check(sps_regression, "No CI config on main regressed in overview/sps.")


def open_pipeline_failure(
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
    job_name: str,
    run_id: str,
    error: str,
    now: datetime,
    log,
) -> None:
    """Open (or keep open) the ``pipeline_failure`` alert of a job and notify; it resolves after a good tick."""
    condition = Condition(
        PIPELINE_FAILURE,
        job_name,
        "critical",
        f"Dagster run {run_id} of job {job_name} failed: {error[:300]}",
        {"run_id": run_id, "job": job_name},
    )
    with warehouse.get_connection() as con:
        record_transitions(con, [condition], set(), now, datadog, channels, log)
        send_notifications(con, datadog, channels, now, log)
