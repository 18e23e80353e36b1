"""GPU prices and their periods: the price file's two forms, the ``gpu_price_periods`` table that keeps their history,
and the one price rule every dollar figure uses. No Dagster here.

A price file maps GPU models to USD per GPU-hour, either a number ("since always") or a list of periods, each with an
optional ``from`` (the UTC day it takes effect) and an optional match (``hosts``, ``projects`` or ``entities``: glob
patterns on the run's hostname, ``entity/project`` or entity)::

    H100-80GB:
      - {usd: 2.99}                                 # the model's price until its first dated period
      - {from: 2026-12-01, usd: 2.49}               # from that UTC day on
      - {from: 2026-12-01, usd: 1.99, hosts: "cw-*"} # runs on hosts cw-*: first matching rule wins
    A100-80GB: 1.79

What the file says is recorded in ``gpu_price_periods`` at each refresh (``record_prices``): a dated period as
dated; an undated price (a number, or a period without ``from``) from the day the pipeline first saw it, except on a
warehouse's first record, where it holds since always (an upgrade records the prices the warehouse had priced with
as since always, then today's file from today). So editing the file never re-prices the past; a dated period set in
the past does, from its day (a closed month takes that as an adjustment, ``closing``).

The price of a GPU-hour used on UTC day ``d`` by a run of model ``m`` (``PRICE_SCHEDULE_CTE``, ``priced_sql``,
``price_on_sql``): of the model's rules whose match the run meets and that have a period in force on ``d``, the first
in the file's order; else the model's unmatched (``list``) price in force on ``d``; else the fallback price
(``WANDB_ASSETS_GPU_DEFAULT_PRICE``, the same history) in force on ``d``; else none (the cost is NULL, never 0). A
rule's period in force on ``d`` is its latest dated period from on or before ``d``; before its first dated period,
its undated price as last seen on or before ``d``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from wandb_assets.lib.accounting.gpus import canonical_gpu_model
from wandb_assets.lib.errors import ConfigError

#: The model key of the fallback price (``WANDB_ASSETS_GPU_DEFAULT_PRICE``): a run whose model has no price of its own
#: (none recorded, an unknown one, or one the list lacks) costs this. No run's model is empty, so it never matches one.
FALLBACK_PRICE = ""

#: What a period may match on, and the run's value each pattern is matched against (SQL over a run row ``{r}``).
MATCHES = {
    "hosts": "{r}.hostname",
    "projects": "({r}.entity || '/' || {r}.project)",
    "entities": "{r}.entity",
}

#: ``price_basis`` of a GPU-hour priced at its model's unmatched price, and at the fallback price.
LIST, FALLBACK = "list", "fallback"

#: The rank of a model's unmatched price: after every rule of the file (a file holds far fewer).
_UNMATCHED_RANK = 1_000_000

#: Where a recorded period came from (``gpu_price_periods.source``).
SOURCE_DATED = "file, dated"
SOURCE_ALWAYS = "file, since always (the warehouse's first record)"
SOURCE_SEEN = "file, from the day first seen"
SOURCE_REMOVED = "file, removed from the day first seen"
SOURCE_UPGRADE = "the prices the warehouse had priced with before periods were kept"


@dataclass(frozen=True)
class PricePeriod:
    """One period of one rule of a GPU model's price (``FALLBACK_PRICE``: the fallback price)."""

    model: str
    usd: float
    valid_from: date | None = None
    match_on: str | None = None
    patterns: tuple[str, ...] = ()
    rank: int = _UNMATCHED_RANK

    @property
    def rule(self) -> str:
        """What ``price_basis`` calls this period's rule: ``list``, ``fallback`` or ``hosts cw-*,gpu-*``."""
        if self.model == FALLBACK_PRICE:
            return FALLBACK
        return LIST if self.match_on is None else f"{self.match_on} {','.join(self.patterns)}"


PriceList = tuple[PricePeriod, ...]


def as_price_list(prices: Any) -> PriceList:
    """A ``PriceList`` from one, or from ``{model: USD}`` / ``(model, USD)`` pairs (undated: since always)."""
    if isinstance(prices, tuple) and all(isinstance(p, PricePeriod) for p in prices):
        return prices
    pairs = prices.items() if isinstance(prices, Mapping) else prices
    return tuple(PricePeriod(model, float(usd)) for model, usd in pairs)


def _usd(value: Any, where: str, raw: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} gives {raw!r} the price {value!r}: a price is a number of USD, 0 or more.")
    return float(value)


