"""The tables derived from ``runs`` (and the GPU samples), each rebuilt whole in one short transaction: success
rates, GPU-hours per day, and ``gpu_usage`` (GPU-hours, idle hours and dollars per day, project, user, team and GPU
model), with the SQL of each (the CI throughput series, ``push_to_main_sps``, is a view: ``lib.warehouse``). What
changes together with the rules of GPU accounting (docs/gpu-accounting.md) lives here; ``lib.warehouse`` holds the
schema and the loads. No Dagster here.
"""

from __future__ import annotations

import json
from datetime import datetime

from wandb_assets.lib.accounting.closing import CLOSED_BY_SETTING, close_month, months_due, rebuild_charges
from wandb_assets.lib.accounting.gpus import DEFAULT_IDLE_GPU_PCT
from wandb_assets.lib.accounting.idle import CURVE_IDLE_RUNS_SQL, held_daily_sql
from wandb_assets.lib.accounting.prices import PRICE_SCHEDULE_CTE, price_file_token, priced_sql, schedule_token
from wandb_assets.lib.curves_warehouse import rejudge_curve_idle
from wandb_assets.lib.gauges import held_samples_sql
from wandb_assets.lib.lake import retry_on_conflict
from wandb_assets.lib.runs_lifecycle import sync_prices
from wandb_assets.lib.sql import (
    ENDED_SQL,
    FAILED_SQL,
    GPU_USAGE_BUILD_KEY,
    INPUTS_KEY,
    busy_until_sql,
    daily_gpu_hours_sql,
    meta_value,
    run_gpu_hours_sql,
    set_meta,
    success_rate_sql,
    transaction,
)
from wandb_assets.lib.warehouse import has_table


@retry_on_conflict
def _replace_table(con, table: str, select_sql: str, params: dict | None = None) -> int:
    """Replace a whole derived table with the result of ``select_sql`` in one transaction."""
    with transaction(con):
        con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} BY NAME {select_sql}", params or {})
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


SUCCESS_RATES_SQL = f"""
SELECT entity, project, ended_at::DATE AS day,
       CASE WHEN GROUPING(category) = 1 THEN 'all' ELSE category END AS category,
       count(*) FILTER (WHERE state = 'finished') AS completed,
       count(*) FILTER (WHERE state IN ({FAILED_SQL})) AS failed,
       count(*) FILTER (WHERE state NOT IN ('finished', {FAILED_SQL})) AS other_ended,
       {success_rate_sql("completed", "failed")} AS success_rate_pct
FROM runs
WHERE state IN ({ENDED_SQL}) AND ended_at IS NOT NULL
GROUP BY GROUPING SETS ((entity, project, ended_at::DATE), (entity, project, ended_at::DATE, category))
"""


#: ``gpu_hours`` rolled up from ``gpu_usage`` as last built (its ``now``): the same run-days (``runs``) and GPU-hours,
#: so the two tables agree to the run-day; computing them again from ``runs`` took 0.15-0.35 s of a tick at a million
#: runs.
GPU_HOURS_SQL = """
SELECT entity, project, day, CASE WHEN GROUPING(category) = 1 THEN 'all' ELSE category END AS category,
       sum(runs) AS runs, sum(gpu_hours) AS gpu_hours
FROM gpu_usage
GROUP BY GROUPING SETS ((entity, project, day), (entity, project, day, category))
"""

