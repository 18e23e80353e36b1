"""Tables derived from ``runs`` (rebuilt whole, in SQL) and the fleet snapshot (appended each tick)."""

from collections.abc import Callable

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.accounting.budgets import record_budgets
from wandb_assets.lib.accounting.costs import cost_cells, cost_summary, coverage_sentence
from wandb_assets.lib.accounting.prices import unknown_price_key_warning
from wandb_assets.lib.clock import configured_time, utc_now
from wandb_assets.lib.derived import (
    push_to_main_sps_rows,
    rebuild_gpu_hours,
    rebuild_gpu_usage,
    rebuild_success_rates,
)
from wandb_assets.lib.gauges import GAUGES, format_gauge, gauge_unit
from wandb_assets.lib.markdown import markdown_table
from wandb_assets.lib.sql import transaction
from wandb_assets.lib.warehouse import PROJECT_SUMMARY_SQL, record_snapshot
from wandb_assets.settings import alert_thresholds, pipeline_settings

COMMON = {
    "group_name": "fleet",
    "kinds": {"duckdb"},
    "owners": ["team:ml-platform"],
    # wandb_projects too: recording the mirror set marks the runs of a project that left (their hours stop at their
    # last heartbeat), so the derived tables are built after it, from the runs as they stand
    "deps": [AssetKey("runs"), AssetKey("wandb_projects"), AssetKey("offline_runs"), AssetKey("run_curves")],
    "pool": WAREHOUSE_POOL,
}


def derived_table_asset(
    table: str, description: str, rebuild: Callable, order_by: str, time_column: str, after: tuple[str, ...] = ()
) -> AssetsDefinition:
    """An asset that rebuilds one whole table in SQL (from ``runs``, and the tables ``after``); metadata: rows, time
    covered, a preview."""

    options = {**COMMON, "deps": [*COMMON["deps"], *(AssetKey(name) for name in after)]}

    @asset(name=table, description=description, **options)
    @names_the_warehouse
    def _derived(warehouse: WarehouseResource) -> MaterializeResult:
        with warehouse.get_connection() as con:
            rows = rebuild(con)
            first, last = con.execute(f"SELECT min({time_column}), max({time_column}) FROM {table}").fetchone()
            cursor = con.execute(f"SELECT * FROM {table} ORDER BY {order_by} LIMIT 10")
            columns = [d[0] for d in cursor.description]
            preview = markdown_table(columns, cursor.fetchall())
        covered = f"{first} .. {last} (UTC, by {time_column})" if first else "empty"
        metadata = {"rows": rows, "covers": covered, "writer_held_s": round(warehouse.last_writer_hold_s(), 3)}
        return MaterializeResult(metadata={**metadata, "preview": MetadataValue.md(preview)})

    return _derived


push_to_main_sps = derived_table_asset(
    "push_to_main_sps",
    "One row per push-to-main CI run: its CI fields, state, end time and the five SPS values (a view of runs: "
    "always as runs holds them; this step reports its rows).",
    push_to_main_sps_rows,
    "ended_at DESC NULLS LAST",
    "created_at",
)
success_rates = derived_table_asset(
    "success_rates",
    "Per UTC day (of ended_at) and category, plus 'all': finished, failed+crashed, other ended runs, "
    "and success rate % = finished / (finished + failed + crashed).",
    rebuild_success_rates,
    "day DESC, category",
    "day",
)
gpu_hours = derived_table_asset(
    "gpu_hours",
    "Per UTC day and category, plus 'all': GPU-hours consumed that day (each run's [created_at, "
    "ended_at or now] clipped to the day, times gpu_count; pending runs count 0), rolled up from gpu_usage as it "
    "was just built (its now): the two tables agree to the run-day.",
    rebuild_gpu_hours,
    "day DESC, category",
    "day",
    after=("gpu_usage",),
)


#: The days of cost by team and project in gpu_usage's metadata.
COST_METADATA_DAYS = 30


