"""The ``runs`` asset: a mirror of the W&B project's runs, partitioned daily by ``createdAt`` (UTC)."""

from collections import Counter
from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.normalize import run_row, to_naive_utc
from wandb_assets.lib.warehouse import replace_runs_window
from wandb_assets.settings import pipeline_settings

daily_partitions = DailyPartitionsDefinition(
    start_date=pipeline_settings().start_date.isoformat(), timezone="UTC", end_offset=1
)

PREVIEW_SQL = """
SELECT run_id, name, state, category, strftime(created_at, '%Y-%m-%d %H:%M') AS created_utc,
       round(duration_hours, 2) AS hours, gpu_count
FROM runs WHERE created_at >= $start AND created_at < $end ORDER BY created_at DESC LIMIT 10
"""


def markdown_table(columns: list[str], rows: list[tuple]) -> str:
    """A small markdown table for Dagster metadata."""
    cells = ["" if v is None else (f"{v:g}" if isinstance(v, float) else str(v)) for row in rows for v in row]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    width = len(columns)
    lines += ["| " + " | ".join(cells[i : i + width]) + " |" for i in range(0, len(cells), width)]
    return "\n".join(lines)


@asset(
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    pool=WAREHOUSE_POOL,
    group_name="wandb",
    kinds={"wandb", "duckdb"},
    owners=["team:ml-platform"],
    description=(
        "Every W&B run of the project, one row per run, partitioned by the UTC day it was created. "
        "Materializing a partition (or a range, in one run) re-reads that window from W&B and replaces it."
    ),
)
def runs(context: AssetExecutionContext, wandb: WandbResource, warehouse: WarehouseResource) -> MaterializeResult:
    pipeline = pipeline_settings()
    window = context.partition_time_window
    start, end = to_naive_utc(window.start), to_naive_utc(window.end)
    entity, project, app_url = wandb.project_path(pipeline)
    anomalies: Counter[str] = Counter()
    malformed: list[str] = []
    categories: Counter[str] = Counter()

    def rows() -> Iterator[dict]:
        for page in wandb.fetch_run_pages(start, end, pipeline):
            for node in page:
                row = run_row(
                    node, entity=entity, project=project, app_url=app_url, default_gpus=pipeline.default_gpus_per_run
                )
                categories[row["category"]] += 1
                if row["anomalies"]:
                    anomalies.update(row["anomalies"])
                    malformed.append(row["run_id"])
                yield row

    with warehouse.get_connection() as con:
        written = replace_runs_window(con, rows(), start, end)
        preview = con.execute(PREVIEW_SQL, {"start": start, "end": end}).fetchall()
        total = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    if malformed:
        context.log.warning(f"{len(malformed)} runs had malformed fields (kept with nulls): {dict(anomalies)}")
    context.log.info(
        f"Wrote {written} runs created {start:%Y-%m-%d} .. {end:%Y-%m-%d} (exclusive) for {entity}/{project}"
    )
    return MaterializeResult(
        metadata={
            "rows_written": written,
            "rows_total": total,
            "window_start_utc": start.isoformat(),
            "window_end_utc": end.isoformat(),
            "project": f"{entity}/{project}",
            "malformed_runs": len(malformed),
            "malformed_fields": MetadataValue.json(dict(anomalies)),
            "malformed_run_ids": MetadataValue.json(malformed[:50]),
            "by_category": MetadataValue.json(dict(categories)),
            "preview": MetadataValue.md(
                markdown_table(["run_id", "name", "state", "category", "created (UTC)", "hours", "gpus"], preview)
            ),
        }
    )
