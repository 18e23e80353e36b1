"""The 24 fleet gauges (the old cron's 20, four of GPU cost and idleness): one definition each, evaluated in
one set-based SQL query over ``runs`` (and ``gpu_samples`` for idle GPU-hours).

Window ``W = (snapshot_at - 24 h, snapshot_at]``. A run has *ended in W* when its state is finished,
failed, crashed, killed or preempted and its ``ended_at`` lies in W. *Alive* means state ``running``.
Runs created after ``snapshot_at`` did not exist at snapshot time and are ignored. A gauge whose value
is undefined (a mean or a rate over no runs, no SPS value to report) is NULL.

GPU-hours: each run occupies ``[created_at, end]`` where ``end`` is ``ended_at`` for ended runs and
``snapshot_at`` for running or preempting runs; pending runs (and ended runs with no end time) occupy
nothing. The part of that span inside W, times ``gpu_count``, is summed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from wandb_assets.lib.accounting.gpus import DEFAULT_IDLE_GPU_PCT
from wandb_assets.lib.accounting.idle import CURVE_IDLE_RUNS_SQL, TICK_INTERVAL, held_daily_sql, held_sql, idle_of_run
from wandb_assets.lib.accounting.prices import PRICE_SCHEDULE_CTE, price_on_sql
from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.sql import (
    ENDED_SQL,
    FAILED_SQL,
    MIRRORED_RUNS_SQL,
    SPS_SQL_STATES,
    busy_until_sql,
    success_rate_sql,
)


@dataclass(frozen=True)
class Gauge:
    """One fleet metric: its Datadog/warehouse name, what it means, and its SQL aggregate."""

    name: str
    description: str
    sql: str


def _count(condition: str) -> str:
    return f"count(*) FILTER (WHERE {condition})"


def _rate_pct(scope: str) -> str:
    completed = _count(f"{scope} AND ended_in_w AND state = 'finished'")
    failed = _count(f"{scope} AND ended_in_w AND state IN ({FAILED_SQL})")
    return success_rate_sql(completed, failed)


def _latest_sps(column: str) -> str:
    return (
        f"arg_max({column}, struct_pack(e := ended_at, id := run_id)) FILTER (WHERE is_ci AND ended_in_w"
        f" AND state IN ({SPS_SQL_STATES}) AND {column} IS NOT NULL)"
    )


_CI = "is_ci"
_SWEEP = "category = 'sweep'"
_ANY = "TRUE"

GAUGES: tuple[Gauge, ...] = (
    Gauge("wandb.runs.active", "runs alive (state running) now, whatever their creation time", _count("alive")),
    Gauge("wandb.runs.completed_24h", "runs finished, ended in W", _count("ended_in_w AND state = 'finished'")),
    Gauge(
        "wandb.runs.failed_24h",
        "runs failed or crashed, ended in W",
        _count(f"ended_in_w AND state IN ({FAILED_SQL})"),
    ),
    Gauge(
        "wandb.runs.total_recent",
        "runs alive now, or ended in W, or created in W (each run once)",
        _count("recent"),
    ),
    Gauge(
        "wandb.training.avg_duration_hours",
        "mean of ended_at - created_at, in hours, over runs ended in W",
        "avg(duration_hours) FILTER (WHERE ended_in_w)",
    ),
    Gauge(
        "wandb.training.total_gpu_hours_24h",
        "sum of gpu_count x hours of each run's [created_at, ended_at or snapshot_at] inside W",
        "coalesce(sum(gpu_hours_in_w), 0)",
    ),
    Gauge(
        "wandb.push_to_main.runs_completed_24h",
        "push-to-main runs finished, ended in W",
        _count(f"{_CI} AND ended_in_w AND state = 'finished'"),
    ),
    Gauge(
        "wandb.push_to_main.runs_failed_24h",
        "push-to-main runs failed or crashed, ended in W",
        _count(f"{_CI} AND ended_in_w AND state IN ({FAILED_SQL})"),
    ),
    Gauge(
        "wandb.push_to_main.success_rate_pct",
        "100 x completed / (completed + failed) among push-to-main runs ended in W; NULL when 0/0",
        _rate_pct(_CI),
    ),
    Gauge(
        "wandb.push_to_main.avg_duration_hours",
        "mean duration in hours of push-to-main runs ended in W",
        f"avg(duration_hours) FILTER (WHERE {_CI} AND ended_in_w)",
    ),
    *(
        Gauge(
            "wandb.push_to_main." + key.replace("/", "."),
            f"summary '{key}' of the push-to-main run that ended latest in W among runs finished or"
            " crashed with a finite value for that key",
            _latest_sps(column),
        )
        for key, column in SPS_KEYS.items()
    ),
    Gauge("wandb.sweep.runs_total_24h", "sweep runs counted by total_recent", _count(f"{_SWEEP} AND recent")),
    Gauge(
        "wandb.sweep.runs_completed_24h",
        "sweep runs finished, ended in W",
        _count(f"{_SWEEP} AND ended_in_w AND state = 'finished'"),
    ),
    Gauge(
        "wandb.sweep.runs_failed_24h",
        "sweep runs failed or crashed, ended in W",
        _count(f"{_SWEEP} AND ended_in_w AND state IN ({FAILED_SQL})"),
    ),
    Gauge("wandb.sweep.runs_active", "sweep runs alive now", _count(f"{_SWEEP} AND alive")),
    Gauge(
        "wandb.sweep.success_rate_pct",
        "100 x completed / (completed + failed) among sweep runs ended in W; NULL when 0/0",
        _rate_pct(_SWEEP),
    ),
    # GPU accounting (issue 22): what the GPUs cost and which of them sit idle. GPU-hours of the last 24 h are
    # wandb.training.total_gpu_hours_24h above.
    Gauge(
        "wandb.gpu.idle_gpus",
        "GPUs below WANDB_ASSETS_IDLE_GPU_PCT in the latest system sample of the runs alive now (a run without "
        "system metrics counts none)",
        "coalesce(sum(idle_gpus_now) FILTER (WHERE alive), 0)",
    ),
    Gauge(
        "wandb.gpu.cost_usd_24h",
        "USD of the GPU-hours in W of runs whose model has a price (WANDB_ASSETS_GPU_PRICES): GPU-hours x USD per "
        "GPU-hour; the rest is wandb.gpu.unpriced_gpu_hours_24h. NULL (never 0) when GPU-hours in W have no price "
        "and none has one; 0 when there are no GPU-hours in W",
        "CASE WHEN count(*) FILTER (WHERE gpu_hours_in_w > 0 AND usd_per_gpu_hour IS NOT NULL) > 0 "
        "THEN sum(gpu_hours_in_w * usd_per_gpu_hour) FILTER (WHERE gpu_hours_in_w > 0) "
        "WHEN count(*) FILTER (WHERE gpu_hours_in_w > 0) > 0 THEN NULL ELSE 0 END",
    ),
    Gauge(
        "wandb.gpu.unpriced_gpu_hours_24h",
        "GPU-hours in W of runs whose model has no price (or is unknown): not in wandb.gpu.cost_usd_24h",
        "coalesce(sum(gpu_hours_in_w) FILTER (WHERE usd_per_gpu_hour IS NULL), 0)",
    ),
    Gauge(
        "wandb.gpu.idle_gpu_hours_24h",
        "idle GPU-hours in W, one source per run as in gpu_usage: its sampled GPU stream once its curves are read "
        "(run_gpu_samples), else the samples taken at each snapshot (gpu_samples); each sample holds until the run's "
        "next one, its end or the snapshot (the one hold rule, docs/gpu-accounting.md)",
        "coalesce(sum(idle_gpu_hours_in_w), 0)",
    ),
)
GAUGE_NAMES: tuple[str, ...] = tuple(g.name for g in GAUGES)


def curve_idle_sql(now: str, runs: str, samples: str = "run_gpu_samples", prefix: str = "") -> str:
    """CTEs ``curve_sampled``, ``gaps``, ``held``, ``held_daily`` (each named with ``prefix`` first): per run of
    ``runs`` (a set of ``(entity, project, run_id)``) and sample of its stream (``samples``: ``run_gpu_samples``, or the
    rows about to be loaded into it) up to ``now``, held by the one rule (``lib.idle``) and cut at UTC midnights."""
    return f"""
{prefix}curve_sampled AS (
    SELECT g.entity, g.project, g.run_id, g."timestamp" AS sampled_at,
           count(*) FILTER (WHERE g.util_pct < $idle_pct) AS idle,
           count(*) FILTER (WHERE g.util_pct >= $idle_pct) AS busy,
           count(g.util_pct) AS gpus
    FROM {samples} g
    WHERE (g.entity, g.project, g.run_id) IN {runs}
    GROUP BY ALL
),
{held_sql(f"{prefix}curve_sampled", "runs", now, prefix=prefix)},
{held_daily_sql(f"{prefix}held").replace("held_daily AS", f"{prefix}held_daily AS")}"""


def held_samples_sql(runs: str, now: str) -> str:
    """CTEs ``sampled``, ``gaps`` and ``held``: per run of ``runs`` and snapshot of ``gpu_samples`` up to ``now``, its
    ``idle`` GPUs and until when that sample holds (``lib.idle``: the one rule). An offline run's own log has every
    sample: it is left to ``log_idle_gpu_hours``."""
    return f"""
