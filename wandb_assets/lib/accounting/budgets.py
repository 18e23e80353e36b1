"""Each team's monthly GPU budget, from ``WANDB_ASSETS_BUDGETS`` (a YAML file the platform team keeps beside the teams
file), into the warehouse table ``team_budgets`` the marts read. No Dagster here.

A team's budget is a number (USD a month, every month) or a list of ``{from: YYYY-MM, usd: N}``, each holding from its
month until the next::

    research:
      - {from: 2026-01, usd: 250000}
      - {from: 2026-11, usd: 300000}
    ci: 20000
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import date
from typing import Any

from wandb_assets.lib.errors import ConfigError

#: The first month of a budget given as one number: it holds in every month.
ALWAYS = date(1970, 1, 1)

TEAM_BUDGETS_SQL = """
CREATE TABLE IF NOT EXISTS team_budgets (team VARCHAR, from_month DATE, monthly_budget_usd DOUBLE);
"""


def _usd(value: Any, where: str, team: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} gives {team!r} the budget {value!r}: a budget is USD a month, 0 or more.")
    return float(value)


def _month(value: Any, where: str, team: str) -> date:
    text = value.isoformat()[:7] if isinstance(value, date) else str(value).strip()
    match = re.fullmatch(r"(\d{4})-(\d{2})", text)
    if not match or not 1 <= int(match[2]) <= 12:
        raise ConfigError(f"{where} gives {team!r} a budget from {value!r}: `from` is a month as YYYY-MM.")
    return date(int(match[1]), int(match[2]), 1)


def parse_budgets(document: Any, where: str) -> list[tuple[str, date, float]]:
    """``[(team, first month, USD a month)]`` from a parsed budgets file; one-sentence ``ConfigError`` naming
    ``where`` for anything else (two budgets of one team from one month included)."""
    if document is None:
        return []
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where} must map teams to USD a month (such as research: 250000).")
    found: list[tuple[str, date, float]] = []
    for raw, value in document.items():
        team = str(raw)
        if not isinstance(value, list):
            found.append((team, ALWAYS, _usd(value, where, team)))
            continue
        months = set()
        for item in value:
            if not isinstance(item, Mapping) or set(item) != {"from", "usd"}:
                raise ConfigError(f"{where} gives {team!r} the budget {item!r}: each is {{from: YYYY-MM, usd: N}}.")
            month = _month(item["from"], where, team)
            if month in months:
                raise ConfigError(f"{where} gives {team!r} two budgets from {month:%Y-%m}: keep one of them.")
            months.add(month)
            found.append((team, month, _usd(item["usd"], where, team)))
    return found


def record_budgets(con, budgets: list[tuple[str, date, float]]) -> None:
    """Replace ``team_budgets`` with ``budgets`` (inside the caller's transaction)."""
    con.execute("DELETE FROM team_budgets")
    if budgets:
        con.executemany("INSERT INTO team_budgets VALUES (?, ?, ?)", budgets)
