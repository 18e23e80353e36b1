"""A mirror of the W&B project's runs, partitioned daily by ``createdAt`` (UTC), in two steps: ``staged_runs``
fetches (concurrently, with the warehouse closed) into per-day files, ``runs`` loads them in one transaction."""

import threading
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from dagster import (
    AssetExecutionContext,
    AssetKey,
    BackfillPolicy,
    Config,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.accounting.gpus import metadata_after_reading, metadata_settled
from wandb_assets.lib.clock import utc_now
from wandb_assets.lib.fetch import Slice, WandbFetchError, id_slices, metadata_file_url, plan_slices
from wandb_assets.lib.markdown import markdown_table
from wandb_assets.lib.normalize import parse_timestamp, to_naive_utc
from wandb_assets.lib.progress import FetchProgress, publish
from wandb_assets.lib.projects import changed_projects
from wandb_assets.lib.staging import (
    Page,
    PageStager,
    RowRules,
    StagedFetch,
    day_file,
    prune_staged,
    read_projects_report,
    refreshed_file,
    write_projects_report,
)
from wandb_assets.lib.throttle import Throttle
from wandb_assets.lib.warehouse import (
    cached_metadata,
    load_runs_window,
    project_freshness,
    record_projects,
    unfinished_runs_by_project,
)
from wandb_assets.settings import pipeline_settings

daily_partitions = DailyPartitionsDefinition(
    start_date=pipeline_settings().start_date.isoformat(), timezone="UTC", end_offset=1
)

#: Runs whose wandb-metadata.json is read, once: the states of a run whose client has written it and stopped.
METADATA_STATES = ("finished", "crashed", "failed")
#: Where ``read_metadata`` leaves a node's metadata for ``handle_page`` (a key W&B never sends).
FETCHED_METADATA = "__wandb_assets_metadata__"

#: Older unfinished runs are refreshed by id, this many per request (a filter stays a reasonable size).
IDS_PER_REQUEST = 500
#: Progress lines in the run's log at most this often (and once at the end).
PROGRESS_LOG_EVERY_S = 10.0

PREVIEW_SQL = """
SELECT run_id, name, state, category, strftime(created_at, '%Y-%m-%d %H:%M') AS created_utc,
       round(duration_hours, 2) AS hours, gpu_count
FROM runs WHERE created_at >= $start AND created_at < $end ORDER BY created_at DESC LIMIT 10
"""


class StagedRunsConfig(Config):
    """``progress_log_level``: the CLI draws a progress bar in a terminal and asks for "debug" lines."""

    progress_log_level: str = "info"
    #: Fetch only these of the mirrored projects (``entity/project``); empty: all of them.
    projects: list[str] = []
    #: A tick: with several projects, read only those with something new (``projects.changed_projects``).
    changed_only: bool = False


def _window(context: AssetExecutionContext) -> tuple[datetime, datetime, list[str]]:
    window = context.partition_time_window
    start, end = to_naive_utc(window.start), to_naive_utc(window.end)
    days = [(start + timedelta(days=n)).date().isoformat() for n in range(round((end - start) / timedelta(days=1)))]
    return start, end, days


@asset(
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name="wandb",
    kinds={"wandb", "json"},
    owners=["team:ml-platform"],
    description=(
        "The W&B runs created on each UTC day, normalised, as one NDJSON file per day under "
        "WANDB_ASSETS_STAGING_DIR (plus the older unfinished runs refreshed by id). The days of one run are "
        "fetched concurrently (WANDB_ASSETS_FETCH_CONCURRENCY requests in flight at most, fewer after a 429); "
        "files are replaced only when the whole fetch succeeded. Never opens the warehouse for writing."
    ),
)
@names_the_warehouse
def staged_runs(
    context: AssetExecutionContext, config: StagedRunsConfig, wandb: WandbResource, warehouse: WarehouseResource
) -> MaterializeResult:
    pipeline = pipeline_settings()
    start, end, days = _window(context)
    projects, listing_failures, app_url = wandb.mirrored_projects(pipeline)
    for pattern, why in listing_failures.items():
        context.log.warning(f"Could not list the projects of {pattern}: {why}")
    if config.projects:
        unknown = sorted(set(config.projects) - set(projects))
        if unknown:
            raise WandbFetchError(f"Not mirrored now: {', '.join(unknown)} (mirrored: {', '.join(projects)}).")
        projects, listing_failures = [p for p in projects if p in config.projects], {}
    if not projects:
        raise WandbFetchError(f"No W&B project to mirror: {'; '.join(listing_failures.values()) or 'none listed'}")
    with warehouse.get_read_connection() as con:  # read-only: other readers do not stop it
        unfinished = unfinished_runs_by_project(con, start) if con is not None else {}
        last_fetched, must_read = project_freshness(con)
        known_metadata = cached_metadata(con, start, end)
    if pipeline.projects is None and "" in unfinished:  # a warehouse not yet migrated, rows without a URL
        unfinished.setdefault(projects[0], []).extend(unfinished.pop(""))
    unchanged: list[str] = []
    if config.changed_only and pipeline.projects is not None:
        try:
            activity = wandb.latest_activity(projects, pipeline)
        except WandbFetchError as exc:  # cannot tell: read them all, as before
            context.log.warning(f"{exc}; reading every project")
            activity = {}
        now = datetime.now(UTC).replace(tzinfo=None)
        projects, unchanged = changed_projects(
            projects, activity, last_fetched, must_read, now, pipeline.project_recheck
        )
        context.log.info(
            f"{len(projects)} project(s) changed or due, {len(unchanged)} unchanged since their last fetch (not read)"
        )
    pieces_per_project = plan_slices(start, end, pipeline.fetch_concurrency, len(projects))
    # Piece by piece across the projects: every project progresses from the start, none waits behind a big one.
    window_slices = [
        replace(piece, index=n, project=project)
        for n, (project, piece) in enumerate((project, piece) for piece in pieces_per_project for project in projects)
    ]
    by_id: list[Slice] = []
    for project in projects:
        pieces = id_slices(unfinished.get(project, []), IDS_PER_REQUEST, len(window_slices) + len(by_id))
        by_id += [replace(piece, project=project) for piece in pieces]
    older_unfinished = [run_id for project in projects for run_id in unfinished.get(project, [])]
    slices = window_slices + by_id
    parts_per_day = Counter(day for piece in window_slices for day in piece.days)
    progress = FetchProgress(dict(parts_per_day), other_slices=len(by_id))
    tally = threading.Lock()
    staged = StagedFetch(pipeline.staging_dir)
    rules = RowRules(app_url, pipeline.default_gpus_per_run, tuple(pipeline.gpu_count_keys))
    stager = PageStager(staged, rules, pipeline.staging_processes)
    pages_handed: Counter[int] = Counter()

    metadata_read: Counter[str] = Counter()
    metadata_failures: Counter[str] = Counter()  # by cause (HTTP 404, a timeout ...)
    downloads = Throttle(pipeline.metadata_downloads)  # the fetch's metadata downloads, from storage, at most

    def read_metadata(piece: Slice, nodes: list[dict]) -> None:
        """Each run of the page first seen ended: its wandb-metadata.json, once (kept in ``runs.wandb_metadata``),
        from where the page says it is, ``downloads`` at a time. A file missing is asked again for a day after its
        run ended (it may land late); a read that failed or found it malformed, after a back-off and a few times at
        most (``metadata_settled``)."""
        now = datetime.now(UTC).replace(tzinfo=None)
        wanted = [
            node
            for node in nodes
            if node.get("state") in METADATA_STATES
            and not metadata_settled(
                known_metadata.get((piece.project, node.get("name"))), parse_timestamp(node.get("heartbeatAt")), now
            )
        ]
        urls = {node["name"]: metadata_file_url(node) for node in wanted}
        for node in nodes:
            node.pop("files", None)
        if not wanted:
            return
        read = wandb.runs_metadata(piece.project, urls, downloads, pipeline)
        for node in wanted:
            node[FETCHED_METADATA] = read[node["name"]]

    def handle_page(piece: Slice, nodes: list[dict]) -> None:
        fetched_at = datetime.now(UTC).replace(tzinfo=None)
        entity, _, project = (piece.project or "").partition("/")
        read_now = [node.pop(FETCHED_METADATA, None) for node in nodes]
        metadata = [  # a failed read is counted, kept with its cause where nothing better was read before
            metadata_after_reading(known_metadata.get((piece.project, node.get("name"))), now, fetched_at)
            for node, now in zip(nodes, read_now, strict=True)
        ]
        with tally:
            pages_handed[piece.index] += 1
            page_number = pages_handed[piece.index]
            metadata_read.update(now["status"] for now in read_now if now)
            metadata_failures.update(now["cause"] for now in read_now if now and now["status"] == "error")
            errors = [now["error"] for now in read_now if now and now["status"] == "error"]
            if errors and metadata_read["error"] == len(errors):  # the first failures: one line, not one per run
                context.log.warning(f"{errors[0]} (read again by a later fetch)")
        stager.stage(Page(piece.index, page_number, piece.days, entity, project, nodes, metadata, fetched_at))

    log = context.log.debug if config.progress_log_level == "debug" else context.log.info
    last_logged = [0.0]

    def report(current: FetchProgress) -> None:
        publish(current, finished=False)
        if current.elapsed() - last_logged[0] >= PROGRESS_LOG_EVERY_S:
            last_logged[0] = current.elapsed()
            log(f"Fetch progress: {current.line()}")

    try:
        stats = wandb.fetch_slices(
            slices,
            pipeline,
            handle_page,
            progress,
            report,
            others_read=bool(unchanged),
            enrich=read_metadata if pipeline.fetch_metadata else None,
        )
        staged_tally = stager.finish()  # pages still being staged by worker processes
        failed = stats.failed_projects
        kept = [piece for piece in window_slices + by_id if piece.project not in failed]
        targets = {day_file(pipeline.staging_dir, d): [(p.index, d) for p in kept if d in p.days] for d in days}
        targets[refreshed_file(pipeline.staging_dir, days[0])] = [(p.index, None) for p in kept if p.day is None]
        # Only the runs asked for by id (and not returned) may be judged vanished: the header says which.
        # Each file says which projects it holds whole: a failed project's rows in the warehouse stay as they are.
        refreshed_path = refreshed_file(pipeline.staging_dir, days[0])
        asked = {project: unfinished.get(project, []) for project in projects if project not in failed}
        staged_bytes = staged.publish(
            targets, whole=[project for project in projects if project not in failed], asked={refreshed_path: asked}
        )
        checked_at = datetime.fromtimestamp(staged.started, UTC).replace(tzinfo=None)
        fetched_whole = [project for project in projects if project not in failed]
        write_projects_report(
            pipeline.staging_dir,
            checked_at,
            fetched_whole,
            {**listing_failures, **failed},
            bool(config.projects),
            unchanged,
            run_id=context.run_id,
        )
    finally:
        stager.close()
        staged.discard()
    anomalies, malformed = staged_tally.anomalies, staged_tally.malformed
    categories, runs_by_day = staged_tally.categories, staged_tally.runs_by_day
    publish(progress, finished=True)
    fetched = progress.runs
    if malformed:
        context.log.warning(f"{len(malformed)} runs had malformed fields (kept with nulls): {dict(anomalies)}")
    if metadata_failures:  # at the end, by cause: one line naming one run read as if a few had failed
        causes = ", ".join(f"{cause} ({count:,})" for cause, count in metadata_failures.most_common())
        context.log.warning(
            f"{metadata_failures.total():,} of {sum(metadata_read.values()):,} wandb-metadata.json files could not be "
            f"read: {causes}. Their runs' GPU model is unknown (GPU count from config or the system metrics) until a "
            "later fetch reads them; `wandb-assets costs` counts them."
        )
    for project, why in failed.items():
        context.log.warning(f"Skipped W&B project {project} (its warehouse rows are kept as they were): {why}")
    where = ", ".join(projects) if len(projects) <= 3 else f"{len(projects)} projects"
    context.log.info(
        f"Fetched {fetched} runs created {start:%Y-%m-%d} .. {end:%Y-%m-%d} (exclusive) for {where}"
        + (f" and {len(older_unfinished)} older unfinished run(s) by id" if older_unfinished else "")
        + f": {progress.line()}; {stats.requests} requests, at most {stats.max_in_flight} in flight"
        + (f", {stats.throttled_responses} throttled (429)" if stats.throttled_responses else "")
        + (f", page size lowered to {stats.page_size_final}" if stats.page_size_final < stats.page_size_initial else "")
    )
    per_day = [(day, runs_by_day.get(day, 0)) for day in days]
    return MaterializeResult(
        metadata={
            "runs_fetched": fetched,
            "days": len(days),
            "older_unfinished_refreshed": len(older_unfinished),
            "fetch_seconds": round(stats.seconds, 2),
            "runs_per_second": round(fetched / stats.seconds, 1) if stats.seconds > 0 else 0.0,
            "requests": stats.requests,
            "slices": stats.slices,
            "max_requests_in_flight": stats.max_in_flight,
            "throttled_responses": stats.throttled_responses,
            "concurrency_decreases": stats.concurrency_decreases,
            "lowest_concurrency": stats.lowest_concurrency,
            "page_size_final": stats.page_size_final,
            "staged_bytes": staged_bytes,
            "staging_folder": MetadataValue.path(str(day_file(pipeline.staging_dir, days[0]).parent)),
            "project": projects[0] if len(projects) == 1 else f"{len(projects)} projects",
            "projects": MetadataValue.json(projects),
            "projects_unchanged": MetadataValue.json(unchanged),
            "failed_projects": MetadataValue.json({**listing_failures, **failed}),
            "metadata_files": MetadataValue.json(dict(metadata_read)),
            "metadata_failures_by_cause": MetadataValue.json(dict(metadata_failures)),
            "malformed_runs": len(malformed),
            "malformed_fields": MetadataValue.json(dict(anomalies)),
            "malformed_run_ids": MetadataValue.json(malformed[:50]),
            "by_category": MetadataValue.json(dict(categories)),
            "runs_per_day": MetadataValue.md(markdown_table(["day (UTC)", "runs"], per_day[-60:])),
        }
    )


@asset(
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[AssetKey("staged_runs")],
    pool=WAREHOUSE_POOL,
    group_name="wandb",
    kinds={"duckdb"},
    owners=["team:ml-platform"],
    description=(
        "Every W&B run of the project, one row per run, partitioned by the UTC day it was created. "
        "Loads the staged files of its days (and the runs refreshed by id) in one short transaction that "
        "replaces those days' rows; the writer connection is open only for that load."
    ),
)
@names_the_warehouse
def runs(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pipeline = pipeline_settings()
    start, end, days = _window(context)
    files = [day_file(pipeline.staging_dir, day) for day in days]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise StagingMissingError(
            f"No staged runs for {len(missing)} day(s) ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}) "
            f"in {files[0].parent}: materialize staged_runs for them first (the refresh and backfill jobs do both)."
        )
    refreshed = refreshed_file(pipeline.staging_dir, days[0])
    with warehouse.get_connection() as con:
        loaded = load_runs_window(
            con,
            [str(f) for f in files],
            start,
            end,
            [str(refreshed)] if refreshed.exists() else None,
            prices=pipeline.gpu_prices,
        )
        preview = con.execute(PREVIEW_SQL, {"start": start, "end": end}).fetchall()
        total = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    held = warehouse.last_writer_hold_s()
    context.log.info(f"Loaded {loaded} staged runs of {start:%Y-%m-%d} .. {end:%Y-%m-%d} (exclusive) in {held:.2f} s")
    pruned = prune_staged(
        pipeline.staging_dir, utc_now().date(), pipeline.staging_retention_days, keep=[*files, refreshed]
    )
    if pruned:
        context.log.info(
            f"Pruned {len(pruned)} staged file(s) older than {pipeline.staging_retention_days} days "
            f"({pruned[0].name} .. {pruned[-1].name}; WANDB_ASSETS_STAGING_RETENTION_DAYS)"
        )
    return MaterializeResult(
        metadata={
            "rows_written": loaded,
            "staged_files_pruned": len(pruned),
            "rows_total": total,
            "window_start_utc": start.isoformat(),
            "window_end_utc": end.isoformat(),
            "writer_held_s": round(held, 3),
            "preview": MetadataValue.md(
                markdown_table(["run_id", "name", "state", "category", "created (UTC)", "hours", "gpus"], preview)
            ),
        }
    )


#: The ``projects`` table of wandb_projects' metadata.
PROJECT_COLUMNS = ["project", "mirrored", "runs", "last fetched (UTC)", "failing since (UTC)", "last error"]


@asset(
    deps=[AssetKey("runs")],
    pool=WAREHOUSE_POOL,
    group_name="wandb",
    kinds={"duckdb"},
    owners=["team:ml-platform"],
    description=(
        "The W&B projects mirrored (WANDB_ASSETS_PROJECTS, or WANDB_ENTITY/WANDB_PROJECT) as the last fetch found "
        "them: first seen, last fetched whole, rows in runs, and since when and why a project fails to read "
        "(the project_unreachable alert). A project no longer mirrored keeps its row and its runs, out of every gauge "
        "and alert; its alive runs become vanished (anomaly unmirrored), last seen then."
    ),
)
@names_the_warehouse
def wandb_projects(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    report = read_projects_report(pipeline_settings().staging_dir, context.run_id)
    if report is None:
        raise StagingMissingError("No fetch has reported its projects yet: materialize staged_runs first.")
    checked_at, projects, partial = report
    with warehouse.get_connection() as con:
        rows, left, came = record_projects(con, projects, checked_at, partial)
    failing = [f"{r[0]}/{r[1]}" for r in rows if r[8] is not None]
    gone = [f"{r[0]}/{r[1]}" for r in rows if not r[2]]
    changes = []  # every gauge, Datadog series and alert counts the projects mirrored now: say when they change
    if left:
        changes.append(
            f"no longer mirrored: {', '.join(left)} (their rows stay, out of the gauges and alerts; their alive runs "
            "are last seen now)"
        )
    if came:
        changes.append(f"newly mirrored: {', '.join(came)}")
    if changes:
        context.log.warning("The mirrored projects changed: " + "; ".join(changes))
    preview = [
        (f"{r[0]}/{r[1]}", r[2], r[6], *(f"{t:%Y-%m-%d %H:%M}" if t else "" for t in (r[5], r[7])), r[8] or "")
        for r in rows
    ]
    return MaterializeResult(
        metadata={
            "checked_at_utc": checked_at.isoformat(),
            "mirrored": sum(bool(r[2]) for r in rows),
            "failing": MetadataValue.json(failing),
            "no_longer_mirrored": MetadataValue.json(gone),
            "projects": MetadataValue.md(markdown_table(PROJECT_COLUMNS, preview)),
        }
    )


class StagingMissingError(RuntimeError):
    """``runs`` was asked to load days that were never fetched."""
