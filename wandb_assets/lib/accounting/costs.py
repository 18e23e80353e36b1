"""What the GPUs cost, by team, project, user or GPU model, over the last days, from ``gpu_usage``; never without the
share of GPU-hours the dollars leave out. The one cost summary of ``wandb-assets costs``, the demo's last lines,
``gpu_usage``'s metadata in the UI and the ``gpu_costs`` notebook. No Dagster here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from wandb_assets.lib.warehouse import has_table

#: The group of GPU-hours whose run recorded no GPU model.
NO_MODEL = "(no model)"

#: ``--by`` -> the SQL naming each group in ``gpu_usage``.
COST_GROUPS: dict[str, str] = {
    "team": "team",
    "project": "entity || '/' || project",
    "user": "coalesce(username, '(no user)')",
    "model": f"coalesce(gpu_model, '{NO_MODEL}')",
}

#: Per group over ``gpu_usage``'s days from ``$first_day``: GPU-hours, dollars, and how many of the GPU-hours the
#: dollars price (``cost_usd`` not NULL), at the fallback price (``price_basis``), or not at all. ``{where}``: more
#: conditions. A ``gpu_usage`` written before ``price_basis`` existed reads it as NULL (``{basis}``).
_COSTS_SQL = """
SELECT {group} AS name, coalesce(sum(gpu_hours), 0) AS gpu_hours, sum(cost_usd) AS cost_usd,
       coalesce(sum(gpu_hours) FILTER (WHERE cost_usd IS NOT NULL), 0) AS priced_gpu_hours,
       coalesce(sum(gpu_hours) FILTER (WHERE {basis} = 'fallback'), 0) AS fallback_gpu_hours,
       coalesce(sum(idle_gpu_hours), 0) AS idle_gpu_hours
FROM gpu_usage WHERE day >= $first_day AND gpu_hours > 0{where}
GROUP BY ALL ORDER BY cost_usd DESC NULLS LAST, gpu_hours DESC, name
"""


@dataclass(frozen=True)
class CostLine:
    """One group's (or the total's) GPU-hours and dollars, with the share of GPU-hours the dollars price."""

    name: str
    gpu_hours: float
    cost_usd: float | None
    priced_gpu_hours: float
    fallback_gpu_hours: float
    idle_gpu_hours: float

    @property
    def unpriced_gpu_hours(self) -> float:
        return max(self.gpu_hours - self.priced_gpu_hours, 0.0)

    @property
    def priced_pct(self) -> float:
        """The GPU-hours the dollars price, percent (100 without GPU-hours: nothing is left out)."""
        return 100.0 * self.priced_gpu_hours / self.gpu_hours if self.gpu_hours else 100.0


@dataclass(frozen=True)
class CostSummary:
    by: str
    first_day: date
    days: int
    lines: tuple[CostLine, ...]
    total: CostLine
    #: The GPU models whose GPU-hours have no price, most hours first: ``(model, GPU-hours)``.
    unpriced_models: tuple[tuple[str, float], ...]
    #: Runs of these days without a GPU model because their wandb-metadata.json could not be read, by cause
    #: (``(cause, runs)``, most first): "no model recorded" is then a failed read, not absence.
    unread_models: tuple[tuple[str, int], ...] = ()
    #: The first day the warehouse holds (``gpu_usage``'s first), None: it holds none; a window reaching before it
    #: says how many of its days the warehouse holds.
    held_from: date | None = None
    #: The prices the dollars are at: ``PriceLine`` per GPU model, rule and period, in the order people read them.
    prices: tuple[PriceLine, ...] = ()
    #: The closed months the window reaches into: ``ClosedLine`` each, oldest first.
    closed: tuple[ClosedLine, ...] = ()


@dataclass(frozen=True)
class PriceLine:
    """GPU-hours of the window priced at one period of one rule (``gpu_model`` None: the fallback price)."""

    gpu_model: str | None
    price_basis: str
    price_from: date | None
    usd_per_gpu_hour: float
    gpu_hours: float


@dataclass(frozen=True)
class ClosedLine:
    """A closed month the window reaches into: when and how it was closed, what it billed then, and what its usage
    changed by since (billed as adjustments in later months)."""

    month: date
    closed_at: datetime
    closed_by: str
    billed_usd: float | None
    adjusted_usd: float | None
    adjusted_gpu_hours: float


def _gpu_usage_has(con, column: str) -> bool:
    """Whether ``gpu_usage`` has ``column``: a snapshot written by an older version lacks the newer price columns
    until the next refresh upgrades the warehouse."""
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'gpu_usage' AND column_name = $column",
            {"column": column},
        ).fetchone()[0]
    )


def cost_summary(con, by: str, today: date, days: int) -> CostSummary:
    """Costs by ``by`` (a key of ``COST_GROUPS``) over the ``days`` UTC days up to ``today`` (today partial)."""
    if by not in COST_GROUPS:
        raise ValueError(f"by must be one of {', '.join(COST_GROUPS)} (got {by!r})")
    first_day = today - timedelta(days=days - 1)
    basis = "price_basis" if _gpu_usage_has(con, "price_basis") else "NULL"

    def query(group: str, where: str = "") -> list[tuple]:
        sql = _COSTS_SQL.format(group=group, basis=basis, where=where)
        return con.execute(sql, {"first_day": first_day}).fetchall()

    lines = tuple(CostLine(*row) for row in query(COST_GROUPS[by]))
    total = query("'total'")
    unpriced = query(COST_GROUPS["model"], " AND cost_usd IS NULL")
    unread = con.execute(_UNREAD_MODELS_SQL, {"first_day": first_day}).fetchall()
    return CostSummary(
        by=by,
        first_day=first_day,
        days=days,
        lines=lines,
        total=CostLine(*total[0]) if total else CostLine("total", 0.0, None, 0.0, 0.0, 0.0),
        unpriced_models=tuple((name, hours) for name, hours, *_ in sorted(unpriced, key=lambda r: -r[1])),
        unread_models=tuple(unread),
        held_from=con.execute("SELECT min(day) FROM gpu_usage").fetchone()[0],
        prices=tuple(PriceLine(*row) for row in con.execute(_PRICES_SQL, {"first_day": first_day}).fetchall())
        if _gpu_usage_has(con, "price_from")
        else (),
        closed=tuple(
            ClosedLine(*row) for row in con.execute(_CLOSED_SQL, {"first_day": first_day, "today": today}).fetchall()
        )
        if has_table(con, "closed_months")
        else (),
    )


#: The periods that priced the window's GPU-hours: per GPU model (none for the fallback price), rule, period and price.
_PRICES_SQL = """
SELECT CASE WHEN price_basis = 'fallback' THEN NULL ELSE gpu_model END AS model, price_basis, price_from,
       usd_per_gpu_hour, sum(gpu_hours) AS gpu_hours
