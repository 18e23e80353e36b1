"""Files to hand on: one month's chargeback for finance, and the runs since a day for another warehouse. DuckDB
writes them with ``COPY ... TO`` from the query, streaming (no table is read into Python), under a memory limit of
its own. No Dagster here, no environment reads.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from wandb_assets.lib.accounting.closing import closed_record, month_end
from wandb_assets.lib.sql import sql_string
from wandb_assets.lib.warehouse import has_table

FORMATS = ("csv", "parquet")
#: The chargeback's formats: those, and ``focus`` (the FinOps FOCUS columns, CSV).
CHARGEBACK_FORMATS = (*FORMATS, "focus")
#: The export connection's DuckDB memory (it spills to ``temp_directory`` beyond): a million runs stream in less.
EXPORT_MEMORY_LIMIT = "512MB"
CHARGEBACK_MART = "analytics.team_gpu_cost_monthly"

#: The chargeback file's columns, in order, with what each holds (docs/analytics.md prints this list).
CHARGEBACK_COLUMNS: dict[str, str] = {
    "month": "the UTC calendar month the row is billed in, YYYY-MM",
    "status": "closed (`wandb-assets close`: the month's rows never change again) or open",
    "covered_from": "the first UTC day of usage the month's own rows hold",
    "covered_to": "the last UTC day of usage the month's own rows hold (an open month that is not over ends today)",
    "team": "team of the users (WANDB_ASSETS_TEAMS); unassigned when not mapped",
    "entity": "W&B entity",
    "project": "W&B project",
    "gpu_model": "canonical GPU model; empty when no source names it",
    "price_basis": "the rule that priced cost_usd: list (the model's price in WANDB_ASSETS_GPU_PRICES), a match "
    "such as `hosts cw-*`, fallback (WANDB_ASSETS_GPU_DEFAULT_PRICE, an estimate) or unpriced (no price: cost_usd "
    "empty)",
    "price_from": "the first UTC day of the price period (empty: since always)",
    "usd_per_gpu_hour": "the USD per GPU-hour of that period",
    "charge_category": "usage (the month's own GPU-hours) or adjustment (a change to a closed month, billed here)",
    "adjustment_of": "for an adjustment, the closed month it restates (YYYY-MM-01); else empty",
    "users": "distinct W&B users whose runs used these GPUs that month",
    "gpu_hours": "GPU-hours, 2 decimals (an adjustment: the change, may be negative)",
    "cost_usd": "USD, in cents; the rows add up to gpu_charges' month total rounded to the cent (largest remainders "
    "take the leftover cents); empty when unpriced",
    "unpriced_gpu_hours": "of gpu_hours, those with no price (not in cost_usd)",
    "idle_gpu_hours": "of gpu_hours, idle (below WANDB_ASSETS_IDLE_GPU_PCT)",
    "idle_cost_usd": "the dollars of those idle GPU-hours, in cents by the same largest remainders, never more than "
    "the row's cost_usd",
    "failed_gpu_hours": "of gpu_hours, those of runs that failed or crashed",
    "failed_cost_usd": "the dollars of failed runs, in cents by the same largest remainders, never more than the "
    "row's cost_usd",
}

#: A row's key (ties of the largest remainders, and the file's order).
_ROW_KEY = "team, entity, project, gpu_model, price_basis, price_from, usd_per_gpu_hour, charge_category, adjustment_of"


def _cents(column: str) -> str:
    """``column`` (dollars) of each month's rows in whole cents by largest remainders: each row's cents rounded down,
    then the cents the month's rounded total still lacks go one each to the rows with the largest remainders (ties by
    the row's key), so the rows add up to the month's total to the cent. NULL stays NULL."""
    month = "OVER (PARTITION BY month)"
    lacking = f"round(sum({column}) {month} * 100) - sum(floor({column} * 100)) {month}"
    rank = (
        f"row_number() OVER (PARTITION BY month ORDER BY {column} * 100 - floor({column} * 100) DESC NULLS LAST, "
        f"{_ROW_KEY})"
    )
    return f"floor({column} * 100) + CASE WHEN {rank} <= {lacking} THEN 1 ELSE 0 END"


def _within(part: str, whole: str) -> str:
    """Cents of a part of a row's dollars never beyond the row's own (a negative adjustment's too)."""
    return f"CASE WHEN {whole} >= 0 THEN least({part}, {whole}) ELSE greatest({part}, {whole}) END"


def chargeback_sql(where: str = "month = $month") -> str:
    """The chargeback's rows of the months ``where`` selects (default one month, ``$month``: its first day), every
    dollar column in whole cents by the same largest-remainder rule (``_cents``) within each month; a row's idle and
    failed cents are capped at its cents (parts of its dollars). Each row says whether its month is closed and the
    usage days the month's own rows cover."""
    return f"""
WITH m AS (SELECT * FROM {CHARGEBACK_MART} WHERE {where}),
cents AS (
    SELECT *, {_cents("cost_usd")} AS cost_cents, {_cents("idle_cost_usd")} AS idle_cents,
           {_cents("failed_cost_usd")} AS failed_cents,
           min(first_day) FILTER (WHERE charge_category = 'usage') OVER (PARTITION BY month) AS covered_from,
           max(last_day) FILTER (WHERE charge_category = 'usage') OVER (PARTITION BY month) AS covered_to
    FROM m
)
SELECT strftime(month, '%Y-%m') AS month,
       CASE WHEN month IN (SELECT month FROM closed_months) THEN 'closed' ELSE 'open' END AS status,
       covered_from, covered_to, team, entity, project, gpu_model, price_basis, price_from, usd_per_gpu_hour,
       charge_category, adjustment_of, users,
       round(gpu_hours, 2) AS gpu_hours, (cost_cents / 100)::DECIMAL(18, 2) AS cost_usd,
       round(unpriced_gpu_hours, 2) AS unpriced_gpu_hours, round(idle_gpu_hours, 2) AS idle_gpu_hours,
       ({_within("idle_cents", "cost_cents")} / 100)::DECIMAL(18, 2) AS idle_cost_usd,
       round(failed_gpu_hours, 2) AS failed_gpu_hours,
       ({_within("failed_cents", "cost_cents")} / 100)::DECIMAL(18, 2) AS failed_cost_usd
FROM cents
ORDER BY month, team, entity, project, gpu_model NULLS LAST, price_basis, price_from NULLS FIRST, usd_per_gpu_hour,
         charge_category DESC, adjustment_of
"""


#: The FinOps FOCUS columns of the same rows (``export chargeback --format focus``): the month a row is billed in,
#: the usage it charges, Usage or Adjustment (a Correction of a closed month), GPU-hours at the period's list price,
#: with the team, project, GPU model and price rule as custom ``x_`` columns.
FOCUS_SQL = f"""
SELECT strftime(strptime(month || '-01', '%Y-%m-%d'), '%Y-%m-%dT00:00:00Z') AS BillingPeriodStart,
       strftime(strptime(month || '-01', '%Y-%m-%d') + INTERVAL 1 MONTH, '%Y-%m-%dT00:00:00Z') AS BillingPeriodEnd,
       strftime(coalesce(adjustment_of, covered_from), '%Y-%m-%dT00:00:00Z') AS ChargePeriodStart,
       strftime(CASE WHEN charge_category = 'adjustment' THEN adjustment_of + INTERVAL 1 MONTH
                     ELSE covered_to + INTERVAL 1 DAY END, '%Y-%m-%dT00:00:00Z') AS ChargePeriodEnd,
       CASE charge_category WHEN 'adjustment' THEN 'Adjustment' ELSE 'Usage' END AS ChargeCategory,
       CASE charge_category WHEN 'adjustment' THEN 'Correction' END AS ChargeClass,
       'GPU-hours of ' || coalesce(gpu_model, 'an unknown GPU') || ' in ' || entity || '/' || project
           AS ChargeDescription,
       'USD' AS BillingCurrency, gpu_hours AS ConsumedQuantity, 'Hours' AS ConsumedUnit,
       gpu_hours AS PricingQuantity, 'Hours' AS PricingUnit, usd_per_gpu_hour AS ListUnitPrice,
       cost_usd AS ListCost, cost_usd AS BilledCost, cost_usd AS EffectiveCost, 'Compute' AS ServiceCategory,
       'W&B GPU usage' AS ServiceName, status AS x_BillingPeriodStatus, team AS x_Team,
       entity || '/' || project AS x_Project, gpu_model AS x_GpuModel, price_basis AS x_PriceBasis,
       price_from AS x_PriceFrom
FROM ({chargeback_sql()})
"""


#: One month of the chargeback mart (``$month``), the file ``export chargeback`` writes.
CHARGEBACK_SQL = chargeback_sql()

#: Every column of the runs created from ``$since`` (UTC), as stored.
RUNS_SQL = "SELECT * FROM runs WHERE created_at >= $since::TIMESTAMP"


@dataclass(frozen=True)
class Exported:
    path: Path
    rows: int


def parse_month(text: str) -> date:
    """``2026-10`` -> 2026-10-01; anything else raises ``ValueError`` with the sentence to print."""
    match = re.fullmatch(r"(\d{4})-(\d{2})", text.strip())
    if not match or not 1 <= int(match[2]) <= 12:
        raise ValueError(f"--month must be a month as YYYY-MM, e.g. 2026-10 (got {text!r}).")
    return date(int(match[1]), int(match[2]), 1)


def _copy(con, select_sql: str, params: dict, target: Path, fmt: str) -> Exported:
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r}).")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    options = "FORMAT csv, HEADER true" if fmt == "csv" else "FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 50000"
    spill = target.parent / f".{target.name}.{os.getpid()}.spill"
    con.execute(f"SET memory_limit = {sql_string(EXPORT_MEMORY_LIMIT)}")
    con.execute("SET preserve_insertion_order = false")  # stream: no buffering to keep the stored order
    con.execute(f"SET temp_directory = {sql_string(str(spill))}")
    try:
        rows = con.execute(f"COPY ({select_sql}) TO {sql_string(str(partial))} ({options})", params).fetchone()[0]
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(spill, ignore_errors=True)
    return Exported(target, rows)


