"""The feed job: Datadog delivery and alert evaluation, run after each fleet snapshot."""

from dagster import AssetSelection, define_asset_job, in_process_executor

FEED_JOB = "feed"

feed_job = define_asset_job(
    FEED_JOB,
    selection=AssetSelection.keys(
        "datadog_feed", "fleet_alerts", "idle_actions", "pr_checks", "warehouse_snapshot", "fleet_report"
    ),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": "600"},
    description="Push pending fleet snapshots to Datadog, evaluate alerts, send notifications, publish the "
    "analysts' warehouse snapshot and the W&B report.",
)
