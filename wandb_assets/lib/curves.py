"""The curves of a run: its sampled training history (chosen metric keys, by step) and its sampled system stream (each
GPU's utilisation, memory and power over time), read for many runs in one request. No Dagster here.

W&B's ``Run`` type answers ``sampledHistory(specs: [JSONString!]!)``: one list of row objects per spec
``{"keys": [...], "samples": N}``, holding only rows that have every key of the spec, at most N of them; and
``events(samples: Int)``: the system stream, a list of JSON strings (``_timestamp``, ``system.gpu.<i>.gpu``,
``system.gpu.<i>.memory``, ``system.gpu.<i>.powerWatts``, ...). Both are asked of every run node of a runs
connection filtered by name, so ``CURVES_RUNS_PER_REQUEST`` runs' curves are one request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from wandb_assets.lib.gpus import MAX_GPUS, system_gpus

#: Runs whose curves one request asks for: W&B meters by database time, and pages with curves stay small.
CURVES_RUNS_PER_REQUEST = 20
#: The most samples a spec may ask for (larger values have answered 500).
MAX_SAMPLES = 1000

#: ``runs.curves_status``: the curves were read (``read``: some rows; ``none``: the run logged none of the keys and
#: no system stream), or the last read failed (``failed``, read again by a later fetch); NULL: not read yet.
READ, NONE, FAILED = "read", "none", "failed"
CURVES_STATUSES = (READ, NONE, FAILED)

#: The states after which a run logs nothing more: its curves are read once after it reaches one.
ENDED_STATES = ("finished", "crashed", "failed", "killed")
#: The states of a run still logging: its curves are read at most every ``WANDB_ASSETS_HISTORY_REFRESH_MINUTES``.
ALIVE_STATES = ("running", "preempting")

#: Our own query: each named run's sampled history (one spec per metric) and system stream.
CURVES_QUERY = """
query RunCurves($project: String!, $entity: String!, $filters: JSONString, $perPage: Int, $cursor: String,
                $order: String, $specs: [JSONString!]!, $samples: Int) {
  project(name: $project, entityName: $entity) {
    runCount(filters: $filters)
    runs(filters: $filters, after: $cursor, first: $perPage, order: $order) {
      edges { node { name sampledHistory(specs: $specs) events(samples: $samples) } cursor }
      pageInfo { endCursor hasNextPage }
    }
  }
}
"""


def history_specs(keys: Iterable[str], samples: int) -> list[str]:
    """One spec per metric key, each with ``_step`` and ``_timestamp`` (a spec returns only rows holding all its
    keys: one spec for several metrics would drop the steps where any one is missing)."""
    return [json.dumps({"keys": ["_step", "_timestamp", key], "samples": samples}) for key in keys]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _moment(seconds: Any) -> datetime | None:
    value = _number(seconds)
    if value is None or not 0 <= value < 253402300800:  # before year 10000
        return None
    return datetime.fromtimestamp(value, UTC).replace(tzinfo=None)


def history_rows(keys: list[str], sampled: Any) -> list[list]:
    """``[metric, step, timestamp (ISO, UTC), value]`` from a node's ``sampledHistory`` (one list per key of
    ``keys``, in order): finite values only, whole steps only, one row per (metric, step)."""
    rows: list[list] = []
    if not isinstance(sampled, list):
        return rows
    for key, series in zip(keys, sampled, strict=False):
        seen: set[int] = set()
        for row in series if isinstance(series, list) else []:
            if not isinstance(row, Mapping):
                continue
            step, value = _number(row.get("_step")), _number(row.get(key))
            if step is None or value is None or not step.is_integer() or int(step) in seen:
                continue
            seen.add(int(step))
            at = _moment(row.get("_timestamp"))
            rows.append([key, int(step), at.isoformat() if at else None, value])
    return rows


def gpu_rows(events: Any) -> list[list]:
    """``[timestamp (ISO, UTC), gpu, util_pct, memory_pct, power_w]`` from a node's ``events`` (JSON strings or
    objects): one row per sample and GPU index seen in it (``system.gpu.<i>.*``), a sample without a time skipped."""
    rows: list[list] = []
    for event in events if isinstance(events, list) else []:
        if isinstance(event, str):
            try:
                event = json.loads(event)
            except ValueError:
                continue
        if not isinstance(event, Mapping):
            continue
        at = _moment(event.get("_timestamp"))
        if at is None:
            continue
        for gpu, values in sorted(system_gpus(event).items()):
            if gpu < MAX_GPUS:
                rows.append([at.isoformat(), gpu, values.get("gpu"), values.get("memory"), values.get("powerWatts")])
    return rows


def read_curves(node: Mapping[str, Any], keys: list[str], read_at: datetime) -> dict[str, Any]:
    """What a run node of ``CURVES_QUERY`` holds: ``{"status", "read_at", "history", "gpu"}`` (the caller adds
    ``final``: whether the run had ended when its curves were asked for)."""
    history, gpu = history_rows(keys, node.get("sampledHistory")), gpu_rows(node.get("events"))
    return {"status": READ if history or gpu else NONE, "read_at": read_at.isoformat(), "history": history, "gpu": gpu}


def failed_curves(read_at: datetime, why: str) -> dict[str, Any]:
    return {"status": FAILED, "read_at": read_at.isoformat(), "error": why}


def curves_due(
    state: str | None,
    known: tuple[str | None, datetime | None, bool | None] | None,
    now: datetime,
    refresh: timedelta,
) -> bool:
    """Whether a fetched run's curves are read now. ``known``: ``(curves_status, curves_read_at, curves_final)`` the
    warehouse holds (naive UTC; final: read when the run had ended). Never read, or the last read failed: yes. An
    ended run: unless its curves were read after it ended (read while it ran, it is read once more; our clock is
    never compared with W&B's heartbeat). An alive run: when the last read is ``refresh`` old. A pending run: no."""
    status, read_at, final = known or (None, None, None)
    if state not in ENDED_STATES and state not in ALIVE_STATES:
        return False
    if status not in (READ, NONE) or read_at is None:
        return True
    if state in ENDED_STATES:
        return not final
    return now - read_at >= refresh
