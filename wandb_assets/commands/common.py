"""What every command shares: the Dagster instance CLI runs are recorded in, the checks made before any run
starts (``preflight``: settings, key, projects, writable paths), a run's exit status, reading the warehouse.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path


def quiet_clients() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DIR", os.path.join(tempfile.gettempdir(), "wandb-assets-wandb"))
    os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)


def dagster_instance():
    """The persistent Dagster instance CLI runs are recorded in; ``ConfigError`` when there is none."""
    from dagster import DagsterInstance

    from wandb_assets.settings import ConfigError

    if not os.environ.get("DAGSTER_HOME"):
        if not Path("dagster.yaml").exists():
            raise ConfigError(
                "DAGSTER_HOME is not set and there is no dagster.yaml here: set DAGSTER_HOME to the folder holding "
                "the instance's dagster.yaml (the repository root, or a folder holding a copy of "
                "deploy/postgres/dagster.yaml for PostgreSQL), or run from the "
                "repository root."
            )
        os.environ["DAGSTER_HOME"] = str(Path.cwd())
    claim_instance(Path(os.environ["DAGSTER_HOME"]), record=False)  # recorded once the configuration is good
    return DagsterInstance.get()


#: Where an instance records the one warehouse its runs write (beside its SQLite storage, git-ignored).
INSTANCE_WAREHOUSE_MARK = Path(".dagster") / "wandb-assets-warehouse"


def claim_instance(home: Path, record: bool = True) -> None:
    """One Dagster instance, one warehouse (issue 53: CLI runs of several warehouses in one instance mixed their
    materializations in one UI, and its daemon launched runs on its own warehouse right after): a command writing
    another warehouse than the one ``home`` records is refused with one sentence saying what to set, before anything
    runs; with ``record``, an instance that records none records this one (a command refused for its configuration
    records nothing: ``preflight`` records, at its end)."""
    from wandb_assets.settings import ConfigError, warehouse_label

    warehouse = warehouse_label()
    mark = home / INSTANCE_WAREHOUSE_MARK
    recorded = mark.read_text().strip() if mark.exists() else None
    if recorded is None and record:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(warehouse + "\n")
    elif recorded is not None and recorded != warehouse:
        raise ConfigError(
            f"The Dagster instance at {home} records the runs of the warehouse {recorded}, and WANDB_ASSETS_DUCKDB "
            f"is {warehouse}: give this warehouse an instance of its own (DAGSTER_HOME set to a folder holding a copy "
            f"of dagster.yaml), or remove {mark} if the instance should serve this warehouse from now on."
        )


def check_writable(path, variable: str, folder: bool = False) -> None:
    """The run can write ``path`` (the warehouse file; with ``folder``, a folder it writes into): its folder is made
    (the run would make it anyway) and a file is made and removed in it, so a read-only mount, ``/proc`` or a full
    disk is found now, whoever runs it (``os.access`` says yes to root everywhere). A ``ConfigError`` naming
    ``variable`` otherwise (found only after the fetch, it cost minutes and a page of traces). A DuckLake is no
    path: its attach says."""
    from wandb_assets.lib.lake import is_lake
    from wandb_assets.settings import ConfigError

    if is_lake(path) or not isinstance(path, (str, os.PathLike)):
        return
    target = Path(path).absolute()
    if target.exists() and target.is_dir() != folder:
        wanted, found = ("folder", "file") if folder else ("file", "folder")
        raise ConfigError(f"{variable} names {path}, which is a {found}: name a {wanted}.")
    home = target if folder else target.parent
    existing = next(p for p in (home, *home.parents) if p.exists())
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=home, prefix=".wandb-assets-write-check-"):
            pass
        if target.is_file() and not os.access(target, os.W_OK):
            existing = target
            raise PermissionError
    except OSError:
        raise ConfigError(
            f"{variable} names {path}, but {existing} cannot be written: point it at a writable place."
        ) from None


def preflight(only: list[str] | None = None) -> None:
    """Check the configuration before any run starts: settings, the key (rejected?), the entity and project
    (exist?), and that ``only`` (``--project``) names mirrored projects. Raises ``ConfigError``; a run that then
    fails is a real failure (exit 1, alert). All good: the instance records the warehouse (``claim_instance``)."""
    _check_configuration(only)
    if os.environ.get("DAGSTER_HOME"):
        claim_instance(Path(os.environ["DAGSTER_HOME"]))


def _check_configuration(only: list[str] | None) -> None:
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.clock import utc_now
    from wandb_assets.lib.fetch import created_between
    from wandb_assets.lib.projects import NO_PROJECT_LISTED
    from wandb_assets.settings import ConfigError, github_target, idle_policy, pipeline_settings

    pipeline = pipeline_settings()
    policy = idle_policy()  # a policy mistake stops the command before it reads anything
    telling = [n for n, step in enumerate(policy.ladder if policy else (), start=1) if step.tell]
    if telling:  # without a token Slack takes (auth.test), every message would wait: said now, once
        from wandb_assets.defs.feed.resources import SlackResource

        SlackResource(wandb=wandb_resource()).verify(
            f"WANDB_ASSETS_IDLE_POLICY tells owners or teams (step {telling[0]})"
        )
    github_target()  # so does a GitHub setting's
    check_writable(pipeline.warehouse, "WANDB_ASSETS_DUCKDB")
    check_writable(pipeline.staging_dir, "WANDB_ASSETS_STAGING_DIR", folder=True)
    if pipeline.projects is not None:  # several projects: the key checked by listing
        projects, failures, _ = wandb_resource().mirrored_projects(pipeline)
        if not projects:
            why = "; ".join(failures.values()) or "the entities list none of them"
            raise ConfigError(f"WANDB_ASSETS_PROJECTS names no project W&B has now: {why}.")
        # an entity that lists no project is a mistake even beside others (a typo would drop the real entity's
        # projects); a listing that failed for another reason (W&B down) is the run's to retry, not a setting's
        empty = [pattern for pattern, why in failures.items() if NO_PROJECT_LISTED in why]
        if empty:
            raise ConfigError(f"WANDB_ASSETS_PROJECTS names {empty[0]}, but {failures[empty[0]]}.")
        # a named project W&B does not list is a typo as much as an entity's (issue 53): refused before anything
        # changes, not skipped while the projects it was meant beside leave the mirror set
        from wandb_assets.lib.projects import unlisted_projects, unlisted_sentence

        named = [ref.entity for ref in pipeline.projects.projects]
        listed = wandb_resource().project_listings(pipeline, named) if named else {}
        missing = unlisted_projects(pipeline.projects, listed)
        if missing:
            raise ConfigError(unlisted_sentence(missing[0], listed[missing[0].entity]))
        warn_of_projects_leaving(pipeline.warehouse, projects)
    else:
        now = utc_now()
        for _ in wandb_resource().fetch_run_pages(created_between(now, now), pipeline):  # one empty page
            pass
        if not only:
            return
        entity, project, _ = wandb_resource().project_path(pipeline)
        projects = [f"{entity}/{project}"]
    unknown = [name for name in only or [] if name not in projects]
    if unknown:
        raise ConfigError(f"--project {unknown[0]} is not a mirrored project (mirrored now: {', '.join(projects)}).")


def warn_of_projects_leaving(location, projects: list[str]) -> None:
    """Say, before anything changes, which projects the warehouse mirrors now that this configuration drops (one
    line on stderr): their runs are kept, unwatched, and come back when the projects are named again."""
    import duckdb

    from wandb_assets.defs.warehouse.resources import is_lock_conflict
    from wandb_assets.warehouse import reading

    try:
        with reading(location) as con:
            if con is None:
                return
            held = _mirrored_now(con)
    except duckdb.IOException as exc:
        if not is_lock_conflict(exc):
            raise
        # another process writes the warehouse now: the run waits for it as every run does (WANDB_ASSETS_LOCK_WAIT),
        # says which projects leave when it reads it, and past the wait fails as a run, paged (issue 53)
        return
    leaving = [name for name in held if name not in projects]
    if leaving:
        shown = ", ".join(leaving[:5]) + (f" and {len(leaving) - 5} more" if len(leaving) > 5 else "")
        print(
            f"warning: {len(leaving)} project(s) mirrored now leave the mirror set with this WANDB_ASSETS_PROJECTS: "
            f"{shown}. Their runs are kept (alive ones counted to their last heartbeat, their alerts kept open "
            "marked unwatched) and are read again when the projects are named again.",
            file=sys.stderr,
        )


def _mirrored_now(con) -> list[str]:
    """The projects the warehouse mirrors now (none before its ``wandb_projects`` table exists)."""
    try:
        rows = con.execute(
            "SELECT entity, project FROM wandb_projects WHERE mirrored AND project <> '*' ORDER BY ALL"
        ).fetchall()
    except Exception:  # noqa: BLE001 - a warehouse without the table yet: nothing mirrored to leave
        return []
    return [f"{entity}/{project}" for entity, project in rows]


def parse_day(text: str, option: str) -> date:
    from wandb_assets.settings import ConfigError

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{option} must be a day like 2026-06-01 (got {text!r}).") from None


def exit_status(result, what: str) -> int:
    from wandb_assets.ticks import failure_message

    if result.success:
        return 0
    print(f"error: {what} failed in {failure_message(result)}", file=sys.stderr)
    return 1


def run_metadata(result, node: str) -> dict:
    """The metadata values of ``node``'s materialization in ``result``."""
    return {k: v.value for k, v in result.asset_materializations_for_node(node)[0].metadata.items()}


def warehouse_rows(sql: str) -> list[tuple]:
    """One query on the warehouse through a short read-only connection; no rows while there is no warehouse."""
    from wandb_assets.warehouse import reading

    with reading() as con:
        return con.execute(sql).fetchall() if con else []


def no_warehouse(location) -> int:
    """Say there is no warehouse at ``location`` (one sentence) and return exit status 2."""
    print(f"error: no warehouse at {location}: run a backfill first (or `wandb-assets demo`).", file=sys.stderr)
    return 2


def snapshot_or_exit(location: str | None):
    """The warehouse snapshot (read-only; the tick's writer is never blocked), or None after saying why."""
    from wandb_assets.warehouse import open_snapshot

    try:
        return open_snapshot(location)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


class ProgressBar:
    """Draws a fetch's progress on one terminal line (redrawn at most every 0.2 s), then ends the line."""

    def __init__(self, stream, every_s: float = 0.2) -> None:
        self.stream, self.every_s, self._last = stream, every_s, 0.0

    def __call__(self, progress, finished: bool) -> None:

        now = time.monotonic()
        if not finished and now - self._last < self.every_s:
            return
        self._last = now
        self.stream.write("\r\033[K" + progress.bar() + ("\n" if finished else ""))
        self.stream.flush()
