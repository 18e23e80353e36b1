"""For analysts: open the latest read-only snapshot of the warehouse, and answer the common questions.

The pipeline writes ``data/warehouse.duckdb`` (``WANDB_ASSETS_DUCKDB``); after every successful tick or
backfill it publishes a copy next to it, ``<name>.snapshot.duckdb``, built on the side and swapped in with
an atomic rename. Notebooks open the snapshot: a connection held open for hours blocks no writer (DuckDB
lets one process write a file, and even a read-only reader of the *same* file blocks writers), and a
reader never sees a half-written state. Nothing here imports Dagster.

In DuckLake mode (``WANDB_ASSETS_DUCKDB=ducklake:postgres:...``) there is no copy: ``open_snapshot()``
attaches the lake read-only. A lake reader sees committed snapshots only and never blocks a writer.

    from wandb_assets import warehouse
    con = warehouse.open_snapshot()
    warehouse.daily_fleet(con).tail()
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from pathlib import Path

import duckdb

from wandb_assets.lib import lake
from wandb_assets.lib.lake import Lake
from wandb_assets.lib.normalize import parse_timestamp, to_naive_utc
from wandb_assets.lib.snapshot import publish_snapshot, snapshot_file
from wandb_assets.lib.sql import sql_string
from wandb_assets.settings import load_settings, pipeline_settings, warehouse_location

__all__ = ["connect", "open_snapshot", "publish_snapshot", "query_read_only", "reading", "snapshot_path"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: What DuckDB says when a file was written by a newer DuckDB than this one.
_NEWER_FILE = "created with an newer version"


def file_open_error(path: str | os.PathLike, exc: Exception) -> str | None:
    """The one sentence for a warehouse file this DuckDB cannot read because a newer DuckDB wrote it."""
    text = str(exc)
    if _NEWER_FILE in text or ("version number" in text and "can only read" in text):
        return (
            f"The warehouse {path} was written by a newer DuckDB than this one ({duckdb.__version__}, pinned for the "
            "DuckLake extensions): move it away and rebuild it with `uv run wandb-assets backfill`."
        )
    return None


def memory_limit_config(limit: str | None) -> dict[str, str]:
    """DuckDB's config for a warehouse connection with ``WANDB_ASSETS_DUCKDB_MEMORY_LIMIT`` (none: DuckDB's default)."""
    return {"memory_limit": limit} if limit else {}


def connect(location: str | os.PathLike | Lake | None = None, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection to the warehouse (default ``WANDB_ASSETS_DUCKDB``): the file, or the lake attached."""
    if location is None:
        location = pipeline_settings().warehouse
    elif not isinstance(location, Lake) and lake.is_lake(location):
        location = warehouse_location(value=str(location))
    if isinstance(location, Lake):
        return lake.connect(location, read_only=read_only)
    try:
        limit = load_settings().WANDB_ASSETS_DUCKDB_MEMORY_LIMIT
        con = duckdb.connect(str(location), read_only=read_only, config=memory_limit_config(limit))
    except duckdb.IOException as exc:
        sentence = file_open_error(location, exc)
        if sentence:
            raise RuntimeError(sentence) from None
        raise
    con.execute("SET TimeZone = 'UTC'")
    return con


@contextmanager
def reading(location: str | os.PathLike | Lake | None = None) -> Iterator[duckdb.DuckDBPyConnection | None]:
    """A short read-only connection to the warehouse itself, closed afterwards; None while there is none."""
    location = pipeline_settings().warehouse if location is None else location
    if not lake.is_lake(location) and not Path(location).exists():
        yield None
        return
    try:
        con = connect(location, read_only=True)
    except lake.LakeMissingError:
        yield None
        return
    try:
        yield con
    finally:
        con.close()


def query_read_only(location: str | os.PathLike | Lake | None, sql: str, params: dict | None = None) -> list[tuple]:
    """One query through a short read-only connection to the warehouse itself (closed even when it fails)."""
    with reading(location) as con:
        if con is None:
            raise FileNotFoundError(f"No warehouse at {location}")
        return con.execute(sql, params or {}).fetchall()


def snapshot_path(warehouse_path: str | os.PathLike | None = None) -> Path:
    """Where the snapshot of a warehouse lives: ``x.duckdb`` -> ``x.snapshot.duckdb``, same folder."""
    path = Path(warehouse_path) if warehouse_path else pipeline_settings().warehouse
    if isinstance(path, Lake):
        raise ValueError("a DuckLake warehouse has no snapshot file: open_snapshot() attaches the lake")
    if not path.is_absolute() and not path.parent.exists() and (PROJECT_ROOT / path).parent.exists():
        path = PROJECT_ROOT / path  # a notebook's kernel runs in notebooks/: resolve against the project
    return snapshot_file(path)