FROM gpu_usage WHERE day >= $first_day AND gpu_hours > 0 AND usd_per_gpu_hour IS NOT NULL
GROUP BY 1, 2, 3, 4 ORDER BY price_basis = 'fallback', model, price_basis <> 'list', price_basis, price_from NULLS FIRST
"""

#: The closed months that overlap ``[$first_day, $today]``: their record, and what is billed since as adjustments
#: of them (in ``gpu_charges``, later months' records included).
_CLOSED_SQL = """
SELECT c.month, c.closed_at, c.closed_by,
       (SELECT sum(cost_usd) FROM closed_month_charges r WHERE r.month = c.month AND r.adjustment_of IS NULL),
       (SELECT sum(cost_usd) FROM gpu_charges a WHERE a.adjustment_of = c.month),
       (SELECT coalesce(sum(gpu_hours), 0) FROM gpu_charges a WHERE a.adjustment_of = c.month)
FROM closed_months c
WHERE c.month <= $today AND c.month + INTERVAL 1 MONTH > $first_day
ORDER BY c.month
"""


#: Runs busy on or after ``$first_day`` with no GPU model whose wandb-metadata.json read failed, by the failure's cause.
_UNREAD_MODELS_SQL = """
SELECT coalesce(json_extract_string(wandb_metadata, '$.cause'),
                CASE json_extract_string(wandb_metadata, '$.status') WHEN 'malformed' THEN 'not JSON' END,
                'unknown') AS cause, count(*) AS runs
FROM runs
WHERE gpu_model IS NULL AND json_extract_string(wandb_metadata, '$.status') IN ('error', 'malformed')
  AND coalesce(ended_at, heartbeat_at, created_at) >= $first_day::TIMESTAMP
GROUP BY 1 ORDER BY runs DESC, cause
"""


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _signed_usd(value: float) -> str:
    return f"{'-' if value < 0 else '+'}${abs(value):,.2f}"


#: The columns of a cost table, as people read them.
COST_HEADERS = ("GPU-hours", "USD", "priced", "fallback GPU-h", "unpriced GPU-h", "idle GPU-h")


def cost_cells(line: CostLine) -> tuple[str, ...]:
    """One line's cells under ``COST_HEADERS``, rounded as people read them."""
    return (
        f"{line.gpu_hours:,.1f}",
        _usd(line.cost_usd),
        f"{line.priced_pct:.0f}%",
        f"{line.fallback_gpu_hours:,.1f}",
        f"{line.unpriced_gpu_hours:,.1f}",
        f"{line.idle_gpu_hours:,.1f}",
    )


