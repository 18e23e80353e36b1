"""The ``pipeline_failure`` alert: opened when a refresh, backfill or feed run fails, resolved only when a
later run of *that same job* succeeds. Never touched by ``fleet_alerts``, so a feed that keeps failing
gives one "opened" notification per channel and no "resolved" until it succeeds.

The sensors request a run of the ``pipeline_alert`` job; the CLI runs the same job in process. Its state and its
delivery do not depend on the warehouse, which may be what failed (locked by another process, unwritable): whether
to page comes from the job's run history in the Dagster instance (a job's first failure after a success opens,
its first success after a failure resolves, so a lock held for an hour pages once and resolves once), and the
message goes straight to the channels. The warehouse's ``alerts`` table records it when it can (a channel that
could not be reached then queues there for the next feed); the op is outside the ``warehouse`` pool, so a writer
that holds the pool for an hour does not hold the page back.
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

from wandb_assets.defs.analytics import ANALYTICS_JOB
from wandb_assets.defs.feed.github import github_checks_job
from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.feed.notify import Notifier
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.fleet.jobs import backfill_job, curves_job, offline_job, refresh_job
from wandb_assets.defs.warehouse.maintenance import warehouse_maintenance_job
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.alerts import PIPELINE_FAILURE, Transition, pipeline_failure, reconcile
from wandb_assets.lib.clock import utc_now

PIPELINE_ALERT_JOB = "pipeline_alert"
#: The jobs whose failure pages, by name: the sensors watch every job of the code location and pass over the others
#: (the analytics job's definitions import dbt, which a command running the other jobs does not load: by name, this
#: module does not import them).
MONITORED_JOBS = frozenset(
    {
        refresh_job.name,
        backfill_job.name,
        offline_job.name,
        curves_job.name,
        feed_job.name,
        github_checks_job.name,
        warehouse_maintenance_job.name,
        ANALYTICS_JOB,
    }
)


class PipelineAlertConfig(Config):
    """Which job's alert to open or resolve, and why."""

    job_name: str
    run_id: str
    event: str  # "opened" (the run failed) or "resolved" (the run succeeded)
    error: str = ""


@op(description="Open or resolve the pipeline_failure alert of one job, notify, and record it where it can.")
def record_pipeline_failure(
    context: OpExecutionContext,
    config: PipelineAlertConfig,
    warehouse: WarehouseResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
) -> None:
    notifier = Notifier(warehouse, datadog, channels, context.log)
    now = utc_now()
    job_name, run_id = config.job_name, config.run_id
    if config.event == "opened":
        condition = pipeline_failure(job_name, run_id, config.error or "unknown error")
        conditions, covered = [condition], set()
        first = not previous_run_failed(context.instance, job_name, run_id)  # a failure streak pages once
    elif config.event == "resolved":
        failed_run = last_failed_run(context.instance, job_name)
        condition = pipeline_failure(job_name, failed_run or run_id, f"resolved by run {run_id}")
        conditions, covered, first = [], {f"{PIPELINE_FAILURE}:{job_name}"}, True
    else:
        raise ValueError(f"event must be 'opened' or 'resolved' (got {config.event!r}).")
    transition = Transition(config.event, condition)
    unreached = notifier.send_now(transition) if first else []
    (context.log.warning if config.event == "opened" else context.log.info)(
        f"Alert {config.event}: {PIPELINE_FAILURE} ({job_name})" + ("" if first else ", already open: not sent again")
    )
    try:  # the history, where the warehouse can take it; a channel not reached waits in its outbox
        with warehouse.get_connection() as con:
            reconcile(con, conditions, covered, now, unreached)
    except Exception as exc:  # noqa: BLE001 - the warehouse may be what failed: the page went out already
        context.log.warning(f"The {PIPELINE_FAILURE} alert was sent but not recorded in the warehouse: {exc}")


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


def last_failed_run(instance: DagsterInstance, job_name: str) -> str | None:
    """The id of the latest failed run of ``job_name`` (what a resolution resolves), or None."""
    records = instance.get_run_records(RunsFilter(job_name=job_name, statuses=[DagsterRunStatus.FAILURE]), limit=1)
    return records[0].dagster_run.run_id if records else None


#: How many of a job's latest runs ``previous_run_failed`` orders by their end (runs in flight together: a few).
_RECENT_RUNS = 25


def _ended_at(record) -> float:
    """When a run record's run ended (its end time; else its last update or creation, for a run recorded without
    events: storage may keep the update to the second only)."""
    return record.end_time or max(record.update_timestamp, record.create_timestamp).timestamp()


def previous_run_failed(instance: DagsterInstance, job_name: str, run_id: str) -> bool:
    """Whether the run of ``job_name`` that finished last before ``run_id`` finished failed: only then is there an
    alert for a success to resolve (so a healthy 15-minute tick launches nothing), or is a failure not the first of
    a streak. Runs are ordered by when they ended, not when they were created (backfills run side by side); a
    cancelled run is an operator's choice: it opens nothing, so it is passed over."""
    records = instance.get_run_records(
        RunsFilter(job_name=job_name, statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE]),
        limit=_RECENT_RUNS,
    )
    own = next((r for r in records if r.dagster_run.run_id == run_id), None)
    ended = _ended_at(own) if own is not None else float("inf")
    earlier = sorted(
        (r for r in records if r.dagster_run.run_id != run_id and _ended_at(r) <= ended), key=_ended_at, reverse=True
    )
    return bool(earlier) and earlier[0].dagster_run.status == DagsterRunStatus.FAILURE


@run_failure_sensor(
    request_job=pipeline_alert_job,
    default_status=DefaultSensorStatus.RUNNING,
    description="A failed refresh, backfill or feed run opens (or keeps open) its job's pipeline_failure alert.",
)
def pipeline_failure_opens(context: RunFailureSensorContext):
    run = context.dagster_run
    if run.job_name not in MONITORED_JOBS:
        return None
    error = step_failure_sentence(context.get_step_failure_events()) or context.failure_event.message or "unknown"
    return RunRequest(
        run_key=f"opened:{run.run_id}", run_config=pipeline_alert_run_config(run.job_name, run.run_id, "opened", error)
    )


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    request_job=pipeline_alert_job,
    default_status=DefaultSensorStatus.RUNNING,
    description="A successful run after a failed one of the same job resolves that job's pipeline_failure alert.",
)
def pipeline_failure_resolves(context: RunStatusSensorContext):
    run = context.dagster_run
    if run.job_name in MONITORED_JOBS and previous_run_failed(context.instance, run.job_name, run.run_id):
        return RunRequest(
            run_key=f"resolved:{run.run_id}", run_config=pipeline_alert_run_config(run.job_name, run.run_id, "resolved")
        )
    return None
