"""The warehouse's invariants, each one SQL query that lists what breaks it (``wandb-assets check``, and the tests
after their loads). No Dagster here. ``INVARIANTS`` holds them, each with its promise; among them: one row per run,
idle never above total in any table, ``runs.cost_usd`` and ``gpu_usage`` equal to their fresh recomputation (the
derived numbers reconcile with their source), no run counted in two projects, no curve point stored twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from wandb_assets.lib.accounting.closing import CHARGE_DIGEST_SQL, EMPTY_DIGEST_SQL, USAGE
from wandb_assets.lib.accounting.gpus import DEFAULT_IDLE_GPU_PCT
from wandb_assets.lib.accounting.prices import (
    FALLBACK,
    FALLBACK_PRICE,
    PRICE_SCHEDULE_CTE,
    schedule_token,
)
from wandb_assets.lib.alerts import RUN_ALERT_RULES
from wandb_assets.lib.derived import GPU_USAGE_SQL
from wandb_assets.lib.exports import CHARGEBACK_MART, chargeback_sql
from wandb_assets.lib.gauges import curve_idle_sql
from wandb_assets.lib.normalize import MOVED, VANISHED
from wandb_assets.lib.runs_lifecycle import PRICED_WITH_KEY, UNMIRRORED, run_costs_sql
from wandb_assets.lib.sql import (
    ALIVE_SQL,
    BUSY_SQL,
    GPU_USAGE_BUILD_KEY,
    INPUTS_KEY,
    MIRRORED_NOW_SQL,
    daily_gpu_hours_sql,
    meta_value,
)
from wandb_assets.lib.warehouse import has_table


@dataclass(frozen=True)
class Invariant:
    """One rule of the warehouse: its name, what it promises, and the SQL listing the rows that break it (at most
    a few columns that name them)."""

    name: str
    promise: str
    violations_sql: str
    tables: tuple[str, ...] = ("runs",)
    #: A derived table's build record (``warehouse_meta``): the invariant is computed with the parameters it was
    #: built with, and holds while the table was never built or its inputs changed since (it is then rebuilt).
    built: str | None = None
    #: Over runs' prices: holds while the runs were never priced, or priced with other periods than those recorded
    #: (``runs_lifecycle.PRICED_WITH_KEY``: the next load prices them again).
    priced: bool = False
    #: Over gpu_usage's prices: holds while gpu_usage was never built by a version that keeps price periods (an
    #: upgraded warehouse: its next tick rebuilds it).
    usage_priced: bool = False


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "one_row_per_run",
        "one row per (entity, project, run_id) in runs",
        "SELECT entity, project, run_id, count(*) AS copies FROM runs GROUP BY ALL HAVING count(*) > 1",
    ),
    Invariant(
        "idle_within_gpu_hours",
        "idle GPU-hours <= GPU-hours per run and UTC day, and in every gpu_usage row (partly idle <= idle, idle and "
        "failed dollars <= dollars)",
        f"""WITH {daily_gpu_hours_sql("entity, project, run_id")},
per_run AS (
    SELECT i.entity, i.project, i.run_id, i.day, round(i.idle_gpu_hours, 3) AS idle,
           round(coalesce(d.gpu_hours, 0), 3) AS gpu_hours
    FROM run_curve_idle i LEFT JOIN daily d
      ON d.entity = i.entity AND d.project = i.project AND d.run_id = i.run_id AND d.day_start = i.day::TIMESTAMP
    WHERE i.idle_gpu_hours > coalesce(d.gpu_hours, 0) * (1 + 1e-9) + 1e-9
)
SELECT * FROM per_run
UNION ALL
SELECT entity, project, username, day, round(idle_gpu_hours, 3), round(gpu_hours, 3) FROM gpu_usage
WHERE idle_gpu_hours > gpu_hours * (1 + 1e-9) + 1e-9 OR partly_idle_gpu_hours > idle_gpu_hours * (1 + 1e-9) + 1e-9
   OR idle_cost_usd > cost_usd * (1 + 1e-9) + 1e-9 OR failed_cost_usd > cost_usd * (1 + 1e-9) + 1e-9""",
        ("runs", "run_curve_idle", "gpu_usage"),
    ),
    Invariant(
        "cost_is_hours_times_price",
        "runs.cost_usd = each UTC day's GPU-hours x the USD per GPU-hour in force that day for the run's model and "
        "cluster (gpu_price_periods), summed (NULL when a day has no price)",
        f"""WITH {run_costs_sql("runs")},
