"""The curves of a run: its sampled training history (chosen metric keys, by step) and its sampled system stream (each
GPU's utilisation, memory and power over time), read for many runs in one request. No Dagster here.

W&B's ``Run`` type answers ``sampledHistory(specs: [JSONString!]!)``: one list of row objects per spec
``{"keys": [...], "samples": N}``, holding only rows that have every key of the spec, at most N of them; and
``events(samples: Int)``: the system stream, a list of JSON strings (``_timestamp``, ``system.gpu.<i>.gpu``,
``system.gpu.<i>.memory``, ``system.gpu.<i>.powerWatts``, ...). Both are asked of every run node of a runs
connection filtered by name, so ``CURVES_RUNS_PER_REQUEST`` runs' curves are one request.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wandb_assets.lib.accounting.gpus import MAX_GPUS, system_gpus
from wandb_assets.lib.fetch import RUN_METADATA_FILE_FIELD, metadata_file_url

#: Runs whose curves one request asks for: W&B meters by database time, and pages with curves stay small.
CURVES_RUNS_PER_REQUEST = 20
#: The most samples a spec may ask for (larger values have answered 500).
MAX_SAMPLES = 1000

#: ``runs.curves_status``: the curves were read (``read``: some rows; ``none``: the run logged none of the keys and
#: no system stream), or the last read failed (``failed``, read again by a later fetch); NULL: not read yet.
READ, NONE, FAILED = "read", "none", "failed"
CURVES_STATUSES = (READ, NONE, FAILED)


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
#: The same, with each run's W&B user and e-mail (the idle ladder tells the owner).
CURVES_WITH_USER_QUERY = CURVES_QUERY.replace(
    "events(samples: $samples)", f"events(samples: $samples) user {{ username email }} {RUN_METADATA_FILE_FIELD}"
)


def history_specs(keys: Iterable[str], samples: int) -> list[str]:
    """One spec per metric key, each with ``_step`` and ``_timestamp`` (a spec returns only rows holding all its
    keys: one spec for several metrics would drop the steps where any one is missing)."""
    return [json.dumps({"keys": ["_step", "_timestamp", key], "samples": samples}) for key in keys]


def _number(value: Any) -> float | None:
    """A finite number, or None (not a number, NaN, infinite, or an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # JSON allows an integer of any length
        return None
    return value if math.isfinite(value) else None


#: The steps the ``run_history.step`` column (BIGINT) holds.
_STEP_RANGE = (-(2**63), 2**63)


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
            if step is None or value is None or not step.is_integer() or not _STEP_RANGE[0] <= step < _STEP_RANGE[1]:
                continue
            if int(step) in seen:
                continue
            seen.add(int(step))
            at = _moment(row.get("_timestamp"))
            rows.append([key, int(step), at.isoformat() if at else None, value])
    return rows


def _events(events: list) -> list:
    """The events as objects: one ``json.loads`` of them all when each is a JSON object's text and they parse to as
    many objects (most of a read's time is here), else one by one, an event that is not JSON skipped."""
    if all(isinstance(e, str) and e.startswith("{") and e.endswith("}") for e in events):
        try:
            parsed = json.loads("[" + ",".join(events) + "]")
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and len(parsed) == len(events):
            return parsed
    out = []
    for event in events:
        if isinstance(event, str):
            try:
                event = json.loads(event)
            except ValueError:
                continue
        out.append(event)
    return out


def gpu_rows(events: Any) -> list[list]:
    """``[timestamp (ISO, UTC), gpu, util_pct, memory_pct, power_w]`` from a node's ``events`` (JSON strings or
    objects): one row per sample and GPU index seen in it (``system.gpu.<i>.*``), a sample without a time skipped."""
    rows: list[list] = []
    for event in _events(events) if isinstance(events, list) else []:
        if not isinstance(event, Mapping):
            continue
        at = _moment(event.get("_timestamp"))
        if at is None:
            continue
        when = at.isoformat()
        for gpu, values in sorted(system_gpus(event).items()):
            if gpu < MAX_GPUS:
                rows.append([when, gpu, values.get("gpu"), values.get("memory"), values.get("powerWatts")])
    return rows


def read_curves(node: Mapping[str, Any], keys: list[str], read_at: datetime) -> dict[str, Any]:
    """What a run node of ``CURVES_QUERY`` holds: ``{"status", "read_at", "history", "gpu"}`` (the caller adds
    ``final``: whether the run had ended when its curves were asked for)."""
    history, gpu = history_rows(keys, node.get("sampledHistory")), gpu_rows(node.get("events"))
    read = {"status": READ if history or gpu else NONE, "read_at": read_at.isoformat(), "history": history, "gpu": gpu}
    user = node.get("user")
    if isinstance(user, Mapping) and isinstance(user.get("email"), str) and "@" in user["email"]:
        read["email"] = user["email"].strip()
    if "files" in node:  # the ladder's query: where the run's wandb-metadata.json is (its own GPU count)
        read["metadata_url"] = metadata_file_url(node)
    return read


def failed_curves(read_at: datetime, why: str) -> dict[str, Any]:
    return {"status": FAILED, "read_at": read_at.isoformat(), "error": why}


#: Under ``WANDB_ASSETS_STAGING_DIR``: one folder per read of curves (``CurvesFolder``), loaded by ``run_curves``.
CURVES_FOLDER = "curves"
#: The three files of a folder, each CSV with a header: which runs were read, their history and their GPU samples.
READS_FILE, HISTORY_FILE, GPU_FILE = "reads", "history", "gpu"
READS_HEADER = ["entity", "project", "run_id", "status", "read_at", "final"]
HISTORY_HEADER = ["entity", "project", "run_id", "metric", "step", "timestamp", "value"]
GPU_HEADER = ["entity", "project", "run_id", "timestamp", "gpu", "util_pct", "memory_pct", "power_w"]
#: How the point files write NULL (``read_csv(nullstr=...)``): an empty field stays an empty string, so a run of a
#: log without an entity ("") keeps its key.
NULL_MARK = "\\N"


def _cells(row: list) -> list:
    return [NULL_MARK if cell is None else cell for cell in row]


class CurvesFolder:
    """The curves one read brings, as typed point files (CSV, one row per point) written as each request answers:
    nothing of a run's curves stays in memory after its request, and the load reads the files straight into its
    inserts. Written under a hidden name and renamed whole by ``publish``, so a load never sees half a read; a
    folder not published (the read failed) is deleted by ``discard``. Thread-safe: requests answer concurrently."""

    def __init__(self, staging: Path, name: str) -> None:
        self.root = Path(staging) / CURVES_FOLDER
        self.partial = self.root / f".{name}.partial"
        self.final = self.root / name
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self._lock = threading.Lock()
        self._parts = 0
        self.points = 0

    def add(self, path: str, final: dict[str, bool], read: dict[str, dict]) -> None:
        """The curves of one request: ``read`` (``{run_id: read_curves(...) or failed_curves(...)}``) of the runs of
        ``path`` (``entity/project``); ``final``: whether each run had ended when asked."""
        entity, _, project = path.partition("/")
        with self._lock:
            self._parts += 1
            part = self._parts
        files = {
            name: (self.partial / f"{name}-{part:06d}.csv").open("w", newline="")
            for name in (READS_FILE, HISTORY_FILE, GPU_FILE)
        }
        try:
            writers = {name: csv.writer(f) for name, f in files.items()}
            writers[READS_FILE].writerow(READS_HEADER)
            writers[HISTORY_FILE].writerow(HISTORY_HEADER)
            writers[GPU_FILE].writerow(GPU_HEADER)
            points = 0
            for run_id, curves in read.items():
                run = [entity, project, run_id]
                is_final = bool(final.get(run_id)) and curves["status"] != FAILED
                writers[READS_FILE].writerow([*run, curves["status"], curves["read_at"], str(is_final).lower()])
                for row in curves.get("history", []):
                    writers[HISTORY_FILE].writerow(_cells([*run, *row]))
                for row in curves.get("gpu", []):
                    writers[GPU_FILE].writerow(_cells([*run, *row]))
                points += len(curves.get("history", [])) + len(curves.get("gpu", []))
        finally:
            for f in files.values():
                f.close()
        with self._lock:
            self.points += points

    def publish(self) -> Path | None:
        """Make the folder visible to the load (None when no request answered: nothing to load)."""
        if not self._parts:
            self.discard()
            return None
        os.replace(self.partial, self.final)
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


#: Where the curves job sets aside a published read the warehouse cannot hold (under the curves folder; a name with a
#: leading dot is never a published read).
REJECTED_FOLDER = ".rejected"


def published_folders(staging: Path) -> list[Path]:
    """The published reads of curves waiting for their load, oldest first (a later read of a run replaces an earlier
    one)."""
    root = Path(staging) / CURVES_FOLDER
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
