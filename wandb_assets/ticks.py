"""Running the pipeline's jobs in this process, as the CLI does: a whole tick, a backfill, the feed, the
report, and the pipeline_failure alert around them. Under ``dagster dev`` the schedule and sensors launch
the same jobs; this module does the same in sequence for cron-less deployments (``wandb-assets refresh``).

It builds the definitions a job needs (``wandb_assets.defs.build_definitions``; all but the analysts' dbt project
unless the job is theirs, whose import is 1-2 s of a command's start), once each a process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import date

from dagster import DagsterInstance, DagsterRunStatus, Definitions, ExecuteInProcessResult, RunsFilter
from dagster._core.errors import DagsterExecutionInterruptedError

from wandb_assets.defs import build_definitions
from wandb_assets.defs.analytics import ANALYTICS_JOB
from wandb_assets.defs.feed.github import GITHUB_CHECKS_JOB
from wandb_assets.defs.feed.jobs import FEED_JOB
from wandb_assets.defs.feed.pipeline_failure import (
    PIPELINE_ALERT_JOB,
    pipeline_alert_run_config,
    previous_run_failed,
    step_failure_sentence,
)
from wandb_assets.defs.fleet.jobs import (
    BACKFILL_JOB,
    CURVES_JOB,
    OFFLINE_JOB,
    REFRESH_JOB,
    TICK_RUN_CONFIG,
    partition_range_tags,
    plan_tick,
)
from wandb_assets.defs.report.jobs import REPORT_JOB
from wandb_assets.settings import github_target, pipeline_settings, warehouse_label

log = logging.getLogger("wandb_assets")

#: CLI runs log INFO and up to the console (step events are DEBUG; ``console_level`` of ``_execute``); everything
#: still goes to the event log.


#: The tag naming the process that runs a job in process: an operator's Ctrl-C cancels that process's runs alone.
PROCESS_TAG = "wandb-assets/pid"
#: The tag naming the warehouse a run wrote (the UI's runs list and each run's page show it).
WAREHOUSE_TAG = "wandb-assets/warehouse"


@functools.cache
def _definitions(analytics: bool) -> Definitions:
    return build_definitions(analytics=analytics)


class Interrupted(KeyboardInterrupt):
    """The operator stopped the command (Ctrl-C, or SIGTERM): its run is canceled, not failed, so nothing pages."""


def _execute(
    instance: DagsterInstance,
    job_name: str,
    run_config: dict | None = None,
    tags: dict | None = None,
    console_level: str = "INFO",
):
    """``job_name`` in this process. In the main thread the run executes on a thread of its own, so Ctrl-C reaches
    our handler rather than Dagster's (which fails the step, and a failed run pages): it marks the run canceling and
    interrupts it, Dagster records it CANCELED (the pipeline_failure sensors pass over cancels), and ``Interrupted``
    is raised. SIGTERM (a supervisor's stop, ``kill``) does the same. Handling SIGTERM during the run also means
    the processes the run starts never inherit it ignored: Dagster maps SIGTERM to SIGINT's handler as its own runs
    end, which is "ignore" in a process started in the background by a script (SIGINT ignored there), and Dagster
    stops each step's ``tail -F`` log mirrors with SIGTERM, waiting 30 s for each before it leaves them running
    (60 s a step, and two ``tail`` processes that outlive the command holding its output open). Elsewhere (a
    sensor's thread) the job simply runs."""
    job = _definitions(analytics=job_name == ANALYTICS_JOB).resolve_job_def(job_name)
    config = {"loggers": {"console": {"config": {"log_level": console_level}}}, **(run_config or {})}
    run_tags = {**(tags or {}), PROCESS_TAG: str(os.getpid()), WAREHOUSE_TAG: warehouse_label()}
    outcome: dict = {}

    def execute() -> None:
        if threading.current_thread() is not threading.main_thread():
            # Ctrl-C reaches the main thread alone, and the processes the run starts (Dagster's log watchers, the
            # fetch's workers) inherit it blocked: the terminal's SIGINT to the whole group stops none of them
            # mid-write (they end with us)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            outcome["result"] = job.execute_in_process(
                instance=instance, run_config=config, tags=run_tags, raise_on_error=False
            )
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    if threading.current_thread() is not threading.main_thread():
        execute()
    else:
        worker = threading.Thread(target=execute, name=f"run-{job_name}", daemon=True)
        interrupted: list[bool] = []

        def cancel(signum, frame) -> None:
            if interrupted:  # one Ctrl-C cancels; more while the run winds down change nothing
                return
            interrupted.append(True)
            why = "Interrupted by the operator (Ctrl-C)." if signum == signal.SIGINT else "Stopped by SIGTERM."
            mine = RunsFilter(statuses=[DagsterRunStatus.STARTED], tags={PROCESS_TAG: str(os.getpid())})
            for run in instance.get_runs(filters=mine):
                instance.report_run_canceling(run, message=why)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(worker.ident), ctypes.py_object(DagsterExecutionInterruptedError)
            )

        previous = {sig: signal.signal(sig, cancel) for sig in (signal.SIGINT, signal.SIGTERM)}
        terminal = sys.stderr
        sys.stderr = _QuietAfter(terminal, interrupted)  # the run's own lines of its cancel stay in its event log
        try:
            worker.start()
            while worker.is_alive():
                worker.join(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sys.stderr = terminal
        if interrupted:
            raise Interrupted
    if "error" in outcome:
        if isinstance(outcome["error"], (KeyboardInterrupt, DagsterExecutionInterruptedError)):
            raise Interrupted from None
        raise outcome["error"]
    return outcome["result"]


class _QuietAfter:
    """``stream``, silent once ``flag`` holds anything: what a canceled run logs goes to its event log (the UI), not
    to the operator's terminal, which gets one line."""

    def __init__(self, stream, flag: list) -> None:
        self._stream, self._flag = stream, flag

    def write(self, text: str) -> int:
        return len(text) if self._flag else self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def failure_message(result: ExecuteInProcessResult) -> str:
    """The innermost error of the first failed step: the sentence a person needs."""
    return step_failure_sentence(result.all_events) or f"run {result.run_id} failed; see the Dagster UI for the logs"


def settle_pipeline_alert(instance: DagsterInstance, result: ExecuteInProcessResult) -> None:
    """What the two pipeline_failure sensors do, for a run made in this process: a failed run opens its
    job's alert; a successful run after a failed one of the same job resolves it (outside the pool: it pages even
    while the warehouse is what failed)."""
    job_name, run_id = result.job_def.name, result.run_id
    if result.success:
        if not previous_run_failed(instance, job_name, run_id):
            return
        config = pipeline_alert_run_config(job_name, run_id, "resolved")
    else:
        config = pipeline_alert_run_config(job_name, run_id, "opened", failure_message(result))
    alert = _execute(instance, PIPELINE_ALERT_JOB, config)
    if not alert.success:
        log.warning(f"Could not record the pipeline_failure alert of {job_name}: {failure_message(alert)}")


def execute_refresh(instance: DagsterInstance, today: date, snapshot_at: str = "") -> ExecuteInProcessResult:
    """Exactly what one scheduled tick does, in this process."""
    first, last, _ = plan_tick(today)
    run_config = {"ops": {**TICK_RUN_CONFIG["ops"], "fleet_snapshot": {"config": {"snapshot_at": snapshot_at}}}}
    return _execute(instance, REFRESH_JOB, run_config, partition_range_tags(first, last))


def execute_backfill(
    instance: DagsterInstance,
    first: date,
    last: date,
    progress_lines: bool = True,
    projects: list[str] | None = None,
) -> ExecuteInProcessResult:
    """Re-read ``first..last`` (inclusive) from W&B in one run; ``projects``: only these mirrored projects (the
    others' rows stay as they are). ``progress_lines=False``: the fetch's progress lines go to the run's log at
    DEBUG only (the CLI draws a progress bar instead)."""
    level = "info" if progress_lines else "debug"
    run_config = {"ops": {"staged_runs": {"config": {"progress_log_level": level, "projects": projects or []}}}}
    return _execute(instance, BACKFILL_JOB, run_config, tags=partition_range_tags(first, last))


def execute_curves(instance: DagsterInstance) -> ExecuteInProcessResult:
    """The ``curves`` job in this process: a share of the curves due, loaded, and gpu_usage rebuilt."""
    return _execute(instance, CURVES_JOB)


def execute_analytics(instance: DagsterInstance, docs: bool = True, verbose: bool = True) -> ExecuteInProcessResult:
    """The ``analytics`` job in this process: ``dbt build`` of the analysts' project, then the snapshot. dbt's own
    log lines go to ``DBT_CONSOLE_LOG`` (each model and test is an event of the run anyway), not this console; without
    ``verbose`` the run's warnings too (dagster-dbt's notes on the sources' tests, every build), errors alone."""
    config = {"ops": {"analytics_models": {"config": {"docs": docs}}}}
    from wandb_assets.defs.analytics.project import open_dbt_console_log  # dbt: the analytics job's alone

    with open_dbt_console_log() as log_file, contextlib.redirect_stdout(log_file):
        return _execute(instance, ANALYTICS_JOB, config, console_level="INFO" if verbose else "ERROR")


def execute_offline(instance: DagsterInstance, paths: list[str], now: str = "") -> ExecuteInProcessResult:
    """Offline logs under ``paths`` into ``runs``, then the fleet tables and a snapshot (the ``offline`` job);
    ``now`` pins the clock (tests)."""
    return _execute(instance, OFFLINE_JOB, {"ops": {"offline_runs": {"config": {"paths": paths, "now": now}}}})


def execute_feed(instance: DagsterInstance, now: str = "") -> ExecuteInProcessResult:
    """The feed job in this process (what the sensor launches after a snapshot)."""
    clock = {"config": {"now": now}}
    return _execute(
        instance,
        FEED_JOB,
        {"ops": {"datadog_feed": clock, "fleet_alerts": clock, "idle_actions": clock, "pr_checks": clock}},
    )


def execute_github_checks(instance: DagsterInstance, now: str = "") -> ExecuteInProcessResult:
    """The ``github_checks`` job in this process (what the sensor launches after a feed, with a repository set)."""
    return _execute(instance, GITHUB_CHECKS_JOB, {"ops": {"github_checks": {"config": {"now": now}}}})


def execute_report(instance: DagsterInstance, force_artifact: bool = True) -> ExecuteInProcessResult:
    """``fleet_report`` in this process, in the warehouse pool (``wandb-assets publish``)."""
    return _execute(instance, REPORT_JOB, {"ops": {"fleet_report": {"config": {"force_artifact": force_artifact}}}})


def run_tick(
    instance: DagsterInstance,
    today: date,
    snapshot_at: str = "",
    now: str = "",
    say: Callable[[str], None] | None = None,
    verbose: bool = True,
) -> list[ExecuteInProcessResult]:
    """Refresh, feed, then (``WANDB_ASSETS_ANALYTICS``) the analysts' dbt models, as the schedule and sensors do;
    returns the results of the runs made (a failed one stops what depends on it; the GitHub delivery's failure does
    not stop the analysts' build). ``say`` is told what starts, in words;
    without ``verbose`` the dbt build's warnings stay in its run's log."""
    say = say or (lambda sentence: None)
    say("Refreshing: reading the recent days from W&B, rebuilding the tables, snapshotting the gauges ...")
    refresh = execute_refresh(instance, today, snapshot_at=snapshot_at)
    settle_pipeline_alert(instance, refresh)
    if not refresh.success:
        return [refresh]
    say("Feeding Datadog and judging the alerts ...")
    feed = execute_feed(instance, now=now)
    settle_pipeline_alert(instance, feed)
    if not feed.success:
        return [refresh, feed]
    done = [refresh, feed]
    if github_target() is not None:
        say("Sending the pull requests' throughput verdicts to GitHub ...")
        github = execute_github_checks(instance, now=now)
        settle_pipeline_alert(instance, github)
        done.append(github)  # a GitHub failure is its own alert; the analysts' build does not wait on it
    if not pipeline_settings().analytics:
        return done
    say("Building the analysts' dbt models, their tests and docs (WANDB_ASSETS_ANALYTICS; a minute or two) ...")
    analytics = execute_analytics(instance, verbose=verbose)
    settle_pipeline_alert(instance, analytics)
    return [*done, analytics]
