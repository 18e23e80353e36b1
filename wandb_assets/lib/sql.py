"""Small SQL helpers shared by the warehouse modules. No Dagster here."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from wandb_assets.lib.normalize import (
    ALIVE_STATES,
    BUSY_STATES,
    ENDED_STATES,
    FAILED_STATES,
    RATED_STATES,
    SPS_STATES,
    VANISHED,
)


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal, for the statements that take no parameters (ATTACH, COMMENT)."""
    return "'" + text.replace("'", "''") + "'"


def sql_list(states: tuple[str, ...]) -> str:
    """``'a', 'b'``: a state set ready for ``state IN (...)`` (our own constants, never user input)."""
    return ", ".join(f"'{state}'" for state in states)


def literal_path(path: str) -> str:
    """``path`` as a file name DuckDB's readers take literally: they expand ``*``, ``?`` and ``[...]`` as a glob,
    so a staging folder named ``staging[1]`` would read ``staging1``'s files. Each such character is put in a
    class of its own (``[[]``, ``[*]``, ``[?]``)."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in str(path))


#: The state sets of ``lib.normalize`` as SQL lists: every query uses these, none spells a state list itself.
ENDED_SQL = sql_list(ENDED_STATES)
ALIVE_SQL = sql_list(ALIVE_STATES)
BUSY_SQL = sql_list(BUSY_STATES)
FAILED_SQL = sql_list(FAILED_STATES)
RATED_SQL = sql_list(RATED_STATES)
SPS_SQL_STATES = sql_list(SPS_STATES)


#: A mirrored row (``source`` wandb) of a project the last fetch mirrored (``wandb_projects.mirrored``); with no
#: project recorded yet, every project counts. Offline rows (air-gapped logs) are no project's mirror: they count.
#: The project test is an uncorrelated ``IN`` (never NULL, as ``EXISTS``): a correlated ``EXISTS`` made DuckDB join
#: every run to the distinct projects of the runs (0.35 s of the gauges' 0.6 s at a million runs).
MIRRORED_NOW_SQL = (
    "(coalesce(runs.source, 'wandb') <> 'wandb' OR NOT EXISTS (SELECT 1 FROM wandb_projects) "
    "OR coalesce((runs.entity, runs.project) IN (SELECT (entity, project) FROM wandb_projects WHERE mirrored), false))"
)
#: The runs every gauge, Datadog series and alert counts: those mirrored now (``MIRRORED_NOW_SQL``). A project that
#: left the mirror set keeps its rows, out of every gauge and alert (its past stays in the GPU-hour and cost tables).
MIRRORED_RUNS_SQL = f"(SELECT * FROM runs WHERE {MIRRORED_NOW_SQL})"


#: The current time as a naive UTC timestamp, whatever the connection's TimeZone setting.
NOW_UTC_SQL = "current_timestamp AT TIME ZONE 'UTC'"


def success_rate_sql(completed: str, failed: str) -> str:
    """The one success-rate rule, as SQL: completed out of completed + failed, in percent; NULL when both are 0
    (a rate of runs that all ended otherwise, or of no run, is undefined, not 0 or 100). Counts are summed
    before dividing: a rate over several projects is never an average of their rates."""
    return f"100.0 * ({completed}) / nullif(({completed}) + ({failed}), 0)"


def busy_until_sql(now: str) -> str:
    """The one GPU-hours rule, as SQL: when a run stops occupying its GPUs, seen at time ``now``.

    An ended run occupies ``[created_at, ended_at]``; a running or preempting run ``[created_at, now]``; a vanished
    run ``[created_at, heartbeat_at]`` (last seen; ``now`` at most); a pending run (or an ended run without an end
    time) nothing (NULL). GPU-hours = ``gpu_count`` times the part of that span one wants, in hours.
    """
    return (
        f"CASE WHEN state IN ({ENDED_SQL}) THEN ended_at WHEN state IN ({BUSY_SQL}) THEN {now} "
        f"WHEN state = '{VANISHED}' THEN least(heartbeat_at, {now}) END"
    )


def run_gpu_hours_sql(now: str) -> str:
    """A run's whole GPU-hours seen at ``now`` (``busy_until_sql``): ``gpu_count`` times its busy span in hours;
    NULL when it occupies nothing."""
    return f"gpu_count * greatest(epoch({busy_until_sql(now)}) - epoch(created_at), 0) / 3600.0"


def daily_gpu_hours_sql(columns: str, table: str = "runs", until: str = "$now::TIMESTAMP") -> str:
    """CTEs ``spans`` and ``daily``: each run's busy span (``busy_until_sql`` at ``until``) cut at UTC midnights,
    one row per run and day with ``day_start`` and ``gpu_hours`` (its GPUs times the hours of that day), carrying
    the ``columns`` of ``table``. The one GPU-hours rule of the gpu_hours and gpu_usage tables and of each run's
    cost (priced day by day)."""
    return f"""
spans AS (
    SELECT {columns}, gpu_count, created_at AS span_start, {busy_until_sql(until)} AS span_end
    FROM {table} WHERE created_at IS NOT NULL
),
daily AS (
    SELECT *, gpu_count * (epoch(least(span_end, day_start + INTERVAL 1 DAY))
                           - epoch(greatest(span_start, day_start))) / 3600.0 AS gpu_hours
    FROM (
        SELECT *,
               -- range() excludes its end: a span ending exactly at midnight adds no 0-hour day after it
               unnest(range(date_trunc('day', span_start), span_end, INTERVAL 1 DAY)) AS day_start
        FROM spans WHERE span_end > span_start
    )
)"""


#: Opens a warehouse connection for a short ``with`` block. Steps that also talk to the network take one of
#: these instead of a connection, so that they can close the warehouse before any request goes out.
Connect = Callable[[], AbstractContextManager]


def reusing(con) -> Connect:
    """A ``Connect`` that hands out one already open connection (an in-memory database, a test)."""
    return lambda: nullcontext(con)


def dict_rows(con, sql: str, params: dict) -> list[dict]:
    """The rows of ``sql`` as dicts by column name."""
    cursor = con.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@contextmanager
def transaction(con) -> Iterator[None]:
    """``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` when the body raises (so a failed write changes nothing)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


#: ``warehouse_meta`` key: a token made anew by every write to what the derived tables are computed from (runs, their
#: curves' idle hours, the tick's GPU samples). A derived table records the token it was built from, so ``check``
#: compares it with a fresh recomputation only when nothing it depends on changed since.
INPUTS_KEY = "inputs_version"
#: ``warehouse_meta`` key: how ``gpu_usage`` was last built (its ``now``, prices, teams and idle threshold, and the
#: inputs' token), so ``check`` can compute it again and compare.
GPU_USAGE_BUILD_KEY = "gpu_usage_build"


def set_meta(con, key: str, value: str) -> None:
    """``warehouse_meta[key] = value`` (inside the caller's transaction)."""
    con.execute("DELETE FROM warehouse_meta WHERE key = $k", {"k": key})
    con.execute("INSERT INTO warehouse_meta VALUES ($k, $v)", {"k": key, "v": value})


def meta_value(con, key: str) -> str | None:
    """``warehouse_meta[key]``, or None."""
    row = con.execute("SELECT value FROM warehouse_meta WHERE key = $k", {"k": key}).fetchone()
    return row[0] if row else None


def inputs_changed(con) -> None:
    """Record that the inputs of the derived tables changed (``INPUTS_KEY``; inside the writer's transaction)."""
    set_meta(con, INPUTS_KEY, uuid.uuid4().hex)
