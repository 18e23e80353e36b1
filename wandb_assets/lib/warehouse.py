"""Warehouse schema and the set-based SQL that writes it. Plain DuckDB; no Dagster.

Every write replaces a well-defined slice (a ``created_at`` window of ``runs``, a whole derived
table, one snapshot of ``fleet_metrics``) with ``DELETE`` + ``INSERT ... BY NAME`` inside one
transaction, so re-running a write leaves identical tables and a failed write leaves them as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from wandb_assets.lib.accounting.budgets import TEAM_BUDGETS_SQL
from wandb_assets.lib.accounting.closing import CLOSING_SQL
from wandb_assets.lib.accounting.gpus import DEFAULT_IDLE_GPU_PCT
from wandb_assets.lib.accounting.prices import GPU_PRICE_PERIODS_SQL
from wandb_assets.lib.acting.idle_actions import IDLE_ACTIONS_SQL
from wandb_assets.lib.acting.pr_checks import PR_CHECKS_SQL
from wandb_assets.lib.acting.pr_outbox import GITHUB_DELIVERIES_SQL
from wandb_assets.lib.alerts import ALERT_SQL, scope_unscoped_alerts
from wandb_assets.lib.clock import utc_instant
from wandb_assets.lib.curves_warehouse import CURVES_SCHEMA_SQL
from wandb_assets.lib.datadog_feed import LEDGER_SQL
from wandb_assets.lib.gauges import (
    GAUGE_NAMES,
    PROJECT_METRICS_SQL,
    RUNS_AS_OF_SQL,
    WHOLE_FLEET,
    gauge_params,
    gauge_query,
)
from wandb_assets.lib.lake import in_lake, retry_on_conflict
from wandb_assets.lib.normalize import SPS_KEYS, VANISHED
from wandb_assets.lib.runs_lifecycle import ASK_AGAIN_SQL, mark_moved, price_runs, settle, unmirror
from wandb_assets.lib.sql import (
    ALIVE_SQL,
    FAILED_SQL,
    GPU_USAGE_BUILD_KEY,
    NOW_UTC_SQL,
    busy_until_sql,
    inputs_changed,
    literal_path,
    meta_value,
    success_rate_sql,
    transaction,
)

_SPS_COLUMNS = list(SPS_KEYS.values())

#: Column name -> DuckDB type of the ``runs`` table, in order.
RUNS_COLUMNS: dict[str, str] = {
    "entity": "VARCHAR",
    "project": "VARCHAR",
    "run_id": "VARCHAR",
    "name": "VARCHAR",
    "state": "VARCHAR",
    "category": "VARCHAR",
    "created_at": "TIMESTAMP",
    "heartbeat_at": "TIMESTAMP",
    "ended_at": "TIMESTAMP",
    "duration_hours": "DOUBLE",
    "gpu_count": "INTEGER",
    "gpu_count_source": "VARCHAR",
    "gpu_model": "VARCHAR",
    "gpu_util_pct": "DOUBLE",
    "latest_gpu_sample": "STRUCT(gpu_index INTEGER, utilisation DOUBLE, memory DOUBLE)[]",
    "log_idle_gpu_hours": "STRUCT(day DATE, idle_gpu_hours DOUBLE)[]",
    "wandb_metadata": "JSON",
    "curves_status": "VARCHAR",
    "curves_read_at": "TIMESTAMP",
    "curves_final": "BOOLEAN",
    "sps_steady": "DOUBLE",
    "cost_usd": "DOUBLE",
    "gpu_type": "VARCHAR",
    "cpu_count": "INTEGER",
    "memory_gb": "DOUBLE",
    "slurm_job_id": "VARCHAR",
    "hostname": "VARCHAR",
    "sweep_id": "VARCHAR",
    "tags": "VARCHAR[]",
    "user": "VARCHAR",
    "group_name": "VARCHAR",
    "job_type": "VARCHAR",
    "url": "VARCHAR",
    "ci_branch": "VARCHAR",
    "ci_commit": "VARCHAR",
    "ci_config": "VARCHAR",
    "ci_timestamp": "TIMESTAMP",
    **{column: "DOUBLE" for column in _SPS_COLUMNS},
    "summary_step": "DOUBLE",
    "cli_version": "VARCHAR",
    "config": "JSON",
    "summary": "JSON",
    "anomalies": "VARCHAR[]",
    "ingested_at": "TIMESTAMP",
    "state_changed_at": "TIMESTAMP",
    "source": "VARCHAR",
    "log_path": "VARCHAR",
}

#: Where a row came from: mirrored from the W&B API (authoritative) or read from an offline ``.wandb`` log.
SOURCE_WANDB, SOURCE_OFFLINE = "wandb", "offline"

#: A run is (entity, project, run_id): never missing (W&B always sends them); a bad load fails at the INSERT.
_NOT_NULL = dict.fromkeys(("entity", "project", "run_id"), " NOT NULL")
#: The columns that identify a run: the same run id in two projects is two runs.
RUN_KEY = ("entity", "project", "run_id")
#: The tables derived from ``runs`` that carry the project of each row (rebuilt whole on every tick).
_PROJECT_TABLES = ("success_rates", "gpu_hours")


def _runs_table_sql(name: str) -> str:
    return f"""CREATE TABLE IF NOT EXISTS {name} ({
        ", ".join(f'"{c}" {t}' + _NOT_NULL.get(c, "") for c, t in RUNS_COLUMNS.items())
    });"""


#: The push-to-main CI runs and their throughput: a view of ``runs`` (until 2026-11-29 a table rewritten whole by
#: every tick: 0.9 s a tick at a million runs, for a copy of what ``runs`` holds).
PUSH_TO_MAIN_SPS_SQL = f"""
SELECT entity, project, run_id, name, ci_branch, ci_commit, ci_config, ci_timestamp, state, created_at, ended_at, url,
       {", ".join(_SPS_COLUMNS)}, sps_steady
