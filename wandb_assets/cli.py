"""``wandb-assets``: the demo, a tick, a backfill, the report run, run comparison and the UI, from the shell.

Commands: ``demo``, ``refresh`` (one tick: refresh, then the Datadog feed, alerts and report), ``backfill``,
``publish``, ``fetch-warehouse``, ``compare``, ``regressions``, ``ui``. Each command runs the same Dagster jobs
the schedule and sensors run, in this process, and records the run in the Dagster instance (``DAGSTER_HOME``, else the
repository's ``dagster.yaml`` when run from its root), so the UI shows CLI runs too, and the warehouse pool
and run monitoring apply. Without either it refuses to run (a throwaway instance has no pool and no
history). Exit status: 0 on success, 1 when a run failed, 2 for a configuration error (checked before any
run starts, so it opens no alert).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

DEMO_ENTITY, DEMO_PROJECT = "demo-team", "fleet-demo"
#: The demo's other projects (a quarter of the main fleet's runs each, other seeds, no incidents): three projects
#: in two entities, mirrored as ``demo-team/*`` and one named project.
DEMO_OTHER_PROJECTS = (("demo-team", "vision", 11), ("research-lab", "llm-pretrain", 12))
DEMO_PROJECTS = f"{DEMO_ENTITY}/*,research-lab/llm-pretrain"
DEMO_KEY = "local-" + "d" * 40
#: The demo's own folder: its warehouse, staging files and Dagster instance, nothing else.
DEMO_DIR = "data/demo"
#: What the demo keeps of the environment it starts in: nothing that names a warehouse, an instance, a W&B
#: project, a secret or a channel (an operator's shell holds the real ones).
DEMO_DROPPED_PREFIXES = ("WANDB_", "DD_", "DAGSTER_", "AWS_", "PG")
#: The demo's W&B server port: fixed, so the run URLs stored in the warehouse stay valid from one demo to the next.
DEMO_WANDB_PORT = 8765


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DIR", os.path.join(tempfile.gettempdir(), "wandb-assets-wandb"))
    os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)


def _instance():
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
    return DagsterInstance.get()


def _check_writable(path, variable: str, folder: bool = False) -> None:
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


def _preflight(only: list[str] | None = None) -> None:
    """Check the configuration before any run starts: settings, the key (rejected?), the entity and project
    (exist?), and that ``only`` (``--project``) names mirrored projects. Raises ``ConfigError``; a run that then
    fails is a real failure (exit 1, alert)."""
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.clock import utc_now
    from wandb_assets.lib.fetch import created_between
    from wandb_assets.settings import ConfigError, pipeline_settings

    pipeline = pipeline_settings()
    _check_writable(pipeline.warehouse, "WANDB_ASSETS_DUCKDB")
    _check_writable(pipeline.staging_dir, "WANDB_ASSETS_STAGING_DIR", folder=True)
    if pipeline.projects is not None:  # several projects: the key checked by listing; a missing one is skipped
        projects, failures, _ = wandb_resource().mirrored_projects(pipeline)
        if not projects:
            why = "; ".join(failures.values()) or "the entities list none of them"
            raise ConfigError(f"WANDB_ASSETS_PROJECTS names no project W&B has now: {why}.")
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


def _day(text: str, option: str) -> date:
    from wandb_assets.settings import ConfigError

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{option} must be a day like 2026-06-01 (got {text!r}).") from None


def _report(result, what: str) -> int:
    from wandb_assets.ticks import failure_message

    if result.success:
        return 0
    print(f"error: {what} failed in {failure_message(result)}", file=sys.stderr)
    return 1


def _warehouse_rows(sql: str) -> list[tuple]:
    """One query on the warehouse through a short read-only connection; no rows while there is no warehouse."""
    from wandb_assets.warehouse import reading

    with reading() as con:
        return con.execute(sql).fetchall() if con else []


def _print_gauges() -> None:
    from wandb_assets.lib.gauges import GAUGE_NAMES, format_gauge, gauge_unit

    rows = _warehouse_rows(
        "SELECT snapshot_at, metric, value FROM fleet_metrics "
        "WHERE snapshot_at = (SELECT max(snapshot_at) FROM fleet_metrics)"
    )
    if not rows:
        print("No fleet snapshot yet.")
        return
    values = {metric: value for _, metric, value in rows}
    print(f"Fleet gauges at {rows[0][0]:%Y-%m-%d %H:%M:%S} UTC (window: the 24 hours before)")
    width = max(map(len, GAUGE_NAMES))
    for name in GAUGE_NAMES:
        print(f"  {name:<{width}}  {format_gauge(name, values.get(name)):>12}  {gauge_unit(name)}")


def _print_projects() -> None:
    """Per project: runs in the warehouse, active now, failed in 24 h, GPU-hours in 24 h; then the fleet line.
    Only when several projects are mirrored (one project's line would repeat the fleet's gauges)."""
    from wandb_assets.lib.warehouse import PROJECT_SUMMARY_SQL

    rows = _warehouse_rows(PROJECT_SUMMARY_SQL)
    if len(rows) < 2:
        return
    header = ("project", "runs, all time", "active", "failed 24 h", "GPU-hours 24 h")
    fleet = (
        f"fleet ({len(rows)} projects)",
        sum(r[1] for r in rows),
        sum(r[2] or 0 for r in rows),
        sum(r[3] or 0 for r in rows),
        round(sum(r[4] or 0 for r in rows), 2),
    )
    width = max(len(header[0]), *(len(r[0]) for r in rows), len(fleet[0]))
    print("\nPer project (runs in the warehouse, active now, and the gauges' 24 hours):")
    print(f"  {header[0]:<{width}}  {header[1]:>14}  {header[2]:>7}  {header[3]:>11}  {header[4]:>14}")
    for project, runs, active, failed, gpu_hours in [*rows, fleet]:
        print(f"  {project:<{width}}  {runs:>14,}  {active or 0:>7,}  {failed or 0:>11,}  {gpu_hours or 0:>14,.2f}")


#: The open alerts, most severe and oldest first.
OPEN_ALERTS_SQL = """
SELECT severity, rule, subject, opened_at, message FROM alerts WHERE resolved_at IS NULL
ORDER BY severity = 'critical' DESC, opened_at, alert_key
"""


def _format_alerts(rows: list[tuple]) -> str:
    lines = [f"Open alerts: {len(rows)}"]
    for severity, rule, subject, opened_at, message in rows:
        lines.append(f"  [{severity}] {rule} ({subject}), open since {opened_at:%Y-%m-%d %H:%M} UTC: {message}")
    return "\n".join(lines)


def _print_alerts() -> None:
    print("\n" + _format_alerts(_warehouse_rows(OPEN_ALERTS_SQL)))


def _print_costs(by: str = "team", days: int = 30) -> None:
    from wandb_assets.lib.costs import cost_summary, format_costs
    from wandb_assets.warehouse import reading

    with reading() as con:
        if con is not None:
            print("\n" + format_costs(cost_summary(con, by, datetime.now(UTC).date(), days)))


def _tick(today: date, quiet: bool = False) -> int:
    instance = _instance()
    _preflight()
    from wandb_assets.ticks import run_tick

    results = run_tick(instance, today)
    code = _report(results[-1], results[-1].job_def.name)
    if code == 0 and not quiet:
        _print_gauges()
        _print_projects()
        _print_alerts()
    return code


def _snapshot_or_exit(location: str | None):
    """The warehouse snapshot (read-only; the tick's writer is never blocked), or None after saying why."""
    from wandb_assets.warehouse import open_snapshot

    try:
        return open_snapshot(location)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_costs(args: argparse.Namespace) -> int:
    """GPU-hours and dollars by team, project, user or model over the last days, with what the dollars leave out."""
    from wandb_assets.lib.costs import cost_summary, format_costs
    from wandb_assets.lib.gpus import unknown_price_key_warning
    from wandb_assets.settings import ConfigError, pipeline_settings

    if args.days < 1:
        raise ConfigError(f"--days must be 1 or more (got {args.days}).")
    for key in pipeline_settings().unknown_price_keys:
        print(f"warning: {unknown_price_key_warning(key)}.")
    con = _snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        print(format_costs(cost_summary(con, args.by, datetime.now(UTC).date(), args.days)))
    finally:
        con.close()
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    """The open alerts, with their links, from the warehouse snapshot."""
    con = _snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        print(_format_alerts(con.execute(OPEN_ALERTS_SQL).fetchall()))
    finally:
        con.close()
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    return _tick(datetime.now(UTC).date(), args.quiet)


def _metadata(result, node: str) -> dict:
    """The metadata values of ``node``'s materialization in ``result``."""
    return {k: v.value for k, v in result.asset_materializations_for_node(node)[0].metadata.items()}


def cmd_curves(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError, pipeline_settings

    if not pipeline_settings().fetch_history:
        raise ConfigError("WANDB_ASSETS_FETCH_HISTORY is false: set it to true to read the runs' curves.")
    instance = _instance()
    _preflight()
    from wandb_assets.ticks import execute_curves, settle_pipeline_alert

    started, read, rounds = time.monotonic(), 0, 0
    while True:
        result = execute_curves(instance)
        settle_pipeline_alert(instance, result)
        code = _report(result, "curves")
        if code:
            return code
        meta = _metadata(result, "staged_curves")
        rounds, read = rounds + 1, read + meta["runs_due"]
        print(
            f"Curves: {meta['runs_due']:,} run(s) read in {meta['requests']:,} request(s) {meta.get('by_status', {})}; "
            f"{meta['more_due']:,} more due ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
        if args.once or not meta["more_due"] or not meta["runs_due"]:
            break
    print(f"Read the curves of {read:,} run(s) in {rounds} round(s), {time.monotonic() - started:.1f} s.")
    return 0


def cmd_analytics(args: argparse.Namespace) -> int:
    """Build the analysts' dbt project now (what the sensor does after each feed), then say where its docs are."""
    instance = _instance()
    from wandb_assets.ticks import execute_analytics, settle_pipeline_alert

    started = time.monotonic()
    result = execute_analytics(instance)
    settle_pipeline_alert(instance, result)
    code = _report(result, "analytics")
    if code == 0:
        checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        built = {e.asset_key for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"}
        print(
            f"Built the analysts' dbt project in {time.monotonic() - started:.1f} s: {len(built) - 1} models and "
            f"seeds, {sum(c.passed for c in checks)} of {len(checks)} tests passed. "
            "Browse them: uv run wandb-assets docs"
        )
    return code


def cmd_dbt(args: argparse.Namespace) -> int:
    """dbt itself, in the analysts' project, pointed at this deployment's warehouse (what the analytics job sets)."""
    from wandb_assets.defs.analytics.assets import dbt_environment
    from wandb_assets.defs.analytics.project import ANALYTICS_DIR, analytics_cli

    dbt_args = args.dbt_args[1:] if args.dbt_args[:1] == ["--"] else args.dbt_args
    env = {**os.environ, **dbt_environment()}
    return subprocess.run([analytics_cli().dbt_executable, *dbt_args], cwd=ANALYTICS_DIR, env=env).returncode


def cmd_export(args: argparse.Namespace) -> int:
    from wandb_assets.lib import exports
    from wandb_assets.settings import ConfigError

    try:
        if args.what == "chargeback":
            month = exports.parse_month(args.month)
        else:
            since = _day(args.since, "--since")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    fmt = args.format or ("csv" if args.what == "chargeback" else "parquet")  # argparse checked --format
    out = Path(args.out)
    _check_writable(out, "--out", folder=True)
    con = _snapshot_or_exit(args.warehouse)  # a file's snapshot (never blocking the tick's writer), or the lake
    if con is None:
        return 2
    try:
        if args.what == "runs":
            done = exports.export_runs(con, since, out, fmt)
            print(f"Wrote {done.rows:,} runs created since {since} to {done.path}")
            return 0
        if not exports.has_chargeback(con):
            raise ConfigError(
                "The analysts' marts are not built in this warehouse yet: run `uv run wandb-assets analytics` "
                "(the analytics job runs after every feed and backfill while WANDB_ASSETS_ANALYTICS is true)."
            )
        try:
            done = exports.export_chargeback(con, month, out, fmt, force=args.force)
        except FileExistsError as exc:
            raise ConfigError(str(exc)) from None
        cents, usage, gpu_hours = exports.chargeback_totals(con, month)
    finally:
        con.close()
    total = "no priced GPU-hours" if cents is None else f"${cents:,.2f}"
    print(
        f"Wrote the chargeback of {month:%Y-%m} to {done.path}: {done.rows} rows, {gpu_hours:,.1f} GPU-hours, {total}"
        + ("" if cents == usage else f" (gpu_usage says ${usage or 0:,.2f}: rebuild the marts)")
    )
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    """Serve the analysts' dbt docs (one static page) on loopback until interrupted."""
    import functools
    import http.server

    from wandb_assets.defs.analytics.project import DOCS_SITE
    from wandb_assets.settings import ConfigError

    if not DOCS_SITE.exists():
        raise ConfigError(
            f"No dbt docs at {DOCS_SITE} yet: each analytics run writes them (`uv run wandb-assets analytics`)."
        )
    if args.write:
        target = Path(args.write) / "index.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(DOCS_SITE.read_bytes())
        print(f"Wrote the dbt docs site to {target}")
        return 0
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(DOCS_SITE.parent))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    with http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler) as server:
        print(
            f"The analysts' dbt docs (tables, models, columns, lineage): http://127.0.0.1:{server.server_port}/",
            flush=True,
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_ingest_offline(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError

    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"{missing[0]} does not exist: give .wandb files, run directories or folders to scan.")
    instance = _instance()
    from wandb_assets.ticks import execute_offline, settle_pipeline_alert

    result = execute_offline(instance, [str(Path(p).resolve()) for p in args.paths])
    settle_pipeline_alert(instance, result)
    code = _report(result, "ingest-offline")
    if code:
        return code
    meta = _metadata(result, "offline_runs")
    quiet = f" ({meta['logs_gone_quiet']} read again: gone quiet)" if meta["logs_gone_quiet"] else ""
    print(
        f"Offline logs: {meta['logs_found']} found, {meta['logs_read']} read, {meta['logs_unchanged']} unchanged"
        f"{quiet}; {meta['runs_loaded']} runs loaded, {meta['runs_kept_mirrored']} kept as mirrored (W&B has them); "
        f"{meta['logs_damaged']} damaged" + (f" {meta['damage_by_kind']}" if meta["logs_damaged"] else "")
    )
    if not args.quiet:
        _print_gauges()
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError, pipeline_settings

    first = _day(args.start, "--start")
    last = _day(args.end, "--end") if args.end else datetime.now(UTC).date()
    if last < first:
        raise ConfigError(f"--end ({last}) is before --start ({first}).")
    starts = pipeline_settings().start_date
    if first < starts:  # before the first partition: Dagster would refuse the run after creating it
        raise ConfigError(
            f"--start {first} is before WANDB_ASSETS_START_DATE ({starts}), the first day the assets have: "
            f"set WANDB_ASSETS_START_DATE={first} to backfill from then."
        )
    instance = _instance()
    only = list(dict.fromkeys(args.project or []))
    _preflight(only)
    from wandb_assets.lib.progress import listening
    from wandb_assets.ticks import execute_backfill, settle_pipeline_alert

    if _is_terminal(sys.stderr):
        with listening(ProgressBar(sys.stderr)):
            result = execute_backfill(instance, first, last, progress_lines=False, projects=only)
    else:  # a log file or CI: the run's progress log lines instead
        result = execute_backfill(instance, first, last, projects=only)
    settle_pipeline_alert(instance, result)
    code = _report(result, f"backfill {first}..{last}")
    if code == 0:
        which = f" ({', '.join(only)})" if only else ""
        print(f"Backfilled {first}..{last}{which} into {pipeline_settings().warehouse}")
    return code


def _is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


class ProgressBar:
    """Draws a fetch's progress on one terminal line (redrawn at most every 0.2 s), then ends the line."""

    def __init__(self, stream, every_s: float = 0.2) -> None:
        self.stream, self.every_s, self._last = stream, every_s, 0.0

    def __call__(self, progress, finished: bool) -> None:
        import time

        now = time.monotonic()
        if not finished and now - self._last < self.every_s:
            return
        self._last = now
        self.stream.write("\r\033[K" + progress.bar() + ("\n" if finished else ""))
        self.stream.flush()


#: Starts of warning messages `wandb-assets ui` hides (PYTHONWARNINGS matches a message's beginning).
QUIET_WARNINGS = ("Function `dev_command` is superseded",)


def _dagster_dev(port: int = 3000, verbose: bool = False, in_home: bool = False) -> int:
    """``dagster dev`` on this repository's workspace. Quiet by default: the daemon's and webserver's INFO
    lines (a "sensor skipped" line every 30 s) are hidden; runs print their own INFO lines and warnings (the
    instance's ``python_logs.python_log_level``)."""
    os.environ.setdefault("DAGSTER_HOME", str(Path.cwd()))
    workspace = Path(__file__).resolve().parent.parent / "workspace.yaml"
    # Inherited by the daemon, the code server and every run worker: two notices nobody can act on (dagster-aws
    # is pinned with dagster; `dg dev` would only wrap this same command in `uv run`).
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), *(f"ignore:{text}" for text in QUIET_WARNINGS)])
    )
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(workspace),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "--log-level",
        "info" if verbose else "warning",
    ]
    print(f"Dagster UI: http://127.0.0.1:{port} (Ctrl-C to stop)", flush=True)
    # in_home (the demo, whose instance is its own): run from DAGSTER_HOME, else `dagster dev` warns that the
    # repository's dagster.yaml "will not be used", which reads as "your configuration is ignored"
    cwd = os.environ["DAGSTER_HOME"] if in_home else None
    # stderr through a filter that drops grpc's spurious poller traceback (lib/terminal.py); stdout is untouched
    dev = subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE)
    try:
        _pass_through(dev.stderr)
        return dev.wait()
    except KeyboardInterrupt:  # `dagster dev` had the same Ctrl-C: let it print its shutdown
        try:
            _pass_through(dev.stderr)
            dev.wait()
        except KeyboardInterrupt:
            pass
        return 0


