"""The warehouse's invariants, each one SQL query that lists what breaks it (``wandb-assets check``, and the tests
after their loads). No Dagster here.

1. One row per run: (entity, project, run_id) is unique in ``runs``.
2. Idle GPU-hours never exceed GPU-hours, per run and UTC day (the rules of ``gpu_usage``).
3. A run's dollars are its GPU-hours times its model's price (``runs.cost_usd``, at the prices last priced with).
4. No running row of a project no longer mirrored counts as busy.
5. No alert stays open on a run that is not alive once the rules have seen it so (an evaluation after its load).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from wandb_assets.lib.gpus import DEFAULT_IDLE_GPU_PCT, PRICES_CTE, usd_sql
from wandb_assets.lib.sql import ALIVE_SQL, BUSY_SQL, MIRRORED_NOW_SQL, run_gpu_hours_sql
from wandb_assets.lib.warehouse import IDLE_GPU_HOURS_SQL, daily_gpu_hours_sql, has_table

#: Rules whose subject is one run (its id in ``details.run_id``).
RUN_RULES = ("stalled_run", "long_running", "idle_gpus")


@dataclass(frozen=True)
class Invariant:
    """One rule of the warehouse: its name, what it promises, and the SQL listing the rows that break it (at most
    a few columns that name them)."""

    name: str
    promise: str
    violations_sql: str
    tables: tuple[str, ...] = ("runs",)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "one_row_per_run",
        "one row per (entity, project, run_id) in runs",
        "SELECT entity, project, run_id, count(*) AS copies FROM runs GROUP BY ALL HAVING count(*) > 1",
    ),
    Invariant(
        "idle_within_gpu_hours",
        "idle GPU-hours <= GPU-hours per run and UTC day",
        f"""WITH {IDLE_GPU_HOURS_SQL}, {daily_gpu_hours_sql("entity, project, run_id")}
SELECT i.entity, i.project, i.run_id, i.day_start::DATE AS day, round(i.idle_gpu_hours, 3) AS idle,
       round(coalesce(d.gpu_hours, 0), 3) AS gpu_hours
FROM idle i LEFT JOIN daily d USING (entity, project, run_id, day_start)
WHERE i.idle_gpu_hours > coalesce(d.gpu_hours, 0) * (1 + 1e-9) + 1e-9""",
        ("runs", "gpu_samples", "run_gpu_samples"),
    ),
    Invariant(
        "cost_is_hours_times_price",
        "runs.cost_usd = GPU-hours x the model's USD per GPU-hour (NULL without a price)",
        f"""WITH {PRICES_CTE},
expected AS (
    SELECT entity, project, run_id, cost_usd, {run_gpu_hours_sql("ingested_at")} * {usd_sql()} AS should
    FROM runs LEFT JOIN prices p ON p.model = runs.gpu_model
)
SELECT entity, project, run_id, cost_usd, should FROM expected
WHERE cost_usd IS DISTINCT FROM should
  AND (cost_usd IS NULL OR should IS NULL OR abs(cost_usd - should) > 1e-6 * greatest(abs(should), 1))""",
    ),
    Invariant(
        "no_busy_unmirrored_run",
        "no running row of a project no longer mirrored counts as busy",
        f"SELECT entity, project, run_id, state FROM runs WHERE state IN ({BUSY_SQL}) AND NOT {MIRRORED_NOW_SQL}",
        ("runs", "wandb_projects"),
    ),
    Invariant(
        "no_alert_on_a_run_not_alive",
        "no alert open on a run that is not alive (once evaluated after the run's load)",
        f"""SELECT a.alert_key, r.state FROM alerts a JOIN runs r
  ON r.run_id = (a.details->>'run_id') AND r.entity = coalesce((a.details->>'entity'), r.entity)
 AND r.project = coalesce((a.details->>'project'), r.project)
WHERE a.resolved_at IS NULL AND a.rule IN ({", ".join(f"'{rule}'" for rule in RUN_RULES)})
  AND r.state NOT IN ({ALIVE_SQL}) AND a.last_seen_at >= r.ingested_at""",
        ("runs", "alerts"),
    ),
    Invariant(
        "curves_once",
        "each point of a run's curves stored once (a re-read replaces them)",
        """SELECT entity, project, run_id, 'history' AS curve, metric AS series, step::VARCHAR AS at, count(*) AS copies
FROM run_history GROUP BY ALL HAVING count(*) > 1
UNION ALL
SELECT entity, project, run_id, 'gpu', gpu::VARCHAR, "timestamp"::VARCHAR, count(*)
FROM run_gpu_samples GROUP BY ALL HAVING count(*) > 1""",
        ("run_history", "run_gpu_samples"),
    ),
)


def check_warehouse(
    con, now: datetime, idle_pct: float = DEFAULT_IDLE_GPU_PCT, examples: int = 3
) -> list[tuple[Invariant, int, list[tuple]]]:
    """Every invariant on ``con`` at ``now`` (naive UTC): ``[(invariant, rows breaking it, a few of them)]``,
    those that hold with 0. An invariant over a table the warehouse does not have yet holds."""
    last = (
        con.execute("SELECT value FROM warehouse_meta WHERE key = 'gpu_prices'").fetchone()
        if has_table(con, "warehouse_meta")
        else None
    )
    params = {"now": now, "idle_pct": idle_pct, "prices": last[0] if last else None}
    found = []
    for invariant in INVARIANTS:
        unpriced = "$prices" in invariant.violations_sql and params["prices"] is None  # never priced: no cost
        if unpriced or not all(has_table(con, table) for table in invariant.tables):  # nothing to hold yet
            found.append((invariant, 0, []))
            continue
        used = {name: value for name, value in params.items() if f"${name}" in invariant.violations_sql}
        rows = con.execute(f"SELECT * FROM ({invariant.violations_sql})", used).fetchall()
        found.append((invariant, len(rows), rows[:examples]))
    return found


def broken(con, now: datetime, idle_pct: float = DEFAULT_IDLE_GPU_PCT) -> list[str]:
    """One sentence per invariant that does not hold (empty: all hold)."""
    return [
        f"{invariant.name}: {count} row(s) break '{invariant.promise}', e.g. {sample}"
        for invariant, count, sample in check_warehouse(con, now, idle_pct)
        if count
    ]