FROM runs WHERE category = 'push_to_main'
"""

SCHEMA_SQL = f"""
{_runs_table_sql("runs")}
CREATE TABLE IF NOT EXISTS success_rates (
    entity VARCHAR, project VARCHAR, day DATE, category VARCHAR, completed BIGINT, failed BIGINT, other_ended BIGINT,
    success_rate_pct DOUBLE
);
CREATE TABLE IF NOT EXISTS gpu_hours (
    entity VARCHAR, project VARCHAR, day DATE, category VARCHAR, runs BIGINT, gpu_hours DOUBLE
);
CREATE TABLE IF NOT EXISTS gpu_usage (
    day DATE, entity VARCHAR, project VARCHAR, username VARCHAR, team VARCHAR, category VARCHAR, gpu_model VARCHAR,
    runs BIGINT, gpu_hours DOUBLE, cost_usd DOUBLE, idle_gpu_hours DOUBLE, price_basis VARCHAR,
    partly_idle_gpu_hours DOUBLE, idle_cost_usd DOUBLE, failed_gpu_hours DOUBLE, failed_cost_usd DOUBLE,
    price_from DATE, usd_per_gpu_hour DOUBLE
);
{GPU_PRICE_PERIODS_SQL}{CLOSING_SQL}{TEAM_BUDGETS_SQL}
{CURVES_SCHEMA_SQL}CREATE TABLE IF NOT EXISTS gpu_samples (
    snapshot_at TIMESTAMP, entity VARCHAR, project VARCHAR, run_id VARCHAR, gpu_index INTEGER, utilisation DOUBLE,
    memory DOUBLE
);
CREATE TABLE IF NOT EXISTS fleet_metrics (snapshot_at TIMESTAMP, metric VARCHAR, value DOUBLE);
CREATE TABLE IF NOT EXISTS project_metrics (
    snapshot_at TIMESTAMP, entity VARCHAR, project VARCHAR, metric VARCHAR, value DOUBLE
);
CREATE TABLE IF NOT EXISTS report_publications (
    snapshot_at TIMESTAMP, published_at TIMESTAMP, project VARCHAR, run_id VARCHAR, artifact VARCHAR
);
CREATE TABLE IF NOT EXISTS wandb_projects (
    entity VARCHAR, project VARCHAR, mirrored BOOLEAN, first_seen_at TIMESTAMP, last_checked_at TIMESTAMP,
    last_fetched_at TIMESTAMP, runs BIGINT, failing_since TIMESTAMP, last_error VARCHAR
);
"""


VIEWS_SQL = f"""
CREATE OR REPLACE VIEW push_to_main_sps AS {PUSH_TO_MAIN_SPS_SQL};

CREATE OR REPLACE VIEW main_sps_by_config AS
SELECT entity, project, ci_config,
       row_number() OVER (PARTITION BY entity, project, ci_config
                          ORDER BY coalesce(ci_timestamp, created_at), run_id) AS commit_order,
       ci_commit, ci_timestamp, created_at, ended_at, state, {", ".join(_SPS_COLUMNS)}, sps_steady, url
FROM push_to_main_sps WHERE ci_branch = 'main' AND ci_config IS NOT NULL;

CREATE OR REPLACE VIEW daily_fleet AS
WITH s AS (
    SELECT day, category, sum(completed)::BIGINT AS completed, sum(failed)::BIGINT AS failed,
           sum(other_ended)::BIGINT AS other_ended
    FROM success_rates GROUP BY day, category
), g AS (
    SELECT day, category, sum(runs)::BIGINT AS runs, sum(gpu_hours) AS gpu_hours FROM gpu_hours GROUP BY day, category
)
SELECT coalesce(s.day, g.day) AS day, coalesce(s.category, g.category) AS category,
       coalesce(s.completed, 0) AS completed, coalesce(s.failed, 0) AS failed,
       coalesce(s.other_ended, 0) AS other_ended, {success_rate_sql("s.completed", "s.failed")} AS success_rate_pct,
       coalesce(g.runs, 0) AS gpu_runs, coalesce(g.gpu_hours, 0) AS gpu_hours
FROM s FULL OUTER JOIN g ON s.day = g.day AND s.category = g.category;

CREATE OR REPLACE VIEW alive_runs AS
SELECT entity, project, run_id, name, category, state, "user", created_at, heartbeat_at,
       (epoch({NOW_UTC_SQL}) - epoch(created_at)) / 3600.0 AS age_hours, gpu_count, url
FROM runs WHERE state IN ({ALIVE_SQL});

CREATE OR REPLACE VIEW sweep_summary AS
SELECT coalesce(sweep_id, '(no sweep id)') AS sweep, count(*) AS runs,
       count(*) FILTER (WHERE state = 'finished') AS completed,
       count(*) FILTER (WHERE state IN ({FAILED_SQL})) AS failed,
       count(*) FILTER (WHERE state IN ({ALIVE_SQL})) AS alive,
       {success_rate_sql("completed", "failed")} AS success_rate_pct,
       coalesce(sum(gpu_count * (epoch({busy_until_sql(NOW_UTC_SQL)})
                                 - epoch(created_at)) / 3600.0), 0) AS gpu_hours,
       min(created_at) AS first_created_at, max(created_at) AS last_created_at
