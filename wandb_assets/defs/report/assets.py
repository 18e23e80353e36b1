"""``fleet_report``: publish unpublished fleet snapshots to the long-lived W&B report run."""

import os

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.assets import warehouse_snapshot
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.report import REPORT_RUN_ID, publish_report
from wandb_assets.warehouse import snapshot_path


def report_settings() -> dict | None:
    """Where the report goes (``WANDB_ASSETS_REPORT_PROJECT`` and friends); None when it is switched off."""
    project = (os.environ.get("WANDB_ASSETS_REPORT_PROJECT") or "").strip()
    if not project:
        return None
    return {
        "project": project,
        "entity": (os.environ.get("WANDB_ASSETS_REPORT_ENTITY") or os.environ.get("WANDB_ENTITY") or "").strip()
        or None,
        "run_id": (os.environ.get("WANDB_ASSETS_REPORT_RUN_ID") or REPORT_RUN_ID).strip(),
        "mode": (os.environ.get("WANDB_ASSETS_REPORT_MODE") or "").strip() or None,
    }


def publish(warehouse: WarehouseResource, wandb: WandbResource, log) -> dict:
    """Publish what is pending; returns metadata for the materialization or the CLI."""
    settings = report_settings()
    if settings is None:
        return {"status": "disabled (set WANDB_ASSETS_REPORT_PROJECT)"}
    api_key = None if settings["mode"] == "offline" else wandb.wandb_settings().api_key
    with warehouse.get_connection() as con:
        result = publish_report(
            con,
            snapshot_path(warehouse.database),
            settings["project"],
            settings["entity"],
            settings["run_id"],
            mode=settings["mode"],
            api_key=api_key,
        )
    if result.published:
        log.info(
            f"Published {len(result.published)} fleet snapshot(s) to W&B run {result.run_path}, "
            f"{result.published[0].isoformat()}Z .. {result.published[-1].isoformat()}Z"
        )
    return {
        "status": "published" if result.published else "up to date",
        "snapshots_published": len(result.published),
        "run": result.run_path,
        "first": result.published[0].isoformat() + "Z" if result.published else "",
        "last": result.published[-1].isoformat() + "Z" if result.published else "",
    }


@asset(
    description="Publishes every fleet snapshot not yet published to one long-lived W&B run (stable id, resumed): "
    "gauges against fleet/snapshot_unix, alerts and SPS tables, SPS plots, an HTML dashboard, the warehouse "
    "artifact. A no-op unless WANDB_ASSETS_REPORT_PROJECT is set.",
    group_name="feed",
    kinds={"wandb", "duckdb"},
    owners=["team:ml-platform"],
    pool=WAREHOUSE_POOL,
    deps=[warehouse_snapshot],
)
def fleet_report(
    context: AssetExecutionContext, warehouse: WarehouseResource, wandb: WandbResource
) -> MaterializeResult:
    metadata = publish(warehouse, wandb, context.log)
    return MaterializeResult(metadata={k: MetadataValue.text(str(v)) for k, v in metadata.items()})
