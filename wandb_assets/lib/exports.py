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

from wandb_assets.lib.sql import sql_string
from wandb_assets.lib.warehouse import has_table

FORMATS = ("csv", "parquet")
#: The export connection's DuckDB memory (it spills to ``temp_directory`` beyond): a million runs stream in less.
EXPORT_MEMORY_LIMIT = "512MB"
CHARGEBACK_MART = "analytics.team_gpu_cost_monthly"

#: The chargeback file's columns, in order, with what each holds (docs/analytics.md prints this list).
CHARGEBACK_COLUMNS: dict[str, str] = {
    "month": "the UTC calendar month, YYYY-MM",
    "team": "team of the users (WANDB_ASSETS_TEAMS); unassigned when not mapped",
    "entity": "W&B entity",
    "project": "W&B project",
    "gpu_model": "canonical GPU model; empty when no source names it",
    "price_basis": "where cost_usd's price came from: list (the model's price in WANDB_ASSETS_GPU_PRICES), fallback "
    "(WANDB_ASSETS_GPU_DEFAULT_PRICE, an estimate) or unpriced (no price: cost_usd empty)",
    "users": "distinct W&B users whose runs used these GPUs that month",
    "gpu_hours": "GPU-hours, 2 decimals",
    "cost_usd": "USD, in cents; the rows add up to gpu_usage's month total rounded to the cent (largest remainders "
    "take the leftover cents); empty when unpriced",
    "unpriced_gpu_hours": "of gpu_hours, those with no price (not in cost_usd)",
    "idle_gpu_hours": "of gpu_hours, idle (below WANDB_ASSETS_IDLE_GPU_PCT)",
    "idle_cost_usd": "the dollars of those idle GPU-hours, in cents by the same largest remainders, never more than "
    "the row's cost_usd",
    "failed_gpu_hours": "of gpu_hours, those of runs that failed or crashed",
    "failed_cost_usd": "the dollars of failed runs, in cents by the same largest remainders, never more than the "
    "row's cost_usd",
}


def _cents(column: str) -> str:
    """``column`` (dollars) of each month's rows in whole cents by largest remainders: each row's cents rounded down,
    then the cents the month's rounded total still lacks go one each to the rows with the largest remainders (ties by
    the row's key), so the rows add up to the month's total to the cent. NULL stays NULL."""
    month = "OVER (PARTITION BY month)"
    lacking = f"round(sum({column}) {month} * 100) - sum(floor({column} * 100)) {month}"
    rank = (
        f"row_number() OVER (PARTITION BY month ORDER BY {column} * 100 - floor({column} * 100) DESC NULLS LAST, "
        "team, entity, project, gpu_model, price_basis)"
    )
    return f"floor({column} * 100) + CASE WHEN {rank} <= {lacking} THEN 1 ELSE 0 END"


def chargeback_sql(where: str = "month = $month") -> str:
    """The chargeback's rows of the months ``where`` selects (default one month, ``$month``: its first day), every
    dollar column in whole cents by the same largest-remainder rule (``_cents``) within each month; a row's idle and
    failed cents are capped at its cents (parts of its dollars)."""
    return f"""
WITH m AS (SELECT * FROM {CHARGEBACK_MART} WHERE {where}),
cents AS (
    SELECT *, {_cents("cost_usd")} AS cost_cents, {_cents("idle_cost_usd")} AS idle_cents,
           {_cents("failed_cost_usd")} AS failed_cents
    FROM m
)
SELECT strftime(month, '%Y-%m') AS month, team, entity, project, gpu_model, price_basis, users,
       round(gpu_hours, 2) AS gpu_hours, (cost_cents / 100)::DECIMAL(18, 2) AS cost_usd,
       round(unpriced_gpu_hours, 2) AS unpriced_gpu_hours, round(idle_gpu_hours, 2) AS idle_gpu_hours,
       (least(idle_cents, cost_cents) / 100)::DECIMAL(18, 2) AS idle_cost_usd,
       round(failed_gpu_hours, 2) AS failed_gpu_hours,
       (least(failed_cents, cost_cents) / 100)::DECIMAL(18, 2) AS failed_cost_usd
FROM cents
ORDER BY month, team, entity, project, gpu_model NULLS LAST, price_basis
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
    """Where a month's chargeback file is written: ``out/chargeback-YYYY-MM.<fmt>``."""
    return out / f"chargeback-{month:%Y-%m}.{fmt}"


def export_chargeback(con, month: date, out: Path, fmt: str = "csv", force: bool = False) -> Exported:
    """``chargeback_path``: the month's rows of the chargeback mart. A month whose file exists already (the one
    finance was given) is written again only with ``force``: else ``FileExistsError`` with the sentence to print."""
    target = chargeback_path(month, out, fmt)
    if target.exists() and not force:
        raise FileExistsError(
            f"{target} exists already (a chargeback handed on is not replaced silently): pass --force to write it "
            "again, or --out another folder."
        )
    return _copy(con, CHARGEBACK_SQL, {"month": month}, target, fmt)


def chargeback_totals(con, month: date) -> tuple[float | None, float | None, float]:
    """The month's dollars in the chargeback file's cents, in gpu_usage rounded to the cent, and its GPU-hours."""
    mart = con.execute(f"SELECT sum(cost_usd) FROM ({CHARGEBACK_SQL})", {"month": month}).fetchone()[0]
    usage = con.execute(
        "SELECT round(sum(cost_usd), 2), coalesce(sum(gpu_hours), 0) FROM gpu_usage "
        "WHERE date_trunc('month', day) = $month",
        {"month": month},
    ).fetchone()
    return (None if mart is None else float(mart)), usage[0], usage[1]


def export_runs(con, since: date, out: Path, fmt: str = "parquet") -> Exported:
    """``out/runs-since-YYYY-MM-DD.<fmt>``: every column of the runs created from ``since``."""
    return _copy(con, RUNS_SQL, {"since": since}, out / f"runs-since-{since:%Y-%m-%d}.{fmt}", fmt)
