"""The 15-minute tick."""

from datetime import UTC

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from wandb_assets.defs.fleet.jobs import (
    CURVES_JOB,
    REFRESH_JOB,
    TICK_RUN_CONFIG,
    curves_job,
    partition_range_tags,
    plan_tick,
    refresh_job,
)
from wandb_assets.settings import pipeline_settings

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def runs_in_flight(instance: DagsterInstance, job_name: str) -> int:
    """Runs of ``job_name`` queued or running: a schedule or sensor never stacks another on them."""
    return instance.get_runs_count(RunsFilter(job_name=job_name, statuses=IN_FLIGHT))


@schedule(
    job=refresh_job,
    cron_schedule="*/15 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every 15 minutes: refresh recent and unfinished runs, rebuild fleet tables, snapshot gauges.",
)
def every_15_minutes(context: ScheduleEvaluationContext):
    in_flight = runs_in_flight(context.instance, REFRESH_JOB)
    if in_flight:
        return SkipReason(f"{in_flight} refresh run(s) still in flight; not stacking another tick.")
    today = context.scheduled_execution_time.astimezone(UTC).date()
    first, last, reason = plan_tick(today)
    context.log.info(f"Tick covers {first}..{last}: {reason}")
    return RunRequest(tags=partition_range_tags(first, last), run_config=TICK_RUN_CONFIG)


@schedule(
    job=curves_job,
    cron_schedule="7,22,37,52 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every 15 minutes, between the ticks: read the curves due (WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs at "
    "most) and load them. Skipped while WANDB_ASSETS_FETCH_HISTORY is false.",
)
def curves_between_ticks(context: ScheduleEvaluationContext):
    if not pipeline_settings().fetch_history:
        return SkipReason("WANDB_ASSETS_FETCH_HISTORY is false: no curves are read.")
    in_flight = runs_in_flight(context.instance, CURVES_JOB)
    if in_flight:
        return SkipReason(f"{in_flight} curves run(s) still in flight; not stacking another.")
    return RunRequest()