expected AS (SELECT entity, project, run_id, cost AS should FROM costs)
SELECT entity, project, run_id, cost_usd, should FROM runs JOIN expected USING (entity, project, run_id)
WHERE cost_usd IS DISTINCT FROM should
  AND (cost_usd IS NULL OR should IS NULL OR abs(cost_usd - should) > 1e-6 * greatest(abs(should), 1))""",
        ("runs", "gpu_price_periods"),
        priced=True,
    ),
    Invariant(
        "gpu_usage_priced_at_its_day",
        "every gpu_usage row's dollars are its GPU-hours at a recorded price period of its rule in force on its day "
        "(gpu_price_periods; fallback: WANDB_ASSETS_GPU_DEFAULT_PRICE's), and a row without a price had none",
        f"""WITH {PRICE_SCHEDULE_CTE}
SELECT g.day, g.entity, g.project, g.gpu_model, g.price_basis, g.price_from, g.usd_per_gpu_hour, g.cost_usd
FROM gpu_usage g
WHERE (g.price_basis IS NOT NULL AND (
        g.cost_usd IS NULL OR abs(g.cost_usd - g.gpu_hours * g.usd_per_gpu_hour) > 1e-6 * greatest(abs(g.cost_usd), 1)
        OR NOT EXISTS (
            SELECT 1 FROM price_schedule s
            WHERE s.model = CASE WHEN g.price_basis = '{FALLBACK}' THEN '{FALLBACK_PRICE}' ELSE g.gpu_model END
              AND s.rule = g.price_basis AND s.price_from IS NOT DISTINCT FROM g.price_from
              AND s.usd = g.usd_per_gpu_hour AND g.day >= s.start_day AND (s.end_day IS NULL OR g.day < s.end_day))))
   OR (g.price_basis IS NULL AND (g.cost_usd IS NOT NULL OR EXISTS (
            SELECT 1 FROM price_schedule s WHERE (s.model = g.gpu_model OR s.model = '{FALLBACK_PRICE}')
              AND s.match_on IS NULL AND g.day >= s.start_day AND (s.end_day IS NULL OR g.day < s.end_day))))""",
        ("gpu_usage", "gpu_price_periods"),
        usage_priced=True,
    ),
    Invariant(
        "closed_months_never_move",
        "each closed month's billed rows (gpu_charges) are its record (closed_month_charges) row for row, and the "
        "record still has the digest, GPU-hours and dollars recorded when the month was closed (closed_months)",
        f"""WITH record AS (
    SELECT month, {CHARGE_DIGEST_SQL} AS digest, coalesce(sum(gpu_hours), 0) AS gpu_hours, sum(cost_usd) AS cost_usd
    FROM closed_month_charges AS closed_row GROUP BY month
),
billed AS (SELECT * FROM gpu_charges WHERE month IN (SELECT month FROM closed_months))
SELECT c.month, 'record changed' AS what FROM closed_months c LEFT JOIN record r USING (month)
WHERE c.digest IS DISTINCT FROM coalesce(r.digest, {EMPTY_DIGEST_SQL})
   OR abs(c.gpu_hours - coalesce(r.gpu_hours, 0)) > 1e-9 OR c.cost_usd IS DISTINCT FROM r.cost_usd
UNION ALL
SELECT month, 'billed differs from the record' FROM (
    (SELECT * FROM billed EXCEPT ALL SELECT * FROM closed_month_charges)
    UNION ALL (SELECT * FROM closed_month_charges EXCEPT ALL SELECT * FROM billed)
)""",
        ("gpu_charges", "closed_month_charges", "closed_months"),
    ),
    Invariant(
        "charges_reconcile_with_usage",
        "each month's usage in gpu_usage equals what gpu_charges bills of it: the month's own rows (or its closed "
        "record) plus the adjustments of it booked later (GPU-hours to 1e-6, dollars to the cent)",
        f"""WITH usage AS (
    SELECT date_trunc('month', day)::DATE AS month, sum(gpu_hours) AS gpu_hours, coalesce(sum(cost_usd), 0) AS usd
    FROM gpu_usage GROUP BY 1
),
billed AS (
    SELECT coalesce(adjustment_of, month) AS month, sum(gpu_hours) AS gpu_hours, coalesce(sum(cost_usd), 0) AS usd
    FROM gpu_charges WHERE charge_category = '{USAGE}' OR adjustment_of IS NOT NULL GROUP BY 1
)
SELECT coalesce(u.month, b.month) AS month, round(u.gpu_hours, 6), round(b.gpu_hours, 6), round(u.usd, 2),
       round(b.usd, 2)
