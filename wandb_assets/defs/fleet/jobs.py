"""The refresh (tick) and backfill jobs, and running them in process (the CLI and the tests use this)."""

from __future__ import annotations

from datetime import date, timedelta

from dagster import (
    AssetSelection,
    DagsterInstance,
    ExecuteInProcessResult,
    define_asset_job,
    in_process_executor,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from wandb_assets.defs.fleet.assets import fleet_snapshot, gpu_hours, push_to_main_sps, success_rates
from wandb_assets.defs.wandb_runs.assets import runs
from wandb_assets.lib.warehouse import read_oldest_unfinished_day, refresh_days
from wandb_assets.settings import pipeline_settings

REFRESH_JOB = "refresh"
BACKFILL_JOB = "backfill"
#: Run monitoring fails a tick that runs longer than this instead of letting it hang.
TICK_MAX_RUNTIME_S = 900
#: When the warehouse cannot be read to plan a tick, re-read this many days to be safe.
FALLBACK_LOOKBACK_DAYS = 7

derived = AssetSelection.assets(push_to_main_sps, success_rates, gpu_hours)

refresh_job = define_asset_job(
    REFRESH_JOB,
    selection=AssetSelection.assets(runs) | derived | AssetSelection.assets(fleet_snapshot),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": str(TICK_MAX_RUNTIME_S)},
    description="One tick: re-read recent and still-running runs, rebuild the fleet tables, snapshot the gauges.",
)

backfill_job = define_asset_job(
    BACKFILL_JOB,
    selection=AssetSelection.assets(runs) | derived | AssetSelection.keys("warehouse_snapshot"),
    executor_def=in_process_executor,
    description="Re-read a range of days from W&B in one run, rebuild the fleet tables (no fleet snapshot), "
    "publish the analysts' warehouse snapshot.",
)


def partition_range_tags(first: date, last: date) -> dict[str, str]:
    """Run tags that make one run cover the daily partitions ``first..last``."""
    return {ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()}


def plan_tick(today: date) -> tuple[date, date, str]:
    """The partition range of a tick, and a sentence explaining it."""
    settings = pipeline_settings()
    try:
        oldest = read_oldest_unfinished_day(str(settings.duckdb_path.resolve()))
    except Exception as exc:  # noqa: BLE001 - a locked or unreadable warehouse must not stop the tick
        first = max(today - timedelta(days=FALLBACK_LOOKBACK_DAYS), settings.start_date)
        return first, today, f"warehouse unreadable ({type(exc).__name__}); re-reading {FALLBACK_LOOKBACK_DAYS} days"
    first, last = refresh_days(oldest, today, settings.start_date)
    reason = f"oldest unfinished run created {oldest}" if oldest and oldest == first else "yesterday and today"
    return first, last, reason


#: CLI runs log INFO and up to the console (step events are DEBUG); everything still goes to the event log.
CONSOLE_LOGS = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def execute_refresh(instance: DagsterInstance, today: date, snapshot_at: str = "") -> ExecuteInProcessResult:
    """Exactly what one scheduled tick does, in this process."""
    from wandb_assets.definitions import defs

    first, last, _ = plan_tick(today)
    run_config = {"ops": {"fleet_snapshot": {"config": {"snapshot_at": snapshot_at}}}, **CONSOLE_LOGS}
    return defs.resolve_job_def(REFRESH_JOB).execute_in_process(
        instance=instance, tags=partition_range_tags(first, last), run_config=run_config, raise_on_error=False
    )


def execute_backfill(instance: DagsterInstance, first: date, last: date) -> ExecuteInProcessResult:
    """Re-read ``first..last`` (inclusive) from W&B in one run."""
    from wandb_assets.definitions import defs

    return defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
        instance=instance, tags=partition_range_tags(first, last), run_config=CONSOLE_LOGS, raise_on_error=False
    )
