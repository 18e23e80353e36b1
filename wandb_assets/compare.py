"""Compare runs side by side from the warehouse: one row per field, one column per run.

Fields: state, category, duration, GPU-hours, the five SPS values, every other numeric summary metric all
the runs share, the config keys whose values differ, and each run's URL. No Dagster here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.sql import NOW_UTC_SQL, busy_until_sql

FIXED = ("state", "category", "created_at", "duration_hours", "gpu_count", "gpu_hours")


class UnknownRunsError(ValueError):
    """Some run ids are not in the warehouse."""


@dataclass
class Comparison:
    run_ids: list[str]
    rows: list[tuple[str, list[Any]]]  # (field, one value per run)
    #: Each run's display name (None when W&B has none: two runs in three), heading its column with its id.
    names: list[str | None] | None = None

    def headings(self) -> list[str]:
        """``name (id)``, or the id alone for a run without a display name."""
        names = self.names or [None] * len(self.run_ids)
        return [f"{n} ({r})" if n and n != r else r for n, r in zip(names, self.run_ids, strict=True)]

    def to_frame(self):
        """As a pandas DataFrame (fields as the index), for notebooks."""
        import pandas as pd

        return pd.DataFrame([values for _, values in self.rows], index=[f for f, _ in self.rows], columns=self.run_ids)

    def to_text(self) -> str:
        def cell(value: Any) -> str:
            if value is None:
                return "-"
            return f"{value:,.4g}" if isinstance(value, float) else str(value)

        width = max(len(f) for f, _ in self.rows)
        heads = self.headings()
        columns = [max(len(h), *(len(cell(v[i])) for _, v in self.rows)) for i, h in enumerate(heads)]
        lines = [" " * width + "  " + "  ".join(h.ljust(w) for h, w in zip(heads, columns, strict=True))]
        for name, values in self.rows:
            lines.append(
                name.ljust(width) + "  " + "  ".join(cell(v).ljust(w) for v, w in zip(values, columns, strict=True))
            )
        return "\n".join(lines)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = value


def compare_runs(con, run_ids: list[str]) -> Comparison:
    """Build the comparison; ``UnknownRunsError`` names every id the warehouse does not hold."""
    wanted = list(dict.fromkeys(run_ids))
    sps_columns = list(SPS_KEYS.values())
    rows = con.execute(
        f"SELECT run_id, {', '.join(c for c in FIXED if c != 'gpu_hours')}, "
        f"gpu_count * (epoch({busy_until_sql(NOW_UTC_SQL)}) - epoch(created_at)) / 3600.0 AS gpu_hours, "
        f"{', '.join(sps_columns)}, url, summary, config, name FROM runs WHERE run_id IN (SELECT unnest($ids))",
        {"ids": wanted},
    ).fetchall()
    names = [
        "run_id",
        *[c for c in FIXED if c != "gpu_hours"],
        "gpu_hours",
        *sps_columns,
        "url",
        "summary",
        "config",
        "name",
    ]
    found = {row[0]: dict(zip(names, row, strict=True)) for row in rows}
    missing = [r for r in wanted if r not in found]
    if missing:
        raise UnknownRunsError(
            f"Unknown run id(s): {', '.join(missing)}. They are not in the warehouse: check the ids (W&B run ids, "
            "not display names) or backfill the days they were created."
        )
    runs = [found[r] for r in wanted]
    table: list[tuple[str, list[Any]]] = [(f, [run[f] for run in runs]) for f in FIXED]
    table += [(key, [run[col] for run in runs]) for key, col in SPS_KEYS.items()]
    summaries = []
    for run in runs:
        flat: dict[str, Any] = {}
        _flatten("", json.loads(run["summary"]) if run["summary"] else {}, flat)
        summaries.append(flat)
    shared = set.intersection(*(set(s) for s in summaries)) if summaries else set()
    for key in sorted(shared):
        values = [s[key] for s in summaries]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and not key.startswith("_") and key not in SPS_KEYS:
            table.append((f"summary.{key}", values))
    configs = []
    for run in runs:
        flat = {}
        _flatten("", json.loads(run["config"]) if run["config"] else {}, flat)
        configs.append(flat)
    for key in sorted(set().union(*configs)):
        values = [c.get(key) for c in configs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            table.append((f"config.{key}", values))
    table.append(("url", [run["url"] for run in runs]))
    return Comparison(wanted, table, [run["name"] for run in runs])