def _from_day(value: Any, where: str, raw: str) -> date:
    if isinstance(value, datetime):
        value = value.date()
    if isinstance(value, str):
        try:
            value = date.fromisoformat(value.strip())
        except ValueError:
            value = None
    if not isinstance(value, date):
        raise ConfigError(f"{where} gives {raw!r} a period from {value!r}: `from` is a UTC day as YYYY-MM-DD.")
    return value


def _patterns(value: Any, where: str, raw: str, on: str) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ConfigError(f"{where} gives {raw!r} `{on}: {value!r}`: a match is a glob pattern or a list of them.")
    return tuple(v.strip() for v in values)


def _periods_of(model: str, raw: str, value: Any, where: str) -> list[PricePeriod]:
    """A model's periods from its value in the file (a number or a list of periods), with each rule's rank."""
    if not isinstance(value, list):
        return [PricePeriod(model, _usd(value, where, raw))]
    if not value:
        raise ConfigError(f"{where} gives {raw!r} an empty list: give a price or a list of periods.")
    periods, ranks, seen = [], {}, set()
    for item in value:
        if not isinstance(item, Mapping) or "usd" not in item:
            raise ConfigError(
                f"{where} gives {raw!r} the period {item!r}: a period is {{usd: 2.49}}, with an optional "
                "`from` and one of hosts, projects or entities."
            )
        unknown = sorted(set(item) - {"usd", "from", *MATCHES})
        matches = [on for on in MATCHES if on in item]
        if unknown or len(matches) > 1:
            raise ConfigError(
                f"{where} gives {raw!r} the period {dict(item)!r}: a period holds usd, an optional "
                "`from` and at most one of hosts, projects or entities."
            )
        on = matches[0] if matches else None
        patterns = _patterns(item[on], where, raw, on) if on else ()
        valid_from = _from_day(item["from"], where, raw) if "from" in item else None
        key = (on, patterns)
        if (key, valid_from) in seen:
            when = f"from {valid_from}" if valid_from else "without `from`"
            raise ConfigError(f"{where} gives {raw!r} two periods of one rule {when}: keep one of them.")
        seen.add((key, valid_from))
        rank = _UNMATCHED_RANK if on is None else ranks.setdefault(key, len(ranks))
        periods.append(PricePeriod(model, _usd(item["usd"], where, raw), valid_from, on, patterns, rank))
    return periods


def parse_prices(document: Any, where: str) -> PriceList:
    """The periods of a parsed price file (keys may be the raw names W&B records: they are made canonical). One
    sentence ``ConfigError`` naming ``where`` for anything else, and for two keys naming one model."""
    if not isinstance(document, Mapping) or not document:
        raise ConfigError(f"{where} must map GPU models to USD per GPU-hour (such as H100-80GB: 2.99).")
    periods: list[PricePeriod] = []
    keys: dict[str, str] = {}  # canonical model -> the key that priced it
    for raw, value in document.items():
        model, _ = canonical_gpu_model(str(raw))
        name = model or str(raw)
        if name in keys:  # read as one model, the last would silently win: the file cannot mean two things
            raise ConfigError(
                f"{where} prices {keys[name]!r} and {raw!r}, which name the same GPU model ({name}): keep one of them."
            )
        keys[name] = str(raw)
        periods.extend(_periods_of(name, str(raw), value, where))
    return tuple(periods)


def with_fallback(prices: PriceList, usd: float | None) -> PriceList:
    """``prices`` and the fallback price (undated), if one is set."""
    return prices if usd is None else (*prices, PricePeriod(FALLBACK_PRICE, float(usd)))


def prices_today(prices: PriceList) -> dict[str, float]:
    """``{model: USD}`` of each model's unmatched undated price (the file's "since always" figure): for messages and
    comparisons that need one number per model."""
    return {p.model: p.usd for p in prices if p.match_on is None and p.valid_from is None}


def unknown_price_keys(document: Any) -> list[str]:
    """The keys of a parsed price mapping that name no GPU model this project knows (``H100-80G`` reads as
    H100-80GB; ``Hopper`` is no model): such a price applies only to runs recording that exact string."""
    if not isinstance(document, Mapping):
        return []
    return [str(raw) for raw in document if not canonical_gpu_model(str(raw))[1]]


def unknown_price_key_warning(key: str) -> str:
    """The one warning about a price key ``unknown_price_keys`` found (no final stop: callers add what follows)."""
    return f"WANDB_ASSETS_GPU_PRICES prices {key!r}, which names no GPU model this project knows"


# ------------------------------------------------------------------------------------------- the recorded history