def _pass_through(stream) -> None:
    from wandb_assets.lib.terminal import drop_known_noise

    for line in drop_known_noise(iter(stream.readline, b"")):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()


def cmd_ui(args: argparse.Namespace) -> int:
    return _dagster_dev(args.port, args.verbose)


def _replay_history(now: datetime, hours: int) -> int:
    """Hourly snapshots over the ``hours`` before the current hour, as the runs looked then: a new warehouse
    otherwise has one snapshot and every chart of the gauges over time is a dot."""
    from wandb_assets.lib.warehouse import replay_snapshots
    from wandb_assets.settings import alert_thresholds, pipeline_settings
    from wandb_assets.warehouse import connect

    last_hour = now.replace(minute=0, second=0)
    moments = [last_hour - timedelta(hours=k) for k in range(hours, 0, -1)]
    th = alert_thresholds()
    con = connect(pipeline_settings().warehouse, read_only=False)
    try:
        return replay_snapshots(con, moments, now, th.gpu_prices, th.idle_gpu_pct)
    finally:
        con.close()


def _demo_environment(folder: Path, warehouse: str | None) -> str:
    """Make this process's environment the demo's own: every variable that could point at something real (a
    warehouse, a staging folder, a Dagster instance, Datadog, Slack, a secret, a lake's credentials) is removed,
    and the warehouse, staging folder and instance are set inside ``folder``. Only an explicit ``--warehouse``
    points elsewhere (then the lake's credentials in the environment are kept). Returns the warehouse."""
    import yaml

    from wandb_assets.lib.lake import is_lake

    keep_lake = warehouse is not None and is_lake(warehouse)
    for name in list(os.environ):
        if name.startswith(DEMO_DROPPED_PREFIXES) and name not in ("WANDB_SILENT",):
            if keep_lake and (name.startswith(("AWS_", "PG")) or name == "WANDB_ASSETS_DUCKLAKE_DATA_PATH"):
                continue
            del os.environ[name]
    folder = folder.resolve()
    home = folder / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    template = Path(__file__).resolve().parent.parent / "dagster.yaml"
    instance = yaml.safe_load(template.read_text()) if template.exists() else {"telemetry": {"enabled": False}}
    storage = instance.setdefault("storage", {"sqlite": {}})
    (storage["custom"]["config"] if "custom" in storage else storage["sqlite"])["base_dir"] = str(home / "storage")
    for key in ("local_artifact_storage", "compute_logs"):
        if key in instance:
            instance[key]["config"]["base_dir"] = str(home / key)
    instance.setdefault("concurrency", {"pools": {"default_limit": 1}})
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    warehouse = warehouse or str(folder / "demo.duckdb")
    teams = folder / "teams.yaml"  # the synthetic fleet's users in teams, for gpu_usage's dollars by team
    teams.write_text("research: [alice, bob]\napplied: [carol, dan, erin]\nci: [ci-bot]\n")
    os.environ.update(
        DAGSTER_HOME=str(home),
        WANDB_ASSETS_DUCKDB=warehouse,
        WANDB_ASSETS_STAGING_DIR=str(folder / "staging"),
        WANDB_ASSETS_TEAMS=str(teams),
    )
    return warehouse