FROM runs WHERE category = 'sweep' GROUP BY ALL;
"""


def _schema_version() -> str:
    from wandb_assets.lib.schema_docs import comment_statements

    text = "\n".join(
        [
            SCHEMA_SQL,
            LEDGER_SQL,
            ALERT_SQL,
            IDLE_ACTIONS_SQL,
            PR_CHECKS_SQL,
            GITHUB_DELIVERIES_SQL,
            VIEWS_SQL,
            *comment_statements(),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_schema(con, home: tuple[str | None, str | None] | None = None) -> None:
    """Create every table and view, with their comments; cheap when the schema is already current.

    ``home``: the configured (entity, project), for a warehouse written before runs carried their project (see
    ``_migrate_run_projects``)."""
    lake = in_lake(con)
    version = _schema_version() + ("-lake" if lake else "")
    made = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'warehouse_meta'"
    ).fetchone()[0]
    current = made and con.execute("SELECT value FROM warehouse_meta WHERE key = 'schema_version'").fetchone()
    if current and current[0] == version:
        return
    with transaction(con):  # one commit: a DuckLake makes one snapshot of it, not one per statement (~150)
        con.execute("CREATE TABLE IF NOT EXISTS warehouse_meta (key VARCHAR, value VARCHAR)")
        _create_schema(con, lake, home)
        _set_version(con, version)


def _set_version(con, version: str) -> None:
    con.execute("DELETE FROM warehouse_meta WHERE key = 'schema_version'")
    con.execute("INSERT INTO warehouse_meta VALUES ('schema_version', $v)", {"v": version})


def _create_schema(con, lake: bool, home: tuple[str | None, str | None] | None) -> None:
    """Tables, views and comments, and the migrations of a warehouse an earlier version wrote."""
    from wandb_assets.lib.schema_docs import comment_statements

    if has_table(con, "push_to_main_sps"):  # a table until 2026-11-29, a view of runs since (VIEWS_SQL, below)
        con.execute("DROP VIEW IF EXISTS main_sps_by_config")
        con.execute("DROP TABLE push_to_main_sps")
    con.execute(SCHEMA_SQL)
    existing = _columns(con, "runs")
    for column, kind in RUNS_COLUMNS.items():
        if column not in existing:  # a warehouse made by an earlier version gains the new columns
            con.execute(f'ALTER TABLE runs ADD COLUMN "{column}" {kind}')
    if "entity" not in existing:
        _migrate_run_projects(con, home)
        _rebuild_runs(con)
    if "gpu_count_source" not in existing:  # rows written before the source was kept: config or the default
        flat, nested = (
            """json_extract(config, '$."compute.gpu_count"')""",
            "json_extract(config, '$.compute.gpu_count')",
        )
        con.execute(
            f"UPDATE runs SET gpu_count_source = CASE WHEN coalesce({flat}, {nested}) IS NOT NULL "
            "THEN 'config' ELSE 'default' END"
        )
    con.execute("ALTER TABLE report_publications ADD COLUMN IF NOT EXISTS artifact VARCHAR")
    con.execute("ALTER TABLE gpu_usage ADD COLUMN IF NOT EXISTS price_basis VARCHAR")  # rebuilt by the next tick
    con.execute("ALTER TABLE gpu_usage ADD COLUMN IF NOT EXISTS partly_idle_gpu_hours DOUBLE")
    for column in ("idle_cost_usd", "failed_gpu_hours", "failed_cost_usd", "usd_per_gpu_hour"):  # the next tick fills
        con.execute(f"ALTER TABLE gpu_usage ADD COLUMN IF NOT EXISTS {column} DOUBLE")
    con.execute("ALTER TABLE gpu_usage ADD COLUMN IF NOT EXISTS price_from DATE")
    con.execute(LEDGER_SQL)
    con.execute(ALERT_SQL)
    con.execute(IDLE_ACTIONS_SQL)
    con.execute("ALTER TABLE idle_actions ADD COLUMN IF NOT EXISTS run_created_at TIMESTAMP")  # NULL: rows before it
    con.execute(PR_CHECKS_SQL)
    con.execute("ALTER TABLE pr_checks ADD COLUMN IF NOT EXISTS pr_run_urls VARCHAR[]")
    con.execute(GITHUB_DELIVERIES_SQL)
    con.execute("ALTER TABLE sps_change_points ADD COLUMN IF NOT EXISTS testbed VARCHAR")  # found again next tick
    scope_unscoped_alerts(con)  # every alert key names its project now, with one project as with several
    if "entity" not in _columns(con, "run_progress"):  # an evaluation's steps, written before they had a project
        con.execute("ALTER TABLE run_progress ADD COLUMN entity VARCHAR")
        con.execute("ALTER TABLE run_progress ADD COLUMN project VARCHAR")
        con.execute(
            "UPDATE run_progress SET entity = r.entity, project = r.project FROM runs r "
            "WHERE run_progress.run_id = r.run_id AND run_progress.entity IS NULL"
        )
    con.execute(OFFLINE_FILES_SQL)
    con.execute(VIEWS_SQL)
    for statement in comment_statements(lake):
        con.execute(statement)


def _rebuild_runs(con) -> None:
    """``runs`` made anew with today's definition (``entity``/``project`` NOT NULL) and every row copied, inside the
    migration's transaction. ``ALTER COLUMN ... SET NOT NULL`` cannot do it: DuckDB checks only committed rows (a
    second transaction, which a crash could skip) and a DuckLake refuses it outright ("no column stats")."""
    con.execute("DROP TABLE IF EXISTS runs_migrated")
    con.execute(_runs_table_sql("runs_migrated"))
    con.execute("INSERT INTO runs_migrated BY NAME SELECT * FROM runs")
    con.execute("DROP TABLE runs")
    con.execute("ALTER TABLE runs_migrated RENAME TO runs")


def _columns(con, table: str) -> set[str]:
    return {
        r[0]
        for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = $t AND NOT internal "
            "AND database_name = current_database()",
            {"t": table},
        ).fetchall()
    }


#: A run page URL as ``run_url`` builds it: ``<app>/<entity>/<project>/runs/<id>``, each part percent-quoted.
_URL_PROJECT = r"/([^/]+)/([^/]+)/runs/[^/]+$"
#: The entity and the project a run's ``url`` names (what the migration and an unmigrated warehouse's reads use).
_URL_ENTITY_SQL = f"url_decode(regexp_extract(url, '{_URL_PROJECT}', 1))"
_URL_PROJECT_NAME_SQL = f"url_decode(regexp_extract(url, '{_URL_PROJECT}', 2))"


def _migrate_run_projects(con, home: tuple[str | None, str | None] | None) -> None:
    """Give every row of a warehouse written before runs carried their project its entity and project (the
    caller then makes both NOT NULL, ``_rebuild_runs``). A mirrored row's come from its URL, which
    W&B's client builds from them; an offline row (no URL) gets the configured ``home``, else the project most
    mirrored rows have. Derived tables gain the columns too (rebuilt on the next tick; filled now when there is
    one project)."""
    con.execute(
        f"UPDATE runs SET entity = {_URL_ENTITY_SQL}, project = {_URL_PROJECT_NAME_SQL} "
        f"WHERE entity IS NULL AND regexp_matches(url, '{_URL_PROJECT}')"
    )
    majority = con.execute(
        "SELECT entity, project FROM runs WHERE entity IS NOT NULL GROUP BY ALL ORDER BY count(*) DESC LIMIT 1"
    ).fetchone() or (None, None)
    entity = (home[0] if home else None) or majority[0]
    project = (home[1] if home else None) or majority[1]
    unknown = con.execute("SELECT count(*) FROM runs WHERE entity IS NULL").fetchone()[0]
    if unknown and not (entity and project):
        raise RuntimeError(
            f"{unknown} runs in this warehouse were written before runs carried their project and none says "
            "which: set WANDB_ENTITY and WANDB_PROJECT to the project they came from."
        )
    if unknown:
        con.execute(
            "UPDATE runs SET entity = $entity, project = $project WHERE entity IS NULL",
            {"entity": entity, "project": project},
        )
    projects = con.execute("SELECT DISTINCT entity, project FROM runs").fetchall()
    for table in _PROJECT_TABLES:
        for column in ("entity", "project"):
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} VARCHAR")
        if len(projects) == 1:
            con.execute(f"UPDATE {table} SET entity = $e, project = $p", {"e": projects[0][0], "p": projects[0][1]})


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def ndjson_lines(rows: Iterable[dict[str, Any]], fetched_at: datetime) -> Iterator[str]:
    """Normalised ``runs`` rows as NDJSON lines; ``ingested_at`` is when they were read from W&B.

    A row is dumped whole (keys the table does not have are ignored by the load, missing ones are NULL):
    one C-level ``json.dumps`` per row is most of what staging costs."""
    tail = f', "ingested_at": "{fetched_at.isoformat(sep=" ")}"}}\n'
    encode = _ROW_ENCODER.encode
    for row in rows:
        yield encode(row)[:-1] + tail


#: ``ndjson_lines``' encoder, made once (``json.dumps`` with ``default`` builds one per call; a row has no cycles).
_ROW_ENCODER = json.JSONEncoder(default=_iso, check_circular=False)


def stage_rows(rows: Iterable[dict[str, Any]], folder: str | None = None) -> tuple[str, int]:
    """Write normalised ``runs`` rows to a temporary NDJSON file, outside the warehouse; returns (path, rows).

    The caller removes the file. (The pipeline stages through ``lib.staging``, one file per day.)
    """
    fd, path = tempfile.mkstemp(suffix=".ndjson", prefix="wandb_runs_", dir=folder)
    written = 0
    try:
        with os.fdopen(fd, "w") as handle:
            for line in ndjson_lines(rows, datetime.now(UTC).replace(tzinfo=None)):
                handle.write(line)
                written += 1
    except BaseException:
        os.unlink(path)
        raise
    return path, written


#: The first line of a staged file may be ``{"__whole__": ["entity/project", ...]}``: the projects whose rows it
#: holds whole (a fetch that failed for a project leaves that project out, so its rows are not replaced). A file of
#: runs refreshed by id also says which runs were asked for: ``"__asked__": {"entity/project": [run ids]}``; only
#: those may be judged vanished (a run the fetch never asked for says nothing about W&B).
WHOLE_KEY = "__whole__"
ASKED_KEY = "__asked__"


def staged_header(path: str | os.PathLike) -> dict[str, Any] | None:
    """A staged file's header line (``WHOLE_KEY``, ``ASKED_KEY``), or None when it has none."""
    with open(path, "rb") as handle:
        first = handle.readline()
    if not first.startswith(b'{"' + WHOLE_KEY.encode() + b'"'):
        return None
    return json.loads(first)


