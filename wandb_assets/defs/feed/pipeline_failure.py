"""The ``pipeline_failure`` alert: opened when a refresh, backfill or feed run fails, resolved only when a
later run of *that same job* succeeds. Never touched by ``fleet_alerts``, so a feed that keeps failing
gives one "opened" notification per channel and no "resolved" until it succeeds.

The sensors do not write the warehouse themselves: they request a run of the ``pipeline_alert`` job, whose
one op runs in the ``warehouse`` pool like every other writer. The CLI runs the same job in process.
"""

from dagster import (
    Config,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    OpExecutionContext,
    RunFailureSensorContext,
    RunRequest,
    RunsFilter,
    RunStatusSensorContext,
    in_process_executor,
    job,
    op,
    run_failure_sensor,
    run_status_sensor,
)

from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.feed.notify import Notifier
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.fleet.jobs import backfill_job, offline_job, refresh_job
from wandb_assets.defs.warehouse.maintenance import warehouse_maintenance_job
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.alerts import PIPELINE_FAILURE, pipeline_failure
from wandb_assets.lib.clock import utc_now

PIPELINE_ALERT_JOB = "pipeline_alert"
MONITORED_JOBS = [refresh_job, backfill_job, offline_job, feed_job, warehouse_maintenance_job]


class PipelineAlertConfig(Config):
    """Which job's alert to open or resolve, and why."""

    job_name: str
    run_id: str
    event: str  # "opened" (the run failed) or "resolved" (the run succeeded)
    error: str = ""


@op(pool=WAREHOUSE_POOL, description="Open or resolve the pipeline_failure alert of one job and notify.")
def record_pipeline_failure(
    context: OpExecutionContext,
    config: PipelineAlertConfig,
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
) -> None:
    notifier = Notifier(warehouse, datadog, channels, context.log)
    now = utc_now()
    if config.event == "opened":
        conditions, covered = [pipeline_failure(config.job_name, config.run_id, config.error or "unknown error")], set()
    elif config.event == "resolved":
        conditions, covered = [], {f"{PIPELINE_FAILURE}:{config.job_name}"}
    else:
        raise ValueError(f"event must be 'opened' or 'resolved' (got {config.event!r}).")
    with warehouse.get_connection() as con:
        notifier.record(con, conditions, covered, now)
    notifier.send(now)


@job(
    name=PIPELINE_ALERT_JOB,
    executor_def=in_process_executor,
    description="Open (a run failed) or resolve (a later run of the same job succeeded) a pipeline_failure alert.",
)
def pipeline_alert_job():
    record_pipeline_failure()


def step_failure_sentence(events) -> str | None:
    """The innermost error of the first failed step among ``events``: the sentence a person needs."""
    for event in events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            while error.cause is not None:
                error = error.cause
            text = error.message.strip()
            return f"step {event.step_key}: {text.splitlines()[-1] if text else error.cls_name}"
    return None


def pipeline_alert_run_config(job_name: str, run_id: str, event: str, error: str = "") -> dict:
    config = {"job_name": job_name, "run_id": run_id, "event": event, "error": error[:1000]}
    return {"ops": {"record_pipeline_failure": {"config": config}}}


def previous_run_failed(instance: DagsterInstance, job_name: str, run_id: str) -> bool:
    """Whether the run of ``job_name`` that finished before ``run_id`` failed: only then is there an alert
    for a success to resolve (so a healthy 15-minute tick launches nothing)."""
    records = instance.get_run_records(
        RunsFilter(
            job_name=job_name,
            statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED],
        ),
        limit=3,
    )
    earlier = [r.dagster_run for r in records if r.dagster_run.run_id != run_id]
    return bool(earlier) and earlier[0].status != DagsterRunStatus.SUCCESS


@run_failure_sensor(
    monitored_jobs=MONITORED_JOBS,
    request_job=pipeline_alert_job,
    default_status=DefaultSensorStatus.RUNNING,
    description="A failed refresh, backfill or feed run opens (or keeps open) its job's pipeline_failure alert.",
)
def pipeline_failure_opens(context: RunFailureSensorContext):
    run = context.dagster_run
    error = step_failure_sentence(context.get_step_failure_events()) or context.failure_event.message or "unknown"
    return RunRequest(
        run_key=f"opened:{run.run_id}", run_config=pipeline_alert_run_config(run.job_name, run.run_id, "opened", error)
    )


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    monitored_jobs=MONITORED_JOBS,
    request_job=pipeline_alert_job,
    default_status=DefaultSensorStatus.RUNNING,
    description="A successful run after a failed one of the same job resolves that job's pipeline_failure alert.",
)
def pipeline_failure_resolves(context: RunStatusSensorContext):
    run = context.dagster_run
    if previous_run_failed(context.instance, run.job_name, run.run_id):
        return RunRequest(
            run_key=f"resolved:{run.run_id}", run_config=pipeline_alert_run_config(run.job_name, run.run_id, "resolved")
        )
    return None