def _cost_table(summary) -> MetadataValue:
    """Cost lines as a narrow table, the name first: USD, and the share of GPU-hours it prices."""
    schema = TableSchema(
        columns=[
            TableColumn(summary.by, "string"),
            TableColumn("USD", "string", description="cost_usd; NULL GPU-hours are not in it"),
            TableColumn("priced", "string", description="share of the GPU-hours with a price (list or fallback)"),
        ]
    )
    rows = [
        TableRecord({summary.by: line.name, "USD": cells[1], "priced": cells[2]})
        for line in (*summary.lines, summary.total)
        for cells in [cost_cells(line)]
    ]
    return MetadataValue.table(rows, schema)


UNPRICED_SCHEMA = TableSchema(
    columns=[TableColumn("gpu_model", "string"), TableColumn("GPU-hours", "float", description="without a price")]
)


@asset(
    description="Per UTC day, project, user, team, category and GPU model: runs, GPU-hours (the gpu_hours rule) and "
    "USD (WANDB_ASSETS_GPU_PRICES, else WANDB_ASSETS_GPU_DEFAULT_PRICE, labelled in price_basis; a model without "
    "either costs NULL and is listed here, never 0); teams from WANDB_ASSETS_TEAMS (else unassigned). Rebuilt "
    "whole; running runs count up to now. Its metadata: cost by team and by project over the last 30 days, with "
    "the share of GPU-hours priced.",
    **COMMON,
)
@names_the_warehouse
def gpu_usage(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pipeline = pipeline_settings()
    for key in pipeline.unknown_price_keys:
        context.log.warning(
            f"{unknown_price_key_warning(key)}: it applies only to runs recording exactly that name (see "
            "docs/gpu-accounting.md for the model names)."
        )
    now = utc_now()
    with warehouse.get_connection() as con:
        idle_pct = alert_thresholds().idle_gpu_pct
        rows = rebuild_gpu_usage(con, now, pipeline.gpu_prices, pipeline.teams, idle_pct, pipeline.close_after_days)
        with transaction(con):
            record_budgets(con, list(pipeline.budgets))
        by_team, by_project = (cost_summary(con, by, now.date(), COST_METADATA_DAYS) for by in ("team", "project"))
        unpriced = con.execute(
            "SELECT coalesce(gpu_model, '(no model)'), round(sum(gpu_hours), 2) FROM gpu_usage "
            "WHERE cost_usd IS NULL AND gpu_hours > 0 GROUP BY 1 ORDER BY 2 DESC"
        ).fetchall()
        totals = con.execute("SELECT round(sum(gpu_hours), 2), round(sum(cost_usd), 2) FROM gpu_usage").fetchone()
    if unpriced:
        context.log.warning(f"GPU models without a price (cost NULL): {', '.join(m for m, _ in unpriced)}")
    return MaterializeResult(
        metadata={
            "cost_by_team_30d": _cost_table(by_team),
            "cost_by_project_30d": _cost_table(by_project),
            "priced_gpu_hours_pct_30d": round(by_team.total.priced_pct, 1),
            "cost_coverage": coverage_sentence(by_team),
            "rows": rows,
            "gpu_hours_total": totals[0] or 0.0,
            "cost_usd_total": totals[1] or 0.0,
            "models_without_price": MetadataValue.table(
                [TableRecord({"gpu_model": m, "GPU-hours": h}) for m, h in unpriced], UNPRICED_SCHEMA
            ),
            "unknown_price_keys": ", ".join(pipeline.unknown_price_keys) or "none",
            "writer_held_s": round(warehouse.last_writer_hold_s(), 3),
        }
    )


class SnapshotConfig(Config):
    """``snapshot_at`` (ISO-8601: ``Z``, an offset, or none for UTC) pins the snapshot time; empty means now."""

    snapshot_at: str = ""


#: The UI gives a metadata table the width of one cell (about 430 px at 1440 px, less when a key is long: so no entry
#: per gauge, whose 30-character keys took 130 px from every table): every table here has its name column first and
#: at most three short columns, and a wide one is split. Each gauge's history is in fleet_metrics and Datadog.

#: The gauges of each snapshot, one table per family (``wandb.<family>.``), the gauge named within its family.
GAUGE_TABLE_SCHEMA = TableSchema(
    columns=[
        TableColumn("gauge", "string", description="wandb.<family>.<gauge>: the Datadog / warehouse name"),
        TableColumn("value", "string", description="rounded as people read it, with its unit"),
    ]
)


def gauge_tables(gauges: dict[str, float | None]) -> dict[str, MetadataValue]:
    """``{"gauges_<family>": table}`` of the snapshot's gauges, families in the order GAUGES gives them."""
    families: dict[str, list[TableRecord]] = {}
    for g in GAUGES:
        family, _, short = g.name.removeprefix("wandb.").partition(".")
        value = gauges.get(g.name)
        shown = "NULL" if value is None else f"{format_gauge(g.name, value)} {gauge_unit(g.name)}"
        families.setdefault(family, []).append(TableRecord({"gauge": short, "value": shown}))
    return {f"gauges_{family}": MetadataValue.table(rows, GAUGE_TABLE_SCHEMA) for family, rows in families.items()}


#: The per-project breakdown of each snapshot (``PROJECT_SUMMARY_SQL``), in two narrow tables: now, and GPU-hours.
PROJECTS_NOW_SCHEMA = TableSchema(
    columns=[
        TableColumn("project", "string", description="entity/project"),
        TableColumn("active", "int", description="wandb.runs.active"),
        TableColumn("failed 24 h", "int", description="wandb.runs.failed_24h"),
    ]
)
PROJECTS_GPU_SCHEMA = TableSchema(
    columns=[
        TableColumn("project", "string", description="entity/project"),
        TableColumn("GPU-h 24 h", "float", description="wandb.training.total_gpu_hours_24h"),
        TableColumn("runs, all time", "int", description="the project's rows in runs"),
    ]
)


def project_tables(projects: list[tuple]) -> dict[str, MetadataValue]:
    now = [TableRecord({"project": p, "active": a or 0, "failed 24 h": f or 0}) for p, _, a, f, _ in projects]
    gpu = [
        TableRecord({"project": p, "GPU-h 24 h": round(g or 0.0, 2), "runs, all time": r}) for p, r, _, _, g in projects
    ]
    return {
        "projects_now": MetadataValue.table(now, PROJECTS_NOW_SCHEMA),
        "projects_gpu_hours": MetadataValue.table(gpu, PROJECTS_GPU_SCHEMA),
    }


@asset(
    description="Appends one snapshot of the fleet gauges to fleet_metrics (snapshot_at, metric, value), the same "
    "gauges per project to project_metrics, and each running run's GPUs to gpu_samples.",
    group_name="fleet",
    kinds={"duckdb"},
    owners=["team:ml-platform"],
    pool=WAREHOUSE_POOL,
    deps=[AssetKey(k) for k in ("runs", "wandb_projects", "push_to_main_sps", "success_rates", "gpu_hours")],
)
@names_the_warehouse
def fleet_snapshot(
    context: AssetExecutionContext, config: SnapshotConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    snapshot_at = configured_time(config.snapshot_at, "snapshot_at") or utc_now()
    thresholds = alert_thresholds()  # the idle threshold of the GPU gauges
    with warehouse.get_connection() as con:
        gauges = record_snapshot(
            con,
            snapshot_at,
            thresholds.idle_gpu_pct,
            pipeline_settings().project_metrics_days,
        )
        snapshots = con.execute("SELECT count(DISTINCT snapshot_at) FROM fleet_metrics").fetchone()[0]
        projects = con.execute(PROJECT_SUMMARY_SQL).fetchall()
    defined = sum(v is not None for v in gauges.values())
    context.log.info(f"Fleet snapshot at {snapshot_at.isoformat()}Z: {defined}/{len(gauges)} gauges defined")
    return MaterializeResult(
        metadata={
            "snapshot_at_utc": snapshot_at.isoformat(),
            "window": f"({snapshot_at.isoformat()} - 24h, {snapshot_at.isoformat()}]",
            "gauges_defined": defined,
            "snapshots_total": snapshots,
            **gauge_tables(gauges),
            **project_tables(projects),
        }
    )
