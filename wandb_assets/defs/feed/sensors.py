"""Run the feed after every fleet snapshot."""

from dagster import AssetKey, DefaultSensorStatus, EventLogEntry, RunRequest, SensorEvaluationContext, asset_sensor

from wandb_assets.defs.feed.jobs import feed_job


@asset_sensor(
    asset_key=AssetKey("fleet_snapshot"),
    job=feed_job,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="After each fleet snapshot: push it to Datadog and evaluate the alerts.",
)
def after_fleet_snapshot(context: SensorEvaluationContext, asset_event: EventLogEntry):
    yield RunRequest(run_key=f"fleet_snapshot:{asset_event.run_id}:{asset_event.timestamp}")
