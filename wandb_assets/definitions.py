"""The code location: every domain's assets, jobs, schedules and resources in one ``Definitions``."""

from dagster import Definitions

from wandb_assets.defs.feed.assets import datadog_feed, fleet_alerts, sps_regression_check, success_rate_check
from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.feed.sensors import after_fleet_snapshot, pipeline_failure_alert
from wandb_assets.defs.fleet.assets import fleet_snapshot, gpu_hours, push_to_main_sps, success_rates
from wandb_assets.defs.fleet.jobs import backfill_job, refresh_job
from wandb_assets.defs.fleet.schedules import every_15_minutes
from wandb_assets.defs.report.assets import fleet_report
from wandb_assets.defs.wandb_runs.assets import runs
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.assets import warehouse_snapshot
from wandb_assets.defs.warehouse.resources import warehouse_resource

wandb = wandb_resource()

defs = Definitions(
    assets=[
        runs,
        push_to_main_sps,
        success_rates,
        gpu_hours,
        fleet_snapshot,
        datadog_feed,
        fleet_alerts,
        warehouse_snapshot,
        fleet_report,
    ],
    asset_checks=[success_rate_check, sps_regression_check],
    jobs=[refresh_job, backfill_job, feed_job],
    schedules=[every_15_minutes],
    sensors=[after_fleet_snapshot, pipeline_failure_alert],
    resources={
        "wandb": wandb,
        "warehouse": warehouse_resource(),
        "datadog": DatadogResource(wandb=wandb),
        "channels": AlertChannelsResource(),
    },
)