def cmd_demo(args: argparse.Namespace) -> int:
    from wandb_assets.lib.lake import is_lake
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import add_curves, generate_fleet
    from wandb_assets.settings import pipeline_settings

    warehouse = _demo_environment(Path(args.dir), args.warehouse)
    if args.no_analytics:  # the CLI's tick and, with --ui, the analytics sensor alike
        os.environ["WANDB_ASSETS_ANALYTICS"] = "false"
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    add_curves(nodes, now)
    try:  # a fixed port: the run links stored in the warehouse (and in the alerts) stay the same every demo
        server = LocalWandbServer(nodes, entity=DEMO_ENTITY, project=DEMO_PROJECT, port=args.wandb_port).start()
    except OSError:
        server = LocalWandbServer(nodes, entity=DEMO_ENTITY, project=DEMO_PROJECT).start()
        print(f"Port {args.wandb_port} is taken: the demo's W&B server uses {server.url} instead.")
    served = len(nodes)
    for entity, project, seed in DEMO_OTHER_PROJECTS:
        other = generate_fleet(
            now, days=args.days, runs_per_day=max(args.runs_per_day // 4, 1), seed=seed, incidents=False
        )
        add_curves(other, now, seed=seed)
        server.add_project(entity, project, other)
        served += len(other)
    first = (now - timedelta(days=args.days)).date()
    os.environ.update(
        WANDB_BASE_URL=server.url,
        WANDB_API_KEY=DEMO_KEY,
        WANDB_ENTITY=DEMO_ENTITY,
        WANDB_PROJECT=DEMO_PROJECT,
        WANDB_ASSETS_PROJECTS=DEMO_PROJECTS,
        WANDB_ASSETS_START_DATE=first.isoformat(),
    )
    names = [f"{DEMO_ENTITY}/{DEMO_PROJECT}", *(f"{e}/{p}" for e, p, _ in DEMO_OTHER_PROJECTS)]
    print(
        f"Serving a synthetic fleet of {served:,} runs over {args.days} days at {server.url} in "
        f"{len(names)} projects ({', '.join(names)}), mirrored as WANDB_ASSETS_PROJECTS={DEMO_PROJECTS}"
    )
    from wandb_assets.ticks import execute_backfill

    print(f"Backfilling {first}..{now.date()} in one run ...", flush=True)
    code = _report(execute_backfill(_instance(), first, now.date()), "backfill")
    if code == 0 and pipeline_settings().fetch_history:
        code = _demo_curves()
    if code == 0 and args.history_hours > 0:
        replayed = _replay_history(now, args.history_hours)
        print(f"Replayed {replayed} hourly fleet snapshots (the last {args.history_hours} h) for the charts.")
    if code == 0:
        print("Running one tick (refresh, then the Datadog feed and the alerts) ...", flush=True)
        code = _tick(now.date())
    if code:
        return code
    _print_costs("team", args.days)
    if pipeline_settings().analytics:
        shown = os.path.relpath(warehouse)
        shown = warehouse if shown.startswith("..") else shown
        _print_chargeback(now.date().replace(day=1), None if is_lake(warehouse) else shown)
    print(f"\nWarehouse: {pipeline_settings().warehouse if is_lake(warehouse) else Path(warehouse).resolve()}")
    if args.ui:
        print(f"Run links (the runs table, the alerts) open on the demo's W&B server {server.url} while this runs.")
        return _dagster_dev(args.port, args.verbose, in_home=True)
    server.stop()
    print(
        "Browse the same data in the Dagster UI: uv run wandb-assets demo --ui  (then http://127.0.0.1:3000); "
        f"the run links open on {server.url} while it runs."
    )
    return 0


#: This month's spend per team against its budget, from the analysts' marts (what `export chargeback` writes in full).
_CHARGEBACK_BY_TEAM_SQL = """
SELECT c.team, sum(c.gpu_hours), sum(c.cost_usd), sum(c.idle_cost_usd), sum(c.failed_cost_usd),
       any_value(b.budget_usd), any_value(b.pct_of_budget)
FROM analytics.team_gpu_cost_monthly c LEFT JOIN analytics.team_budget_vs_spend b USING (month, team)
WHERE c.month = $month GROUP BY c.team ORDER BY sum(c.cost_usd) DESC NULLS LAST, c.team
"""


def _print_chargeback(month: date, warehouse: str | None = None) -> None:
    """This month's spend by team; ``warehouse``: named in the export hint (the demo's is not the default)."""
    where = f" --warehouse {warehouse}" if warehouse else ""
    from wandb_assets.lib.exports import has_chargeback
    from wandb_assets.warehouse import reading

    def usd(value) -> str:
        return "-" if value is None else f"${value:,.0f}"

    with reading() as con:
        if con is None or not has_chargeback(con):
            return
        rows = con.execute(_CHARGEBACK_BY_TEAM_SQL, {"month": month}).fetchall()
    print(
        f"\nChargeback {month:%Y-%m} so far, by team (the analysts' dbt marts; full file: "
        f"uv run wandb-assets export chargeback --month {month:%Y-%m}{where}):"
    )
    print(f"  {'team':<12} {'GPU-hours':>10} {'cost':>10} {'idle':>8} {'failed':>8} {'budget':>10} {'used':>6}")
    for team, hours, cost, idle, failed, budget, pct in rows:
        used = "-" if pct is None else f"{pct:.0f}%"
        print(
            f"  {team:<12} {hours:>10,.1f} {usd(cost):>10} {usd(idle):>8} {usd(failed):>8} {usd(budget):>10} {used:>6}"
        )


def _demo_curves() -> int:
    """One run of the curves job, as its schedule does between the ticks: the newest ended runs' curves."""
    from wandb_assets.ticks import execute_curves

    print("Reading the newest runs' curves (the curves job, between the ticks) ...", flush=True)
    result = execute_curves(_instance())
    code = _report(result, "curves")
    if code == 0:
        meta = _metadata(result, "staged_curves")
        print(
            f"Read the curves of {meta['runs_due']:,} runs in {meta['requests']} requests {meta.get('by_status', {})}; "
            f"{meta['more_due']:,} older ones wait for the next runs."
        )
    return code


def cmd_publish(args: argparse.Namespace) -> int:
    from wandb_assets.defs.report.assets import report_target
    from wandb_assets.settings import ConfigError, load_settings

    if report_target(load_settings()) is None:
        raise ConfigError("WANDB_ASSETS_REPORT_PROJECT is not set: name the W&B project the report publishes to.")
    instance = _instance()
    from wandb_assets.ticks import execute_report

    result = execute_report(instance, force_artifact=True)  # the report job: in the warehouse pool
    code = _report(result, "publish")
    if code == 0:
        metadata = result.asset_materializations_for_node("fleet_report")[0].metadata
        print(", ".join(f"{k}: {v.value}" for k, v in metadata.items() if v.value != ""))
    return code


def cmd_compare(args: argparse.Namespace) -> int:
    from wandb_assets.compare import UnknownRunsError, compare_runs

    con = _snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        print(compare_runs(con, args.run_ids).to_text())
    except UnknownRunsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_regressions(args: argparse.Namespace) -> int:
    """Backtest: the change points the SPS-regression detector finds in the warehouse snapshot's history."""
    from wandb_assets.warehouse import change_points

    since = _day(args.since, "--since") if args.since else None
    con = _snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    found = change_points(con, config=args.config, since=since)
    if found.empty:
        print("No SPS regression found on main" + (f" for {args.config}" if args.config else "") + ".")
        return 0
    for row in found.itertuples():
        status = f"recovered at {row.recovered_commit}" if row.recovered_commit else "still slow"
        print(
            f"{row.ci_config}: {row.change_pct:+.1f}% ({row.before:,.1f} -> {row.after:,.1f}) from "
            f"{row.last_good_commit} to {row.first_slow_commit} ({row.first_slow_created_at:%Y-%m-%d %H:%M} UTC), "
            f"paged at {row.detected_commit} after {row.confirming_runs} slow run(s); {status}"
        )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The warehouse's invariants (``lib.checks``): exit 0 when all hold, 1 naming each that does not."""
    from datetime import UTC, datetime

    from wandb_assets.lib.checks import check_warehouse
    from wandb_assets.settings import alert_thresholds, pipeline_settings
    from wandb_assets.warehouse import reading

    location = args.warehouse or pipeline_settings().warehouse
    with reading(location) as con:
        if con is None:
            print(f"error: no warehouse at {location}: run a backfill first (or `wandb-assets demo`).", file=sys.stderr)
            return 2
        now = datetime.now(UTC).replace(tzinfo=None)
        results = check_warehouse(con, now, alert_thresholds().idle_gpu_pct)
        runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if results else 0
    failed = 0
    for invariant, count, sample in results:
        if count:
            failed += 1
            print(f"FAILED {invariant.name}: {count} row(s) break '{invariant.promise}', e.g. {sample}")
        else:
            print(f"ok     {invariant.name}: {invariant.promise}")
    print(f"{len(results) - failed} of {len(results)} invariants hold over {runs:,} runs of {location}.")
    return 1 if failed else 0


def cmd_fetch_warehouse(args: argparse.Namespace) -> int:
    from wandb_assets.defs.report.assets import report_target
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.fetch import default_entity, get_api
    from wandb_assets.settings import ConfigError, load_settings, pipeline_settings

    target = report_target(load_settings())
    if target is None:
        raise ConfigError("WANDB_ASSETS_REPORT_PROJECT is not set: name the W&B project the report publishes to.")
    settings = {"project": target[0], "entity": target[1]}
    api = get_api(wandb_resource().wandb_settings(), pipeline_settings())
    name = f"{settings['entity'] or default_entity(api)}/{settings['project']}/fleet-warehouse:{args.version}"
    try:
        artifact = api.artifact(name, type="warehouse")
        folder = artifact.download(root=args.dest)
    except Exception as exc:  # noqa: BLE001 - the client raises many types; say which artifact was missing
        print(f"error: could not fetch {name}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return 1
    path = Path(folder).resolve() / "warehouse.duckdb"
    print(f"Downloaded {name} (snapshot {artifact.metadata.get('snapshot_at', '?')}) to {path}")
    print(f"Open it with: from wandb_assets import warehouse; con = warehouse.open_snapshot('{path}', exact=True)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from wandb_assets.lib.exports import FORMATS as EXPORT_FORMATS

    parser = argparse.ArgumentParser(prog="wandb-assets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="serve a synthetic fleet locally, backfill it, run one tick, print gauges",
        description="Serve a synthetic fleet (three projects, about 6,700 runs) from a W&B-compatible server on "
        "127.0.0.1, backfill it into its own warehouse in one Dagster run, run one tick (the Datadog feed in dry "
        "run), and print the gauges, each project's line, the open alerts and the GPU cost by team. No W&B account, "
        "no network; it touches nothing outside --dir.",
    )
    demo.add_argument(
        "--dir",
        default=DEMO_DIR,
        help=f"the demo's own folder: its warehouse, staging files and Dagster instance (default {DEMO_DIR}); "
        "the demo ignores WANDB_ASSETS_*, DAGSTER_*, DD_* and the Slack webhook of the environment, and its feed "
        "is a dry run",
    )
    demo.add_argument(
        "--warehouse", help="put the demo's warehouse here instead (a file, or a ducklake: catalog), explicitly"
    )
    demo.add_argument("--days", type=int, default=30, help="days of synthetic history, up to today (default 30)")
    demo.add_argument(
        "--runs-per-day", type=int, default=150, help="runs a day in the main project; the others get a quarter"
    )
    demo.add_argument("--ui", action="store_true", help="then open the Dagster UI on the same data")
    demo.add_argument(
        "--no-analytics", action="store_true", help="skip the analysts' dbt project (its build, docs and chargeback)"
    )
    demo.add_argument(
        "--history-hours",
        type=int,
        default=72,
        help="replay this many hourly fleet snapshots before the tick, for the charts (default 72; 0: none)",
    )
    demo.add_argument(
        "--wandb-port",
        type=int,
        default=DEMO_WANDB_PORT,
        help=f"the local W&B server's port (default {DEMO_WANDB_PORT})",
    )
    demo.add_argument("--port", type=int, default=3000, help="the UI's port on 127.0.0.1 (with --ui; default 3000)")
    demo.add_argument("--verbose", action="store_true", help="with --ui: also print the daemon's INFO lines")
    demo.set_defaults(func=cmd_demo)
    refresh = sub.add_parser(
        "refresh",
        help="do exactly what one 15-minute tick does, in this process",
        description="One tick, as the schedule runs it: re-read the recent days from W&B, rebuild the tables, "
        "snapshot the gauges, then the Datadog feed and the alerts. Prints the gauges, each project's line and the "
        "open alerts. Exit 2 for a configuration mistake (nothing ran), 1 when the run failed.",
    )
    refresh.add_argument("--quiet", action="store_true", help="do not print the gauges")
    refresh.set_defaults(func=cmd_refresh)
    curves = sub.add_parser(
        "curves",
        help="read the curves due now, until none is left (after a backfill)",
        description="Read the curves of the runs due (each ended run's once, a running run's at most every "
        "WANDB_ASSETS_HISTORY_REFRESH_MINUTES) and load them, WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs a round, round "
        "after round until none is due: what the ticks do a share at a time, at once (after a backfill, say). "
        "Needs WANDB_ASSETS_FETCH_HISTORY.",
    )
    curves.add_argument("--once", action="store_true", help="one round only, as one tick does")
    curves.set_defaults(func=cmd_curves)
    analytics = sub.add_parser(
        "analytics",
        help="build the analysts' dbt project (analytics/) now",
        description="Build the analysts' dbt project in the warehouse: the seed, staging views, marts and their "
        "tests (asset checks), then its docs and the analysts' snapshot. The analytics job does the same after "
        "every feed and backfill run.",
    )
    analytics.set_defaults(func=cmd_analytics)
    dbt = sub.add_parser(
        "dbt",
        help="run dbt in the analysts' project against this warehouse (e.g. dbt -- build -s run_efficiency+)",
        description="Run dbt with these arguments in analytics/, its profile pointed at WANDB_ASSETS_DUCKDB (the file "
        "or the lake) as the analytics job does. On a file it takes the writer's lock while it runs: a tick waits.",
    )
    dbt.add_argument("dbt_args", nargs=argparse.REMAINDER, help="dbt's own arguments, after --")
    dbt.set_defaults(func=cmd_dbt)
    export = sub.add_parser(
        "export",
        help="write a month's chargeback (finance) or the runs since a day (another warehouse) to a file",
        description="Write a file to hand on, from the analysts' snapshot (or the lake), streamed by DuckDB.",
    )
    export_sub = export.add_subparsers(dest="what", required=True, help="chargeback or runs")
    chargeback = export_sub.add_parser(
        "chargeback",
        help="one month's GPU-hours and dollars by team, project and GPU model",
        description="Write chargeback-YYYY-MM.<format>: one month of the team_gpu_cost_monthly mart, dollars in "
        "cents adding up to gpu_usage's month to the cent (columns: docs/analytics.md).",
    )
    chargeback.add_argument("--month", required=True, help="the UTC month, YYYY-MM")
    chargeback.add_argument("--force", action="store_true", help="write the month's file again where it exists")
    runs_export = export_sub.add_parser(
        "runs",
        help="every column of the runs created since a day",
        description="Write runs-since-YYYY-MM-DD.<format>: every column of the runs created on or after --since.",
    )
    runs_export.add_argument("--since", required=True, help="first UTC day, YYYY-MM-DD")
    for command in (chargeback, runs_export):
        command.add_argument("--format", choices=EXPORT_FORMATS, help="csv (chargeback default) or parquet")
        command.add_argument("--out", default=".", help="folder to write into (default: here)")
        command.add_argument("--warehouse", help="warehouse path or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    export.set_defaults(func=cmd_export)
    docs = sub.add_parser(
        "docs",
        help="serve the analysts' dbt docs (tables, models, columns, lineage) on loopback",
        description="Serve the docs the last analytics run generated (every source table and model with its "
        "columns and lineage) at http://127.0.0.1:PORT/, or write them as a static site with --write DIR.",
    )
    docs.add_argument("--port", type=int, default=8580, help="loopback port (default 8580; 0: any free one)")
    docs.add_argument("--write", metavar="DIR", help="write DIR/index.html instead of serving")
    docs.set_defaults(func=cmd_docs)
    offline = sub.add_parser(
        "ingest-offline",
        help="read offline .wandb run logs (files, run directories, folders) into the warehouse",
        description="Read offline .wandb run logs (air-gapped clusters) into the same tables as mirrored runs: a "
        "file, a run directory, or a folder searched recursively; a log read before and unchanged is skipped.",
    )
    offline.add_argument("paths", nargs="+", metavar="PATH", help="a .wandb file, a run directory or a folder")
    offline.add_argument("--quiet", action="store_true", help="do not print the gauges")
    offline.set_defaults(func=cmd_ingest_offline)
    backfill = sub.add_parser(
        "backfill",
        help="re-read a range of UTC days from W&B in one run",
        description="Re-read the runs created on a range of UTC days from W&B and load them, in one Dagster run, "
        "then rebuild the fleet tables. The range must start on or after WANDB_ASSETS_START_DATE.",
    )
    backfill.add_argument("--start", required=True, help="first day, YYYY-MM-DD")
    backfill.add_argument("--end", help="last day, YYYY-MM-DD (default: today)")
    backfill.add_argument(
        "--project",
        action="append",
        metavar="ENTITY/PROJECT",
        help="only this mirrored project (repeat for several; default: every mirrored project)",
    )
    backfill.set_defaults(func=cmd_backfill)
    publish = sub.add_parser(
        "publish",
        help="publish unpublished fleet snapshots to the W&B report run",
        description="Log every fleet snapshot not yet published to the long-lived W&B report run "
        "(WANDB_ASSETS_REPORT_PROJECT) and the warehouse snapshot as an artifact; in offline mode it writes a "
        "local run directory for `wandb sync`.",
    )
    publish.set_defaults(func=cmd_publish)
    compare = sub.add_parser(
        "compare",
        help="compare runs side by side from the warehouse snapshot",
        description="Runs side by side from the warehouse snapshot: state, duration, GPU-hours, the SPS values, "
        "the numeric summary metrics they share, the config keys that differ, and their URLs.",
    )
    compare.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="W&B run ids (not display names)")
    compare.add_argument("--warehouse", help="warehouse file (default WANDB_ASSETS_DUCKDB)")
    compare.set_defaults(func=cmd_compare)
    regressions = sub.add_parser(
        "regressions",
        help="SPS regressions found in the main-branch history (a backtest)",
        description="The change points the SPS-regression detector finds in the snapshot's main-branch history, "
        "per CI config: how much, between which commits, when paged, and whether it recovered.",
    )
    regressions.add_argument("--config", help="one CI config (default: all)")
    regressions.add_argument("--since", help="first day, YYYY-MM-DD: regressions whose first slow run is later")
    regressions.add_argument("--warehouse", help="warehouse file (default WANDB_ASSETS_DUCKDB)")
    regressions.set_defaults(func=cmd_regressions)
    costs = sub.add_parser(
        "costs",
        help="GPU-hours and dollars by team, project, user or GPU model",
        description="GPU-hours and dollars over the last days (UTC, today so far included) from the warehouse "
        "snapshot's gpu_usage, by team (WANDB_ASSETS_TEAMS), project, user or GPU model; each line says what share "
        "of its GPU-hours the dollars price, and the last line names the GPU models without a price.",
    )
    costs.add_argument("--by", choices=("team", "project", "user", "model"), default="team", help="default team")
    costs.add_argument("--days", type=int, default=30, help="the last N UTC days, today included (default 30)")
    costs.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    costs.set_defaults(func=cmd_costs)
    alerts = sub.add_parser(
        "alerts",
        help="the open alerts, with links",
        description="The alerts open at the last tick (most severe, then oldest first), each with its links to W&B, "
        "from the warehouse snapshot.",
    )
    alerts.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    alerts.set_defaults(func=cmd_alerts)
    check = sub.add_parser(
        "check",
        help="check the warehouse's invariants (exit 1 naming each that does not hold)",
        description="Check the warehouse itself (read-only, a few seconds): one row per run, idle GPU-hours within "
        "GPU-hours, dollars = GPU-hours x price, no busy run of a project no longer mirrored, no alert open on a "
        "run that is not alive. Exit 0 when every one holds, 1 when one does not (each named with examples).",
    )
    check.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    check.set_defaults(func=cmd_check)
    fetch = sub.add_parser(
        "fetch-warehouse",
        help="download a published warehouse artifact",
        description="Download the warehouse snapshot `publish` logged as a W&B artifact, to open it read-only "
        "from a notebook on another machine.",
    )
    fetch.add_argument("--version", default="latest", help="artifact version or alias (default latest)")
    fetch.add_argument("--dest", default="data/fetched", help="folder to download into")
    fetch.set_defaults(func=cmd_fetch_warehouse)
    ui = sub.add_parser(
        "ui",
        help="open the Dagster UI (dagster dev) on this repository's instance",
        description="Run `dagster dev` on this repository's workspace and instance (DAGSTER_HOME, else the "
        "repository's dagster.yaml): the UI, the daemon, and the 15-minute schedule.",
    )
    ui.add_argument("--port", type=int, default=3000, help="port on 127.0.0.1 (default 3000)")
    ui.add_argument("--verbose", action="store_true", help="also print the daemon's and webserver's INFO lines")
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet()
    # A run's per-partition asset events stored as one batch (by the repository's SQLite storage, and by Dagster's
    # PostgreSQL one): 250 events of a 61-day backfill cost 0.4 s instead of 2.2 s. Children (the UI's daemon and
    # its runs) inherit it.
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", "1000")
    from wandb_assets.settings import ConfigError

    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run() -> int:
    """The ``wandb-assets`` command: ``main``, then an exit without the interpreter's last garbage collection."""
    try:
        return main()
    finally:
        # At exit the interpreter collects every object graph left (Dagster's, wandb's): ~0.8 s after a backfill.
        # Frozen, they go with the process instead; files and connections are closed by then.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(run())