def whole_projects(path: str | os.PathLike) -> list[str] | None:
    """The projects a staged file holds whole (its header line), or None when it says nothing (every project)."""
    header = staged_header(path)
    return None if header is None else list(header[WHOLE_KEY])


def asked_runs(paths: Iterable[str | os.PathLike]) -> list[tuple[str, str, str]]:
    """``(entity, project, run_id)`` of every run the fetches that wrote ``paths`` asked W&B for by id."""
    asked: list[tuple[str, str, str]] = []
    for path in paths:
        for name, ids in ((staged_header(path) or {}).get(ASKED_KEY) or {}).items():
            entity, _, project = name.partition("/")
            asked += [(entity, project, run_id) for run_id in ids]
    return asked


_STAGED_SPEC = ", ".join(f"'{c}': '{'VARCHAR' if t == 'JSON' else t}'" for c, t in RUNS_COLUMNS.items())
_READ_STAGED = (
    "SELECT * EXCLUDE (config, summary, wandb_metadata), config::JSON AS config, summary::JSON AS summary, "
    "wandb_metadata::JSON AS wandb_metadata "
    f"FROM read_json($paths, format = 'newline_delimited', columns = {{{_STAGED_SPEC}}}) "
    "WHERE NOT (run_id IS NULL AND entity IS NULL AND project IS NULL)"  # a file's header line (WHOLE_KEY)
)