def open_snapshot(path: str | os.PathLike | None = None, exact: bool = False) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the latest snapshot (``path`` is the warehouse or the snapshot file;
    ``exact=True`` opens ``path`` itself, e.g. a file ``wandb-assets fetch-warehouse`` downloaded).

    In DuckLake mode (``path`` or ``WANDB_ASSETS_DUCKDB`` a ``ducklake:`` string) the lake itself, read-only."""
    location = warehouse_location(value=str(path)) if path else pipeline_settings().warehouse
    if isinstance(location, Lake):
        return lake.connect(location, read_only=True)
    if path and (exact or str(path).endswith(".snapshot.duckdb")):
        target = Path(path)
    else:
        target = snapshot_path(path)
    if not target.exists():
        raise FileNotFoundError(
            f"No warehouse snapshot at {target}: it is published after each successful tick or backfill "
            "(`uv run wandb-assets refresh`, or `uv run wandb-assets demo` for synthetic data)."
        )
    # A private in-memory database that attaches the file: duckdb.connect(path) would hand back a cached
    # instance of an earlier snapshot while any connection to it is still open in this process.
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH {sql_string(str(target))} AS warehouse (READ_ONLY)")
    except duckdb.IOException as exc:
        con.close()
        sentence = file_open_error(target, exc)
        if sentence:
            raise RuntimeError(sentence) from None
        raise
    con.execute("USE warehouse")
    con.execute("SET TimeZone = 'UTC'")
    return con


def _window(column: str, start: date | datetime | str | None, end: date | datetime | str | None) -> tuple[str, dict]:
    """The one date-range rule of these helpers: ``start`` and ``end`` are days (a date, or an ISO string or
    datetime whose day counts), both included, whatever the column's type: ``end="2026-06-02"`` keeps
    everything up to 2026-06-02 23:59:59.999999 UTC."""
    clauses, params = [], {}
    if start is not None:
        clauses.append(f"{column} >= $start")
        params["start"] = _day(start)
    if end is not None:
        clauses.append(f"{column} < $end + INTERVAL 1 DAY")
        params["end"] = _day(end)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _day(value: date | datetime | str) -> date:
    if isinstance(value, datetime):
        return to_naive_utc(value).date()
    if isinstance(value, date):
        return value
    parsed = parse_timestamp(str(value))
    if parsed is None:
        raise ValueError(f"{value!r} is not a date like 2026-06-02.")
    return parsed.date()


def gauges_over_time(con, start=None, end=None):
    """The fleet gauges as a time series: one row per snapshot, one column per metric (pandas)."""
    where, params = _window("snapshot_at", start, end)
    frame = con.execute(f"SELECT snapshot_at, metric, value FROM fleet_metrics{where}", params).df()
    return frame.pivot(index="snapshot_at", columns="metric", values="value").sort_index()


def daily_fleet(con, start=None, end=None):
    """Daily success rate and GPU-hours per category (the ``daily_fleet`` view)."""
    where, params = _window("day", start, end)
    return con.execute(f"SELECT * FROM daily_fleet{where} ORDER BY day, category", params).df()


def main_sps(con, config: str | None = None):
    """Main-branch SPS per CI config in commit order (the ``main_sps_by_config`` view)."""
    where, params = (" WHERE ci_config = $config", {"config": config}) if config else ("", {})
    return con.execute(f"SELECT * FROM main_sps_by_config{where} ORDER BY ci_config, commit_order", params).df()


def ci_runs(con, start=None, end=None):
    """Every push-to-main run (main and PRs) with its SPS values."""
    where, params = _window("created_at", start, end)
    return con.execute(f"SELECT * FROM push_to_main_sps{where} ORDER BY created_at", params).df()


def sps_regressions(con):
    """Every ``sps_regression`` alert, open or resolved: the last good and first slow commit of each."""
    return con.execute(
        "SELECT details->>'ci_config' AS ci_config, opened_at, resolved_at, "
        "details->>'last_good_commit' AS last_good_commit, details->>'first_slow_commit' AS first_slow_commit, "
        "(details->>'confirming_runs')::BIGINT AS confirming_runs, (details->>'before')::DOUBLE AS before, "
        "(details->>'after')::DOUBLE AS after, (details->>'change_pct')::DOUBLE AS change_pct "
        "FROM alerts WHERE rule = 'sps_regression' ORDER BY opened_at"
    ).df()


def change_points(con, config: str | None = None, since=None, metric: str | None = None):
    """The regressions the detector finds in the warehouse's main-branch history (a backtest: what would have
    paged, and when), one row per regression; ``since`` keeps those first slow on or after that day. Read from
    ``sps_change_points`` (recorded by each tick's alert evaluation) while the main series are what they were
    then; found anew otherwise (a second or two at a million runs)."""
    import pandas as pd

    from wandb_assets.lib.alerts import change_points as found
    from wandb_assets.settings import load_settings

    metric = metric or load_settings().WANDB_ASSETS_SPS_METRIC
    latest = con.execute("SELECT max(ended_at) FROM runs").fetchone()[0]
    rows = [row for row in (found(con, latest, metric) if latest else []) if config in (None, row["ci_config"])]
    frame = pd.DataFrame(rows, columns=CHANGE_POINT_COLUMNS)
    if since is not None and len(frame):
        frame = frame[frame.first_slow_created_at >= pd.Timestamp(_day(since))]
    return frame.reset_index(drop=True)


CHANGE_POINT_COLUMNS = [
    "ci_config",
    "last_good_commit",
    "first_slow_commit",
    "first_slow_created_at",
    "detected_commit",
    "before",
    "after",
    "change_pct",
    "confirming_runs",
    "recovered_commit",
    "first_slow_url",
]


def sweeps(con, start=None, end=None):
    """One row per sweep: outcomes and GPU cost (the ``sweep_summary`` view); ``start``/``end`` keep the sweeps
    whose last run was created in those days."""
    where, params = _window("last_created_at", start, end)
    return con.execute(f"SELECT * FROM sweep_summary{where} ORDER BY gpu_hours DESC", params).df()


def gpu_costs(con, start=None, end=None):
    """GPU-hours, dollars and idle GPU-hours per UTC day, project, user, team, category and GPU model (the
    ``gpu_usage`` table); ``start``/``end`` are days."""
    where, params = _window("day", start, end)
    return con.execute(f"SELECT * FROM gpu_usage{where} ORDER BY day, cost_usd DESC NULLS LAST", params).df()


def _mart(con, name: str, where: str = "", params: dict | None = None):
    from wandb_assets.lib.exports import has_chargeback

    if not has_chargeback(con):
        raise RuntimeError(
            "The analysts' dbt marts are not in this warehouse yet: they are built after each tick while "
            "WANDB_ASSETS_ANALYTICS is true (`uv run wandb-assets analytics` builds them now)."
        )
    return con.execute(f"SELECT * FROM analytics.{name}{where}", params or {}).df()


def team_budget_vs_spend(con):
    """Each team's spend per month against its budget: the analysts' dbt mart ``analytics.team_budget_vs_spend``."""
    return _mart(con, "team_budget_vs_spend", " ORDER BY month, spend_usd DESC NULLS LAST")


def chargeback(con, month: date | str | None = None):
    """The chargeback (the dbt mart ``analytics.team_gpu_cost_monthly``), one month (its first day) or all."""
    if month is None:
        return _mart(con, "team_gpu_cost_monthly", " ORDER BY month, cost_usd DESC NULLS LAST")
    return _mart(
        con,
        "team_gpu_cost_monthly",
        " WHERE month = $month ORDER BY cost_usd DESC NULLS LAST",
        {"month": _day(month).replace(day=1)},
    )


def top_idle_runs(con, limit: int = 10, now=None, idle_pct: float | None = None):
    """The runs that left the most GPU-hours idle (from ``gpu_samples``; ``WANDB_ASSETS_IDLE_GPU_PCT``)."""
    from wandb_assets.lib.derived import TOP_IDLE_RUNS_SQL
    from wandb_assets.settings import load_settings

    at = now or con.execute("SELECT max(snapshot_at) FROM gpu_samples").fetchone()[0] or datetime(1970, 1, 1)
    pct = load_settings().WANDB_ASSETS_IDLE_GPU_PCT if idle_pct is None else idle_pct
    return con.execute(TOP_IDLE_RUNS_SQL, {"now": at, "idle_pct": pct, "limit": limit}).df()


def gpu_hours_by_source(con, now=None):
    """GPU-hours by where each run's GPU count came from (``gpu_count_source``): the share that is a guess."""
    from wandb_assets.lib.derived import GPU_HOURS_BY_SOURCE_SQL

    at = now or con.execute("SELECT max(snapshot_at) FROM fleet_metrics").fetchone()[0] or datetime(1970, 1, 1)
    return con.execute(GPU_HOURS_BY_SOURCE_SQL, {"now": at}).df()


def alive_runs(con):
    """Runs alive now, oldest first (the ``alive_runs`` view)."""
    return con.execute("SELECT * FROM alive_runs ORDER BY created_at").df()


#: The first day counts as partial when its first run was created this long after midnight (UTC).
PARTIAL_FIRST_DAY_AFTER = timedelta(hours=1)


def partial_days(con) -> dict[date, str]:
    """Days whose daily numbers cover only part of the day, with why: the first day when the data starts later
    than 01:00 UTC (a backfill from the middle of a day), and the day of the latest snapshot (so far). Charts
    grey them out so that they do not read as drops."""
    first, latest = con.execute(
        "SELECT min(created_at), coalesce((SELECT max(snapshot_at) FROM fleet_metrics), max(heartbeat_at)) FROM runs"
    ).fetchone()
    partial: dict[date, str] = {}
    if first is not None and first - datetime.combine(first.date(), datetime.min.time()) > PARTIAL_FIRST_DAY_AFTER:
        partial[first.date()] = f"data starts {first:%H:%M} UTC"
    if latest is not None:
        so_far = f"until {latest:%H:%M} UTC"
        partial[latest.date()] = f"{partial[latest.date()]}, {so_far}" if latest.date() in partial else so_far
    return partial


def curves_missing(con, metric: str = "overview/sps") -> str | None:
    """What the curves charts lack on this warehouse, in a sentence that names the command or setting that fills
    it (None when the curves of ``metric`` are there): no run's curves read yet, or none of ``metric``."""
    read = con.execute("SELECT count(*) FROM runs WHERE curves_status = 'read'").fetchone()[0]
    if not read:
        return (
            "No run's curves are read yet: the curves job reads each ended run's once between the ticks; "
            "`uv run wandb-assets curves` reads them all now (WANDB_ASSETS_FETCH_HISTORY must be true)."
        )
    held = [m for (m,) in con.execute("SELECT metric FROM run_history GROUP BY 1 ORDER BY count(*) DESC").fetchall()]
    if metric in held:
        return None
    return (
        f"No run's curves hold {metric!r}; they hold {', '.join(repr(m) for m in held[:5]) or 'no history key'}: "
        "set the notebook's metric (and WANDB_ASSETS_SPS_METRIC, for steady SPS) to one of them, or add the key to "
        "WANDB_ASSETS_HISTORY_KEYS."
    )


def ci_curves(con, config: str, metric: str = "overview/sps", commits: int = 8):
    """The ``metric`` curves (``run_history``) of the last ``commits`` main-branch runs of CI config ``config``, in
    commit order: one row per point (``commit_order`` 1 = the oldest shown), with each run's ``sps_steady``."""
    return con.execute(
        """WITH main AS (
            SELECT entity, project, run_id, ci_commit, sps_steady,
                   row_number() OVER (ORDER BY coalesce(ci_timestamp, created_at) DESC, run_id DESC) AS newest
            FROM runs WHERE category = 'push_to_main' AND ci_branch = 'main' AND ci_config = $config
              AND curves_status = 'read'
        )
        SELECT $commits + 1 - m.newest AS commit_order, m.ci_commit, m.run_id, m.sps_steady, h.step, h.value
        FROM main m JOIN run_history h USING (entity, project, run_id)
        WHERE m.newest <= $commits AND h.metric = $metric
        ORDER BY commit_order, h.step""",
        {"config": config, "metric": metric, "commits": commits},
    ).df()


def steady_sps_by_gpu_model(con):
    """Per CI config and GPU model: the runs with a steady SPS (``runs.sps_steady``), their median and spread."""
    return con.execute(
        """SELECT ci_config, coalesce(gpu_model, '(no model)') AS gpu_model, count(*) AS runs,
                  median(sps_steady) AS median_sps, quantile_cont(sps_steady, 0.1) AS p10_sps,
                  quantile_cont(sps_steady, 0.9) AS p90_sps
           FROM runs WHERE sps_steady IS NOT NULL AND ci_config IS NOT NULL
           GROUP BY ALL ORDER BY ci_config, median_sps DESC"""
    ).df()


def gpu_utilisation_by_run(con, hours: int = 24, runs: int = 30, bin_minutes: int = 30):
    """The fleet's last ``hours`` (up to its newest GPU sample) from the runs' sampled GPU streams
    (``run_gpu_samples``): the mean utilisation of each run's GPUs per ``bin_minutes``, for the ``runs`` runs with the
    most samples then (pandas: run label x bin start)."""
    return con.execute(
        """WITH recent AS (
            SELECT g.*, max(g."timestamp") OVER () AS newest FROM run_gpu_samples g
        ), window_ AS (
            SELECT * FROM recent WHERE "timestamp" > newest - to_hours($hours::BIGINT)
        ), top AS (
            SELECT entity, project, run_id, count(*) AS samples FROM window_ GROUP BY ALL
            ORDER BY samples DESC, run_id LIMIT $runs
        )
        SELECT coalesce(r.name, w.run_id) || ' (' || coalesce(r.gpu_model, '?') || ')' AS run,
               time_bucket(to_minutes($bin::BIGINT), w."timestamp") AS bin_start, avg(w.util_pct) AS util_pct
        FROM window_ w JOIN top USING (entity, project, run_id)
        JOIN runs r USING (entity, project, run_id)
        GROUP BY ALL ORDER BY run, bin_start""",
        {"hours": hours, "runs": runs, "bin": bin_minutes},
    ).df()
