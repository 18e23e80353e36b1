"""The ``runs`` asset: a mirror of the W&B project's runs, partitioned daily by ``createdAt`` (UTC)."""

import os
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
from wandb_assets.lib.fetch import created_between, with_ids
from wandb_assets.lib.markdown import markdown_table
from wandb_assets.lib.normalize import run_row, to_naive_utc
from wandb_assets.lib.warehouse import load_runs_window, stage_rows, unfinished_run_ids
from wandb_assets.settings import pipeline_settings

daily_partitions = DailyPartitionsDefinition(
    start_date=pipeline_settings().start_date.isoformat(), timezone="UTC", end_offset=1
)

#: Older unfinished runs are refreshed by id, this many per request (a filter stays a reasonable size).
IDS_PER_REQUEST = 500

PREVIEW_SQL = """
SELECT run_id, name, state, category, strftime(created_at, '%Y-%m-%d %H:%M') AS created_utc,
       round(duration_hours, 2) AS hours, gpu_count
FROM runs WHERE created_at >= $start AND created_at < $end ORDER BY created_at DESC LIMIT 10
"""


@asset(
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    pool=WAREHOUSE_POOL,
    group_name="wandb",
    kinds={"wandb", "duckdb"},
    owners=["team:ml-platform"],
    description=(
        "Every W&B run of the project, one row per run, partitioned by the UTC day it was created. "
        "Materializing a partition (or a range, in one run) re-reads that window from W&B and replaces it; "
        "runs still unfinished from before the window are refreshed by id (500 per request)."
    ),
)
def runs(context: AssetExecutionContext, wandb: WandbResource, warehouse: WarehouseResource) -> MaterializeResult:
    pipeline = pipeline_settings()
    window = context.partition_time_window
    start, end = to_naive_utc(window.start), to_naive_utc(window.end)
    entity, project, app_url = wandb.project_path(pipeline)
    with warehouse.get_connection() as con:
        older_unfinished = unfinished_run_ids(con, start)
    anomalies: Counter[str] = Counter()
    malformed: list[str] = []
    categories: Counter[str] = Counter()

    def rows() -> Iterator[dict]:
        chunks = range(0, len(older_unfinished), IDS_PER_REQUEST)
        queries = [created_between(start, end)] + [with_ids(older_unfinished[i : i + IDS_PER_REQUEST]) for i in chunks]
        for filters in queries:
            for page in wandb.fetch_run_pages(filters, pipeline):
                for node in page:
                    row = run_row(
                        node,
                        entity=entity,
                        project=project,
                        app_url=app_url,
                        default_gpus=pipeline.default_gpus_per_run,
                    )
                    categories[row["category"]] += 1
                    if row["anomalies"]:
                        anomalies.update(row["anomalies"])
                        malformed.append(row["run_id"])
                    yield row

    # Fetch and stage with the warehouse closed (a failed fetch writes nothing); hold the writer only to load.
    staged, written = stage_rows(rows())
    try:
        with warehouse.get_connection() as con:
            load_runs_window(con, staged, start, end)
            preview = con.execute(PREVIEW_SQL, {"start": start, "end": end}).fetchall()
            total = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        os.unlink(staged)
    if malformed:
        context.log.warning(f"{len(malformed)} runs had malformed fields (kept with nulls): {dict(anomalies)}")
    context.log.info(
        f"Wrote {written} runs created {start:%Y-%m-%d} .. {end:%Y-%m-%d} (exclusive) for {entity}/{project}"
        + (f", and refreshed {len(older_unfinished)} older unfinished run(s) by id" if older_unfinished else "")
    )
    return MaterializeResult(
        metadata={
            "rows_written": written,
            "rows_total": total,
            "window_start_utc": start.isoformat(),
            "window_end_utc": end.isoformat(),
            "older_unfinished_refreshed": len(older_unfinished),
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
