"""Daily housekeeping of the warehouse (``lib.maintenance``): a lake's snapshots expired and files merged, a
DuckDB file checkpointed. One op in the ``warehouse`` pool, so it never writes beside a tick."""

from dagster import (
    DefaultScheduleStatus,
    OpExecutionContext,
    RunRequest,
    in_process_executor,
    job,
    op,
    schedule,
)

from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.clock import utc_now
from wandb_assets.lib.maintenance import checkpoint, maintain_lake
from wandb_assets.settings import pipeline_settings

MAINTENANCE_JOB = "warehouse_maintenance"


@op(pool=WAREHOUSE_POOL, description="Expire and merge a DuckLake's snapshots and files, or checkpoint a DuckDB file.")
def maintain_warehouse(context: OpExecutionContext, warehouse: WarehouseResource) -> None:
    with warehouse.get_connection() as con:
        if warehouse.lake is None:
            checkpoint(con)
            context.log.info(f"Checkpointed {warehouse.database}")
            return
        done = maintain_lake(con, utc_now(), pipeline_settings().lake_snapshot_retention)
    context.log.info(
        f"DuckLake maintenance: {done['snapshots_before']} -> {done['snapshots_after']} snapshots, "
        f"{done['data_files_before']} -> {done['data_files_after']} data files, {done['files_deleted']} files deleted"
    )


@job(
    name=MAINTENANCE_JOB,
    executor_def=in_process_executor,
    description="Daily: merge the lake's small files and expire its old snapshots (or checkpoint the DuckDB file).",
)
def warehouse_maintenance_job() -> None:
    maintain_warehouse()


@schedule(
    job=warehouse_maintenance_job,
    cron_schedule="40 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every day at 03:40 UTC, between ticks (it waits for the warehouse pool like every writer).",
)
def daily_warehouse_maintenance() -> RunRequest:
    return RunRequest()
