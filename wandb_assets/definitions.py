"""The code location: every domain's assets, jobs, schedules and resources in one ``Definitions``."""

from dagster import Definitions

from wandb_assets.defs.fleet.assets import fleet_snapshot, gpu_hours, push_to_main_sps, success_rates
from wandb_assets.defs.fleet.jobs import backfill_job, refresh_job
from wandb_assets.defs.fleet.schedules import every_15_minutes
from wandb_assets.defs.wandb_runs.assets import runs
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.resources import warehouse_resource

defs = Definitions(
    assets=[runs, push_to_main_sps, success_rates, gpu_hours, fleet_snapshot],
    jobs=[refresh_job, backfill_job],
    schedules=[every_15_minutes],
    resources={"wandb": wandb_resource(), "warehouse": warehouse_resource()},
)