FROM usage u FULL OUTER JOIN billed b USING (month)
WHERE abs(coalesce(u.gpu_hours, 0) - coalesce(b.gpu_hours, 0)) > 1e-4
   OR abs(coalesce(u.usd, 0) - coalesce(b.usd, 0)) >= 0.01""",
        ("gpu_usage", "gpu_charges", "closed_month_charges", "closed_months"),
        built=GPU_USAGE_BUILD_KEY,
    ),
    Invariant(
        "no_busy_unmirrored_run",
        "no running row of a project no longer mirrored counts as busy",
        f"SELECT entity, project, run_id, state FROM runs WHERE state IN ({BUSY_SQL}) AND NOT {MIRRORED_NOW_SQL}",
        ("runs", "wandb_projects"),
    ),
    Invariant(
        "no_alert_on_a_run_not_alive",
        "no alert open on a run that is not alive (once evaluated after the row last changed: its load, or the run "
        "lifecycle marking it vanished, unmirrored or moved; an unwatched project's stay)",
        f"""SELECT a.alert_key, r.state FROM alerts a JOIN runs r
  ON r.run_id = (a.details->>'run_id') AND r.entity = coalesce((a.details->>'entity'), r.entity)
 AND r.project = coalesce((a.details->>'project'), r.project)
WHERE a.resolved_at IS NULL AND a.rule IN ({", ".join(f"'{rule}'" for rule in RUN_ALERT_RULES)})
  AND r.state NOT IN ({ALIVE_SQL})
  AND a.last_seen_at >= greatest(r.ingested_at, r.state_changed_at)
  AND NOT coalesce((a.details->>'unwatched')::BOOLEAN, false)
  AND {MIRRORED_NOW_SQL.replace("runs.", "r.")}""",
        ("runs", "alerts", "wandb_projects"),
    ),
    Invariant(
        "gpu_usage_reconciles",
        "gpu_usage equals gpu_usage computed again from runs and their GPU samples at its build's time, prices, teams "
        "and idle threshold (GPU-hours to 1e-6, dollars to the cent), when nothing it is computed from changed since",
        f"""SELECT coalesce(a.day, b.day) AS day, coalesce(a.entity, b.entity) AS entity,
       coalesce(a.project, b.project) AS project, coalesce(a.username, b.username) AS username,
       round(a.gpu_hours, 3) AS stored_gpu_hours, round(b.gpu_hours, 3) AS computed_gpu_hours,
       round(a.idle_gpu_hours, 3) AS stored_idle, round(b.idle_gpu_hours, 3) AS computed_idle
FROM gpu_usage a FULL OUTER JOIN ({GPU_USAGE_SQL}) b
  ON a.day = b.day AND a.entity = b.entity AND a.project = b.project
 AND a.username IS NOT DISTINCT FROM b.username AND a.team = b.team AND a.category IS NOT DISTINCT FROM b.category
 AND a.gpu_model IS NOT DISTINCT FROM b.gpu_model AND a.price_basis IS NOT DISTINCT FROM b.price_basis
 AND a.price_from IS NOT DISTINCT FROM b.price_from AND a.usd_per_gpu_hour IS NOT DISTINCT FROM b.usd_per_gpu_hour
WHERE a.day IS NULL OR b.day IS NULL
   OR abs(a.gpu_hours - b.gpu_hours) > 1e-6 OR abs(a.idle_gpu_hours - b.idle_gpu_hours) > 1e-6
   OR abs(a.partly_idle_gpu_hours - b.partly_idle_gpu_hours) > 1e-6
   OR abs(a.failed_gpu_hours - b.failed_gpu_hours) > 1e-6
   OR abs(coalesce(a.cost_usd, 0) - coalesce(b.cost_usd, 0)) >= 0.005 OR (a.cost_usd IS NULL) <> (b.cost_usd IS NULL)
   OR abs(coalesce(a.idle_cost_usd, 0) - coalesce(b.idle_cost_usd, 0)) >= 0.005
   OR abs(coalesce(a.failed_cost_usd, 0) - coalesce(b.failed_cost_usd, 0)) >= 0.005""",
        ("runs", "gpu_usage", "run_curve_idle", "gpu_samples"),
        built=GPU_USAGE_BUILD_KEY,
    ),
    Invariant(
        "curve_idle_reconciles",
        "run_curve_idle equals the idle GPU-hours of each run's stored GPU stream computed again by the hold rule "
        "(lib.idle), at the threshold it was judged at (to 1e-6 GPU-hours per run and UTC day)",
        f"""WITH {
            curve_idle_sql("$now::TIMESTAMP", "(SELECT DISTINCT entity, project, run_id FROM run_curve_idle)").replace(
                "$idle_pct", "(SELECT max(idle_pct) FROM run_curve_idle)"
            )
        },
