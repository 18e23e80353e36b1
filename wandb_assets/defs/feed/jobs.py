"""The feed job: Datadog delivery and alert evaluation, run after each fleet snapshot."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from wandb_assets.defs.feed.assets import datadog_feed, fleet_alerts

FEED_JOB = "feed"

feed_job = define_asset_job(
    FEED_JOB,
    selection=AssetSelection.assets(datadog_feed, fleet_alerts)
    | AssetSelection.keys("warehouse_snapshot", "fleet_report"),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": "600"},
    description="Push pending fleet snapshots to Datadog, evaluate alerts, send notifications, publish the "
    "analysts' warehouse snapshot.",
)


def execute_feed(instance, now: str = ""):
    """The feed job in this process (what the sensor launches after a snapshot)."""
    from wandb_assets.definitions import defs
    from wandb_assets.defs.fleet.jobs import CONSOLE_LOGS

    clock = {"config": {"now": now}}
    run_config = {"ops": {"datadog_feed": clock, "fleet_alerts": clock}, **CONSOLE_LOGS}
    return defs.resolve_job_def(FEED_JOB).execute_in_process(
        instance=instance, run_config=run_config, raise_on_error=False
    )
