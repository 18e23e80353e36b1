"""After each fleet snapshot: push it to Datadog (``datadog_feed``) and evaluate the alerts (``fleet_alerts``).

Siblings are referred to by key (``fleet_snapshot``); nothing here imports another domain's assets.
"""

from datetime import datetime

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    Config,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    asset_check,
)

from wandb_assets.defs.feed.notify import Notifier
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.acting.idle_readout import OPEN_EPISODES_SQL
from wandb_assets.lib.alerts import (
    RULE_FUNCTIONS,
    evaluate_rules,
    record_change_points,
    sps_regression,
    sps_regression_summary,
    success_rate_low,
    success_rate_summary,
)
from wandb_assets.lib.clock import configured_time, utc_now
from wandb_assets.lib.datadog_feed import deliver_pending, enqueue_snapshots, record_dry_run
from wandb_assets.lib.warehouse import latest_snapshot_at
from wandb_assets.settings import ConfigError, alert_thresholds

FLEET_SNAPSHOT = AssetKey("fleet_snapshot")
FEED = {"group_name": "feed", "owners": ["team:ml-platform"], "deps": [FLEET_SNAPSHOT], "pool": WAREHOUSE_POOL}


class ClockConfig(Config):
    """``now`` (ISO-8601: ``Z``, an offset, or none for UTC) pins the clock, for checks and tests; empty means now."""

    now: str = ""

    def resolve(self) -> datetime:
        return configured_time(self.now, "now") or utc_now()


@asset(
    description="Datadog delivery ledger (datadog_deliveries): each fleet snapshot sent at least once as v2 "
    "gauges (a re-send repeats the same point); pending snapshots retried oldest first, expired after one hour; "
    "dry run when no DD_API_KEY is configured anywhere.",
    kinds={"duckdb", "datadog"},
    **FEED,
)
@names_the_warehouse
def datadog_feed(
    context: AssetExecutionContext, config: ClockConfig, warehouse: WarehouseResource, datadog: DatadogResource
) -> MaterializeResult:
    now = config.resolve()
    try:
        key = datadog.api_key()  # None only when no key is configured anywhere
    except ConfigError:
        # A key is configured but unreadable now: the new snapshots are owed to Datadog, so they are queued
        # as pending (the next tick sends them) and the step fails loudly.
        with warehouse.get_connection() as con:
            enqueue_snapshots(con, now, dry_run=False)
        raise
    tags = datadog.tags()
    with warehouse.get_connection() as con:
        new = enqueue_snapshots(con, now, dry_run=key is None)
        if key is None:
            report = record_dry_run(con, new, tags, context.log.info, datadog.project_series())
    if key is not None:
        report = deliver_pending(
            warehouse.get_connection,
            lambda payload: datadog.submit_series(key, payload),
            now,
            tags,
            datadog.project_series(),
        )
    with warehouse.get_connection() as con:
        ledger = dict(con.execute("SELECT status, count(*) FROM datadog_deliveries GROUP BY 1").fetchall())
    if report.problem:
        context.log.error(report.problem)
    return MaterializeResult(
        metadata={
            "mode": "dry_run" if key is None else "live",
            "delivered_now": len(report.delivered),
            "expired_now": len(report.expired),
            "rejected_now": len(report.rejected),
            "pending": len(report.still_pending),
            "problem": report.problem or "",
            "ledger": MetadataValue.json(ledger),
        }
    )


#: The `open_alerts_list` table of fleet_alerts' metadata: one column, so the UI wraps each whole message (with its
#: links) in its one cell, readable without a click (the full message is here; the log line is one short line).
OPEN_ALERTS_SCHEMA = TableSchema(
    columns=[TableColumn("open alert", "string", description="[severity] rule, since when (UTC): the message")]
)
#: The idle ladder's open episodes (``idle_actions``) beside the alerts: what was done about each idle run so far.
IDLE_EPISODES_SCHEMA = TableSchema(
    columns=[TableColumn("idle episode", "string", description="run, idle since (UTC): the steps done and outcomes")]
)