def _one_copy_each(con, table: str) -> None:
    """A run W&B sent twice in one fetch (a page boundary shifted while runs were created) is one row of ``table``:
    the copy read last. Counted first (a hash of the keys), so a load without such a run pays no window over its
    rows; else only the keys and row ids are ranked."""
    twice = con.execute(f"SELECT count(*) > count(DISTINCT (entity, project, run_id)) FROM {table}").fetchone()[0]
    if twice:
        con.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM (SELECT rowid, row_number() OVER ("
            "PARTITION BY entity, project, run_id ORDER BY ingested_at DESC, rowid DESC) AS copy "
            f"FROM {table}) WHERE copy > 1)"
        )


_STAGE_INCOMING = f"CREATE OR REPLACE TEMP TABLE incoming_runs AS {_READ_STAGED}"

#: A run's row replaced by a load keeps what the warehouse knew of its curves (``lib.curves_warehouse``: its own
#: asset reads and loads them).
_KEEP_CURVES_STATUS = """
UPDATE incoming_runs SET curves_status = r.curves_status, curves_read_at = r.curves_read_at,
    curves_final = r.curves_final, sps_steady = r.sps_steady
FROM runs r
WHERE r.entity = incoming_runs.entity AND r.project = incoming_runs.project AND r.run_id = incoming_runs.run_id
"""


def fetched_since(path: str | os.PathLike) -> datetime:
    """When the fetch that wrote a staged file began (its modification time, set so at publish): every row in it
    was read from W&B at or after this moment (naive UTC)."""
    return datetime.fromtimestamp(os.stat(path).st_mtime, UTC).replace(tzinfo=None)


def _whole_triples(paths: list[str], projects: Iterable[tuple[str, str]] | None) -> list[list[str]] | None:
    """``[day, entity, project]`` for every project a file holds whole on its day (``*``: any day), or None
    when the load may replace every project (no file says otherwise and ``projects`` is None)."""
    if projects is not None:
        return [["*", entity, project] for entity, project in projects]
    triples: list[list[str]] = []
    for path in paths:
        listed = whole_projects(path)
        if listed is None:
            return None  # a file from before headers (or a test's): it holds every project of its window
        day = Path(path).name.removesuffix(".ndjson")
        triples += [[day, *name.split("/", 1)] for name in listed]
    return triples


@retry_on_conflict
def load_runs_window(
    con,
    paths: str | list[str],
    start: datetime,
    end: datetime,
    refreshed: list[str] | None = None,
    projects: Iterable[tuple[str, str]] | None = None,
    prices=None,
    priced_at: datetime | None = None,
) -> int:
    """Replace every run created in ``[start, end)``, and any other copy of a staged run id, with the rows
    staged in ``paths``: one transaction, so a failure leaves the table as it was. Returns rows loaded.

    Freshness decides, not the order of loads: a staged row never replaces a copy fetched later than it was
    (``ingested_at``), and a window row missing from the files is judged vanished only if it was fetched before the
    oldest of those files' fetches began (``fetched_since``), so loading an old staged file, or a slow fetch
    published after a quicker one, cannot turn back the clock or mark runs a later fetch found.

    Nothing W&B stops returning is deleted: a window row missing from the files (deleted or moved in W&B) stays,
    marked ``vanished`` (``runs_lifecycle.settle``), its past GPU-hours and cost as they were; a copy another project
    of its entity now holds is ``moved`` (``runs_lifecycle.mark_moved``: it counts there only).

    ``refreshed`` holds the runs fetched by id: every run the warehouse held alive, created before ``start``. Each
    replaces the warehouse's copy only if fetched later. A run those fetches asked for by id (``asked_runs``: their
    header) that W&B did not return, held alive since before that fetch began, is marked ``vanished`` and counted in
    its ``anomalies``: its GPU-hours and cost stop at its last heartbeat, its past days stay. A run never asked
    for (loaded by another fetch meanwhile) is never judged.

    A run is (entity, project, run_id). ``projects``: the (entity, project) pairs whose window the files hold
    whole; only their rows in the window may be judged (a project whose fetch failed keeps its rows as they are).
    None: every project's. ``prices``: the price file (``prices.PriceList``, or ``(model, USD)`` pairs), recorded
    as seen at ``priced_at`` (now by default) and each run's ``cost_usd`` (``runs_lifecycle.price_runs``).
    """
    ensure_schema(con)
    paths = [paths] if isinstance(paths, str) else list(paths)
    window_fetched = min((fetched_since(p) for p in paths), default=None)
    refreshed_fetched = min((fetched_since(p) for p in refreshed or []), default=None)
    whole = _whole_triples(paths, projects)
    asked = asked_runs(refreshed or [])
    with transaction(con):
        inputs_changed(con)
        con.execute(_STAGE_INCOMING, {"paths": [literal_path(p) for p in paths]})
        _one_copy_each(con, "incoming_runs")
        con.execute("CREATE OR REPLACE TEMP TABLE refreshed_runs AS SELECT * FROM incoming_runs LIMIT 0")
        if refreshed:
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE refreshed_runs AS {_READ_STAGED}",
                {"paths": [literal_path(p) for p in refreshed]},
            )
            _one_copy_each(con, "refreshed_runs")
        # What W&B no longer returns: a window row of a project the files hold whole, fetched before these files'
        # fetches began (a later fetch's row is never judged by an older file), and a run asked for by id, held
        # alive since before that fetch began. Each stays, marked (runs_lifecycle.settle).
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE just_vanished AS
            SELECT entity, project, run_id FROM runs
            WHERE coalesce(source, '{SOURCE_WANDB}') = '{SOURCE_WANDB}'
              AND NOT list_contains(coalesce(anomalies, []), '{VANISHED}')
              AND (entity, project, run_id) NOT IN (SELECT entity, project, run_id FROM incoming_runs)
              AND (entity, project, run_id) NOT IN (SELECT entity, project, run_id FROM refreshed_runs)
              AND ((created_at >= $start AND created_at < $end
                    AND (ingested_at IS NULL OR ingested_at <= $fetched)
                    AND ($whole IS NULL OR list_contains($whole, [strftime(created_at, '%Y-%m-%d'), entity, project])
                         OR list_contains($whole, ['*', entity, project])))
                   OR ({ASK_AGAIN_SQL} AND ingested_at <= $refreshed_fetched
                       AND (entity, project, run_id) IN (
                           SELECT unnest($e::VARCHAR[]), unnest($p::VARCHAR[]), unnest($r::VARCHAR[]))))""",
            {
                "start": start,
                "end": end,
                "fetched": window_fetched,
                "whole": whole,
                "refreshed_fetched": refreshed_fetched,
                "e": [a[0] for a in asked],
                "p": [a[1] for a in asked],
                "r": [a[2] for a in asked],
            },
        )
        marked_at = utc_instant()
        settle(con, marked_at)
        con.execute(
            "INSERT INTO incoming_runs BY NAME SELECT * FROM refreshed_runs "
            "WHERE (entity, project, run_id) NOT IN (SELECT entity, project, run_id FROM incoming_runs)"
        )
        con.execute("DROP TABLE refreshed_runs")
        # A copy fetched later than the staged one stays: the staged row is dropped.
        con.execute(
            "DELETE FROM incoming_runs WHERE EXISTS (SELECT 1 FROM runs WHERE runs.run_id = incoming_runs.run_id "
            "AND runs.entity = incoming_runs.entity AND runs.project = incoming_runs.project "
            "AND runs.ingested_at > incoming_runs.ingested_at)"
        )
        con.execute(_KEEP_CURVES_STATUS)
        # Every earlier copy of a fetched run (a vanished one W&B returns again is restored): a run appears once.
        con.execute(
            "DELETE FROM runs WHERE (entity, project, run_id) IN (SELECT entity, project, run_id FROM incoming_runs)"
        )
        price_runs(con, prices, priced_at)
        con.execute(
            f"INSERT INTO runs BY NAME SELECT * REPLACE (coalesce(source, '{SOURCE_WANDB}') AS source) "
            "FROM incoming_runs"
        )
        mark_moved(con, marked_at)
        loaded = con.execute("SELECT count(*) FROM incoming_runs").fetchone()[0]
        con.execute("DROP TABLE incoming_runs")
    return loaded


OFFLINE_FILES_SQL = """
CREATE TABLE IF NOT EXISTS offline_log_files (
    path VARCHAR, size BIGINT, mtime_ns BIGINT, run_id VARCHAR, records INTEGER, history_items BIGINT,
    damage JSON, loaded VARCHAR, read_at TIMESTAMP
);
"""


def read_offline_file_states(con) -> dict[str, tuple[int, int]]:
    """``{path: (size, mtime_ns)}`` of every offline log already read (an unchanged log is not read again)."""
    ensure_schema(con)
    rows = con.execute("SELECT path, size, mtime_ns FROM offline_log_files").fetchall()
    return {path: (size, mtime_ns) for path, size, mtime_ns in rows}


def offline_logs_gone_quiet(con, now: datetime, stall: timedelta) -> set[str]:
    """Logs whose offline run was ``running`` when read and whose last record is now older than ``stall``: no
    exit record will come, so read again they make the run ``crashed`` (as W&B marks a run whose process died)."""
    ensure_schema(con)
    rows = con.execute(
        f"SELECT f.path FROM offline_log_files f JOIN runs r ON r.log_path = f.path AND r.source = '{SOURCE_OFFLINE}' "
        "WHERE r.state = 'running' AND r.heartbeat_at < $cutoff",
        {"cutoff": now - stall},
    ).fetchall()
    return {path for (path,) in rows}


@retry_on_conflict
def load_offline_runs(
    con,
    staged_path: str | None,
    files: list[dict[str, Any]],
    now: datetime,
    vanished_logs: Iterable[str] = (),
    stall_cutoff: datetime | None = None,
    prices=None,
    then: Callable[[Any], None] | None = None,
) -> dict[str, int]:
    """Load offline runs staged in ``staged_path`` (NDJSON ``runs`` rows) and record the ``files`` read, in one
    transaction; ``then(con)`` runs last in it (the logs' curves: with their runs, or neither). Returns counts:
    ``loaded``, ``kept_mirrored``, ``kept_newer``, ``crashed_log_gone``.

    Precedence: a run W&B already mirrored keeps its mirrored row (authoritative); an earlier offline copy of the
    same run id is replaced only by a log whose last record is not older (``heartbeat_at``), so an older log of
    a resumed run, touched later, never replaces the newer one's row. A ``running`` offline run whose log is
    in ``vanished_logs`` and whose last record is older than ``stall_cutoff`` is ``crashed`` (``log_missing``):
    no record will ever come."""
    ensure_schema(con)
    with transaction(con):
        inputs_changed(con)
        if staged_path:
            con.execute(_STAGE_INCOMING, {"paths": [literal_path(staged_path)]})
            _one_copy_each(con, "incoming_runs")
            con.execute(_KEEP_CURVES_STATUS)  # a log read again replaces its curves (``then``), never adds to them
        else:
            con.execute("CREATE OR REPLACE TEMP TABLE incoming_runs AS SELECT * FROM runs LIMIT 0")
        mirrored = set(
            con.execute(
                "SELECT entity, project, run_id FROM runs WHERE (entity, project, run_id) IN "
                "(SELECT entity, project, run_id FROM incoming_runs) "
                f"AND coalesce(source, '{SOURCE_WANDB}') <> '{SOURCE_OFFLINE}'"
            ).fetchall()
        )
        # Offline runs the warehouse holds from a log whose last record is later than this one's: they stay.
        con.execute(
            "CREATE OR REPLACE TEMP TABLE newer_offline AS SELECT i.entity, i.project, i.run_id FROM incoming_runs i "
            f"JOIN runs r USING (entity, project, run_id) WHERE r.source = '{SOURCE_OFFLINE}' "
            "AND r.heartbeat_at > i.heartbeat_at"
        )
        newer = set(con.execute("SELECT * FROM newer_offline").fetchall())
        con.execute(
            f"DELETE FROM runs WHERE source = '{SOURCE_OFFLINE}' AND (entity, project, run_id) IN ("
            "SELECT entity, project, run_id FROM incoming_runs EXCEPT SELECT * FROM newer_offline)"
        )
        con.execute("DROP TABLE newer_offline")
        price_runs(con, prices, now)
        con.execute(
            f"INSERT INTO runs BY NAME SELECT * REPLACE ('{SOURCE_OFFLINE}' AS source) FROM incoming_runs "
            "WHERE (entity, project, run_id) NOT IN (SELECT entity, project, run_id FROM runs)"
        )
        loaded = con.execute("SELECT count(*) FROM incoming_runs").fetchone()[0] - len(mirrored) - len(newer)
        con.execute("DROP TABLE incoming_runs")
        crashed = 0
        if vanished_logs and stall_cutoff is not None:
            crashed = con.execute(
                f"UPDATE runs SET state = 'crashed', ended_at = heartbeat_at, "
                "duration_hours = greatest(date_diff('microsecond', created_at, heartbeat_at), 0) / 3.6e9, "
                "anomalies = list_append(anomalies, 'log_missing') "
                f"WHERE source = '{SOURCE_OFFLINE}' AND state = 'running' AND heartbeat_at < $cutoff "
                "AND log_path IN (SELECT unnest($paths::VARCHAR[]))",
                {"cutoff": stall_cutoff, "paths": list(vanished_logs)},
            ).fetchone()[0]
        paths = [f["path"] for f in files]
        con.execute("DELETE FROM offline_log_files WHERE path IN (SELECT unnest($paths::VARCHAR[]))", {"paths": paths})
        if files:  # DuckDB refuses executemany with no parameter sets
            con.executemany(
                "INSERT INTO offline_log_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        f["path"],
                        f["size"],
                        f["mtime_ns"],
                        f["run_id"],
                        f["records"],
                        f["history_items"],
                        json.dumps(f["damage"]),
                        "kept mirrored"
                        if _offline_key(f) in mirrored
                        else "kept newer log"
                        if _offline_key(f) in newer and f["loaded"] == "loaded"
                        else f["loaded"],
                        now,
                    )
                    for f in files
                ],
            )
        if then is not None:
            then(con)
    return {"loaded": loaded, "kept_mirrored": len(mirrored), "kept_newer": len(newer), "crashed_log_gone": crashed}


def _offline_key(entry: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """The run a ledger entry's log was loaded as (``read_changed_logs`` records it)."""
    return entry.get("entity"), entry.get("project"), entry["run_id"]


def replace_runs_window(con, rows: Iterable[dict[str, Any]], start: datetime, end: datetime) -> int:
    """Stage ``rows`` and load them over ``[start, end)`` (see the two steps). Returns rows written."""
    path, written = stage_rows(rows)
    try:
        load_runs_window(con, path, start, end)
    finally:
        os.unlink(path)
    return written


#: The projects after one fetch's report (``$report``: JSON list of ``{entity, project, error, unchanged}``,
#: ``error`` NULL when the project was fetched whole, or ``unchanged`` when a tick found nothing new in it and did
#: not read it; ``project`` ``*`` for an entity whose listing failed), merged with what the table held: a project
#: keeps its first sighting and last good fetch; one the report does not name is no longer mirrored (dropped from
#: the configuration or no longer listed) and its rows stay, unless the report is ``$partial`` (a backfill of some
#: projects: the others stay as they were) or names its entity's listing as failed (that entity's projects could not
#: be told: each stays as it was, its failure history too). A ``*`` row lives only while its listing fails.
WANDB_PROJECTS_SQL = """
WITH report AS (
    SELECT unnest(from_json($report::JSON, $shape), recursive := true)
),
unlisted AS (SELECT DISTINCT entity FROM report WHERE project = '*' AND error IS NOT NULL),
counted AS (SELECT entity, project, count(*) AS runs FROM runs GROUP BY ALL),
merged AS (
    SELECT r.*, w.* EXCLUDE (entity, project, runs), coalesce(r.entity, w.entity) AS entity_,
           coalesce(r.project, w.project) AS project_,
           r.entity IS NULL AND ($partial OR w.entity IN (SELECT entity FROM unlisted)) AS as_was,
           r.entity IS NOT NULL AS reported
    FROM report r FULL OUTER JOIN wandb_projects w ON r.entity = w.entity AND r.project = w.project
    WHERE r.entity IS NOT NULL OR w.project <> '*'
)
SELECT entity_ AS entity, project_ AS project,
       CASE WHEN reported THEN true WHEN as_was THEN mirrored ELSE false END AS mirrored,
       coalesce(first_seen_at, $checked_at::TIMESTAMP) AS first_seen_at,
       CASE WHEN reported THEN $checked_at::TIMESTAMP ELSE last_checked_at END AS last_checked_at,
       CASE WHEN reported AND error IS NULL AND NOT coalesce(unchanged, false)
            THEN $checked_at::TIMESTAMP ELSE last_fetched_at END AS last_fetched_at,
       coalesce(c.runs, 0) AS runs,
       CASE WHEN NOT reported THEN (CASE WHEN as_was THEN failing_since END) WHEN error IS NULL THEN NULL
            ELSE coalesce(failing_since, $checked_at::TIMESTAMP) END AS failing_since,
       CASE WHEN NOT reported THEN (CASE WHEN as_was THEN last_error END) ELSE error END AS last_error
FROM merged LEFT JOIN counted c ON c.entity = merged.entity_ AND c.project = merged.project_
ORDER BY ALL
"""


_REPORT_SHAPE = '[{"entity": "VARCHAR", "project": "VARCHAR", "error": "VARCHAR", "unchanged": "BOOLEAN"}]'


@retry_on_conflict
def record_projects(
    con, report: list[dict[str, str | None]], checked_at: datetime, partial: bool = False
) -> tuple[list[tuple], list[str], list[str]]:
    """Replace ``wandb_projects`` with the projects of one fetch's ``report`` merged into what it held (see
    ``WANDB_PROJECTS_SQL``; the table is small, a row per project, so the merge is read whole, then written), and
    mark the alive rows of projects no longer mirrored (``runs_lifecycle.unmirror``), in one transaction. Returns the
    rows written and the mirror set's change: ``(rows, left, came)`` as ``entity/project`` names."""
    ensure_schema(con)
    params = {"report": json.dumps(report), "checked_at": checked_at, "partial": partial, "shape": _REPORT_SHAPE}
    before = {
        f"{e}/{p}" for e, p in con.execute("SELECT entity, project FROM wandb_projects WHERE mirrored").fetchall()
    }
    rows = con.execute(WANDB_PROJECTS_SQL, params).fetchall()
    with transaction(con):
        inputs_changed(con)
        con.execute("DELETE FROM wandb_projects")
        if rows:
            con.executemany(f"INSERT INTO wandb_projects VALUES ({', '.join('?' * len(rows[0]))})", rows)
        marked_at = utc_instant()
        unmirror(con, marked_at)
        mark_moved(con, marked_at)  # a run of a project that left, now held by a mirrored one
    after = {f"{r[0]}/{r[1]}" for r in rows if r[2] and r[1] != "*"}
    before = {name for name in before if not name.endswith("/*")}
    return rows, sorted(before - after), sorted(after - before) if before else []


#: The per-project breakdown of the latest fleet snapshot people read first (the CLI after a tick, the UI's
#: fleet_snapshot metadata): runs in the warehouse, active now, failed in 24 h, GPU-hours in 24 h, per project.
PROJECT_SUMMARY_SQL = """
WITH latest AS (SELECT max(snapshot_at) AS t FROM project_metrics),
gauges AS (
    SELECT entity, project,
           max(value) FILTER (WHERE metric = 'wandb.runs.active') AS active,
           max(value) FILTER (WHERE metric = 'wandb.runs.failed_24h') AS failed_24h,
           max(value) FILTER (WHERE metric = 'wandb.training.total_gpu_hours_24h') AS gpu_hours_24h
    FROM project_metrics WHERE snapshot_at = (SELECT t FROM latest) GROUP BY ALL
),
counted AS (SELECT entity, project, count(*) AS runs FROM runs GROUP BY ALL)
SELECT entity || '/' || project AS project, coalesce(c.runs, 0) AS runs, g.active::BIGINT AS active,
       g.failed_24h::BIGINT AS failed_24h, round(g.gpu_hours_24h, 2) AS gpu_hours_24h
FROM gauges g LEFT JOIN counted c USING (entity, project) ORDER BY entity, project
"""


#: Each running run's GPUs at a snapshot, from the latest system sample W&B returned for it (``{runs}``: the
#: ``runs`` table, or ``RUNS_AS_OF_SQL`` for a replayed past snapshot, which repeats that latest sample).
_GPU_SAMPLES_SQL = """
INSERT INTO gpu_samples BY NAME
SELECT $snapshot_at::TIMESTAMP AS snapshot_at, entity, project, run_id, sample.gpu_index, sample.utilisation,
       sample.memory
FROM (SELECT entity, project, run_id, unnest(latest_gpu_sample) AS sample FROM {runs}
      WHERE state = 'running' AND created_at <= $snapshot_at)
"""
GPU_SAMPLES_SQL = _GPU_SAMPLES_SQL.format(runs="runs")
#: How long the per-snapshot GPU samples are kept (the idle_gpus alert looks back half an hour).
GPU_SAMPLES_KEPT = timedelta(days=8)


@retry_on_conflict
def record_snapshot(
    con,
    snapshot_at: datetime,
    idle_pct: float = DEFAULT_IDLE_GPU_PCT,
    project_metrics_days: int = 0,
) -> dict[str, float | None]:
    """Compute the gauges at ``snapshot_at`` (``idle_pct``, the prices: see ``gauges.gauge_params``) and store them as
    one ``fleet_metrics`` snapshot (the whole fleet) and one ``project_metrics`` snapshot (the same gauges per
    project), with each running run's GPUs in ``gpu_samples``. The samples are written first: the idle gauges of
    this snapshot count the samples taken at it. ``project_metrics_days`` > 0: older per-project rows are deleted."""
    ensure_schema(con)
    with transaction(con):
        params = {"snapshot_at": snapshot_at, "kept": snapshot_at - GPU_SAMPLES_KEPT}
        # Dropping old samples changes what gpu_usage was computed from, and so does a sample taken at or before its
        # ``now`` (a snapshot pinned in the past; a tick's own snapshot is taken after the build).
        built = json.loads(meta_value(con, GPU_USAGE_BUILD_KEY) or "{}").get("now")
        earlier = built is not None and snapshot_at <= datetime.fromisoformat(built)
        pruned = con.execute(
            "DELETE FROM gpu_samples WHERE snapshot_at < $kept::TIMESTAMP", {"kept": params["kept"]}
        ).fetchone()[0]
        replaced = con.execute(
            "DELETE FROM gpu_samples WHERE snapshot_at = $snapshot_at", {"snapshot_at": snapshot_at}
        ).fetchone()[0]
        if pruned or replaced or earlier:
            inputs_changed(con)
        con.execute(GPU_SAMPLES_SQL, {"snapshot_at": snapshot_at})
        con.execute("DELETE FROM fleet_metrics WHERE snapshot_at = $t", {"t": snapshot_at})
        con.execute("DELETE FROM project_metrics WHERE snapshot_at = $snapshot_at", {"snapshot_at": snapshot_at})
        if project_metrics_days > 0:
            con.execute(
                "DELETE FROM project_metrics WHERE snapshot_at < $kept",
                {"kept": snapshot_at - timedelta(days=project_metrics_days)},
            )
        gauges = _store_gauges(con, snapshot_at, idle_pct)
        con.executemany(
            "INSERT INTO fleet_metrics (snapshot_at, metric, value) VALUES (?, ?, ?)",
            [(snapshot_at, name, value) for name, value in gauges.items()],
        )
    return gauges


def _store_gauges(con, snapshot_at: datetime, idle_pct: float, as_of: bool = False) -> dict[str, float | None]:
    """The gauges at ``snapshot_at``, the fleet's and each project's in one pass over the runs (``gauges.gauge_query``
    ``with_fleet``; two passes took 0.55 s of a tick at a million runs): each project's rows stored in
    ``project_metrics``, the fleet's returned (``fleet_metrics``' values)."""
    params = gauge_params(snapshot_at, idle_pct)
    con.execute(f"CREATE OR REPLACE TEMP TABLE snapshot_gauges AS {gauge_query(as_of, with_fleet=True)}", params)
    fleet = con.execute(
        f"SELECT * EXCLUDE ({WHOLE_FLEET}, entity, project) FROM snapshot_gauges WHERE {WHOLE_FLEET}"
    ).fetchone()
    projects = f"SELECT * EXCLUDE ({WHOLE_FLEET}) FROM snapshot_gauges WHERE NOT {WHOLE_FLEET}"
    con.execute(
        f"INSERT INTO project_metrics BY NAME {PROJECT_METRICS_SQL.format(query=projects)}",
        {"snapshot_at": snapshot_at},
    )
    con.execute("DROP TABLE snapshot_gauges")
    return dict(zip(GAUGE_NAMES, fleet, strict=True))


@retry_on_conflict
def replay_snapshots(
    con,
    moments: list[datetime],
    now: datetime,
    idle_pct: float = DEFAULT_IDLE_GPU_PCT,
) -> int:
    """Store a past snapshot at each of ``moments`` from the runs as they looked then (``RUNS_AS_OF_SQL``), so
    a new warehouse (the demo) has a history to chart. They are entered in the Datadog ledger as ``replayed``:
    the feed never sends them (a gauge from the past would land at the wrong time). The GPU samples of a replayed
    snapshot repeat each then-running run's latest sample (the only one W&B returns). Returns how many."""
    ensure_schema(con)  # (the Datadog ledger is part of the schema)
    rows = []
    with transaction(con):
        inputs_changed(con)
        for table in ("fleet_metrics", "project_metrics", "gpu_samples", "datadog_deliveries"):
            con.execute(
                f"DELETE FROM {table} WHERE snapshot_at IN (SELECT unnest($moments::TIMESTAMP[]))", {"moments": moments}
            )
        for at in sorted(moments):  # samples first (the idle gauges count them), then the gauges as they were then
            con.execute(_GPU_SAMPLES_SQL.format(runs=RUNS_AS_OF_SQL), {"snapshot_at": at})
            gauges = _store_gauges(con, at, idle_pct, as_of=True)
            rows += [(at, name, value) for name, value in gauges.items()]
        if rows:  # DuckDB refuses executemany with no parameter sets
            con.executemany("INSERT INTO fleet_metrics (snapshot_at, metric, value) VALUES (?, ?, ?)", rows)
            con.executemany(
                "INSERT INTO datadog_deliveries VALUES (?, 'replayed', 0, NULL, NULL, ?)", [(at, now) for at in moments]
            )
    return len(moments)


#: A tick catches up at most this many days after an outage (older gaps are a backfill's: ``wandb-assets backfill``).
CATCH_UP_MAX_DAYS = 31


def refresh_days(
    oldest_unfinished: date | None,
    today: date,
    first_partition: date,
    max_days: int = 7,
    last_tick: date | None = None,
) -> tuple[date, date]:
    """Days one tick re-reads: from yesterday, or the day of the last tick that took its snapshot (``last_tick``)
    if that was earlier (a tick after an outage reads the days it missed, at most ``CATCH_UP_MAX_DAYS``), or the
    oldest still-unfinished run's day but never more than ``max_days`` back (older unfinished runs are refreshed by
    id, see ``unfinished_run_ids``), whichever is earliest; through today."""
    first = today - timedelta(days=1)
    if last_tick is not None and last_tick < first:
        first = max(last_tick, today - timedelta(days=CATCH_UP_MAX_DAYS))
    if oldest_unfinished is not None and oldest_unfinished < first:
        first = min(first, max(oldest_unfinished, today - timedelta(days=max_days)))
    return max(first, first_partition), today


def latest_snapshot_at(con) -> datetime | None:
    """When the latest fleet snapshot was taken (``fleet_metrics``; a replayed one lies in the past), or None."""
    return con.execute("SELECT max(snapshot_at) FROM fleet_metrics").fetchone()[0]


def read_last_tick_day(con) -> date | None:
    """The UTC day of the latest snapshot a tick took (``latest_snapshot_at``), or None (no warehouse or none)."""
    if con is None or not has_table(con, "fleet_metrics"):
        return None
    latest = latest_snapshot_at(con)
    return latest.date() if latest else None


def has_table(con, name: str, schema: str | None = None) -> bool:
    """Whether the current database has table ``name`` (in ``schema``, or any; a new lake's catalog starts empty)."""
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = $name AND database_name = current_database() "
            "AND schema_name = coalesce($schema, schema_name)",
            {"name": name, "schema": schema},
        ).fetchone()[0]
    )


