"""Offline W&B run logs into ``runs``: the ``offline_runs`` asset, and the sensor that launches the ``offline``
job (``defs/fleet/jobs.py``: the logs, then the fleet tables and a snapshot, like a tick) when a log appears,
grows, or goes quiet (its running run passed the stall threshold)."""

import hashlib
import json
import os
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

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
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.clock import configured_time, utc_now
from wandb_assets.lib.curves import CurvesFolder
from wandb_assets.lib.curves_warehouse import load_curves_in_transaction
from wandb_assets.lib.offline_runs import file_states, find_run_logs, read_changed_logs, reader
from wandb_assets.lib.warehouse import (
    SOURCE_OFFLINE,
    load_offline_runs,
    offline_logs_gone_quiet,
    read_offline_file_states,
    stage_rows,
)
from wandb_assets.settings import alert_thresholds, load_settings, pipeline_settings

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
    """``paths``: files or folders to scan (empty: ``WANDB_ASSETS_OFFLINE_DIRS``); ``now`` (ISO-8601) pins the
    clock that decides whether a run without an exit record is still running, for tests; empty means now."""

    paths: list[str] = []
    now: str = ""


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
@names_the_warehouse
def offline_runs(
    context: AssetExecutionContext, config: OfflineRunsConfig, warehouse: WarehouseResource
) -> MaterializeResult:
    settings, mirrored = pipeline_settings(), load_settings()
    paths = config.paths or list(settings.offline_dirs)
    now = configured_time(config.now, "now") or utc_now()
    thresholds = alert_thresholds()
    stall = timedelta(minutes=thresholds.stall_heartbeat_minutes)
    with warehouse.get_connection() as con:
        known, quiet = read_offline_file_states(con), offline_logs_gone_quiet(con, now, stall)
    report = read_changed_logs(  # the warehouse is closed while the logs are read
        paths,
        known,
        now=now,
        stall=stall,
        default_gpus=settings.default_gpus_per_run,
        gpu_count_keys=settings.gpu_count_keys,
        workers=min(4, os.cpu_count() or 1),
        gone_quiet=quiet,
        entity=mirrored.WANDB_ENTITY,  # the project the gauges and alerts are for (unset: every log)
        project=mirrored.WANDB_PROJECT,
        selection=settings.projects,  # WANDB_ASSETS_PROJECTS: its projects and whole entities
        # the GPU stream always (its idle hours by the one hold rule), the history keys' curves when asked for
        curves=(list(settings.history_keys) if settings.fetch_history else [], settings.history_samples),
    )
    if settings.projects is None and mirrored.WANDB_PROJECT is None:
        # The job reads no secret (it runs on air-gapped clusters: no network), so only these two can say which.
        context.log.warning(
            "Offline logs: neither WANDB_ASSETS_PROJECTS nor WANDB_PROJECT is set here, so the logs of every project "
            "in the folders are loaded: set one of them in this job's environment to load only the mirrored ones."
        )
    for path in report.missing:
        context.log.warning(f"Offline logs: {path} does not exist")
    staged, _ = stage_rows(report.rows) if report.rows else (None, 0)
    Path(settings.staging_dir).mkdir(parents=True, exist_ok=True)
    curves_folder = Path(tempfile.mkdtemp(prefix="offline-curves-", dir=settings.staging_dir))
    curves: dict[str, int] = {}
    try:
        with_curves = _log_curves_loader(report.curves, curves_folder, thresholds, now, curves)
        with warehouse.get_connection() as con:
            counts = load_offline_runs(
                con,
                staged,
                report.files,
                now,
                report.vanished,
                now - stall,
                prices=settings.gpu_prices,
                then=with_curves,
            )
    finally:
        if staged:
            os.unlink(staged)
        shutil.rmtree(curves_folder, ignore_errors=True)
    damaged = report.damaged
    line = (
        f"Offline logs: {report.found} found in {len(paths)} path(s), {len(report.files)} read, "
        f"{report.unchanged} unchanged, {report.gone_quiet} gone quiet; {counts['loaded']} runs loaded, "
        f"{counts['kept_mirrored']} kept as mirrored, {counts['kept_newer']} kept a newer log's row, "
        f"{report.other_project} of another project skipped, {counts['crashed_log_gone']} crashed (log gone); "
        f"{len(damaged)} damaged"
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
            "logs_gone_quiet": report.gone_quiet,  # read again: their running run passed the stall threshold
            "runs_loaded": counts["loaded"],
            "runs_kept_mirrored": counts["kept_mirrored"],
            "runs_kept_newer_log": counts["kept_newer"],
            "logs_other_project": report.other_project,  # of another entity/project than WANDB_ENTITY/PROJECT
            "runs_crashed_log_gone": counts["crashed_log_gone"],
            "logs_damaged": len(damaged),
            "damage": MetadataValue.table(records, schema=DAMAGE_SCHEMA),
            "damage_by_kind": MetadataValue.json(report.damage_counts()),
            "missing_paths": ", ".join(report.missing),
            "curves": MetadataValue.json(curves),
            "reader": reader(),  # native (the C extension) or python (built without a compiler: same rows, slower)
        }
    )


