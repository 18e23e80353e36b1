"""The curves in the warehouse: their tables, which runs' curves are due (the backlog ``staged_curves`` reads a share
of on each run), and their load from the point files of ``curves.CurvesFolder``, with what they give the run: its
curves status, its steady SPS, and its idle GPU-hours per day from its whole sampled GPU stream. No Dagster here."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from wandb_assets.lib.curves import (
    FAILED,
    GPU_FILE,
    GPU_HEADER,
    HISTORY_FILE,
    HISTORY_HEADER,
    NONE,
    NULL_MARK,
    READ,
    READS_FILE,
    READS_HEADER,
)
from wandb_assets.lib.gauges import curve_idle_sql
from wandb_assets.lib.sql import (
    BUSY_SQL,
    ENDED_SQL,
    MIRRORED_RUNS_SQL,
    inputs_changed,
    literal_path,
    set_meta,
    transaction,
)

CURVES_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS run_history (
    entity VARCHAR, project VARCHAR, run_id VARCHAR, metric VARCHAR, step BIGINT, "timestamp" TIMESTAMP, value DOUBLE
);
CREATE TABLE IF NOT EXISTS run_gpu_samples (
    entity VARCHAR, project VARCHAR, run_id VARCHAR, "timestamp" TIMESTAMP, gpu INTEGER, util_pct DOUBLE,
    memory_pct DOUBLE, power_w DOUBLE
);
CREATE TABLE IF NOT EXISTS run_curve_idle (
    entity VARCHAR, project VARCHAR, run_id VARCHAR, day DATE, idle_pct DOUBLE, idle_gpu_hours DOUBLE,
    partly_idle_gpu_hours DOUBLE
);
"""


#: The one rule of when a run's curves are read, as SQL (``$now``, ``$refresh``: an INTERVAL). A run of a project
#: mirrored now (never a vanished or pending one): ended, unless its curves were read after it ended (``curves_final``;
#: read while it ran, it is read once more, the whole run; our clock is never compared with W&B's heartbeat); running,
#: when never read, or its last read failed or is ``$refresh`` old. Newest first, the reads that failed last: they
#: are asked again on every run until they answer, after the runs never tried.
DUE_CURVES_SQL = f"""
SELECT entity, project, run_id, state IN ({ENDED_SQL}) AS final
FROM {MIRRORED_RUNS_SQL} runs
WHERE coalesce(source, 'wandb') = 'wandb' AND (
    (state IN ({ENDED_SQL}) AND NOT coalesce(curves_final, false))
    OR (state IN ({BUSY_SQL}) AND (curves_status IS NULL OR curves_status = '{FAILED}'
                                   OR curves_read_at <= $now::TIMESTAMP - $refresh::INTERVAL)))
ORDER BY curves_status IS NOT DISTINCT FROM '{FAILED}', coalesce(ended_at, heartbeat_at, created_at) DESC NULLS LAST,
         entity, project, run_id
"""

_COLUMNS = {
    READS_FILE: "'entity': 'VARCHAR', 'project': 'VARCHAR', 'run_id': 'VARCHAR', 'status': 'VARCHAR', "
    "'read_at': 'TIMESTAMP', 'final': 'BOOLEAN'",
    HISTORY_FILE: "'entity': 'VARCHAR', 'project': 'VARCHAR', 'run_id': 'VARCHAR', 'metric': 'VARCHAR', "
    "'step': 'BIGINT', 'timestamp': 'TIMESTAMP', 'value': 'DOUBLE'",
    GPU_FILE: "'entity': 'VARCHAR', 'project': 'VARCHAR', 'run_id': 'VARCHAR', 'timestamp': 'TIMESTAMP', "
    "'gpu': 'INTEGER', 'util_pct': 'DOUBLE', 'memory_pct': 'DOUBLE', 'power_w': 'DOUBLE'",
}


_HEADERS = {READS_FILE: READS_HEADER, HISTORY_FILE: HISTORY_HEADER, GPU_FILE: GPU_HEADER}


def _read(kind: str, parquet: bool = True) -> str:
    """The files ``$paths`` of ``kind``: Parquet, or the CSV of a folder written before issue 54."""
    if parquet:
        return f"(SELECT {', '.join(_HEADERS[kind])} FROM read_parquet($paths))"
    return (
        f"read_csv($paths, header = true, auto_detect = false, nullstr = '{NULL_MARK}', columns = {{{_COLUMNS[kind]}}})"
    )