#: CTEs ``sampled``, ``held``, ``idle``, ``partly_idle``: idle GPU-hours per run and UTC day up to ``$now``: for a
#: run whose curves were read after it ended, from its whole sampled GPU stream, judged when they were loaded
#: (``run_curve_idle``, ``lib.curves_warehouse``; ``partly_idle``: GPUs idle while another GPU of the run was busy);
#: else from the samples
#: ticks took while it ran (``gauges.held_samples_sql``), or for an offline run from its log
#: (``runs.log_idle_gpu_hours``); a GPU below ``$idle_pct`` is idle. The one rule for gpu_usage and the notebooks.
IDLE_GPU_HOURS_SQL = f"""{
    held_samples_sql(
        f"(SELECT * FROM runs WHERE (entity, project, run_id) NOT IN {CURVE_IDLE_RUNS_SQL})", "$now::TIMESTAMP"
    )
},
partly_idle AS (
    SELECT entity, project, run_id, day::TIMESTAMP AS day_start, partly_idle_gpu_hours
    FROM run_curve_idle WHERE day::TIMESTAMP <= $now::TIMESTAMP
),
{held_daily_sql()},
idle AS (
    SELECT entity, project, run_id, day_start, sum(idle * hours) AS idle_gpu_hours
    FROM held_daily GROUP BY ALL
    UNION ALL  -- runs read whole after their end: from their own sampled stream, judged at their load
    SELECT entity, project, run_id, day::TIMESTAMP AS day_start, idle_gpu_hours
    FROM run_curve_idle WHERE day::TIMESTAMP <= $now::TIMESTAMP
    UNION ALL  -- offline logs read without their curves: idle GPU-hours per day from their stats records, judged
    SELECT entity, project, run_id, day_start, sum(idle_gpu_hours) FROM (  -- when the log was read (with its
        SELECT entity, project, run_id, u.day::TIMESTAMP AS day_start, u.idle_gpu_hours  -- curves: run_curve_idle)
        FROM (SELECT entity, project, run_id, unnest(log_idle_gpu_hours) AS u FROM runs
              WHERE log_idle_gpu_hours IS NOT NULL AND (entity, project, run_id) NOT IN {CURVE_IDLE_RUNS_SQL})
        WHERE u.day::TIMESTAMP <= $now::TIMESTAMP
    ) GROUP BY ALL
)
"""

#: GPU-hours and dollars per UTC day, project, user, team, category, GPU model and price (``$teams``: JSON list of
#: ``{user, team}``): each day's GPU-hours at the price in force that day for the run's model and cluster
#: (``prices.priced_sql`` over ``gpu_price_periods``: ``usd_per_gpu_hour``, the rule ``price_basis`` and the period's
#: first day ``price_from``). A model without a price costs the fallback price (``price_basis`` fallback) or NULL,
#: never 0.
GPU_USAGE_SQL = f"""
WITH {PRICE_SCHEDULE_CTE},
teams AS (
    SELECT unnest(from_json($teams::JSON, '[{{"user": "VARCHAR", "team": "VARCHAR"}}]'), recursive := true)
),
{IDLE_GPU_HOURS_SQL},
{daily_gpu_hours_sql('entity, project, run_id, category, "user" AS username, gpu_model, hostname, state')},
priced AS ({priced_sql("daily", "d.day_start::DATE")})
SELECT day_start::DATE AS day, d.entity, d.project, username, coalesce(t.team, 'unassigned') AS team, category,
       gpu_model, count(*) AS runs, sum(gpu_hours) AS gpu_hours, sum(gpu_hours) * usd_per_gpu_hour AS cost_usd,
       coalesce(sum(i.idle_gpu_hours), 0) AS idle_gpu_hours, price_basis, price_from, usd_per_gpu_hour,
       coalesce(sum(pi.partly_idle_gpu_hours), 0) AS partly_idle_gpu_hours,
       coalesce(sum(i.idle_gpu_hours), 0) * usd_per_gpu_hour AS idle_cost_usd,
       coalesce(sum(gpu_hours) FILTER (WHERE state IN ({FAILED_SQL})), 0) AS failed_gpu_hours,
       coalesce(sum(gpu_hours) FILTER (WHERE state IN ({FAILED_SQL})), 0) * usd_per_gpu_hour AS failed_cost_usd
FROM priced d LEFT JOIN teams t ON t.user = d.username
LEFT JOIN idle i USING (entity, project, run_id, day_start)
LEFT JOIN partly_idle pi USING (entity, project, run_id, day_start)
GROUP BY day_start, d.entity, d.project, username, team, category, gpu_model, usd_per_gpu_hour, price_basis, price_from
"""


#: The runs that left the most GPU-hours idle (``$limit``), with who ran them, on what, and since when.
TOP_IDLE_RUNS_SQL = f"""
WITH {IDLE_GPU_HOURS_SQL}
SELECT r.entity || '/' || r.project AS project, r.run_id, r.name, r."user", r.state, r.gpu_count, r.gpu_model,
       round(sum(i.idle_gpu_hours), 2) AS idle_gpu_hours, r.url
FROM idle i JOIN runs r USING (entity, project, run_id)
GROUP BY ALL HAVING sum(i.idle_gpu_hours) > 0 ORDER BY idle_gpu_hours DESC, r.run_id LIMIT $limit
"""

