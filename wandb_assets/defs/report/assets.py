"""``fleet_report``: publish unpublished fleet snapshots to the long-lived W&B report run."""

from datetime import timedelta

from dagster import AssetExecutionContext, AssetKey, Config, MaterializeResult, MetadataValue, asset

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.snapshot import snapshot_file
from wandb_assets.report import ArtifactPolicy, publish_report
from wandb_assets.settings import Settings, load_settings


def report_target(settings: Settings) -> tuple[str, str | None, str, str | None] | None:
    """``(project, entity, run_id, mode)`` of the report run; None when it is switched off."""
    if not settings.WANDB_ASSETS_REPORT_PROJECT:
        return None
    entity = settings.WANDB_ASSETS_REPORT_ENTITY or settings.WANDB_ENTITY
    return (
        settings.WANDB_ASSETS_REPORT_PROJECT,
        entity,
        settings.WANDB_ASSETS_REPORT_RUN_ID,
        settings.WANDB_ASSETS_REPORT_MODE,
    )


def publish(warehouse: WarehouseResource, wandb: WandbResource, log, force_artifact: bool = False) -> dict:
    """Publish what is pending; returns metadata for the materialization or the CLI."""
    settings = load_settings()
    target = report_target(settings)
    if target is None:
        return {"status": "disabled (set WANDB_ASSETS_REPORT_PROJECT)"}
    project, entity, run_id, mode = target
    api_key = None if mode == "offline" else wandb.wandb_settings().api_key
    policy = ArtifactPolicy(
        ttl=timedelta(days=settings.WANDB_ASSETS_REPORT_ARTIFACT_TTL_DAYS),
        raw=settings.WANDB_ASSETS_REPORT_RAW,
        force=force_artifact,
    )
    result = publish_report(
        warehouse.get_connection,
        warehouse.lake or snapshot_file(warehouse.database),
        project,
        entity,
        run_id,
        mode=mode,
        api_key=api_key,
        artifact_policy=policy,
    )
    # offline mode writes a local run directory (`wandb sync` uploads it later): never say "published" for it
    done = "written offline (upload it with `wandb sync`)" if mode == "offline" else "published"
    if result.published:
        log.info(
            f"{'Wrote' if mode == 'offline' else 'Published'} {len(result.published)} fleet snapshot(s) "
            f"{'offline for' if mode == 'offline' else 'to'} W&B run {result.run_path}, "
            f"{result.published[0].isoformat()}Z .. {result.published[-1].isoformat()}Z"
        )
    return {
        "status": done if result.published else "up to date",
        "snapshots_published": len(result.published),
        "run": result.run_path,
        "first": result.published[0].isoformat() + "Z" if result.published else "",
        "last": result.published[-1].isoformat() + "Z" if result.published else "",
        "warehouse_artifact": result.artifact,
    }


class ReportConfig(Config):
    """``force_artifact`` publishes the warehouse artifact even if one went out today (``wandb-assets publish``)."""

    force_artifact: bool = False


@asset(
    description="Publishes every fleet snapshot not yet published to one long-lived W&B run (stable id, resumed): "
    "gauges against fleet/snapshot_unix, alerts and SPS tables, SPS plots, an HTML dashboard, and once a day the "
    "warehouse artifact (with a TTL, without raw run JSON). A no-op unless WANDB_ASSETS_REPORT_PROJECT is set.",
    group_name="feed",
    kinds={"wandb", "duckdb"},
    owners=["team:ml-platform"],
    pool=WAREHOUSE_POOL,
    deps=[AssetKey("warehouse_snapshot")],
)
@names_the_warehouse
def fleet_report(
    context: AssetExecutionContext, config: ReportConfig, warehouse: WarehouseResource, wandb: WandbResource
) -> MaterializeResult:
    metadata = publish(warehouse, wandb, context.log, force_artifact=config.force_artifact)
    return MaterializeResult(metadata={k: MetadataValue.text(str(v)) for k, v in metadata.items()})