def _files(folder: Path, kind: str) -> tuple[list[str], bool]:
    """``kind``'s files of ``folder`` and whether they are Parquet (a folder is one or the other)."""
    parquet = sorted(str(p) for p in folder.glob(f"{kind}-*.parquet"))
    return (parquet, True) if parquet else (sorted(str(p) for p in folder.glob(f"{kind}-*.csv")), False)


_KEYS = "(entity, project, run_id)"
_REPLACED = f"{_KEYS} IN (SELECT entity, project, run_id FROM curve_reads WHERE status IN ('{READ}', '{NONE}'))"

#: A run's steady-state SPS from its curve of ``$sps_metric``: the median after warm-up, the first
#: ``STEADY_WARMUP_SHARE`` of its step range dropped (a step range, not a count of points: sampling thins them evenly).
STEADY_WARMUP_SHARE = 0.1
_STEADY_SPS = f"""
UPDATE runs SET sps_steady = s.steady
FROM (
    SELECT c.entity, c.project, c.run_id, (
        SELECT median(h.value) FROM points h
        WHERE h.entity = c.entity AND h.project = c.project AND h.run_id = c.run_id
          AND h.step >= b.lo + {STEADY_WARMUP_SHARE} * (b.hi - b.lo)) AS steady
    FROM curve_reads c
    LEFT JOIN (SELECT entity, project, run_id, min(step) AS lo, max(step) AS hi FROM points GROUP BY ALL) b
        USING (entity, project, run_id)
    WHERE c.status IN ('{READ}', '{NONE}')
) s
WHERE s.entity = runs.entity AND s.project = runs.project AND s.run_id = runs.run_id
"""


def _steady_sps(source: str) -> str:
    """``_STEADY_SPS`` from ``source``'s points of ``$sps_metric`` (the rows being loaded: never a scan of every
    run's history)."""
    points = f"points AS (SELECT * FROM {source} WHERE metric = $sps_metric AND {_REPLACED})"
    return f"WITH {points} {_STEADY_SPS}"


#: Idle and partly idle GPU-hours per run and UTC day, from the whole sampled stream of the runs of ``$runs_sql``
#: (``gauges.curve_idle_sql``: the one idle rule), a GPU below ``$idle_pct`` idle.
def _curve_idle_insert(runs_sql: str, samples: str = "run_gpu_samples") -> str:
    return f"""
INSERT INTO run_curve_idle BY NAME
WITH {curve_idle_sql("$now::TIMESTAMP", runs_sql, samples)}
SELECT entity, project, run_id, day_start::DATE AS day, $idle_pct::DOUBLE AS idle_pct,
       sum(idle * hours) AS idle_gpu_hours, sum(partly * hours) AS partly_idle_gpu_hours
FROM held_daily GROUP BY ALL
"""


_FINAL_REPLACED = f"(SELECT entity, project, run_id FROM curve_reads WHERE final AND status IN ('{READ}', '{NONE}'))"


#: ``warehouse_meta`` key: the metric ``runs.sps_steady`` was computed from (WANDB_ASSETS_SPS_METRIC at the last load).
STEADY_METRIC_KEY = "sps_steady_metric"


def sps_metric_advice(con, sps_metric: str) -> str | None:
    """A sentence when no run's curves hold ``sps_metric`` (WANDB_ASSETS_SPS_METRIC) but some hold another history
    key: steady SPS (and the notebooks' curves of it) stay empty without a word otherwise. None when it is there, or
    when no curve is stored yet."""
    held = con.execute(
        "SELECT metric, count(DISTINCT (entity, project, run_id)) AS runs FROM run_history GROUP BY 1 "
        "ORDER BY runs DESC, metric"
    ).fetchall()
    if not held or any(metric == sps_metric for metric, _ in held):
        return None
    best, runs = held[0]
    return (
        f"No run's curves hold WANDB_ASSETS_SPS_METRIC={sps_metric!r}, so steady SPS is empty; {runs:,} run(s)' "
        f"curves hold {best!r}: set WANDB_ASSETS_SPS_METRIC={best} (the sps_regression alert then watches it too)."
    )


def steady_metric(con) -> str | None:
    """The metric every ``runs.sps_steady`` is of (None: not recorded yet): the detector uses steady SPS only when it
    is the metric it judges."""
    made = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'warehouse_meta'"
    ).fetchone()[0]
    if not made:
        return None
    row = con.execute("SELECT value FROM warehouse_meta WHERE key = $k", {"k": STEADY_METRIC_KEY}).fetchone()
    return row[0] if row else None


