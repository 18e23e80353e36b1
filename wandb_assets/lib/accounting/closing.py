"""Closed months and the booked ledger finance reads. No Dagster here.

``gpu_usage`` is what the GPUs did, day by day, computed again at every tick; ``gpu_charges`` is what is billed, month
by month: an open month's usage as computed; a closed month exactly as recorded when it was closed
(``closed_month_charges``, ``close_month``); and whatever changed since in a closed month's usage (a late run, a
price dated into the past, a teams-file edit, idle hours read later) as adjustment lines booked to the first open month
after it (``adjustment_of`` = the month restated), as accounting does. A closed month never moves: its rows, and so its
chargeback file, stay byte for byte.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta

from wandb_assets.lib.sql import dict_rows


class ClosingRefused(Exception):
    """A month that cannot be closed (not over, or closed already): one sentence."""


#: The grain of the ledger: who, where, on what, at which price.
CHARGE_KEY = (
    "team",
    "entity",
    "project",
    "username",
    "gpu_model",
    "price_basis",
    "price_from",
    "usd_per_gpu_hour",
)
#: The amounts of a ledger row (each adds up across rows).
CHARGE_AMOUNTS = ("gpu_hours", "cost_usd", "idle_gpu_hours", "idle_cost_usd", "failed_gpu_hours", "failed_cost_usd")

#: ``gpu_charges.charge_category``.
USAGE, ADJUSTMENT = "usage", "adjustment"

_CHARGE_COLUMNS = """
    month DATE, charge_category VARCHAR, adjustment_of DATE, first_day DATE, last_day DATE, team VARCHAR,
    entity VARCHAR, project VARCHAR, username VARCHAR, gpu_model VARCHAR, price_basis VARCHAR, price_from DATE,
    usd_per_gpu_hour DOUBLE, gpu_hours DOUBLE, cost_usd DOUBLE, idle_gpu_hours DOUBLE, idle_cost_usd DOUBLE,
    failed_gpu_hours DOUBLE, failed_cost_usd DOUBLE"""

CLOSING_SQL = f"""
CREATE TABLE IF NOT EXISTS gpu_charges ({_CHARGE_COLUMNS}
);
CREATE TABLE IF NOT EXISTS closed_month_charges ({_CHARGE_COLUMNS}
);
CREATE TABLE IF NOT EXISTS closed_months (
    month DATE, closed_at TIMESTAMP, closed_by VARCHAR, first_day DATE, last_day DATE, gpu_hours DOUBLE,
    cost_usd DOUBLE, digest VARCHAR
);
"""

#: The digest of a month's record rows (an aggregate over ``closed_month_charges`` or ``gpu_charges`` rows): each row
#: as JSON, in one order. ``EMPTY_DIGEST_SQL``: that of no rows.
CHARGE_DIGEST_SQL = (
    "md5(coalesce(string_agg(to_json(closed_row)::VARCHAR, '|' ORDER BY to_json(closed_row)::VARCHAR), ''))"
)
EMPTY_DIGEST_SQL = "md5('')"

#: An amount smaller than this (GPU-hours or USD) is no adjustment: floating-point noise of a sum computed again.
EPSILON = 1e-6


def month_end(month: date) -> date:
    """The first day of the month after ``month`` (its first day)."""
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def closed_months(con) -> list[date]:
    """The months closed, oldest first."""
    return [m for (m,) in con.execute("SELECT month FROM closed_months ORDER BY month").fetchall()]


def booking_months(closed: list[date]) -> dict[date, date]:
    """``{closed month: the first month after it that is not closed}``: where what changed in it is booked."""
    shut = set(closed)
    booked = {}
    for month in closed:
        target = month_end(month)
        while target in shut:
            target = month_end(target)
        booked[month] = target
    return booked


def _key_join(a: str, b: str) -> str:
    return " AND ".join(f"{a}.{k} IS NOT DISTINCT FROM {b}.{k}" for k in CHARGE_KEY)


_KEYS = ", ".join(CHARGE_KEY)
_SUMS = ", ".join(f"sum({a}) AS {a}" for a in CHARGE_AMOUNTS)

#: An adjustment's amounts (over ``changed c``): its dollars NULL where neither the usage nor its record had a price.
_ADJUSTED = ", ".join(
    f"CASE WHEN c.unpriced THEN NULL ELSE c.{a} END AS {a}" if "cost" in a else f"c.{a}" for a in CHARGE_AMOUNTS
)

#: ``gpu_charges`` from ``gpu_usage``, ``closed_month_charges`` and ``$booking`` (JSON ``[{month, book}]``).
CHARGES_SQL = f"""
WITH booking AS (
    SELECT unnest(from_json($booking::JSON, '[{{"month": "DATE", "book": "DATE"}}]'), recursive := true)
),
usage AS (
    SELECT date_trunc('month', day)::DATE AS usage_month, {_KEYS}, min(day) AS first_day, max(day) AS last_day, {_SUMS}
    FROM gpu_usage GROUP BY ALL
),
recorded AS (  -- what the closed records hold of each closed month's usage: its own rows and adjustments of it
    SELECT coalesce(adjustment_of, month) AS usage_month, {_KEYS}, {_SUMS}
    FROM closed_month_charges GROUP BY ALL
),
changed AS (
    SELECT coalesce(u.usage_month, r.usage_month) AS usage_month,
           {", ".join(f"coalesce(u.{k}, r.{k}) AS {k}" for k in CHARGE_KEY)},
           {", ".join(f"coalesce(u.{a}, 0) - coalesce(r.{a}, 0) AS {a}" for a in CHARGE_AMOUNTS)},
           (u.cost_usd IS NULL AND r.cost_usd IS NULL) AS unpriced
    FROM (SELECT * FROM usage WHERE usage_month IN (SELECT month FROM booking)) u
    FULL OUTER JOIN recorded r ON u.usage_month = r.usage_month AND {_key_join("u", "r")}
)
SELECT usage_month AS month, '{USAGE}' AS charge_category, NULL::DATE AS adjustment_of, first_day, last_day, {_KEYS},
       {", ".join(CHARGE_AMOUNTS)}
