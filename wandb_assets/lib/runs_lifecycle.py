"""The one lifecycle of a run the warehouse holds, after W&B stops returning it where it was: vanished (deleted, or
not returned when asked for by id), unmirrored (its project left the mirror set), moved (W&B returns it from another
project of its entity), and the pricing each change needs. Vanished and unmirrored runs go through ``settle`` (mark,
then re-price the runs marked); a load or a mirror-set change then finds the moves (``mark_moved``). No Dagster here;
each function runs inside its caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

from wandb_assets.lib.accounting.prices import (
    LEGACY_PRICES_KEY,
    PRICE_SCHEDULE_CTE,
    price_on_sql,
    priced_sql,
    record_prices,
    schedule_token,
)
from wandb_assets.lib.clock import utc_instant
from wandb_assets.lib.normalize import MOVED, VANISHED
from wandb_assets.lib.sql import (
    ALIVE_SQL,
    MIRRORED_NOW_SQL,
    busy_until_sql,
    daily_gpu_hours_sql,
    meta_value,
    run_gpu_hours_sql,
    set_meta,
)

#: The anomaly of a run marked because its project left the mirror set (not because W&B lost it).
UNMIRRORED = "unmirrored"

#: The runs a fetch asks W&B for by id (besides its window): alive ones, and those marked only because their project
#: left the mirror set (when it comes back they are asked again; W&B not returning one then marks it vanished).
ASK_AGAIN_SQL = (
    f"(state IN ({ALIVE_SQL}) OR (state = '{VANISHED}' AND list_contains(coalesce(anomalies, []), '{UNMIRRORED}') "
    f"AND NOT list_contains(coalesce(anomalies, []), '{VANISHED}')))"
)

_MARKED = "(entity, project, run_id) IN (SELECT entity, project, run_id FROM just_vanished)"


def price_sql(table: str, where: str = "TRUE") -> list[str]:
    """The statements that set a run's ``cost_usd`` in ``table`` (rows ``where``): each UTC day's GPU-hours up to its
    end (alive: up to when it was read, ``ingested_at``) at the price in force that day for its model and cluster
    (``prices.priced_sql`` over ``gpu_price_periods``), summed; NULL when a day has no price or without GPU time
    (pending); a run occupying no time (moved) costs 0 at the price of its first day, NULL without one."""
    span = busy_until_sql("ingested_at")
    return [
        f"""WITH {PRICE_SCHEDULE_CTE}
UPDATE {table} SET cost_usd = {run_gpu_hours_sql("ingested_at")} * {price_on_sql(table, "created_at::DATE")}
WHERE ({where}) AND NOT coalesce({span} > created_at, FALSE)""",
        f"""WITH {run_costs_sql(f"(SELECT * FROM {table} WHERE {where})")}