#: GPU-hours by where each run's GPU count came from (config, metadata, system_metrics, default): how much is a guess.
GPU_HOURS_BY_SOURCE_SQL = f"""
SELECT coalesce(gpu_count_source, 'unknown') AS gpu_count_source, count(*) AS runs,
       sum({run_gpu_hours_sql("$now::TIMESTAMP")}) AS gpu_hours
FROM runs WHERE created_at IS NOT NULL AND {busy_until_sql("$now::TIMESTAMP")} > created_at
GROUP BY 1 ORDER BY gpu_hours DESC
"""


@retry_on_conflict
def rebuild_gpu_usage(
    con,
    now: datetime,
    prices,
    teams: dict[str, str],
    idle_pct: float = DEFAULT_IDLE_GPU_PCT,
    close_after_days: int | None = None,
) -> int:
    """Rebuild ``gpu_usage`` at ``now`` (running runs count up to it) with these teams, after recording ``prices``
    as seen on ``now``'s UTC day (``runs_lifecycle.sync_prices``); a sampled GPU below ``idle_pct`` is idle. Then the
    booked ledger ``gpu_charges`` (``closing.rebuild_charges``: closed months as recorded, the rest as computed), and
    with ``close_after_days`` every month ended that many days ago is closed (``closing.close_month``). Records how
    it was built (``GPU_USAGE_BUILD_KEY``)."""
    params = {
        "now": now,
        "idle_pct": idle_pct,
        "teams": json.dumps([{"user": u, "team": t} for u, t in teams.items()]),
    }
    with transaction(con):
        sync_prices(con, prices, now)
        rejudge_curve_idle(con, idle_pct, now)
        con.execute("DELETE FROM gpu_usage")
        con.execute(f"INSERT INTO gpu_usage BY NAME {GPU_USAGE_SQL}", params)
        rebuild_charges(con)
        if close_after_days is not None:
            for month in months_due(con, now, close_after_days):
                close_month(con, month, now, CLOSED_BY_SETTING)
        built = {
            **params,
            "now": now.isoformat(sep=" "),
            "prices": schedule_token(con),
            "price_file": price_file_token(prices),
            "inputs": meta_value(con, INPUTS_KEY),
        }
        set_meta(con, GPU_USAGE_BUILD_KEY, json.dumps(built))
    return con.execute("SELECT count(*) FROM gpu_usage").fetchone()[0]


def settings_since_build(con, prices, teams: dict[str, str], idle_pct: float) -> tuple[datetime | None, list[str]]:
    """When ``gpu_usage`` was last built, and which of the settings it was built with differ from these (``teams``,
    ``prices``, ``idle threshold``): figures read from it are as of that build until the next refresh."""
    text = meta_value(con, GPU_USAGE_BUILD_KEY) if has_table(con, "warehouse_meta") else None
    if text is None:
        return None, []
    build = json.loads(text)
    teams_now = sorted((u, t) for u, t in teams.items())
    differ = [
        name
        for name, was, now in (
            ("teams", sorted((r["user"], r["team"]) for r in json.loads(build["teams"])), teams_now),
            ("prices", build.get("price_file"), price_file_token(prices)),
            ("idle threshold", build["idle_pct"], idle_pct),
        )
        if was != now
    ]
    return datetime.fromisoformat(build["now"]), differ


def push_to_main_sps_rows(con) -> int:
    """``push_to_main_sps`` is a view of ``runs`` (``warehouse.PUSH_TO_MAIN_SPS_SQL``): nothing to rebuild; its rows."""
    return con.execute("SELECT count(*) FROM push_to_main_sps").fetchone()[0]


def rebuild_success_rates(con) -> int:
    return _replace_table(con, "success_rates", SUCCESS_RATES_SQL)


def rebuild_gpu_hours(con) -> int:
    """``gpu_hours`` from ``gpu_usage`` as last built (``rebuild_gpu_usage``): its day, project and category sums."""
    return _replace_table(con, "gpu_hours", GPU_HOURS_SQL)
