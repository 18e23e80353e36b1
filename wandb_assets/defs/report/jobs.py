"""The report job: ``wandb-assets publish`` runs ``fleet_report`` through it, in the warehouse pool."""

from dagster import AssetSelection, define_asset_job, in_process_executor

REPORT_JOB = "report"

report_job = define_asset_job(
    REPORT_JOB,
    selection=AssetSelection.keys("fleet_report"),
    executor_def=in_process_executor,
    description="Publish unpublished fleet snapshots (and the warehouse artifact) to the W&B report run.",
)