UPDATE {table} SET cost_usd = c.cost FROM costs c
WHERE {table}.entity = c.entity AND {table}.project = c.project AND {table}.run_id = c.run_id""",
    ]


def run_costs_sql(rows: str) -> str:
    """CTEs ending in ``costs (entity, project, run_id, cost)``: the dollars of each of ``rows`` (runs rows, SQL) that
    occupied GPU time, each UTC day's GPU-hours up to its end (alive: to ``ingested_at``) at the price in force that
    day, summed; NULL when a day has no price. The one cost rule of ``runs.cost_usd`` and of ``check``."""
    return f"""{PRICE_SCHEDULE_CTE},
{daily_gpu_hours_sql("entity, project, run_id, gpu_model, hostname", rows, "ingested_at")},
priced AS ({priced_sql("daily", "d.day_start::DATE")}),
costs AS (
    SELECT entity, project, run_id,
           CASE WHEN bool_and(usd_per_gpu_hour IS NOT NULL) THEN sum(gpu_hours * usd_per_gpu_hour) END AS cost
    FROM (SELECT DISTINCT ON (entity, project, run_id, day_start) * FROM priced)  -- a run twice (a broken
    GROUP BY ALL  -- warehouse: ``check``'s one_row_per_run) costs its days once, as the run it is
)"""


#: ``warehouse_meta`` key: the price periods the warehouse last priced its runs with (``prices.schedule_token``).
PRICED_WITH_KEY = "gpu_price_periods_priced"


def reprice(con, table: str, where: str = "TRUE") -> None:
    """Set ``cost_usd`` of the rows of ``table`` ``where`` selects (``price_sql``)."""
    for statement in price_sql(table, where):
        con.execute(statement)


def sync_prices(con, prices, at: datetime) -> None:
    """Record ``prices`` as seen at ``at`` (``prices.record_prices``); when the recorded periods then differ from those
    the warehouse last priced its runs with, every run is priced again (a past day moves only when a dated period
    says so)."""
    record_prices(con, prices, at.date(), at, legacy=meta_value(con, LEGACY_PRICES_KEY))
    token = schedule_token(con)
    if meta_value(con, PRICED_WITH_KEY) != token:
        reprice(con, "runs")
        set_meta(con, PRICED_WITH_KEY, token)


def price_runs(con, prices, at: datetime | None = None) -> None:
    """``sync_prices`` as seen at ``at`` (now by default), then price the incoming rows (``incoming_runs``). None:
    rows keep what they hold (a caller without settings)."""
    if prices is None:
        return
    sync_prices(con, prices, at or utc_instant())
    reprice(con, "incoming_runs")


def settle(con, at: datetime, anomaly: str = VANISHED) -> int:
    """Mark the runs of the temp table ``just_vanished`` (``entity, project, run_id``): an alive one becomes
    ``vanished`` (last seen at its heartbeat: it occupies no GPU after it); an ended one keeps its state (its success,
    duration and GPU-hours stay as counted). Each carries ``anomaly`` (``vanished``; ``unmirrored`` for a project that
    left the mirror set) and ``state_changed_at = at`` (the row changed without a load: what was evaluated before
    ``at`` saw it alive). They are re-priced (``reprice``: their GPU time ends at their last heartbeat). The temp
    table is dropped. Returns the runs marked. (A load then finds the moves, ``mark_moved``, once its rows are in.)"""
    marked = con.execute("SELECT count(*) FROM just_vanished").fetchone()[0]
    if marked:
        con.execute(
            f"UPDATE runs SET state = CASE WHEN state IN ({ALIVE_SQL}) THEN '{VANISHED}' ELSE state END, "
            f"anomalies = list_append(coalesce(anomalies, []), $anomaly), state_changed_at = $at WHERE {_MARKED}",
            {"anomaly": anomaly, "at": at},
        )
        reprice(con, "runs", _MARKED)
    con.execute("DROP TABLE just_vanished")
    return marked


#: A copy of a run W&B no longer answers for where it is: vanished, or of a project no longer mirrored (nobody asks).
LEFT_BEHIND_SQL = (
    f"list_contains(coalesce(runs.anomalies, []), '{VANISHED}') OR "
    f"(coalesce(runs.source, 'wandb') = 'wandb' AND NOT {MIRRORED_NOW_SQL})"
)


def same_run_sql(a: str, b: str) -> str:
    """SQL true when the rows ``a`` and ``b`` (``entity, run_id, created_at``) are one run: W&B run ids are unique per
    project only (``wandb.init(id="baseline")`` recurs), so a run is its entity, id **and** creation time, never its id
    alone. The one identity of a run: the lifecycle's moves, the idle ladder's ledger, the alert continuation and
    ``check`` use it."""
    return f"({a}.entity = {b}.entity AND {a}.run_id = {b}.run_id AND {a}.created_at = {b}.created_at)"


#: A row of ``runs`` that is a moved run's old copy not yet marked: left behind, while another project of its entity
#: holds (and answers for) the same run (``same_run_sql``). ``check``'s one_project_per_run lists these.
MOVED_COPY_SQL = f"""runs.state <> '{MOVED}' AND ({LEFT_BEHIND_SQL}) AND EXISTS (
    SELECT 1 FROM runs o WHERE {same_run_sql("o", "runs")} AND o.project <> runs.project
    AND NOT ({LEFT_BEHIND_SQL.replace("runs.", "o.")}))"""


def moved_copy_sql(alias: str, into_project: str) -> str:
    """SQL true when the row ``alias`` (``entity, project, run_id``) names a copy ``mark_moved`` marked of the same run
    (``same_run_sql``) that the project ``into_project`` (SQL) holds now: what was recorded of the run there (an open
    alert, the idle ladder's steps) is the run's where W&B holds it now, and never another run's with the same id."""
    return (
        f"EXISTS (SELECT 1 FROM runs m JOIN runs n ON {same_run_sql('m', 'n')} WHERE m.entity = {alias}.entity "
        f"AND m.project = {alias}.project AND m.run_id = {alias}.run_id AND m.state = '{MOVED}' "
        f"AND n.project = {into_project} AND n.state <> '{MOVED}')"
    )


def mark_moved(con, at: datetime) -> int:
    """A copy left behind (``LEFT_BEHIND_SQL``) of a run whose id and creation time another project of its entity
    holds (and answers for: not left behind there) is ``moved``: it occupies no GPU here and costs nothing here
    (re-priced: 0 GPU-hours), and its curves go with their idle hours (the other copy's count; moved back, it is
    read again); ``state_changed_at = at``, as ``settle``. Returns the copies marked."""
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE moved_runs AS SELECT entity, project, run_id FROM runs WHERE {MOVED_COPY_SQL}"
    )
    count = con.execute("SELECT count(*) FROM moved_runs").fetchone()[0]
    if count:
        keys = "(entity, project, run_id) IN (SELECT entity, project, run_id FROM moved_runs)"
        con.execute(
            f"UPDATE runs SET state = '{MOVED}', anomalies = list_append(anomalies, '{MOVED}'), curves_status = NULL, "
            f"curves_read_at = NULL, curves_final = NULL, sps_steady = NULL, state_changed_at = $at WHERE {keys}",
            {"at": at},
        )
        reprice(con, "runs", keys)
        for table in ("run_curve_idle", "run_history", "run_gpu_samples"):  # its curves are the other copy's now
            con.execute(f"DELETE FROM {table} WHERE {keys}")
    con.execute("DROP TABLE moved_runs")
    return count


def unmirror(con, at: datetime) -> int:
    """The alive mirrored rows of projects no longer mirrored (``MIRRORED_NOW_SQL``): nobody will refresh them, so they
    are last seen where they are (``settle`` with ``unmirrored``: out of every gauge and alert, their past GPU-hours
    and dollars up to their heartbeat). Asked for again when the project comes back (``ASK_AGAIN_SQL``)."""
    con.execute(
        "CREATE OR REPLACE TEMP TABLE just_vanished AS SELECT entity, project, run_id FROM runs "
        f"WHERE state IN ({ALIVE_SQL}) AND NOT {MIRRORED_NOW_SQL}"
    )
    return settle(con, at, UNMIRRORED)
