"""One whole tick in this process, as the CLI runs it: refresh, then the feed, and an alert if either fails.

Under ``dagster dev`` the schedule launches the refresh and sensors launch the feed and the failure alert;
this module does the same in sequence for cron-less deployments (``wandb-assets refresh``).
"""

from __future__ import annotations

import logging
from datetime import date

from dagster import DagsterInstance, ExecuteInProcessResult

from wandb_assets.defs.feed.assets import open_pipeline_failure
from wandb_assets.defs.feed.jobs import execute_feed
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource
from wandb_assets.defs.fleet.assets import utc_now
from wandb_assets.defs.fleet.jobs import execute_refresh
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.resources import warehouse_resource

log = logging.getLogger("wandb_assets")


def failure_message(result: ExecuteInProcessResult) -> str:
    """The innermost error of the first failed step: the sentence a person needs."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            while error.cause is not None:
                error = error.cause
            text = error.message.strip()
            return f"step {event.step_key}: {text.splitlines()[-1] if text else error.cls_name}"
    return f"run {result.run_id} failed; see the Dagster UI for the logs"


def alert_on_failure(result: ExecuteInProcessResult) -> None:
    """Open the pipeline_failure alert for a failed in-process run (the run-failure sensor's work)."""
    try:
        open_pipeline_failure(
            warehouse_resource(),
            DatadogResource(wandb=wandb_resource()),
            AlertChannelsResource(),
            result.job_def.name,
            result.run_id,
            failure_message(result),
            utc_now(),
            log,
        )
    except Exception as exc:  # noqa: BLE001 - the original failure is what the caller reports
        log.warning(f"Could not record the pipeline_failure alert: {exc}")


def run_tick(
    instance: DagsterInstance, today: date, snapshot_at: str = "", now: str = ""
) -> list[ExecuteInProcessResult]:
    """Refresh then feed; returns the results of the runs made (the last one failed if any did)."""
    refresh = execute_refresh(instance, today, snapshot_at=snapshot_at)
    if not refresh.success:
        alert_on_failure(refresh)
        return [refresh]
    feed = execute_feed(instance, now=now)
    if not feed.success:
        alert_on_failure(feed)
    return [refresh, feed]
