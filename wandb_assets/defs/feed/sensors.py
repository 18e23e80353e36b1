"""Sensors: run the feed after every fleet snapshot, and alert when a pipeline run fails."""

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    EventLogEntry,
    RunFailureSensorContext,
    RunRequest,
    SensorEvaluationContext,
    asset_sensor,
    run_failure_sensor,
)

from wandb_assets.defs.feed.assets import open_pipeline_failure
from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.fleet.assets import utc_now
from wandb_assets.defs.fleet.jobs import backfill_job, refresh_job
from wandb_assets.defs.warehouse.resources import WarehouseResource


@asset_sensor(
    asset_key=AssetKey("fleet_snapshot"),
    job=feed_job,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="After each fleet snapshot: push it to Datadog and evaluate the alerts.",
)
def after_fleet_snapshot(context: SensorEvaluationContext, asset_event: EventLogEntry):
    yield RunRequest(run_key=f"fleet_snapshot:{asset_event.run_id}:{asset_event.timestamp}")


@run_failure_sensor(
    monitored_jobs=[refresh_job, backfill_job, feed_job],
    default_status=DefaultSensorStatus.RUNNING,
    description="A failed tick, backfill or feed run opens a pipeline_failure alert.",
)
def pipeline_failure_alert(
    context: RunFailureSensorContext,
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
):
    error = context.failure_event.message or "unknown error"
    open_pipeline_failure(
        warehouse,
        datadog,
        channels,
        context.dagster_run.job_name,
        context.dagster_run.run_id,
        error,
        utc_now(),
        context.log,
    )
