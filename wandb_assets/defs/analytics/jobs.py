"""The analytics job: ``dbt build`` of the analysts' project, then the analysts' snapshot published again so
notebooks see the fresh marts; and the sensor that runs it after every feed or backfill run."""

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunStatusSensorContext,
    SkipReason,
    define_asset_job,
    in_process_executor,
    run_status_sensor,
)

from wandb_assets.defs.analytics import ANALYTICS_JOB
from wandb_assets.defs.analytics import assets as analytics_assets  # the module: its assets are loaded once
from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.fleet.jobs import backfill_job
from wandb_assets.defs.fleet.schedules import runs_in_flight
from wandb_assets.settings import pipeline_settings

analytics_job = define_asset_job(
    ANALYTICS_JOB,
    selection=AssetSelection.assets(analytics_assets.analytics_models) | AssetSelection.keys("warehouse_snapshot"),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": "900"},
    description="Build the analysts' dbt project (analytics/: seed, staging views, marts, tests as asset checks) "
    "in the warehouse, then publish the analysts' snapshot with the fresh marts. After every feed or backfill "
    "run, in a run of its own: a tick never waits for dbt.",
)


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    monitored_jobs=[feed_job, backfill_job],
    request_job=analytics_job,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="After each successful feed (every tick's second run) or backfill: build the dbt models.",
)
def analytics_after_feed(context: RunStatusSensorContext):
    if not pipeline_settings().analytics:
        return SkipReason("WANDB_ASSETS_ANALYTICS is false: the dbt models are not built.")
    in_flight = runs_in_flight(context.instance, ANALYTICS_JOB)
    if in_flight:
        return SkipReason(f"{in_flight} analytics run(s) still in flight; the next feed builds the models.")
    return RunRequest(run_key=f"after:{context.dagster_run.run_id}")