computed AS (
    SELECT entity, project, run_id, day_start::DATE AS day, sum(idle * hours) AS idle_gpu_hours
    FROM held_daily GROUP BY ALL
)
SELECT coalesce(s.entity, c.entity) AS entity, coalesce(s.project, c.project) AS project,
       coalesce(s.run_id, c.run_id) AS run_id, coalesce(s.day, c.day) AS day,
       round(s.idle_gpu_hours, 3) AS stored, round(c.idle_gpu_hours, 3) AS computed
FROM run_curve_idle s FULL OUTER JOIN computed c USING (entity, project, run_id, day)
WHERE abs(coalesce(s.idle_gpu_hours, 0) - coalesce(c.idle_gpu_hours, 0)) > 1e-6""",
        ("runs", "run_curve_idle", "run_gpu_samples"),
    ),
    Invariant(
        "one_project_per_run",
        "a run (its entity, id and creation time) is counted in one project at most, whatever the states of its "
        "copies: every copy but the one W&B holds it in is 'moved' (alive in two projects at once, or a copy left "
        "behind vanished or unmirrored, would count its GPU-hours twice)",
        f"""SELECT entity, run_id, created_at, list(project || ' (' || state || ')' ORDER BY project) AS counted_in
FROM runs WHERE state <> '{MOVED}' GROUP BY entity, run_id, created_at HAVING count(DISTINCT project) > 1""",
        ("runs", "wandb_projects"),
    ),
    Invariant(
        "no_run_left_unmirrored",
        "a run marked only because its project left the mirror set is asked for again once the project is back (the "
        "project's next fetch restores it, or marks it vanished)",
        f"""SELECT r.entity, r.project, r.run_id, r.ingested_at, w.last_fetched_at FROM runs r