sampled AS (
    SELECT s.entity, s.project, s.run_id, s.snapshot_at AS sampled_at,
           count(*) FILTER (WHERE s.utilisation < $idle_pct) AS idle,
           count(*) FILTER (WHERE s.utilisation >= $idle_pct) AS busy, count(*) AS gpus
    FROM gpu_samples s GROUP BY ALL
),
{held_sql("sampled", f"(SELECT * FROM {runs} WHERE log_idle_gpu_hours IS NULL)", now, TICK_INTERVAL)}"""


_GAUGE_SQL = """
WITH w AS (SELECT $snapshot_at::TIMESTAMP AS t1, $snapshot_at::TIMESTAMP - INTERVAL 24 HOUR AS t0),
{prices},
{held},
{curve_held},
idle_in_w AS (  -- one source per run, as gpu_usage: its curves' stream once read, else the ticks' samples
    SELECT entity, project, run_id, sum(idle * greatest(
        epoch(least(until, w.t1)) - epoch(greatest(sampled_at, w.t0)), 0) / 3600.0) AS idle_gpu_hours_in_w
    FROM (SELECT entity, project, run_id, sampled_at, until, idle FROM held
          UNION ALL SELECT entity, project, run_id, sampled_at, until, idle FROM curve_held), w
    GROUP BY ALL
),
classified AS (
    SELECT runs.*, w.t0, w.t1,
        category = 'push_to_main' AS is_ci,
        state = 'running' AS alive,
        state IN ({ended})
            AND ended_at > w.t0 AND ended_at <= w.t1 AS ended_in_w,
        {busy_until} AS busy_until,
        {usd} AS usd_per_gpu_hour,
        {idle_now} AS idle_gpus_now,
        i.idle_gpu_hours_in_w
    FROM {runs} AS runs CROSS JOIN w
    LEFT JOIN idle_in_w i USING (entity, project, run_id)
    -- a run that ended before W counts in no gauge (busy until its end, its samples held no later): the history's
    -- million runs are not classified at every snapshot (0.56 s -> 0.18 s a query at a million runs)
    WHERE created_at <= w.t1 AND NOT coalesce(state IN ({ended}) AND ended_at <= w.t0, false)
),
flagged AS (
    SELECT *,
        alive OR ended_in_w OR (created_at > t0) AS recent,
        -- least() skips NULLs, so a run that occupies nothing (pending) must be zeroed explicitly
        CASE WHEN busy_until IS NULL THEN 0 ELSE gpu_count * greatest(
            epoch(least(busy_until, t1)) - epoch(greatest(created_at, t0)), 0) / 3600.0 END AS gpu_hours_in_w
    FROM classified
)
SELECT {columns} FROM {rows}{group}
"""
#: ``by_project``: every project with a run created by the snapshot has its row, its gauges 0 or NULL when none of its
#: runs is alive or in W (rows of NULL flags count nowhere), as when every run was classified
_EVERY_PROJECT = """(SELECT * FROM flagged UNION ALL BY NAME
    SELECT DISTINCT entity, project FROM {runs} AS runs, w WHERE created_at <= w.t1)"""


#: ``runs`` as they looked at ``$snapshot_at``, reconstructed from today's rows for a replayed history: a run
#: that ended after that moment was still running then (no end, heartbeat at most that moment). What cannot
#: be reconstructed (a run pending then, running later) stays as it is now.
RUNS_AS_OF_SQL = f"""(SELECT * REPLACE (
    CASE WHEN ended_at > $snapshot_at THEN 'running' ELSE state END AS state,
    CASE WHEN ended_at > $snapshot_at THEN NULL ELSE ended_at END AS ended_at,
    least(heartbeat_at, $snapshot_at::TIMESTAMP) AS heartbeat_at
) FROM {MIRRORED_RUNS_SQL} runs)"""


#: ``gauge_query(with_fleet=True)``: the column that is true on the row of the whole fleet.
WHOLE_FLEET = "whole_fleet"


def gauge_query(as_of: bool = False, by_project: bool = False, with_fleet: bool = False) -> str:
    """The SQL that evaluates every gauge at ``$snapshot_at`` (a naive UTC timestamp); ``as_of``: over
    ``RUNS_AS_OF_SQL`` (a replayed past snapshot) instead of the ``runs`` table. ``by_project``: one row per
    ``entity, project`` (the same aggregates over each project's runs) instead of one over the whole fleet;
    ``with_fleet``: both in one pass over the runs, the fleet's the row whose ``WHOLE_FLEET`` is true (its entity and
    project NULL; the rows a project without runs adds count in no gauge, so it is the fleet's row unchanged)."""
    columns = ",\n    ".join(f'({g.sql})::DOUBLE AS "{g.name}"' for g in GAUGES)
    if by_project or with_fleet:
        columns = "entity, project,\n    " + columns
    if with_fleet:
        columns = f"GROUPING(entity) = 1 AS {WHOLE_FLEET}, " + columns
    group = (
        " GROUP BY GROUPING SETS ((entity, project), ())"
        if with_fleet
        else " GROUP BY entity, project"
        if by_project
        else ""
    )
    runs = RUNS_AS_OF_SQL if as_of else MIRRORED_RUNS_SQL
    return _GAUGE_SQL.format(
        columns=columns,
        rows=_EVERY_PROJECT.format(runs=runs) if by_project or with_fleet else "flagged",
        ended=ENDED_SQL,
        busy_until=busy_until_sql("w.t1"),
        runs=runs,
        group=group,
        prices=PRICE_SCHEDULE_CTE,
        usd=price_on_sql("runs", "w.t1::DATE"),
        held=held_samples_sql(
            f"(SELECT * FROM {runs} r WHERE (entity, project, run_id) NOT IN {CURVE_IDLE_RUNS_SQL})",
            "$snapshot_at::TIMESTAMP",
        ),
        curve_held=curve_idle_sql("$snapshot_at::TIMESTAMP", CURVE_IDLE_RUNS_SQL, prefix="curve_"),
        idle_now=idle_of_run(
            "len(list_filter(latest_gpu_sample, g -> g.utilisation < $idle_pct))", "len(latest_gpu_sample)", "gpu_count"
        ),
    )


#: One ``project_metrics`` row per project and gauge at ``$snapshot_at``, NULL values kept (set-based), from
#: ``{query}``'s rows of ``entity, project`` and the gauges.
PROJECT_METRICS_SQL = """
SELECT $snapshot_at::TIMESTAMP AS snapshot_at, entity, project, metric, value
FROM ({query}) UNPIVOT INCLUDE NULLS (value FOR metric IN (COLUMNS(* EXCLUDE (entity, project))))
"""


def gauge_params(snapshot_at: datetime, idle_pct: float = DEFAULT_IDLE_GPU_PCT) -> dict[str, Any]:
    """The parameters of ``gauge_query``: the snapshot time and the utilisation (percent) below which a GPU is idle.
    Dollars are the GPU-hours at the prices in force on the snapshot's UTC day (``gpu_price_periods``, the run's model
    and cluster): a rate, not a bill (``gpu_usage`` prices each day at its own period)."""
    return {"snapshot_at": snapshot_at, "idle_pct": idle_pct}


def compute_gauges(
    con,
    snapshot_at: datetime,
    as_of: bool = False,
    idle_pct: float = DEFAULT_IDLE_GPU_PCT,
) -> dict[str, float | None]:
    """Evaluate every gauge against the ``runs`` table of a DuckDB connection (``as_of``: as the runs
    looked at ``snapshot_at``, see ``RUNS_AS_OF_SQL``; ``idle_pct``: see ``gauge_params``)."""
    values = con.execute(gauge_query(as_of), gauge_params(snapshot_at, idle_pct)).fetchone()
    return dict(zip(GAUGE_NAMES, values, strict=True))


def compute_project_gauges(
    con, snapshot_at: datetime, idle_pct: float = DEFAULT_IDLE_GPU_PCT
) -> dict[tuple[str, str], dict[str, float | None]]:
    """``compute_gauges`` per ``(entity, project)``: the same definitions over each project's runs alone."""
    rows = con.execute(gauge_query(by_project=True), gauge_params(snapshot_at, idle_pct)).fetchall()
    return {(row[0], row[1]): dict(zip(GAUGE_NAMES, row[2:], strict=True)) for row in sorted(rows)}


def snapshot_gauge(con, snapshot_at: datetime, name: str, idle_pct: float = DEFAULT_IDLE_GPU_PCT) -> float | None:
    """Gauge ``name`` of the fleet at ``snapshot_at``: as the snapshot taken then stored it (``fleet_metrics``: what
    Datadog was sent), else computed now (``compute_gauges``)."""
    stored = con.execute(
        "SELECT value FROM fleet_metrics WHERE snapshot_at = $t AND metric = $name", {"t": snapshot_at, "name": name}
    ).fetchone()
    return stored[0] if stored is not None else compute_gauges(con, snapshot_at, idle_pct=idle_pct)[name]


def snapshot_project_gauge(
    con, snapshot_at: datetime, name: str, idle_pct: float = DEFAULT_IDLE_GPU_PCT
) -> dict[tuple[str, str], float | None]:
    """Gauge ``name`` of each project at ``snapshot_at``: as the snapshot taken then stored it (``project_metrics``),
    else computed now (``compute_project_gauges``). A tick's checks and alerts read the snapshot they judge instead of
    evaluating every gauge of every project again, twice (0.6 s each at a million runs)."""
    stored = con.execute(
        "SELECT entity, project, value FROM project_metrics WHERE snapshot_at = $t AND metric = $name "
        "ORDER BY entity, project",
        {"t": snapshot_at, "name": name},
    ).fetchall()
    if stored:
        return {(e, p): value for e, p, value in stored}
    return {key: gauges[name] for key, gauges in compute_project_gauges(con, snapshot_at, idle_pct).items()}


def gauge_unit(name: str) -> str:
    """What a gauge counts, from its name: runs, %, hours, GPU-hours or steps/s."""
    if name.endswith("_pct"):
        return "%"
    if "gpu_hours" in name:
        return "GPU-hours"
    if "_usd" in name:
        return "USD"
    if name.endswith("_gpus"):
        return "GPUs"
    if name.endswith("_hours"):
        return "hours"
    if name.endswith(("sps", "steps_per_second")):
        return "steps/s"
    return "runs"


def rounded_gauge(name: str, value: float | None) -> float | int | None:
    """A gauge as people read it: counts as whole numbers, everything else to two decimals."""
    if value is None:
        return None
    return int(round(value)) if gauge_unit(name) in ("runs", "GPUs") else round(float(value), 2)


def format_gauge(name: str, value: float | None) -> str:
    """``24``, ``74.68``, ``2,166.39`` or ``NULL``: the CLI's and the tables' text for a value."""
    shown = rounded_gauge(name, value)
    if shown is None:
        return "NULL"
    return f"{shown:,}" if isinstance(shown, int) else f"{shown:,.2f}"
