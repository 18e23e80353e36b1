"""The curves' parse as Python wrote it, point by point, before issue 54 moved it into DuckDB
(``lib/curves.parse_rows``): the reference the SQL is compared with, over any input (``tests/test_curves.py``). No
code shared with ``lib/``."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

_GPU_KEY = re.compile(r"^system\.gpu\.([0-9]{1,4})\.([A-Za-z]+)$")
_MAX_GPUS = 4096


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def moment(seconds: Any) -> str | None:
    value = number(seconds)
    if value is None or not 0 <= value < 253402300800:
        return None
    return datetime.fromtimestamp(value, UTC).replace(tzinfo=None).isoformat()


def history_rows(keys: list[str], sampled: Any) -> list[list]:
    rows: list[list] = []
    if not isinstance(sampled, list):
        return rows
    for key, series in zip(keys, sampled, strict=False):
        seen: set[int] = set()
        for row in series if isinstance(series, list) else []:
            if not isinstance(row, Mapping):
                continue
            step, value = number(row.get("_step")), number(row.get(key))
            if step is None or value is None or not step.is_integer() or not -(2**63) <= step < 2**63:
                continue
            if int(step) in seen:
                continue
            seen.add(int(step))
            rows.append([key, int(step), moment(row.get("_timestamp")), value])
    return rows


def _first_of_each_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's keys as JSON text holds them: a key twice keeps its first value."""
    kept: dict[str, Any] = {}
    for key, value in pairs:
        kept.setdefault(key, value)
    return kept


def gpu_rows(events: Any) -> list[list]:
    """One row per GPU an event reads (two keys naming one GPU's same reading, ``01`` and ``1``: the larger)."""
    rows: list[list] = []
    for event in events if isinstance(events, list) else []:
        if isinstance(event, str):
            try:
                event = json.loads(event, object_pairs_hook=_first_of_each_key)
            except ValueError:
                continue
        if not isinstance(event, Mapping):
            continue
        at = moment(event.get("_timestamp"))
        if at is None:
            continue
        gpus: dict[int, dict[str, float]] = {}
        for key, value in event.items():
            match = _GPU_KEY.match(key)
            reading = number(value)
            if match and reading is not None:
                values = gpus.setdefault(int(match.group(1)), {})
                values[match.group(2)] = max(reading, values.get(match.group(2), reading))
        for gpu, values in sorted(gpus.items()):
            if gpu < _MAX_GPUS:
                rows.append([at, gpu, values.get("gpu"), values.get("memory"), values.get("powerWatts")])
    return rows