JOIN wandb_projects w ON w.entity = r.entity AND w.project = r.project
WHERE w.mirrored AND r.state = '{VANISHED}' AND list_contains(coalesce(r.anomalies, []), '{UNMIRRORED}')
  AND NOT list_contains(r.anomalies, '{VANISHED}') AND w.last_fetched_at > r.ingested_at""",
        ("runs", "wandb_projects"),
    ),
    Invariant(
        "marts_reconcile",
        "every month of the money marts (team_gpu_cost_monthly, team_budget_vs_spend) and of the chargeback file "
        "equals what gpu_charges bills in it (GPU-hours to 1e-6, dollars to the cent; the file's rows in whole cents "
        "add up to within half a cent of the month, idle and failed cents within each row's), while gpu_usage is the "
        "build they were made from",
        f"""WITH usage AS (  -- what gpu_charges bills in each month
    SELECT month, sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS usd,
           sum(idle_gpu_hours) AS idle, sum(idle_cost_usd) AS idle_usd, sum(failed_gpu_hours) AS failed,
           sum(failed_cost_usd) AS failed_usd
    FROM gpu_charges GROUP BY 1
),
mart AS (
    SELECT month, sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS usd, sum(idle_gpu_hours) AS idle,
           sum(idle_cost_usd) AS idle_usd, sum(failed_gpu_hours) AS failed, sum(failed_cost_usd) AS failed_usd
    FROM {CHARGEBACK_MART} GROUP BY 1
),
spend AS (SELECT month, sum(spend_usd) AS usd FROM analytics.team_budget_vs_spend GROUP BY 1),
file AS (
    SELECT month, sum(cost_usd) AS usd, count(*) FILTER (WHERE abs(idle_cost_usd) > abs(cost_usd)
           OR abs(failed_cost_usd) > abs(cost_usd) OR abs(idle_gpu_hours) > abs(gpu_hours) + 0.01
           OR abs(failed_gpu_hours) > abs(gpu_hours) + 0.01) AS rows_over
    FROM ({chargeback_sql("true")}) GROUP BY 1
),
compared AS (
    SELECT 'team_gpu_cost_monthly' AS mart, coalesce(u.month, m.month) AS month, round(u.usd, 2) AS gpu_usage_usd,
           round(m.usd, 2) AS mart_usd, round(u.gpu_hours, 3) AS gpu_usage_gpu_hours,
           round(m.gpu_hours, 3) AS mart_gpu_hours
    FROM usage u FULL OUTER JOIN mart m USING (month)
    WHERE u.month IS NULL OR m.month IS NULL OR abs(u.gpu_hours - m.gpu_hours) > 1e-6
       OR abs(coalesce(u.idle, 0) - coalesce(m.idle, 0)) > 1e-6
       OR abs(coalesce(u.failed, 0) - coalesce(m.failed, 0)) > 1e-6
       OR (u.usd IS NULL) <> (m.usd IS NULL) OR abs(coalesce(u.usd, 0) - coalesce(m.usd, 0)) >= 0.005
       OR abs(coalesce(u.idle_usd, 0) - coalesce(m.idle_usd, 0)) >= 0.005
       OR abs(coalesce(u.failed_usd, 0) - coalesce(m.failed_usd, 0)) >= 0.005
    UNION ALL
    SELECT 'team_budget_vs_spend', coalesce(u.month, s.month), round(u.usd, 2), round(s.usd, 2), NULL, NULL
    FROM usage u FULL OUTER JOIN spend s USING (month)
    WHERE (u.usd IS NULL) <> (s.usd IS NULL) OR abs(coalesce(u.usd, 0) - coalesce(s.usd, 0)) >= 0.005
    UNION ALL
    SELECT 'chargeback file', u.month, round(u.usd, 2), f.usd, f.rows_over, NULL
    FROM usage u JOIN file f ON strftime(u.month, '%Y-%m') = f.month
    -- whole cents within half a cent of the month's dollars (at an exact half cent the float sum's last bit
    -- decides the way it rounds: the mart sums in another order than gpu_usage)
    WHERE (f.usd IS NULL) <> (u.usd IS NULL) OR abs(f.usd - u.usd) > 0.005 + 1e-6 OR f.rows_over > 0
)
SELECT * FROM compared
WHERE (SELECT value FROM warehouse_meta WHERE key = '{GPU_USAGE_BUILD_KEY}')
      = (SELECT any_value(gpu_usage_build) FROM analytics.marts_build)""",
        (
            "gpu_usage",
            "gpu_charges",
            "warehouse_meta",
            "analytics.marts_build",
            "analytics.team_gpu_cost_monthly",
            "analytics.team_budget_vs_spend",
        ),
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
    params = {"now": now, "idle_pct": idle_pct}
    found = []
    for invariant in INVARIANTS:
        given = params
        if invariant.built is not None:
            given = _build_params(con, invariant.built)
            if given is None:  # never built, or built from inputs that have changed since: nothing to compare
                found.append((invariant, 0, []))
                continue
        if (invariant.priced and not _priced_with_recorded_periods(con)) or (
            invariant.usage_priced and not _usage_built_with_periods(con)
        ):
            found.append((invariant, 0, []))
            continue
        if not all(
            has_table(con, *reversed(table.split(".")[-2:])) for table in invariant.tables
        ):  # nothing to hold yet
            found.append((invariant, 0, []))
            continue
        used = {name: value for name, value in given.items() if f"${name}" in invariant.violations_sql}
        rows = con.execute(f"SELECT * FROM ({invariant.violations_sql})", used).fetchall()
        found.append((invariant, len(rows), rows[:examples]))
    return found


def _priced_with_recorded_periods(con) -> bool:
    return (
        has_table(con, "warehouse_meta")
        and has_table(con, "gpu_price_periods")
        and meta_value(con, PRICED_WITH_KEY) == schedule_token(con)
    )


def _usage_built_with_periods(con) -> bool:
    build = meta_value(con, GPU_USAGE_BUILD_KEY) if has_table(con, "warehouse_meta") else None
    return build is not None and "price_file" in json.loads(build)


def _build_params(con, key: str) -> dict | None:
    """The parameters a derived table was built with (``key`` of ``warehouse_meta``), or None when it was never built
    or what it is computed from changed since (``sql.INPUTS_KEY``)."""
    if not has_table(con, "warehouse_meta"):
        return None
    text = meta_value(con, key)
    if text is None:
        return None
    build = json.loads(text)
    if build.pop("inputs") != meta_value(con, INPUTS_KEY):
        return None
    if has_table(con, "gpu_price_periods") and build.pop("prices", None) != schedule_token(con):
        return None  # priced with periods recorded since: rebuilt by the next tick
    return build


def broken(con, now: datetime, idle_pct: float = DEFAULT_IDLE_GPU_PCT) -> list[str]:
    """One sentence per invariant that does not hold (empty: all hold)."""
    return [
        f"{invariant.name}: {count} row(s) break '{invariant.promise}', e.g. {sample}"
        for invariant, count, sample in check_warehouse(con, now, idle_pct)
        if count
    ]