GPU_PRICE_PERIODS_SQL = """
CREATE TABLE IF NOT EXISTS gpu_price_periods (
    model VARCHAR, rule VARCHAR, match_on VARCHAR, patterns VARCHAR[], rank INTEGER, valid_from DATE, usd DOUBLE,
    dated BOOLEAN, source VARCHAR, recorded_at TIMESTAMP, seq BIGINT
);
"""

#: ``warehouse_meta`` key of the prices a warehouse priced its runs with before periods were kept (JSON list of
#: ``{model, usd}``): an upgrade records them as since always, so nothing moves at upgrade.
LEGACY_PRICES_KEY = "gpu_prices"


def _key(model: str, match_on: str | None, patterns: Iterable[str] | None) -> tuple:
    return (model, match_on, tuple(patterns or ()))


def record_prices(con, prices: Any, day: date, at: datetime, legacy: str | None = None) -> int:
    """Record what the price file says in ``gpu_price_periods`` (inside the caller's transaction), as seen on UTC
    ``day`` at ``at``: its dated periods as dated (replacing the dated ones recorded before); each rule's undated price
    since always on the first record (``legacy``: the JSON prices an older warehouse priced with, recorded as since
    always first), else from ``day`` when it differs from the last one recorded (a rule gone from the file: no price
    from ``day``); every rule's rank as in the file now. Returns the rows it added."""
    prices = as_price_list(prices)
    stored = con.execute(
        "SELECT model, match_on, patterns, usd, valid_from FROM gpu_price_periods WHERE NOT dated "
        "ORDER BY valid_from NULLS FIRST, seq"
    ).fetchall()
    seq = con.execute("SELECT coalesce(max(seq), 0) FROM gpu_price_periods").fetchone()[0]
    rows: list[tuple] = []

    def add(p: PricePeriod, valid_from: date | None, usd: float | None, dated: bool, source: str) -> None:
        nonlocal seq
        seq += 1
        rows.append((p.model, p.rule, p.match_on, list(p.patterns), p.rank, valid_from, usd, dated, source, at, seq))

    last: dict[tuple, tuple[PricePeriod, float | None]] = {}
    if not stored and legacy:
        for item in json.loads(legacy):
            period = PricePeriod(item["model"], item["usd"])
            add(period, None, period.usd, False, SOURCE_UPGRADE)
            last[_key(period.model, None, ())] = (period, period.usd)
    first = not stored and not rows
    for model, match_on, patterns, usd, _ in stored:
        period = PricePeriod(model, usd or 0.0, None, match_on, tuple(patterns or ()))
        last[_key(model, match_on, patterns)] = (period, usd)
    undated = {_key(p.model, p.match_on, p.patterns): p for p in prices if p.valid_from is None}
    for key, period in undated.items():
        before = last.get(key)
        if before is None or before[1] != period.usd:
            add(period, None if first else day, period.usd, False, SOURCE_ALWAYS if first else SOURCE_SEEN)
    for key, (period, usd) in last.items():
        if key not in undated and usd is not None:
            add(period, day, None, False, SOURCE_REMOVED)
    added = len(rows)
    con.execute("DELETE FROM gpu_price_periods WHERE dated")
    for p in prices:
        if p.valid_from is not None:
            add(p, p.valid_from, p.usd, True, SOURCE_DATED)
    if rows:
        con.executemany("INSERT INTO gpu_price_periods VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    for p in {_key(p.model, p.match_on, p.patterns): p for p in prices}.values():
        con.execute(
            "UPDATE gpu_price_periods SET rank = $rank WHERE model = $model AND match_on IS NOT DISTINCT FROM $on "
            "AND coalesce(patterns, []) = $patterns::VARCHAR[] AND rank <> $rank",
            {"rank": p.rank, "model": p.model, "on": p.match_on, "patterns": list(p.patterns)},
        )
    return added


#: The CTE ``price_schedule``: each recorded rule's periods as ``[start_day, end_day)`` (``end_day`` NULL: open), one
#: row per pattern, without the spans that price nothing (a removed rule, an undated price after the first dated
#: period). Every figure priced here reads it.
PRICE_SCHEDULE_CTE = """price_schedule AS (
    SELECT model, rule, match_on, unnest(CASE WHEN match_on IS NULL THEN [NULL]::VARCHAR[] ELSE patterns END)
               AS pattern, rank, usd, valid_from AS price_from, start_day, end_day
    FROM (
        SELECT *, coalesce(valid_from, DATE '0001-01-01') AS start_day,
               CASE WHEN dated THEN lead(valid_from) OVER (PARTITION BY model, rule, dated ORDER BY valid_from, seq)
                    ELSE least(lead(coalesce(valid_from, DATE '0001-01-01'))
                                   OVER (PARTITION BY model, rule, dated ORDER BY valid_from NULLS FIRST, seq),
                               min(valid_from) FILTER (WHERE dated) OVER (PARTITION BY model, rule)) END AS end_day
        FROM gpu_price_periods
    )
    WHERE usd IS NOT NULL AND (end_day IS NULL OR end_day > start_day)
)"""


def _in_force(s: str, day: str) -> str:
    return f"{day} >= {s}.start_day AND ({s}.end_day IS NULL OR {day} < {s}.end_day)"


def _matches(s: str, r: str) -> str:
    cases = " ".join(
        f"WHEN {s}.match_on = '{on}' THEN coalesce({value.format(r=r)} GLOB {s}.pattern, FALSE)"
        for on, value in MATCHES.items()
    )
    return f"(CASE WHEN {s}.match_on IS NULL THEN TRUE {cases} ELSE FALSE END)"


#: What a price depends on besides the day (``MATCHES``' columns and the model): ``priced_sql`` prices each distinct
#: combination once.
PRICED_BY = ("gpu_model", "hostname", "entity", "project")


def priced_sql(source: str, day: str) -> str:
    """The rows of ``source`` (each with ``gpu_model``, ``hostname``, ``entity``, ``project``) with their price on the
    UTC day ``day`` (SQL over a row ``d``): ``usd_per_gpu_hour`` (NULL: none), ``price_basis`` (the rule: ``list``,
    ``fallback`` or ``hosts cw-*``) and ``price_from`` (the period's first day, NULL since always). Needs
    ``PRICE_SCHEDULE_CTE``. The one price rule, set-based (``price_on_sql`` for one row). Each distinct model, host,
    project and day is priced once and joined back: choosing the first matching period per run and day grouped a
    million-run warehouse's 1.2 million run-days by four keys (0.6 s of a tick's 0.65 s ``gpu_usage``), where its
    distinct prices number a few thousand."""
    by = ", ".join(f"d.{c}" for c in PRICED_BY)
    same = " AND ".join(f"d.{c} IS NOT DISTINCT FROM p.{c}" for c in (*PRICED_BY, "price_day"))
    return f"""SELECT d.* EXCLUDE (price_day), p.usd_per_gpu_hour, p.price_basis, p.price_from
FROM (SELECT *, {day} AS price_day FROM {source} d) d
LEFT JOIN (
    SELECT d.*, coalesce(s.usd, f.usd) AS usd_per_gpu_hour,
           CASE WHEN s.usd IS NOT NULL THEN s.rule WHEN f.usd IS NOT NULL THEN '{FALLBACK}' END AS price_basis,
           CASE WHEN s.usd IS NOT NULL THEN s.price_from ELSE f.price_from END AS price_from
    FROM (SELECT DISTINCT {by}, {day} AS price_day FROM {source} d) d
    LEFT JOIN price_schedule s ON s.model = d.gpu_model AND {_in_force("s", "d.price_day")} AND {_matches("s", "d")}
    LEFT JOIN price_schedule f ON f.model = '{FALLBACK_PRICE}' AND {_in_force("f", "d.price_day")}
    QUALIFY row_number() OVER (PARTITION BY {by}, d.price_day ORDER BY s.rank NULLS LAST) = 1
) p ON {same}"""


def price_on_sql(r: str, day: str) -> str:
    """The USD per GPU-hour of the run row ``r`` on the UTC day ``day`` (SQL), by the same rule as ``priced_sql``,
    as a scalar for a few rows (the gauges, the alerts and the ladder price today's hours). Needs
    ``PRICE_SCHEDULE_CTE``."""
    return (
        f"coalesce((SELECT arg_min(s.usd, s.rank) FROM price_schedule s WHERE s.model = {r}.gpu_model "
        f"AND {_in_force('s', day)} AND {_matches('s', r)}), (SELECT min(f.usd) FROM price_schedule f "
        f"WHERE f.model = '{FALLBACK_PRICE}' AND {_in_force('f', day)}))"
    )


def price_file_token(prices) -> str:
    """What a price file says, as one JSON text (``settings_since_build`` compares builds with the settings)."""
    return json.dumps(sorted((p.model, p.rule, p.rank, str(p.valid_from), p.usd) for p in as_price_list(prices)))


def schedule_token(con) -> str:
    """The recorded periods as one JSON text: what a build was priced with (``check`` compares)."""
    rows = con.execute(
        "SELECT model, rule, rank, valid_from::VARCHAR, usd, dated FROM gpu_price_periods "
        "ORDER BY model, rule, dated, valid_from NULLS FIRST, seq"
    ).fetchall()
    return json.dumps(rows)