def unfinished_run_ids(con, before: datetime) -> list[str]:
    """Runs the warehouse still holds as alive that were created before ``before``: a tick whose window does
    not reach back to them refreshes them by id instead."""
    return sorted(run_id for ids in unfinished_runs_by_project(con, before).values() for run_id in ids)


def unfinished_runs_by_project(con, before: datetime) -> dict[str, list[str]]:
    """``unfinished_run_ids`` per ``entity/project``. A warehouse not yet migrated (written before runs carried
    their project) gives each run the project of its URL, as the migration will (``""`` for a row without one)."""
    if not has_table(con, "runs"):
        return {}
    from_url = f"{_URL_ENTITY_SQL} || '/' || {_URL_PROJECT_NAME_SQL}"
    project = (
        "entity || '/' || project"
        if "entity" in _columns(con, "runs")
        else f"CASE WHEN regexp_matches(url, '{_URL_PROJECT}') THEN {from_url} ELSE '' END"
    )
    found: dict[str, list[str]] = {}
    for path, run_id in con.execute(
        f"SELECT {project}, run_id FROM runs WHERE {ASK_AGAIN_SQL} AND created_at < $before "
        f"AND coalesce(source, '{SOURCE_WANDB}') = '{SOURCE_WANDB}' ORDER BY ALL",
        {"before": before},
    ).fetchall():
        found.setdefault(path, []).append(run_id)
    return found