@asset(
    description="Alert lifecycle (alerts, alert_notifications): rules evaluated at the latest snapshot; "
    "an alert notifies when it opens and when it resolves, through an outbox that survives channel outages "
    "(delivery at least once). pipeline_failure alerts are not evaluated here: their own job opens and resolves "
    "them. Also records every SPS change point the detector finds, recovered ones too (sps_change_points), "
    "which the sps_regression rule and the change_points helper read while the series is unchanged.",
    kinds={"duckdb"},
    **FEED,
)
@names_the_warehouse
def fleet_alerts(
    context: AssetExecutionContext,
    config: ClockConfig,
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
) -> MaterializeResult:
    now = config.resolve()
    notifier = Notifier(warehouse, datadog, channels, context.log)
    thresholds = alert_thresholds()
    with warehouse.get_connection() as con:
        at = latest_snapshot_at(con)
        change_points = record_change_points(con, at, thresholds.sps_metric) if at else 0
        conditions = evaluate_rules(con, at, thresholds, change_points_recorded=True) if at else []
        transitions = notifier.record(con, conditions, set(RULE_FUNCTIONS), now)
    sent, _ = notifier.send(now)
    with warehouse.get_connection() as con:
        open_rows = con.execute(
            "SELECT rule, subject, severity, strftime(opened_at, '%Y-%m-%d %H:%M'), message FROM alerts "
            "WHERE resolved_at IS NULL ORDER BY opened_at"
        ).fetchall()
        waiting = con.execute("SELECT count(*) FROM alert_notifications WHERE status = 'pending'").fetchone()[0]
        episodes = con.execute(OPEN_EPISODES_SQL).fetchall()  # the idle ladder's (idle_actions), as of its last tick
    return MaterializeResult(
        metadata={
            "evaluated_at_snapshot": at.isoformat() if at else "",
            "open_alerts": len(open_rows),
            "sps_change_points": change_points,
            "opened": len([t for t in transitions if t.event == "opened"]),
            "resolved": len([t for t in transitions if t.event == "resolved"]),
            "notifications_sent": sent,
            "notifications_waiting": waiting,
            "idle_ladder_open_episodes": MetadataValue.table(
                [
                    TableRecord({"idle episode": f"{e}/{p}/{r}, idle since {started:%Y-%m-%d %H:%M} UTC: {done}"})
                    for e, p, r, started, done, *_ in episodes
                ],
                IDLE_EPISODES_SCHEMA,
            ),
            "open_alerts_list": MetadataValue.table(
                [
                    TableRecord({"open alert": f"[{severity}] {rule}, since {opened}: {message}"})
                    for rule, _subject, severity, opened, message in open_rows
                ],
                OPEN_ALERTS_SCHEMA,
            ),
        }
    )


#: The findings table of a check's result: one row per alert condition found.
FINDINGS_SCHEMA = TableSchema(
    columns=[
        TableColumn("subject", "string"),
        TableColumn("severity", "string"),
        TableColumn("finding", "string"),
    ]
)


#: How a warning-level check's finding starts: a warning, its alert open, never an error of the pipeline.
WARNING_PREFIX = "Warning (the alert is open; nothing failed to run): "


def _check(rule, summary, description: str, prepare=None):
    """A warning-level check of ``fleet_snapshot`` by ``rule``; ``prepare`` records what the rule then reads (it is
    called with ``recorded=True``)."""

    @asset_check(
        asset=FLEET_SNAPSHOT,
        name=f"{rule.__name__}_check",
        description=f"Warning-level, non-blocking: {description}",
        blocking=False,
        pool=WAREHOUSE_POOL,
    )
    def _snapshot_check(warehouse: WarehouseResource) -> AssetCheckResult:
        thresholds = alert_thresholds()
        with warehouse.get_connection() as con:
            at = latest_snapshot_at(con)
            if at and prepare is not None:  # then the rule reads what it recorded
                prepare(con, at, thresholds)
            conditions = rule(con, at, thresholds, **({"recorded": True} if prepare else {})) if at else []
            if conditions:  # the result's description is what was found, pass or fail
                found = conditions[0].message + (f" (and {len(conditions) - 1} more)" if len(conditions) > 1 else "")
            else:
                found = "No fleet snapshot yet." if at is None else summary(con, at, thresholds)
        rows = [TableRecord({"subject": c.subject, "severity": c.severity, "finding": c.message}) for c in conditions]
        return AssetCheckResult(
            passed=not conditions,
            severity=AssetCheckSeverity.WARN,
            # Dagster's UI labels every failed check "Failed" (a WARN one with a yellow warning icon): say it here
            description=f"{WARNING_PREFIX}{found}" if conditions else found,
            metadata={
                "snapshot_at_utc": at.isoformat() if at else "",
                "findings": MetadataValue.table(rows, schema=FINDINGS_SCHEMA),
                "found": found,
            },
        )

    return _snapshot_check


success_rate_low_check = _check(
    success_rate_low, success_rate_summary, "Push-to-main success rate is not below its threshold."
)
sps_regression_check = _check(
    sps_regression,
    sps_regression_summary,
    "No CI config on main has an unrecovered SPS regression (WANDB_ASSETS_SPS_METRIC, commit order).",
    # the detector runs once a tick, here (the series changed with the load): fleet_alerts reads what it recorded
    prepare=lambda con, at, thresholds: record_change_points(con, at, thresholds.sps_metric),
)