def _log_curves_loader(curves: dict, folder: Path, thresholds, now, counts: dict[str, int]):
    """The logs' curves as point files (written now, with the warehouse closed), and what loads them into
    run_history and run_gpu_samples in the runs' own transaction (``load_offline_runs(then=...)``), by the curves
    job's rule, for the runs whose stored row is the log's (a run W&B mirrors keeps the curves read online).
    ``counts`` gets ``{status: runs}``. None when there are none."""
    if not curves:
        return None
    staged = CurvesFolder(folder, "logs")
    for path in sorted({f"{entity}/{project}" for entity, project, _ in curves}):
        runs = {run_id: value for (entity, project, run_id), value in curves.items() if f"{entity}/{project}" == path}
        staged.add(path, {run_id: value["final"] for run_id, value in runs.items()}, runs)
    published = staged.publish()

    def load(con) -> None:
        found = load_curves_in_transaction(
            con, [published], thresholds.sps_metric, thresholds.idle_gpu_pct, now, source=SOURCE_OFFLINE
        )
        counts.update({status: runs for status, runs in found.items() if status in ("read", "none", "failed")})

    return load


@sensor(
    job=offline_job,
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Launches the offline job when a .wandb log appears or grows in WANDB_ASSETS_OFFLINE_DIRS, or "
    "goes quiet past the stall threshold (its running run is crashed now); sizes and modification times in the "
    "cursor, no file is read here.",
)
def offline_run_logs(context: SensorEvaluationContext):
    folders = pipeline_settings().offline_dirs
    if not folders:
        return SkipReason("WANDB_ASSETS_OFFLINE_DIRS is not set")
    files, _ = find_run_logs(folders)
    states = {path: list(state) for path, state in file_states(files).items()}
    now, stall_s = time.time(), alert_thresholds().stall_heartbeat_minutes * 60
    previous = json.loads(context.cursor) if context.cursor else {}
    seen, seen_at = previous.get("logs", {}), previous.get("at", now)
    changed = sorted(p for p, state in states.items() if seen.get(p) != state)
    went_quiet = sorted(
        p
        for p, state in states.items()
        if seen.get(p) == state and quiet(state, now, stall_s) and not quiet(state, seen_at, stall_s)
    )
    context.update_cursor(json.dumps({"logs": states, "at": now}, sort_keys=True))
    if not changed and not went_quiet:
        return SkipReason(f"no new, grown or newly quiet logs among {len(states)}")
    reasons = {"changed": {p: states[p] for p in changed}, "quiet": went_quiet, "at": round(now)}
    key = hashlib.sha256(json.dumps(reasons, sort_keys=True).encode()).hexdigest()[:16]
    return RunRequest(
        run_key=key,
        tags={
            "wandb_assets/offline_logs_changed": str(len(changed)),
            "wandb_assets/offline_logs_quiet": str(len(went_quiet)),
        },
    )


def quiet(state: list[int], at: float, stall_s: float) -> bool:
    """Whether a log last written at ``state``'s mtime had passed the stall threshold (``stall_s`` seconds) at
    ``at`` (epoch seconds): a running run in it has become a crashed one, which only reading it again records."""
    return at - state[1] / 1e9 > stall_s
