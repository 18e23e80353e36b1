"""The refresh (tick) and backfill jobs, selected by asset key, and how a tick plans its partition range."""

from __future__ import annotations

from datetime import date, timedelta

from dagster import AssetSelection, define_asset_job, in_process_executor

from wandb_assets.lib.warehouse import CATCH_UP_MAX_DAYS, read_last_tick_day, read_oldest_unfinished_day, refresh_days
from wandb_assets.settings import pipeline_settings
from wandb_assets.warehouse import reading

REFRESH_JOB = "refresh"
BACKFILL_JOB = "backfill"
OFFLINE_JOB = "offline"
CURVES_JOB = "curves"
#: Run monitoring fails a tick that runs longer than this instead of letting it hang (a curves run too).
TICK_MAX_RUNTIME_S = 900
#: ... and an offline ingest (1,000 logs of 10,000 rows take 12 s; a crafted or huge log must not hold the
#: warehouse slot for good).
OFFLINE_MAX_RUNTIME_S = 3600
#: When the warehouse cannot be read to plan a tick, re-read this many days to be safe.
FALLBACK_LOOKBACK_DAYS = 7
#: Dagster's run tags for a partition range in one run (the literal strings, as Dagster documents them).
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"

DERIVED = AssetSelection.keys("push_to_main_sps", "success_rates", "gpu_hours", "gpu_usage")
#: Fetch and load the mirrored projects' runs, and record what the fetch found of each project. The runs' curves are
#: read by a job of their own (``curves_job``): never on the tick's or a backfill's path.
MIRROR = AssetSelection.keys("staged_runs", "runs", "wandb_projects")

refresh_job = define_asset_job(
    REFRESH_JOB,
    selection=MIRROR | DERIVED | AssetSelection.keys("fleet_snapshot"),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": str(TICK_MAX_RUNTIME_S)},
    description="One tick: re-read recent and still-running runs, rebuild the fleet tables, snapshot the gauges.",
)

backfill_job = define_asset_job(
    BACKFILL_JOB,
    selection=MIRROR | DERIVED | AssetSelection.keys("warehouse_snapshot"),
    executor_def=in_process_executor,
    description="Re-read a range of days from W&B in one run, rebuild the fleet tables (no fleet snapshot), "
    "publish the analysts' warehouse snapshot.",
)

offline_job = define_asset_job(
    OFFLINE_JOB,
    selection=AssetSelection.keys("offline_runs") | DERIVED | AssetSelection.keys("fleet_snapshot"),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": str(OFFLINE_MAX_RUNTIME_S)},
    description="Offline run logs into `runs`, then the fleet tables and a snapshot (a tick after its fetch).",
)


curves_job = define_asset_job(
    CURVES_JOB,
    selection=AssetSelection.keys("staged_curves", "run_curves", "gpu_usage"),
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": str(TICK_MAX_RUNTIME_S)},
    description="Read the curves due (WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs at most, the newest ended first) and "
    "load them, then rebuild gpu_usage (idle hours from curves). Its own schedule, between the ticks: never on a "
    "tick's or a backfill's path (`wandb-assets curves` repeats it until none is due).",
)


#: A tick's run config: with several projects, read only those that changed (the schedule and the CLI alike).
TICK_RUN_CONFIG = {"ops": {"staged_runs": {"config": {"changed_only": True}}}}


def partition_range_tags(first: date, last: date) -> dict[str, str]:
    """Run tags that make one run cover the daily partitions ``first..last``."""
    return {RANGE_START_TAG: first.isoformat(), RANGE_END_TAG: last.isoformat()}


def plan_tick(today: date) -> tuple[date, date, str]:
    """The partition range of a tick, and a sentence explaining it."""
    settings = pipeline_settings()
    try:
        with reading(settings.warehouse) as con:
            oldest = read_oldest_unfinished_day(con)
            last_tick = read_last_tick_day(con)
    except Exception as exc:  # noqa: BLE001 - a locked or unreadable warehouse must not stop the tick
        first = max(today - timedelta(days=FALLBACK_LOOKBACK_DAYS), settings.start_date)
        return first, today, f"warehouse unreadable ({type(exc).__name__}); re-reading {FALLBACK_LOOKBACK_DAYS} days"
    first, last = refresh_days(oldest, today, settings.start_date, settings.unfinished_window_days, last_tick)
    # said by the rule that set the first day (``refresh_days``: the earliest day of the rules wins)
    if first >= today - timedelta(days=1):
        reason = "yesterday and today"
    elif first == settings.start_date:
        reason = f"from the first day held, {first} (WANDB_ASSETS_START_DATE)"
    elif first == oldest:
        reason = f"oldest unfinished run created {oldest}"
    elif first == last_tick:
        reason = f"the last tick's snapshot was taken {last_tick}: catching up from that day"
    elif last_tick is not None and last_tick < first:
        reason = (
            f"the last tick's snapshot was taken {last_tick}: catching up {CATCH_UP_MAX_DAYS} days (backfill older)"
        )
    else:
        reason = f"unfinished runs since {oldest}: the last {settings.unfinished_window_days} days"
    if oldest is not None and oldest < first:
        reason += "; older unfinished runs refreshed by id"
    return first, last, reason