def _restate_steady(con, sps_metric: str) -> int:
    """Inside a load's transaction: when WANDB_ASSETS_SPS_METRIC is not the metric recorded for ``sps_steady``, every
    run with curves gets its steady SPS of the new metric from ``run_history`` (one scan), and the metric is
    recorded. Returns the runs restated (0: nothing to do)."""
    if steady_metric(con) == sps_metric:
        return 0
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE curve_reads AS SELECT entity, project, run_id, curves_status AS status "
        f"FROM runs WHERE curves_status IN ('{READ}', '{NONE}')"
    )
    restated = con.execute("SELECT count(*) FROM curve_reads").fetchone()[0]
    if restated:
        con.execute(_steady_sps("run_history"), {"sps_metric": sps_metric})
    con.execute("DROP TABLE curve_reads")
    set_meta(con, STEADY_METRIC_KEY, sps_metric)
    return restated


def due_curves(con, now: datetime, refresh: timedelta, limit: int) -> tuple[list[tuple[str, str, str, bool]], int]:
    """``([(entity, project, run_id, final)], due)``: at most ``limit`` runs whose curves are due (``DUE_CURVES_SQL``;
    final: the run has ended, a read now is its last), and how many are due in all (the backlog)."""
    if con is None or "curves_final" not in {r[0] for r in con.execute("DESCRIBE runs").fetchall()}:
        return [], 0
    params = {"now": now, "refresh": refresh}
    rows = con.execute(f"{DUE_CURVES_SQL} LIMIT $limit", params | {"limit": limit}).fetchall()
    total = (
        len(rows)
        if len(rows) < limit
        else con.execute(f"SELECT count(*) FROM ({DUE_CURVES_SQL})", params).fetchone()[0]
    )
    return rows, total


def load_curves(con, folders: list[Path], sps_metric: str, idle_pct: float, now: datetime) -> dict[str, int]:
    """Load the published reads ``folders`` (oldest first) in one transaction: a run read (``read`` / ``none``)
    replaces its earlier curves (never adds to them), gets its status, its steady SPS and, once ended, its idle
    GPU-hours per day; a failed read marks a run ``failed`` only when no earlier read of it answered (those curves
    stay). (Idle rows judged at another ``idle_pct`` are judged again by ``rejudge_curve_idle``, right before
    ``gpu_usage`` reads them.)
    When WANDB_ASSETS_SPS_METRIC changed, every run's steady SPS is restated first. Returns ``{status: runs}`` over
    the folders, ``points`` and ``steady_restated``."""
    with transaction(con):
        inputs_changed(con)
        return load_curves_in_transaction(con, folders, sps_metric, idle_pct, now)


def load_curves_setting_aside(
    con, folders: list[Path], sps_metric: str, idle_pct: float, now: datetime
) -> tuple[dict[str, int], list[Path]]:
    """``load_curves``, and when the folders cannot load together, each alone (oldest first): a folder the tables
    cannot hold is left out and its runs are marked ``failed`` (read again later, as a read that failed). Returns the
    counts and the folders left out, for the caller to set aside: one bad folder never blocks the others."""
    try:
        return load_curves(con, folders, sps_metric, idle_pct, now), []
    except duckdb.Error:
        pass  # rolled back: each folder alone
    counts: dict[str, int] = {}
    rejected: list[Path] = []
    for folder in folders:
        try:
            loaded = load_curves(con, [folder], sps_metric, idle_pct, now)
        except duckdb.Error:
            rejected.append(folder)
            _mark_failed(con, folder, now)
            continue
        for key, value in loaded.items():
            counts[key] = counts.get(key, 0) + value
    counts["rejected_folders"] = len(rejected)
    return counts, rejected


def _mark_failed(con, folder: Path, now: datetime) -> None:
    """The runs of a folder that cannot load: ``failed`` unless an earlier read of them answered (their curves stay)."""
    reads, parquet = _files(folder, READS_FILE)
    if not reads:
        return
    with transaction(con):
        con.execute(
            f"""UPDATE runs SET curves_status = '{FAILED}', curves_read_at = $now
            FROM (SELECT entity, project, run_id FROM {_read(READS_FILE, parquet)}) c
            WHERE c.entity = runs.entity AND c.project = runs.project AND c.run_id = runs.run_id
              AND (runs.curves_status IS NULL OR runs.curves_status = '{FAILED}')""",
            {"paths": [literal_path(p) for p in reads], "now": now},
        )


