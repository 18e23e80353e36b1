"""``wandb-assets``: the demo, a tick, a backfill, the report run, run comparison and the UI, from the shell.

This file holds the commands' arguments and the exit status; the commands themselves live in ``wandb_assets/commands/``
by what they do (``runs``, ``reading``, ``servers``, ``demo``). Each command runs the same Dagster jobs the schedule
and sensors run, in this process, and records the run in the Dagster instance (``DAGSTER_HOME``, else the
repository's ``dagster.yaml`` when run from its root), so the UI shows CLI runs too, and the warehouse pool and run
monitoring apply. Without either it refuses to run (a throwaway instance has no pool and no history). Exit status: 0
on success, 1 when a run failed, 2 for a configuration error (checked before any run starts, so it opens no alert).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from wandb_assets.commands.closing import cmd_close
from wandb_assets.commands.common import quiet_clients
from wandb_assets.commands.datadog import cmd_datadog
from wandb_assets.commands.demo import DEMO_DIR, DEMO_WANDB_PORT, cmd_demo
from wandb_assets.commands.reading import (
    cmd_alerts,
    cmd_check,
    cmd_compare,
    cmd_costs,
    cmd_export,
    cmd_fetch_warehouse,
    cmd_idle,
    cmd_pr_check,
    cmd_projects,
    cmd_regressions,
)
from wandb_assets.commands.runs import (
    cmd_analytics,
    cmd_backfill,
    cmd_curves,
    cmd_dbt,
    cmd_ingest_offline,
    cmd_publish,
    cmd_refresh,
)
from wandb_assets.commands.servers import cmd_docs, cmd_ui


def build_parser() -> argparse.ArgumentParser:
    from wandb_assets.lib.exports import CHARGEBACK_FORMATS
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
    refresh.add_argument(
        "--verbose", action="store_true", help="also print the dbt build's warnings (kept in its run's log otherwise)"
    )
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
        "cents adding up to what gpu_charges bills in the month to the cent, a closed month as it was closed, with "
        "whether the month is closed and the days it covers (columns: docs/analytics.md).",
    )
    chargeback.add_argument("--month", required=True, help="the UTC month, YYYY-MM")
    chargeback.add_argument("--force", action="store_true", help="write the month's file again where it exists")
    runs_export = export_sub.add_parser(
        "runs",
        help="every column of the runs created since a day",
        description="Write runs-since-YYYY-MM-DD.<format>: every column of the runs created on or after --since.",
    )
    runs_export.add_argument("--since", required=True, help="first UTC day, YYYY-MM-DD")
    chargeback.add_argument(
        "--format",
        choices=CHARGEBACK_FORMATS,
        help="csv (default), parquet, or focus: the same rows in the FinOps FOCUS columns "
        "(chargeback-YYYY-MM.focus.csv)",
    )
    runs_export.add_argument("--format", choices=EXPORT_FORMATS, help="parquet (default) or csv")
    for command in (chargeback, runs_export):
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
    datadog = sub.add_parser(
        "datadog",
        help="the fleet's Datadog dashboard and monitors as code",
        description="Without options, what --apply would change. --apply creates or updates the dashboard of the "
        "fleet gauges and the monitors of the alert rules in Datadog (DD_API_KEY and DD_APP_KEY), writing only "
        "what differs: a second --apply changes nothing. --export DIR writes them as JSON (deploy/datadog/ holds "
        "them as shipped).",
    )
    datadog.add_argument("--apply", action="store_true", help="create or update them in Datadog")
    datadog.add_argument("--export", metavar="DIR", help="write dashboard.json and monitors.json into DIR")
    datadog.set_defaults(func=cmd_datadog)
    projects = sub.add_parser(
        "projects",
        help="the entities and projects the key can read, the mirrored ones marked",
        description="The W&B entities WANDB_API_KEY can read (its own and its teams') and each one's projects, a * "
        "before each project mirrored now (WANDB_ASSETS_PROJECTS, or WANDB_ENTITY/WANDB_PROJECT). Reads W&B only.",
    )
    projects.set_defaults(func=cmd_projects)
    alerts = sub.add_parser(
        "alerts",
        help="the open alerts, with links",
        description="The alerts open at the last tick (most severe, then oldest first), each with its links to W&B, "
        "from the warehouse snapshot.",
    )
    alerts.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    alerts.set_defaults(func=cmd_alerts)
    pr_check = sub.add_parser(
        "pr-check",
        help="a pull request's training throughput against main on the same hardware",
        description="Each ended run of the PR (github.sky.pr<N>.<commit>.<config>.<ts>) judged per SPS metric against "
        "the last main runs of the same config and testbed (GPU count and model): Student-t lower boundary at 99 %% "
        "(Bencher's t_test), or --percent. Reads the warehouse snapshot; prints a Markdown table.",
    )
    pr_check.add_argument("--pr", type=int, required=True, help="the pull request's number")
    pr_check.add_argument("--commit", help="only this commit (a prefix of the SHA is enough)")
    pr_check.add_argument("--baseline-runs", type=int, default=10, help="main runs in the baseline (default 10)")
    pr_check.add_argument("--min-baseline", type=int, default=5, help="fewer main runs: no baseline (default 5)")
    pr_check.add_argument("--percent", type=float, help="a percentage threshold instead of the t-test")
    pr_check.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a metric regressed")
    pr_check.add_argument(
        "--allow-missing",
        action="store_true",
        help="with --fail-on-regression: exit 0 when the PR has no ended run in the snapshot (else no verdict exits 1)",
    )
    pr_check.add_argument(
        "--wait",
        type=float,
        metavar="MINUTES",
        help="wait up to MINUTES for the snapshot to hold ended runs of the PR and none still running (with "
        "--fail-on-regression, no verdict by then exits 1)",
    )
    pr_check.add_argument(
        "--dry-run",
        action="store_true",
        help="also print the check run and the PR comment the GitHub delivery would post for these verdicts (sends "
        "nothing; pr-check never does)",
    )
    pr_check.add_argument("--poll-seconds", type=float, default=30.0, help=argparse.SUPPRESS)
    pr_check.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    pr_check.set_defaults(func=cmd_pr_check)
    idle = sub.add_parser(
        "idle",
        help="the idle ladder: open episodes, the next step and when",
        description="The idle-GPU ladder (WANDB_ASSETS_IDLE_POLICY) from the warehouse snapshot: the policy, each "
        "running run's open idle episode (what was done, the next step and when, what a stop step would do), and the "
        "runs idle at their latest sample that are not on the ladder (exempt, or not judged yet).",
    )
    idle.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    idle.add_argument(
        "--preview",
        action="store_true",
        help="what the ladder would do now: who would be told what (each message as it would go out) and which runs "
        "would be stopped, the idle runs' GPU streams read from W&B and each stop checked against W&B as at send "
        "time; nothing is sent, stopped or recorded",
    )
    idle.add_argument(
        "--policy",
        metavar="FILE",
        help="with --preview: the policy file to try (default WANDB_ASSETS_IDLE_POLICY), before switching it on",
    )
    idle.add_argument("--now", default="", help=argparse.SUPPRESS)  # pins the clock (tests)
    idle.set_defaults(func=cmd_idle)
    check = sub.add_parser(
        "check",
        help="check the warehouse's invariants (exit 1 naming each that does not hold)",
        description="Check the warehouse itself (read-only, a few seconds): one row per run; idle GPU-hours within "
        "GPU-hours; runs.cost_usd, gpu_usage and run_curve_idle equal to their recomputation from the runs and their "
        "GPU streams; the money marts and the chargeback equal to gpu_usage month by month; no run counted in two "
        "projects; no curve point stored twice; no busy run of a project no longer mirrored; no alert open on a run "
        "that is not alive (docs/gpu-accounting.md). Exit 0 when every one holds, 1 naming each that does not.",
    )
    check.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    check.set_defaults(func=cmd_check)
    close = sub.add_parser(
        "close",
        help="close a month of the chargeback: it never changes after (later changes are adjustments)",
        description="Record a month's GPU-hours and dollars per team, project, user and model as closed "
        "(closed_months): from then on its chargeback re-exports byte for byte, and a late run, a price dated into "
        "it or a teams-file edit is billed as an adjustment in the first open month (docs/gpu-accounting.md). "
        "WANDB_ASSETS_CLOSE_AFTER_DAYS closes months automatically. Exit 0 closed, 1 when the month is not over or "
        "closed already, 2 without a warehouse.",
    )
    close.add_argument("--month", required=True, help="the month, YYYY-MM")
    close.add_argument("--warehouse", help="warehouse file or ducklake: string (default WANDB_ASSETS_DUCKDB)")
    close.add_argument("--now", default="", help=argparse.SUPPRESS)  # pins the clock (tests)
    close.set_defaults(func=cmd_close)
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
    from wandb_assets.bytecode import ensure_compiled

    ensure_compiled(lambda sentence: print(sentence, file=sys.stderr, flush=True))
    quiet_clients()
    # A run's per-partition asset events stored as one batch (by the repository's SQLite storage, and by Dagster's
    # PostgreSQL one): 250 events of a 61-day backfill cost 0.4 s instead of 2.2 s. Children (the UI's daemon and
    # its runs) inherit it.
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", "1000")
    from wandb_assets.settings import ConfigError

    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader gone (`| head`) fails here, inside, not in the interpreter's last flush
        return code
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the operator's choice, not a failure: the run is canceled, nothing pages
        print("interrupted; run the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `wandb-assets idle | head`: the reader has what it wanted; no traceback (issue 53)
        _quiet_closed_stdout()
        return 141  # as a shell reports a process ended by SIGPIPE


def _quiet_closed_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is left does not fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (captured in tests): nothing to flush at exit
        pass
    finally:
        os.close(devnull)


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