def coverage_sentence(summary: CostSummary) -> str:
    """What the dollars leave out, in one sentence (nothing left out: says so)."""
    total = summary.total
    if total.unpriced_gpu_hours <= 0:
        fallback = (
            f", {total.fallback_gpu_hours:,.1f} of them at the fallback price (WANDB_ASSETS_GPU_DEFAULT_PRICE)"
            if total.fallback_gpu_hours
            else ""
        )
        return f"Every GPU-hour is priced{fallback}."
    models = ", ".join(
        f"{'no model recorded' if name == NO_MODEL else name} ({hours:,.1f})"
        for name, hours in summary.unpriced_models[:5]
    )
    more = f" and {len(summary.unpriced_models) - 5} more" if len(summary.unpriced_models) > 5 else ""
    return (
        f"{total.unpriced_gpu_hours:,.1f} GPU-hours ({100 - total.priced_pct:.0f}%) have no price and are not in the "
        f"dollars: {models}{more}. Price them in WANDB_ASSETS_GPU_PRICES, or set WANDB_ASSETS_GPU_DEFAULT_PRICE."
    )


def format_costs(summary: CostSummary) -> str:
    """The summary as a text table with a total line and the coverage sentence."""
    last_day = summary.first_day + timedelta(days=summary.days - 1)
    held = ""
    if summary.held_from is not None and summary.first_day < summary.held_from <= last_day:
        held = (
            f"; the warehouse holds {(last_day - summary.held_from).days + 1} of them, from {summary.held_from}: "
            "the dollars of the days before are not in it"
        )
    title = (
        f"GPU cost by {summary.by}, {summary.first_day} to {last_day} UTC ({summary.days} days, the last one so "
        f"far{held}):"
    )
    if not summary.lines:
        return f"{title}\n  no GPU-hours in these days."
    rows = [(line.name, *cost_cells(line)) for line in (*summary.lines, summary.total)]
    header = (summary.by, *COST_HEADERS)
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    out = [title]
    for k, row in enumerate((header, *rows)):
        if k == len(rows):  # the total, under a rule
            out.append("  " + "  ".join("-" * w for w in widths))
        cells = [f"{row[0]:<{widths[0]}}", *(f"{cell:>{w}}" for cell, w in zip(row[1:], widths[1:], strict=True))]
        out.append("  " + "  ".join(cells))
    out.append(coverage_sentence(summary))
    if summary.unread_models:
        causes = ", ".join(f"{cause} ({runs:,})" for cause, runs in summary.unread_models)
        runs = sum(runs for _, runs in summary.unread_models)
        out.append(
            f"{runs:,} run(s)' GPU model could not be read (their wandb-metadata.json: {causes}): their GPU-hours "
            "count as no model recorded until a later fetch reads them."
        )
    out.extend(price_sentences(summary))
    return "\n".join(out)


def price_sentences(summary: CostSummary) -> list[str]:
    """Which periods and rules priced the dollars, and which months in the window are closed (with what changed in
    them since, billed elsewhere): one line each, none when there is nothing to say."""
    out = []
    if summary.prices:
        out.append("Priced at:")
        for line in summary.prices:
            what = "the fallback price" if line.gpu_model is None else line.gpu_model
            since = "since always" if line.price_from is None else f"from {line.price_from}"
            rule = "" if line.price_basis in ("list", "fallback") else f", {line.price_basis}"
            out.append(
                f"  {what}: ${line.usd_per_gpu_hour:,.2f} an hour ({since}{rule}), {line.gpu_hours:,.1f} GPU-hours"
            )
    for month in summary.closed:
        billed = "no priced GPU-hours" if month.billed_usd is None else _usd(month.billed_usd)
        change = (
            "nothing in it has changed since"
            if not month.adjusted_gpu_hours and not month.adjusted_usd
            else f"what changed in it since ({month.adjusted_gpu_hours:+,.1f} GPU-hours, "
            f"{'unpriced' if month.adjusted_usd is None else _signed_usd(month.adjusted_usd)}) is billed as "
            "adjustments in later months"
        )
        out.append(
            f"{month.month:%Y-%m} is closed (at {month.closed_at:%Y-%m-%d %H:%M} UTC, by {month.closed_by}): its "
            f"chargeback bills {billed} as recorded then; the figures above are its usage as computed now, and "
            f"{change}."
        )
    return out