def has_chargeback(con) -> bool:
    """Whether the analysts' chargeback mart is built in this warehouse."""
    return has_table(con, "team_gpu_cost_monthly", schema="analytics")


def chargeback_path(month: date, out: Path, fmt: str = "csv") -> Path:
    """Where a month's chargeback file is written: ``out/chargeback-YYYY-MM.<fmt>`` (FOCUS: ``.focus.csv``)."""
    return out / f"chargeback-{month:%Y-%m}.{'focus.csv' if fmt == 'focus' else fmt}"


def export_chargeback(con, month: date, out: Path, fmt: str = "csv", force: bool = False) -> Exported:
    """``chargeback_path``: the month's rows of the chargeback mart. A month whose file exists already (the one
    finance was given) is written again only with ``force``: else ``FileExistsError`` with the sentence to print."""
    target = chargeback_path(month, out, fmt)
    if target.exists() and not force:
        raise FileExistsError(
            f"{target} exists already (a chargeback handed on is not replaced silently): pass --force to write it "
            "again, or --out another folder."
        )
    if fmt == "focus":
        return _copy(con, FOCUS_SQL, {"month": month}, target, "csv")
    return _copy(con, CHARGEBACK_SQL, {"month": month}, target, fmt)


def month_coverage(con, month: date, today: date) -> str | None:
    """What a chargeback of ``month`` does not hold, as one sentence (None: a closed month, or a whole one): the month
    is not over, or the warehouse's usage starts after the month's first day."""
    if closed_record(con, month):
        return None
    end = month_end(month)
    first = con.execute("SELECT min(day) FROM gpu_usage").fetchone()[0]
    held = f"the warehouse holds usage from {first}" if first else "the warehouse holds no usage yet"
    if today < end:
        return f"the month is not over: its figures are those up to {today} UTC, and will change ({held})."
    if first is None or first > month:
        return f"{held}: the days of {month:%Y-%m} before it are not in this chargeback."
    return None


def chargeback_totals(con, month: date) -> tuple[float | None, float | None, float]:
    """The month's dollars in the chargeback file's cents, in gpu_charges rounded to the cent, and its GPU-hours."""
    mart = con.execute(f"SELECT sum(cost_usd) FROM ({CHARGEBACK_SQL})", {"month": month}).fetchone()[0]
    usage = con.execute(
        "SELECT round(sum(cost_usd), 2), coalesce(sum(gpu_hours), 0) FROM gpu_charges WHERE month = $month",
        {"month": month},
    ).fetchone()
    return (None if mart is None else float(mart)), usage[0], usage[1]


def export_runs(con, since: date, out: Path, fmt: str = "parquet") -> Exported:
    """``out/runs-since-YYYY-MM-DD.<fmt>``: every column of the runs created from ``since``."""
    return _copy(con, RUNS_SQL, {"since": since}, out / f"runs-since-{since:%Y-%m-%d}.{fmt}", fmt)