def load_curves_in_transaction(
    con, folders: list[Path], sps_metric: str, idle_pct: float, now: datetime, source: str | None = None
) -> dict[str, int]:
    """``load_curves`` inside the caller's transaction (offline logs: with their runs); ``source``: only the runs
    whose stored row has it (a log's curves never replace those W&B's copy of the run has)."""
    counts: dict[str, int] = {"steady_restated": _restate_steady(con, sps_metric)}
    for folder in folders:
        found = {kind: _files(folder, kind) for kind in _COLUMNS}
        paths = {kind: files for kind, (files, _) in found.items()}
        if not paths[READS_FILE]:
            continue
        parquet = found[READS_FILE][1]

        def params(kind: str, paths=paths) -> dict:
            return {"paths": [literal_path(p) for p in paths[kind]]}

        con.execute(
            f"CREATE OR REPLACE TEMP TABLE curve_reads AS SELECT * FROM {_read(READS_FILE, parquet)} "
            f"WHERE {_KEYS} IN (SELECT entity, project, run_id FROM runs WHERE $source IS NULL OR source = $source)",
            params(READS_FILE) | {"source": source},
        )
        for status, runs in con.execute("SELECT status, count(*) FROM curve_reads GROUP BY 1").fetchall():
            counts[status] = counts.get(status, 0) + runs
        earlier = con.execute(
            f"SELECT count(*) FROM runs WHERE curves_status IN ('{READ}', '{NONE}') AND {_REPLACED}"
        ).fetchone()[0]
        if earlier:  # else nothing to replace: no scan of every run's curves
            for table in ("run_history", "run_gpu_samples"):
                con.execute(f"DELETE FROM {table} WHERE {_REPLACED}")
        con.execute(f"DELETE FROM run_curve_idle WHERE {_REPLACED}")
        for table, kind in (("run_history", HISTORY_FILE), ("run_gpu_samples", GPU_FILE)):
            (added,) = con.execute(
                f"INSERT INTO {table} BY NAME SELECT * FROM {_read(kind, parquet)} WHERE {_REPLACED}", params(kind)
            ).fetchone()
            counts["points"] = counts.get("points", 0) + added
        con.execute(
            f"""UPDATE runs SET curves_status = c.status, curves_read_at = c.read_at, curves_final = c.final
            FROM curve_reads c
            WHERE c.entity = runs.entity AND c.project = runs.project AND c.run_id = runs.run_id
              AND (c.status <> '{FAILED}' OR runs.curves_status IS NULL OR runs.curves_status = '{FAILED}')"""
        )
        # Steady SPS and idle hours from the files just loaded (read again, streaming), not from the tables.
        con.execute(_steady_sps(_read(HISTORY_FILE, parquet)), {"sps_metric": sps_metric, **params(HISTORY_FILE)})
        con.execute(
            _curve_idle_insert(_FINAL_REPLACED, _read(GPU_FILE, parquet)),
            {"now": now, "idle_pct": idle_pct, **params(GPU_FILE)},
        )
        con.execute("DROP TABLE curve_reads")
    return counts


def rejudge_curve_idle(con, idle_pct: float, now: datetime) -> int:
    """Judge again, at ``idle_pct``, the idle GPU-hours of the runs whose rows were judged at another threshold
    (WANDB_ASSETS_IDLE_GPU_PCT changed): the numbers keep one meaning. Returns the rows found stale (0: nothing
    done). Inside the caller's transaction."""
    stale = con.execute("SELECT count(*) FROM run_curve_idle WHERE idle_pct <> $p", {"p": idle_pct}).fetchone()[0]
    if stale:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE stale_idle AS SELECT DISTINCT entity, project, run_id "
            "FROM run_curve_idle WHERE idle_pct <> $p",
            {"p": idle_pct},
        )
        con.execute(f"DELETE FROM run_curve_idle WHERE {_KEYS} IN (SELECT entity, project, run_id FROM stale_idle)")
        con.execute(_curve_idle_insert("(SELECT * FROM stale_idle)"), {"now": now, "idle_pct": idle_pct})
        con.execute("DROP TABLE stale_idle")
    return stale
