"""Offline W&B run logs into ``runs``: the ``offline_runs`` asset, and the sensor that launches the ``offline``
job (``defs/fleet/jobs.py``: the logs, then the fleet tables and a snapshot, like a tick) when a log appears or
grows."""

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta

from dagster import (
    AssetExecutionContext,
    Config,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    sensor,
)

from wandb_assets.defs.fleet.jobs import offline_job
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.offline_runs import file_states, find_run_logs, read_changed_logs, reader
from wandb_assets.lib.warehouse import load_offline_runs, read_offline_file_states, stage_rows
from wandb_assets.settings import alert_thresholds, pipeline_settings

#: How often the sensor looks at the folders (a stat per log; no file is read).
SENSOR_INTERVAL_S = 60

DAMAGE_SCHEMA = TableSchema(
    columns=[
        TableColumn("path", "string"),
        TableColumn("run_id", "string"),
        TableColumn("kind", "string"),
        TableColumn("offset", "int"),
        TableColumn("detail", "string"),
    ]
)


class OfflineRunsConfig(Config):
    """``paths``: files or folders to scan (empty: ``WANDB_ASSETS_OFFLINE_DIRS``)."""

    paths: list[str] = []


@asset(
    group_name="wandb",
    description="Runs from offline W&B logs (wandb/offline-run-*/run-<id>.wandb) in the folders of "
    "WANDB_ASSETS_OFFLINE_DIRS, read straight into `runs` (source = offline) with the mirrored rules. A log "
    "already read and unchanged is skipped; a damaged log keeps every record before the damage; a run W&B "
    "mirrors keeps its mirrored row.",
    kinds={"wandb", "duckdb"},
    owners=["team:ml-platform"],
    pool=WAREHOUSE_POOL,
)
def offline_runs(
    context: AssetExecutionContext, config: OfflineRunsConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    settings = pipeline_settings()
    paths = config.paths or list(settings.offline_dirs)
    now = datetime.now(UTC).replace(tzinfo=None)
    with warehouse.get_connection() as con:
        known = read_offline_file_states(con)
    report = read_changed_logs(  # the warehouse is closed while the logs are read
        paths,
        known,
        now=now,
        stall=timedelta(minutes=alert_thresholds().stall_heartbeat_minutes),
        default_gpus=settings.default_gpus_per_run,
        workers=min(4, os.cpu_count() or 1),
    )
    for path in report.missing:
        context.log.warning(f"Offline logs: {path} does not exist")
    staged, _ = stage_rows(report.rows) if report.rows else (None, 0)
    try:
        with warehouse.get_connection() as con:
            counts = load_offline_runs(con, staged, report.files, now)
    finally:
        if staged:
            os.unlink(staged)
    damaged = report.damaged
    line = (
        f"Offline logs: {report.found} found in {len(paths)} path(s), {len(report.files)} read, "
        f"{report.unchanged} unchanged; {counts['loaded']} runs loaded, {counts['kept_mirrored']} kept as "
        f"mirrored; {len(damaged)} damaged"
    )
    (context.log.warning if damaged else context.log.info)(
        line + (f" ({', '.join(f'{k} {n}' for k, n in sorted(report.damage_counts().items()))})" if damaged else "")
    )
    records = [
        TableRecord(
            {"path": f["path"], "run_id": f["run_id"], "kind": d["kind"], "offset": d["offset"], "detail": d["detail"]}
        )
        for f in damaged
        for d in f["damage"]
    ]
    return MaterializeResult(
        metadata={
            "paths": ", ".join(paths),
            "logs_found": report.found,
            "logs_read": len(report.files),
            "logs_unchanged": report.unchanged,
            "runs_loaded": counts["loaded"],
            "runs_kept_mirrored": counts["kept_mirrored"],
            "logs_damaged": len(damaged),
            "damage": MetadataValue.table(records, schema=DAMAGE_SCHEMA),
            "damage_by_kind": MetadataValue.json(report.damage_counts()),
            "missing_paths": ", ".join(report.missing),
            "reader": reader(),  # native (the C extension) or python (built without a compiler: same rows, slower)
        }
    )


@sensor(
    job=offline_job,
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Launches the offline job when a .wandb log appears or grows in WANDB_ASSETS_OFFLINE_DIRS "
    "(sizes and modification times in the cursor; no file is read here).",
)
def offline_run_logs(context: SensorEvaluationContext):
    folders = pipeline_settings().offline_dirs
    if not folders:
        return SkipReason("WANDB_ASSETS_OFFLINE_DIRS is not set")
    files, _ = find_run_logs(folders)
    states = {path: list(state) for path, state in file_states(files).items()}
    previous = json.loads(context.cursor) if context.cursor else {}
    changed = sorted(p for p, state in states.items() if previous.get(p) != state)
    context.update_cursor(json.dumps(states, sort_keys=True))
    if not changed:
        return SkipReason(f"no new or grown logs among {len(states)}")
    key = hashlib.sha256(json.dumps({p: states[p] for p in changed}, sort_keys=True).encode()).hexdigest()[:16]
    return RunRequest(run_key=key, tags={"wandb_assets/offline_logs_changed": str(len(changed))})
