"""The analysts' read-only snapshot of the warehouse, published after every successful tick or backfill."""

from pathlib import Path

from dagster import AssetKey, MaterializeResult, MetadataValue, asset

from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.lake import current_snapshot_id
from wandb_assets.lib.snapshot import publish_snapshot
from wandb_assets.lib.warehouse import latest_snapshot_at, row_counts


@asset(
    description="A read-only copy of the warehouse next to it (<name>.snapshot.duckdb), built on the side and "
    "swapped in atomically; notebooks open it (wandb_assets.warehouse.open_snapshot) and never block the pipeline. "
    "In DuckLake mode no copy is made (readers attach the lake): it records the lake's snapshot id.",
    group_name="warehouse",
    kinds={"duckdb"},
    owners=["team:ml-platform"],
    pool=WAREHOUSE_POOL,
    deps=[
        AssetKey(key)
        for key in (
            "runs",
            "push_to_main_sps",
            "success_rates",
            "gpu_hours",
            "fleet_snapshot",
            "datadog_feed",
            "fleet_alerts",
            "idle_actions",
            "pr_checks",
            "team_gpu_cost_monthly",  # the analysts' dbt marts: in the analytics job, published after the build
        )
    ],
)
@names_the_warehouse
def warehouse_snapshot(warehouse: WarehouseResource) -> MaterializeResult:
    with warehouse.get_connection() as con:
        counts = row_counts(con)
        latest = latest_snapshot_at(con)
        lake_snapshot = current_snapshot_id(con)
        target = None if warehouse.lake else publish_snapshot(con, warehouse.database)
    common = {
        "latest_fleet_snapshot_utc": latest.isoformat() if latest else "",
        "row_counts": MetadataValue.json(counts),
    }
    if target is None:  # DuckLake: readers attach the lake itself and see its committed snapshots; no copy
        return MaterializeResult(
            metadata={"lake": str(warehouse.database), "lake_snapshot_id": lake_snapshot, **common}
        )
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(target)),
            "size_mib": round(Path(target).stat().st_size / 2**20, 2),
            **common,
        }
    )
