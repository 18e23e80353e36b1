"""The analysts' dbt project and its manifest.

The manifest (``analytics/target/manifest.json``) is made at build time: the image runs ``dagster-dbt project
prepare-and-package --file wandb_assets/defs/analytics/project.py``; anywhere else (``dagster dev``, the CLI) it is
made once when missing or older than a file of the project, never on a tick's path (loading the definitions only
compares modification times).
"""

import fcntl
import os
import sys
from pathlib import Path
from typing import TextIO

from dagster_dbt import DbtCliResource, DbtProject

from wandb_assets.warehouse import PROJECT_ROOT

ANALYTICS_DIR = PROJECT_ROOT / "analytics"
#: The analysts' docs (``dbt docs generate --static``): published by each analytics run, served by
#: ``wandb-assets docs``.
DOCS_SITE = ANALYTICS_DIR / "target" / "site" / "index.html"
#: dbt's console output of the analytics runs (their models and tests are run events anyway), appended by each.
DBT_CONSOLE_LOG = ANALYTICS_DIR / "target" / "cli-dbt.log"
#: Past this size the log is moved aside (to ``cli-dbt.log.1``) before a run appends to it.
DBT_CONSOLE_LOG_MAX_BYTES = 10 * 1024 * 1024
#: What the manifest is made from: a change to any of these makes it stale.
_SOURCES = ("dbt_project.yml", "profiles.yml", "models", "seeds", "macros", "tests")

analytics_project = DbtProject(project_dir=ANALYTICS_DIR)  # target: WANDB_ANALYTICS_TARGET (profiles.yml)
# Not ``prepare_if_dev()``: under ``dagster dev`` it runs ``dbt parse`` in every process that loads the definitions,
# and every run worker and step process does (measured: +6 s per step, a UI backfill's runs 2-4x slower).
# ``ensure_manifest`` parses only when a file of the project changed.


def open_dbt_console_log() -> TextIO:
    """``DBT_CONSOLE_LOG`` to append a run's dbt lines to. Appended, never truncated: runs write it at once (the
    daemon's, a command's; a command truncating it emptied another's lines, issue 53); past
    ``DBT_CONSOLE_LOG_MAX_BYTES`` it is first moved aside whole, and a run still writing the old file goes on there."""
    DBT_CONSOLE_LOG.parent.mkdir(parents=True, exist_ok=True)
    try:
        if DBT_CONSOLE_LOG.stat().st_size > DBT_CONSOLE_LOG_MAX_BYTES:
            os.replace(DBT_CONSOLE_LOG, DBT_CONSOLE_LOG.with_name(DBT_CONSOLE_LOG.name + ".1"))
    except FileNotFoundError:
        pass
    return open(DBT_CONSOLE_LOG, "a")


def _newest_source_mtime(project_dir: Path) -> float:
    newest = 0.0
    for name in _SOURCES:
        path = project_dir / name
        files = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
        newest = max([newest, *(f.stat().st_mtime for f in files if f.is_file())])
    return newest


def _stale(manifest: Path, project_dir: Path) -> bool:
    return not manifest.exists() or manifest.stat().st_mtime < _newest_source_mtime(project_dir)


def ensure_manifest(project: DbtProject = analytics_project) -> Path:
    """The project's manifest, made first (``dbt parse``, ~3 s) when it is missing or stale; one process at a time
    makes it (the others wait and find it made)."""
    manifest = project.manifest_path
    if not _stale(manifest, project.project_dir):
        return manifest
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with open(manifest.parent / ".manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale(manifest, project.project_dir):
            analytics_cli().cli(["parse", "--quiet"], target_path=manifest.parent).wait()
    return manifest


def analytics_cli() -> DbtCliResource:
    """The dbt CLI of this environment (its own ``dbt``, found beside this Python even when the virtual
    environment's ``bin`` is not on ``PATH``)."""
    beside = Path(sys.executable).parent / "dbt"
    return DbtCliResource(project_dir=analytics_project, dbt_executable=str(beside) if beside.exists() else "dbt")