FROM usage WHERE usage_month NOT IN (SELECT month FROM booking)
UNION ALL BY NAME
SELECT * FROM closed_month_charges
UNION ALL BY NAME
SELECT b.book AS month, '{ADJUSTMENT}' AS charge_category, c.usage_month AS adjustment_of,
       c.usage_month AS first_day, (c.usage_month + INTERVAL 1 MONTH - INTERVAL 1 DAY)::DATE AS last_day, {_KEYS},
       {_ADJUSTED}
FROM changed c JOIN booking b ON b.month = c.usage_month
WHERE {" OR ".join(f"abs(coalesce(c.{a}, 0)) > {EPSILON}" for a in CHARGE_AMOUNTS)}
"""


def rebuild_charges(con) -> int:
    """Rebuild ``gpu_charges`` from ``gpu_usage`` and the closed months (inside the caller's transaction, after
    ``gpu_usage``). Returns its rows."""
    booking = booking_months(closed_months(con))
    con.execute("DELETE FROM gpu_charges")
    con.execute(
        f"INSERT INTO gpu_charges BY NAME {CHARGES_SQL}",
        {"booking": json.dumps([{"month": str(m), "book": str(b)} for m, b in booking.items()])},
    )
    return con.execute("SELECT count(*) FROM gpu_charges").fetchone()[0]


#: How a month was closed (``closed_months.closed_by``).
CLOSED_BY_COMMAND = "wandb-assets close"
CLOSED_BY_SETTING = "WANDB_ASSETS_CLOSE_AFTER_DAYS"


def close_month(con, month: date, now: datetime, closed_by: str = CLOSED_BY_COMMAND) -> dict:
    """Record ``month`` (its first day) as closed at ``now`` (inside the caller's transaction, right after
    ``gpu_charges`` was rebuilt): its rows of ``gpu_charges`` copied to ``closed_month_charges``, its totals, the
    days its usage covers and the digest of its rows to ``closed_months``. ``ClosingRefused`` for a month not over or
    closed already.
    Returns the month's record."""
    if month_end(month) > now.date():
        raise ClosingRefused(
            f"{month:%Y-%m} is not over (it ends {month_end(month)} 00:00 UTC): only a past month closes."
        )
    row = con.execute("SELECT closed_at FROM closed_months WHERE month = $m", {"m": month}).fetchone()
    if row:
        raise ClosingRefused(f"{month:%Y-%m} was closed at {row[0]:%Y-%m-%d %H:%M} UTC: a closed month never changes.")
    con.execute("INSERT INTO closed_month_charges BY NAME SELECT * FROM gpu_charges WHERE month = $m", {"m": month})
    con.execute(
        "INSERT INTO closed_months SELECT $m, $now, $by, min(first_day), max(last_day), coalesce(sum(gpu_hours), 0), "
        f"sum(cost_usd), {CHARGE_DIGEST_SQL} FROM closed_month_charges AS closed_row WHERE month = $m",
        {"m": month, "now": now, "by": closed_by},
    )
    return closed_record(con, month)


def closed_record(con, month: date) -> dict:
    """``closed_months``' row of ``month`` as a dict (empty: not closed)."""
    found = dict_rows(con, "SELECT * FROM closed_months WHERE month = $m", {"m": month})
    return found[0] if found else {}


def months_due(con, now: datetime, after_days: int) -> list[date]:
    """The months to close automatically at ``now``: ended at least ``after_days`` ago, not closed, from the first
    month ``gpu_usage`` holds."""
    first = con.execute("SELECT min(day) FROM gpu_usage").fetchone()[0]
    if first is None:
        return []
    shut = set(closed_months(con))
    month, due = first.replace(day=1), []
    while month_end(month) + timedelta(days=after_days) <= now.date():
        if month not in shut:
            due.append(month)
        month = month_end(month)
    return due
