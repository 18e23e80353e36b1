"""Staged runs: normalised rows in NDJSON files outside the warehouse, one file per UTC creation day.

A fetch writes each slice to its own part file in a private folder; only when every slice succeeded are
the parts published, one file per day, each by an atomic rename. A failed fetch therefore leaves every
day's previous file (and the warehouse, which it never opens for writing) as it was. Loading reads a
window's files in one transaction (``warehouse.load_runs_window``). Runs refreshed by id (older unfinished
runs) go to one extra file named after the first day of the fetch that refreshed them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from wandb_assets.lib.normalize import run_row
from wandb_assets.lib.warehouse import ASKED_KEY, WHOLE_KEY, ndjson_lines
from wandb_assets.lib.workers import ProcessPool

RUNS_FOLDER = "runs"


def day_file(staging: Path, day: date | str) -> Path:
    """The staged runs created on ``day`` (UTC)."""
    return Path(staging) / RUNS_FOLDER / f"{day}.ndjson"


def refreshed_file(staging: Path, first_day: date | str) -> Path:
    """Older unfinished runs refreshed by id by the fetch whose window starts on ``first_day``."""
    return Path(staging) / RUNS_FOLDER / f"refreshed-before-{first_day}.ndjson"


def prune_staged(staging: Path, today: date, retention_days: int, keep: Iterable[Path] = ()) -> list[Path]:
    """Delete the staged day files (and refreshed-by-id files) of days more than ``retention_days`` before
    ``today`` (UTC) whose fetch (modification time, ``publish``) is as old too, except ``keep`` (what the load that
    calls this just read: a ``runs``-only rerun of the same window still finds it). Other files (a fetch's private
    folder, the projects report) are never touched. Returns the files deleted, oldest first. ``retention_days`` 0
    deletes nothing."""
    if retention_days <= 0:
        return []
    cutoff = today - timedelta(days=retention_days)
    kept = {Path(path).resolve() for path in keep}
    pruned: list[Path] = []
    for path in sorted((Path(staging) / RUNS_FOLDER).glob("*.ndjson")):
        name = path.name.removesuffix(".ndjson").removeprefix("refreshed-before-")
        try:
            day = date.fromisoformat(name)
        except ValueError:
            continue
        if day >= cutoff or path.resolve() in kept:
            continue
        try:
            fetched = datetime.fromtimestamp(path.stat().st_mtime, UTC).date()
        except FileNotFoundError:
            continue
        if fetched < cutoff:  # a backfill's old day just published (not yet loaded) is fetched today: it stays
            path.unlink(missing_ok=True)
            pruned.append(path)
    return pruned


def projects_file(staging: Path, run_id: str | None = None) -> Path:
    """What the last fetch found of each project (``write_projects_report``), for the ``wandb_projects`` table; with
    ``run_id``, what the fetch of that Dagster run found (two fetches at once on one staging folder each keep
    their own: a ``wandb_projects`` step reads its own run's)."""
    if run_id is None:
        return Path(staging) / "projects.json"
    return Path(staging) / "projects" / f"{run_id}.json"


def write_projects_report(
    staging: Path,
    checked_at: datetime,
    fetched: Iterable[str],
    failed: dict[str, str],
    partial: bool = False,
    unchanged: Iterable[str] = (),
    run_id: str | None = None,
) -> None:
    """Replace (atomically) the report of which projects (``entity/project``; ``entity/*`` for a listing) the fetch
    begun at ``checked_at`` read whole and which failed, and why; ``partial``: the fetch was asked for some of the
    mirrored projects only (says nothing of the others); ``unchanged``: projects a tick found nothing new in and
    did not read (readable, but not read whole now). With ``run_id``, also that run's own copy (older copies of
    other runs, two days old, are removed)."""

    def row(path: str, error: str | None, unchanged: bool = False) -> dict:
        entity, _, project = path.partition("/")
        return {"entity": entity, "project": project, "error": error} | ({"unchanged": True} if unchanged else {})

    projects = [row(p, None) for p in fetched] + [row(p, why) for p, why in failed.items()]
    projects += [row(p, None, unchanged=True) for p in unchanged]
    report = {"checked_at": checked_at.isoformat(), "projects": projects, "partial": partial}
    targets = [projects_file(staging)] + ([projects_file(staging, run_id)] if run_id else [])
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}")
        temporary.write_text(json.dumps(report))
        os.replace(temporary, target)
    if run_id:
        cutoff = time.time() - ABANDONED_FETCH_S
        for old in projects_file(staging, run_id).parent.glob("*.json"):
            if old.stat().st_mtime < cutoff:
                old.unlink(missing_ok=True)


