"""The curves of the runs, in two steps like the runs themselves: ``staged_curves`` reads the curves of the runs due
(a share of the backlog, with the warehouse closed) into point files, ``run_curves`` loads them in one transaction."""

import shutil
from datetime import UTC, datetime

from dagster import AssetExecutionContext, AssetKey, MaterializeResult, MetadataValue, asset

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.curves import REJECTED_FOLDER, CurvesFolder, published_folders
from wandb_assets.lib.curves_warehouse import due_curves, load_curves_setting_aside, sps_metric_advice
from wandb_assets.settings import alert_thresholds, pipeline_settings


@asset(
    deps=[AssetKey("runs")],
    group_name="wandb",
    kinds={"wandb", "parquet"},
    owners=["team:ml-platform"],
    description=(
        "The curves of the runs due (once after a run ends, at most every WANDB_ASSETS_HISTORY_REFRESH_MINUTES while "
        "it runs, again after a failed read): their sampled history of WANDB_ASSETS_HISTORY_KEYS and their GPUs' "
        "system stream, 20 runs a request, at most WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs a run (the newest ended "
        "first; the rest wait for the next runs of the curves job), as point files under "
        "WANDB_ASSETS_STAGING_DIR/curves. A failed request leaves its runs 'failed' and never fails the others. Off "
        "unless WANDB_ASSETS_FETCH_HISTORY."
    ),
)
@names_the_warehouse
def staged_curves(
    context: AssetExecutionContext, wandb: WandbResource, warehouse: WarehouseResource
) -> MaterializeResult:
    pipeline = pipeline_settings()
    if not pipeline.fetch_history:
        context.log.info("Curves are not read (WANDB_ASSETS_FETCH_HISTORY is false)")
        return MaterializeResult(metadata={"runs_due": 0, "more_due": 0, "reading": "off (WANDB_ASSETS_FETCH_HISTORY)"})
    now = datetime.now(UTC).replace(tzinfo=None)
    with warehouse.get_read_connection() as con:  # read-only and short: closed before any request goes out
        due, backlog = due_curves(con, now, pipeline.history_refresh, pipeline.history_runs_per_tick)
    more = backlog - len(due)
    folder = CurvesFolder(pipeline.staging_dir, f"{now:%Y%m%dT%H%M%S%f}-{context.run_id[:8]}")
    statuses: dict[str, int] = {}

    def on_read(path: str, final: dict[str, bool], read: dict[str, dict]) -> None:
        for status, runs in folder.add(path, final, read).items():
            statuses[status] = statuses.get(status, 0) + runs
        failed = [curves["error"] for curves in read.values() if curves["status"] == "failed"]
        if failed:
            context.log.warning(f"Curves of {len(failed)} run(s) of {path} not read (asked again later): {failed[0]}")

    try:
        throttle = wandb.due_curves(due, on_read, pipeline) if due else None
        published = folder.publish()
    finally:
        folder.discard()
    requests = throttle.requests if throttle else 0
    context.log.info(
        f"Read the curves of {len(due)} run(s) in {requests} request(s): {statuses or 'none due'}"
        + (f"; {more} more due, read by the next runs (WANDB_ASSETS_HISTORY_RUNS_PER_TICK)" if more else "")
    )
    return MaterializeResult(
        metadata={
            "runs_due": len(due),
            "more_due": more,
            "runs_per_tick": pipeline.history_runs_per_tick,
            "requests": requests,
            "max_requests_in_flight": throttle.max_in_flight if throttle else 0,
            "points": folder.points,
            "by_status": MetadataValue.json(statuses),
            "folder": MetadataValue.path(str(published)) if published else "(nothing read)",
        }
    )


@asset(
    deps=[AssetKey("staged_curves")],
    pool=WAREHOUSE_POOL,
    group_name="wandb",
    kinds={"duckdb"},
    owners=["team:ml-platform"],
    description=(
        "The curves read, loaded in one short transaction: run_history (metric, step, timestamp, value) and "
        "run_gpu_samples (timestamp, gpu, utilisation, memory, power) of each run read, replacing its earlier ones; "
        "the run's curves_status, curves_read_at, curves_final and sps_steady; and run_curve_idle, its idle and "
        "partly idle GPU-hours per UTC day from its whole sampled stream once it has ended (gpu_usage's idle)."
    ),
)
@names_the_warehouse
def run_curves(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pipeline = pipeline_settings()
    thresholds = alert_thresholds()
    folders = published_folders(pipeline.staging_dir)
    now = datetime.now(UTC).replace(tzinfo=None)
    with warehouse.get_connection() as con:
        counts, rejected = load_curves_setting_aside(con, folders, thresholds.sps_metric, thresholds.idle_gpu_pct, now)
        stored = con.execute(
            "SELECT (SELECT count(*) FROM run_history), (SELECT count(*) FROM run_gpu_samples), "
            "(SELECT count(*) FROM runs WHERE curves_status IS NOT NULL)"
        ).fetchone()
        advice = sps_metric_advice(con, thresholds.sps_metric)
    held = warehouse.last_writer_hold_s()
    if advice:
        context.log.warning(advice)
    for folder in rejected:  # the tables cannot hold it: kept for a look, never loaded again; its runs are failed
        aside = folder.parent / REJECTED_FOLDER
        aside.mkdir(exist_ok=True)
        folder.rename(aside / folder.name)
        context.log.warning(f"Set aside curves the warehouse cannot hold: {aside / folder.name} (its runs: failed)")
    for folder in folders:  # loaded: the next run must not load them again
        if folder.exists():
            shutil.rmtree(folder)
    points = counts.pop("points", 0)
    restated = counts.pop("steady_restated", 0)
    context.log.info(f"Loaded the curves of {sum(counts.values())} run(s) ({points} points) in {held:.2f} s")
    return MaterializeResult(
        metadata={
            "runs_loaded": sum(counts.values()),
            "by_status": MetadataValue.json(counts),
            "points_loaded": points,
            "steady_sps_restated": restated,
            "history_points_total": stored[0],
            "gpu_samples_total": stored[1],
            "runs_with_curves_status": stored[2],
            "writer_held_s": round(held, 3),
        }
    )
