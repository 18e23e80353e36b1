"""Commands that run the pipeline's Dagster jobs in this process (recorded in the instance, as the schedule's):
``refresh`` (one tick), ``backfill``, ``curves``, ``ingest-offline``, ``analytics`` (and ``dbt`` itself), ``publish``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path

from wandb_assets.commands.common import (
    ProgressBar,
    dagster_instance,
    exit_status,
    is_terminal,
    parse_day,
    preflight,
    run_metadata,
)
from wandb_assets.commands.reading import print_alerts, print_gauges, print_projects


def run_one_tick(today: date, quiet: bool = False, verbose: bool = False) -> int:
    instance = dagster_instance()
    preflight()
    from wandb_assets.ticks import run_tick

    def say(sentence: str) -> None:
        print(sentence, file=sys.stderr, flush=True)

    results = run_tick(instance, today, say=say, verbose=verbose)
    failed = next((result for result in results if not result.success), results[-1])
    code = exit_status(failed, failed.job_def.name)
    if code == 0 and not quiet:
        print_gauges()
        print_projects()
        print_alerts()
    return code


def cmd_refresh(args: argparse.Namespace) -> int:
    return run_one_tick(datetime.now(UTC).date(), args.quiet, args.verbose)


def cmd_curves(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError, pipeline_settings

    if not pipeline_settings().fetch_history:
        raise ConfigError("WANDB_ASSETS_FETCH_HISTORY is false: set it to true to read the runs' curves.")
    instance = dagster_instance()
    preflight()
    from wandb_assets.ticks import execute_curves, settle_pipeline_alert

    started, read, rounds = time.monotonic(), 0, 0
    while True:
        result = execute_curves(instance)
        settle_pipeline_alert(instance, result)
        code = exit_status(result, "curves")
        if code:
            return code
        meta = run_metadata(result, "staged_curves")
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
    instance = dagster_instance()
    from wandb_assets.ticks import execute_analytics, settle_pipeline_alert

    started = time.monotonic()
    result = execute_analytics(instance)
    settle_pipeline_alert(instance, result)
    code = exit_status(result, "analytics")
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
    """dbt itself, in the analysts' project, pointed at this deployment's warehouse (what the analytics job sets);
    after a command that builds models, the docs page is made again so `wandb-assets docs` shows them."""
    from wandb_assets.defs.analytics.assets import dbt_environment, publish_docs
    from wandb_assets.defs.analytics.project import ANALYTICS_DIR, analytics_cli

    dbt_args = args.dbt_args[1:] if args.dbt_args[:1] == ["--"] else args.dbt_args
    env = {**os.environ, **dbt_environment()}
    executable = analytics_cli().dbt_executable
    code = subprocess.run([executable, *dbt_args], cwd=ANALYTICS_DIR, env=env).returncode
    if code or not set(dbt_args) & BUILDING_DBT_COMMANDS:
        return code
    print("Making the dbt docs page again (the models as built now) ...", flush=True)
    docs = subprocess.run(
        [executable, "docs", "generate", "--static"], cwd=ANALYTICS_DIR, env=env, capture_output=True, text=True
    )
    if docs.returncode:
        print(f"warning: dbt docs generate failed; the docs page is as before:\n{docs.stdout[-2000:]}", file=sys.stderr)
        return 0
    site = publish_docs(ANALYTICS_DIR / "target" / "static_index.html")
    print(f"The docs page shows them: {site} (uv run wandb-assets docs)")
    return 0


#: dbt commands after which the docs page is made again (a model built or changed).
BUILDING_DBT_COMMANDS = {"build", "run", "seed", "snapshot"}


def cmd_ingest_offline(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError

    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"{missing[0]} does not exist: give .wandb files, run directories or folders to scan.")
    instance = dagster_instance()
    from wandb_assets.ticks import execute_offline, settle_pipeline_alert

    result = execute_offline(instance, [str(Path(p).resolve()) for p in args.paths])
    settle_pipeline_alert(instance, result)
    code = exit_status(result, "ingest-offline")
    if code:
        return code
    meta = run_metadata(result, "offline_runs")
    quiet = f" ({meta['logs_gone_quiet']} read again: gone quiet)" if meta["logs_gone_quiet"] else ""
    print(
        f"Offline logs: {meta['logs_found']} found, {meta['logs_read']} read, {meta['logs_unchanged']} unchanged"
        f"{quiet}; {meta['runs_loaded']} runs loaded, {meta['runs_kept_mirrored']} kept as mirrored (W&B has them); "
        f"{meta['logs_damaged']} damaged" + (f" {meta['damage_by_kind']}" if meta["logs_damaged"] else "")
    )
    if not args.quiet:
        print_gauges()
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from wandb_assets.settings import ConfigError, pipeline_settings

    first = parse_day(args.start, "--start")
    last = parse_day(args.end, "--end") if args.end else datetime.now(UTC).date()
    if last < first:
        raise ConfigError(f"--end ({last}) is before --start ({first}).")
    starts = pipeline_settings().start_date
    if first < starts:  # before the first partition: Dagster would refuse the run after creating it
        raise ConfigError(
            f"--start {first} is before WANDB_ASSETS_START_DATE ({starts}), the first day the assets have: "
            f"set WANDB_ASSETS_START_DATE={first} to backfill from then."
        )
    instance = dagster_instance()
    only = list(dict.fromkeys(args.project or []))
    preflight(only)
    from wandb_assets.lib.progress import listening
    from wandb_assets.ticks import execute_backfill, settle_pipeline_alert

    if is_terminal(sys.stderr):
        with listening(ProgressBar(sys.stderr)):
            result = execute_backfill(instance, first, last, progress_lines=False, projects=only)
    else:  # a log file or CI: the run's progress log lines instead
        result = execute_backfill(instance, first, last, projects=only)
    settle_pipeline_alert(instance, result)
    code = exit_status(result, f"backfill {first}..{last}")
    if code == 0:
        which = f" ({', '.join(only)})" if only else ""
        print(f"Backfilled {first}..{last}{which} into {pipeline_settings().warehouse}")
    return code


def cmd_publish(args: argparse.Namespace) -> int:
    from wandb_assets.defs.report.assets import report_target
    from wandb_assets.settings import ConfigError, load_settings

    if report_target(load_settings()) is None:
        raise ConfigError("WANDB_ASSETS_REPORT_PROJECT is not set: name the W&B project the report publishes to.")
    instance = dagster_instance()
    from wandb_assets.ticks import execute_report

    result = execute_report(instance, force_artifact=True)  # the report job: in the warehouse pool
    code = exit_status(result, "publish")
    if code == 0:
        from wandb_assets.defs.warehouse.named import WAREHOUSE_METADATA

        metadata = result.asset_materializations_for_node("fleet_report")[0].metadata
        said = {k: v.value for k, v in metadata.items() if v.value != "" and k != WAREHOUSE_METADATA}
        print(", ".join(f"{k}: {v}" for k, v in said.items()))  # the warehouse is the one configured
    return code