def read_projects_report(staging: Path, run_id: str | None = None) -> tuple[datetime, list[dict], bool] | None:
    """``(checked_at, [{entity, project, error}, ...], partial)`` of the fetch of Dagster run ``run_id`` when it
    left one, else of the last fetch; None before the first."""
    path = projects_file(staging, run_id) if run_id else None
    if path is None or not path.exists():
        path = projects_file(staging)
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    return datetime.fromisoformat(report["checked_at"]), report["projects"], report.get("partial", False)


#: A fetch's private folder older than this is abandoned whoever made it (no fetch runs for two days).
ABANDONED_FETCH_S = 2 * 86400


def sweep_abandoned_fetches(folder: Path, now: float | None = None) -> list[Path]:
    """Remove the private folders of fetches that can no longer publish: their process is gone (it was killed:
    SIGKILL, OOM, a lost node, so its ``finally`` never ran) or they are older than ``ABANDONED_FETCH_S``. Returns
    what was removed. A folder of a live process on this host is left alone."""
    now = time.time() if now is None else now
    removed = []
    for path in Path(folder).glob(".fetch-*"):
        pid = path.name.split("-")[1]
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > ABANDONED_FETCH_S or (pid.isdigit() and not _alive(int(pid))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class StagedFetch:
    """The private folder of one fetch: a part file per page of a slice (and creation day), published as per-day
    files at the end. Every page has files of its own, so pages may be written at once by several threads or
    processes, in any order: ``publish`` puts each slice's pages back in order."""

    def __init__(self, staging: Path) -> None:
        self.started = time.time()  # before the first request: every row it stages was read after this
        self.folder = Path(staging) / RUNS_FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        sweep_abandoned_fetches(self.folder)
        self.work = Path(tempfile.mkdtemp(prefix=f".fetch-{os.getpid()}-", dir=self.folder))

    def part(self, slice_index: int, page: int, day: str | None = None) -> Path:
        stem = f"part-{slice_index:05d}-{page:06d}"
        return self.work / (f"{stem}.ndjson" if day is None else f"{stem}-{day}.ndjson")

    def parts(self) -> dict[tuple[int, str | None], list[Path]]:
        """Every part file written, by ``(slice index, day)`` (None: a slice without days), pages in order: one
        listing of the folder, whoever wrote them (a page may have been staged by a worker process)."""
        found: dict[tuple[int, str | None], list[Path]] = {}
        for path in sorted(self.work.glob("part-*.ndjson")):
            _, index, _page, *day = path.stem.split("-", 3)
            found.setdefault((int(index), day[0] if day else None), []).append(path)
        return found

    def write(
        self,
        slice_index: int,
        page: int,
        rows: Iterable[dict[str, Any]],
        fetched_at: datetime,
        days: tuple[str, ...] = (),
    ) -> None:
        """Write one page's rows; a slice of several ``days`` has one part per day, each row in its creation day's
        (a row without one in the first day's)."""
        if len(days) <= 1:
            with open(self.part(slice_index, page, days[0] if days else None), "w") as handle:
                handle.writelines(ndjson_lines(rows, fetched_at))
            return
        by_day: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            created = row.get("created_at")
            by_day.setdefault(created.date().isoformat() if isinstance(created, datetime) else days[0], []).append(row)
        for day, day_rows in by_day.items():
            with open(self.part(slice_index, page, day), "w") as handle:
                handle.writelines(ndjson_lines(day_rows, fetched_at))

    def publish(
        self,
        targets: dict[Path, list[tuple[int, str | None]]],
        whole: list[str] | None = None,
        asked: dict[Path, dict[str, list[str]]] | None = None,
    ) -> int:
        """Concatenate each target's part files (``(slice index, day)``, in that order) and rename the result over
        the target, one
        file at a time (each rename is atomic). Each file's modification time is when the fetch began: the load
        reads it as the file's freshness (``warehouse.fetched_since``). ``whole``: the projects
        (``entity/project``) every file holds whole, written as the file's first line (``warehouse.WHOLE_KEY``),
        so that the file and what it may replace are one rename. ``asked``: per target, the runs asked for by id
        (``{entity/project: [run ids]}``, ``warehouse.ASKED_KEY`` in its header). Returns the bytes published."""
        published = 0
        written = self.parts()
        for target, parts in targets.items():
            header = b""
            if whole is not None:
                fields: dict[str, Any] = {WHOLE_KEY: sorted(whole)}
                if asked and target in asked:
                    fields[ASKED_KEY] = asked[target]
                header = (json.dumps(fields) + "\n").encode()
            temporary = self.work / f"publish-{target.name}"
            with open(temporary, "wb") as out:
                out.write(header)
                for index, day in parts:
                    for part in written.get((index, day), []):
                        with open(part, "rb") as handle:
                            shutil.copyfileobj(handle, out, 1024 * 1024)
            published += temporary.stat().st_size
            os.utime(temporary, (self.started, self.started))
            os.replace(temporary, target)
        return published

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


@dataclass(frozen=True)
class RowRules:
    """What ``normalize.run_row`` needs besides a node and its metadata: the settings of one fetch."""

    app_url: str
    default_gpus: int
    gpu_count_keys: tuple[str, ...]


@dataclass
class PageTally:
    """What the staged rows held, for the fetch's log and metadata: categories, runs per creation day (of the
    window's slices, not those by id), anomalies by field and the run ids of malformed runs."""

    categories: Counter = field(default_factory=Counter)
    runs_by_day: Counter = field(default_factory=Counter)
    anomalies: Counter = field(default_factory=Counter)
    malformed: list[str] = field(default_factory=list)

    def add(self, other: PageTally) -> None:
        self.categories.update(other.categories)
        self.runs_by_day.update(other.runs_by_day)
        self.anomalies.update(other.anomalies)
        self.malformed += other.malformed


@dataclass(frozen=True)
class Page:
    """One fetched page of one slice, with where its rows go (``days``: the slice's) and each node's metadata."""

    slice_index: int
    page: int
    days: tuple[str, ...]
    entity: str
    project: str
    nodes: list[dict]
    metadata: list[dict | None]
    fetched_at: datetime


def stage_page(staged: StagedFetch, page: Page, rules: RowRules) -> PageTally:
    """Normalise a page's nodes into ``runs`` rows and write them to its part files; what they held. A node with no
    usable id cannot be stored (a run is its id): it is counted (``run_id`` in the anomalies, ``(no id)`` among the
    malformed) and left out."""
    made = [
        run_row(
            node,
            entity=page.entity,
            project=page.project,
            app_url=rules.app_url,
            default_gpus=rules.default_gpus,
            gpu_count_keys=rules.gpu_count_keys,
            metadata=metadata,
        )
        for node, metadata in zip(page.nodes, page.metadata, strict=True)
    ]
    rows = [row for row in made if row["run_id"] is not None]
    tally = PageTally()
    for _ in range(len(made) - len(rows)):
        tally.anomalies["run_id"] += 1
        tally.malformed.append("(no id)")
    for row in rows:
        tally.categories[row["category"]] += 1
        if page.days and isinstance(row["created_at"], datetime):
            tally.runs_by_day[row["created_at"].date().isoformat()] += 1
        if row["anomalies"]:
            tally.anomalies.update(row["anomalies"])
            tally.malformed.append(row["run_id"])
    staged.write(page.slice_index, page.page, rows, page.fetched_at, page.days)
    return tally


#: Pages of a fetch are staged in this process until it has handed over this many runs; the rest go to worker
#: processes (starting one costs ~0.2 s of a core: a tick's few runs are not worth it; from 4,000 instead of 1,000,
#: a 30,000-run backfill took ~0.2 s longer).
PROCESSES_FROM_RUNS = 1000


class PageStager:
    """Stages a fetch's pages (``stage_page``) as they arrive, from any thread. The first ``from_runs`` runs are
    staged on the calling thread; after them, with ``processes`` > 0, pages go to that many worker processes
    (``workers.ProcessPool``) and the calling thread returns to fetching. ``finish`` waits for every page and
    returns the tally; ``close`` stops the workers."""

    def __init__(self, staged: StagedFetch, rules: RowRules, processes: int, from_runs: int | None = None) -> None:
        self.staged, self.rules, self.processes = staged, rules, processes
        self.from_runs = PROCESSES_FROM_RUNS if from_runs is None else from_runs
        self.tally = PageTally()
        self.lock = threading.Lock()
        self.handed = 0
        self.pool: ProcessPool | None = None

    def stage(self, page: Page) -> None:
        with self.lock:
            self.handed += len(page.nodes)
            if self.pool is None and self.processes > 0 and self.handed > self.from_runs:
                self.pool = ProcessPool(self.processes)
            pool = self.pool
        if pool is None:
            self._add(stage_page(self.staged, page, self.rules))
        else:
            pool.submit(stage_page, (self.staged, page, self.rules), self._add)

    def _add(self, tally: PageTally) -> None:
        with self.lock:
            self.tally.add(tally)

    def finish(self) -> PageTally:
        if self.pool is not None:
            self.pool.join()
        return self.tally

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(cancel=True)