#: What the load reads of W&B's ``wandb-metadata.json`` of ended runs created in ``[$start, $end)`` (read once per
#: run: a later fetch of the run carries it over instead of asking again).
METADATA_CACHE_SQL = """
SELECT entity || '/' || project, run_id, wandb_metadata::VARCHAR FROM runs
WHERE wandb_metadata IS NOT NULL AND created_at >= $start AND created_at < $end
"""


def cached_metadata(con, start: datetime, end: datetime) -> dict[tuple[str, str], dict]:
    """``{(entity/project, run_id): {"status", "gpu_count", "gpu"}}`` already read for runs created in the window;
    ``con`` read-only, or None (no warehouse yet)."""
    if con is None or not has_table(con, "runs") or "wandb_metadata" not in _columns(con, "runs"):
        return {}
    rows = con.execute(METADATA_CACHE_SQL, {"start": start, "end": end}).fetchall()
    return {(path, run_id): json.loads(text) for path, run_id, text in rows}


def project_freshness(con) -> tuple[dict[str, datetime], set[str]]:
    """``({entity/project: last fetched whole}, {entity/project a tick must read})``: a project must be read when
    it holds a mirrored run still alive or its last fetch failed. For a tick to tell which projects changed
    (``projects.changed_projects``). ``con`` is read-only, or None (no warehouse)."""
    if con is None or not has_table(con, "runs") or "entity" not in _columns(con, "runs"):
        return {}, set()
    last, must_read = {}, set()
    if has_table(con, "wandb_projects"):
        rows = con.execute(
            "SELECT entity || '/' || project, last_fetched_at, last_error IS NOT NULL FROM wandb_projects"
        ).fetchall()
        last = {project: fetched for project, fetched, _ in rows if fetched is not None}
        must_read = {project for project, _, failing in rows if failing}
    alive = con.execute(
        f"SELECT DISTINCT entity || '/' || project FROM runs WHERE {ASK_AGAIN_SQL} "
        f"AND coalesce(source, '{SOURCE_WANDB}') = '{SOURCE_WANDB}'"
    ).fetchall()
    return last, must_read | {r[0] for r in alive}


#: Tables whose row counts describe a warehouse copy (snapshot asset metadata, report artifact metadata).
COUNTED_TABLES = ("runs", "push_to_main_sps", "success_rates", "gpu_hours", "fleet_metrics", "alerts")


def row_counts(con) -> dict[str, int]:
    """Rows per table of ``COUNTED_TABLES``."""
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COUNTED_TABLES}


def read_oldest_unfinished_day(con) -> date | None:
    """Creation day of the oldest run the warehouse still holds as running, pending or preempting.

    ``con`` is a read-only connection, or None when there is no warehouse yet; None when there is no such run.
    """
    if con is None or not has_table(con, "runs"):
        return None
    oldest = con.execute(
        f"SELECT min(created_at) FROM runs WHERE state IN ({ALIVE_SQL}) "
        f"AND coalesce(source, '{SOURCE_WANDB}') = '{SOURCE_WANDB}'"
    ).fetchone()[0]
    return oldest.date() if oldest else None
