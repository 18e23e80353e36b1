"""Commands that read the warehouse and start no Dagster run: ``costs``, ``alerts``, ``check``, ``export``,
``compare``, ``regressions``, ``fetch-warehouse``, and the gauges, projects and alerts a tick prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from wandb_assets.commands.common import check_writable, no_warehouse, parse_day, snapshot_or_exit, warehouse_rows


def print_gauges() -> None:
    from wandb_assets.lib.gauges import GAUGE_NAMES, format_gauge, gauge_unit

    rows = warehouse_rows(
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


def print_projects() -> None:
    """Per project: runs in the warehouse, active now, failed in 24 h, GPU-hours in 24 h; then the fleet line.
    Only when several projects are mirrored (one project's line would repeat the fleet's gauges)."""
    from wandb_assets.lib.warehouse import PROJECT_SUMMARY_SQL

    rows = warehouse_rows(PROJECT_SUMMARY_SQL)
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


def format_alerts(rows: list[tuple]) -> str:
    lines = [f"Open alerts: {len(rows)}"]
    for severity, rule, subject, opened_at, message in rows:
        lines.append(f"  [{severity}] {rule} ({subject}), open since {opened_at:%Y-%m-%d %H:%M} UTC: {message}")
    return "\n".join(lines)


def print_alerts() -> None:
    print("\n" + format_alerts(warehouse_rows(OPEN_ALERTS_SQL)))


def print_costs(by: str = "team", days: int = 30) -> None:
    from wandb_assets.lib.accounting.costs import cost_summary, format_costs
    from wandb_assets.warehouse import reading

    with reading() as con:
        if con is not None:
            print("\n" + format_costs(cost_summary(con, by, datetime.now(UTC).date(), days)))


def cmd_costs(args: argparse.Namespace) -> int:
    """GPU-hours and dollars by team, project, user or model over the last days, with what the dollars leave out."""
    from wandb_assets.lib.accounting.costs import cost_summary, format_costs
    from wandb_assets.lib.accounting.prices import unknown_price_key_warning
    from wandb_assets.lib.derived import settings_since_build
    from wandb_assets.settings import ConfigError, alert_thresholds, pipeline_settings

    if args.days < 1:
        raise ConfigError(f"--days must be 1 or more (got {args.days}).")
    for key in pipeline_settings().unknown_price_keys:
        print(f"warning: {unknown_price_key_warning(key)}.")
    pipeline = pipeline_settings()
    con = snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        print(format_costs(cost_summary(con, args.by, datetime.now(UTC).date(), args.days)))
        built, differ = settings_since_build(con, pipeline.gpu_prices, pipeline.teams, alert_thresholds().idle_gpu_pct)
    finally:
        con.close()
    if differ:  # the figures are the last build's: say so rather than mix today's settings with them
        print(
            f"note: these figures are as of the last refresh ({built:%Y-%m-%d %H:%M} UTC), built with other "
            f"{' and '.join(differ)} than the settings now: run `uv run wandb-assets refresh` to apply them."
        )
    return 0


def cmd_projects(args: argparse.Namespace) -> int:
    """The entities the key can read and their projects, the mirrored ones marked (issue 53: a newcomer found the
    second entity through a GraphQL call). Reads W&B alone: no warehouse, no run."""
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.projects import ProjectRef, format_readable_projects
    from wandb_assets.settings import pipeline_settings

    pipeline = pipeline_settings()
    wandb = wandb_resource()
    entities, where = wandb.readable_entities(pipeline)
    if pipeline.projects is not None:
        entities = list(dict.fromkeys([*entities, *pipeline.projects.entities]))
    listed = wandb.project_listings(pipeline, entities)
    failed = {e: "the listing failed: W&B did not answer for it" for e in entities if e not in listed}
    single = None
    if pipeline.projects is None:
        entity, project, _ = wandb.project_path(pipeline)
        single = ProjectRef(entity, project)
    print(format_readable_projects(listed, failed, pipeline.projects, single, where))
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    """The open alerts, with their links, from the warehouse snapshot."""
    con = snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        print(format_alerts(con.execute(OPEN_ALERTS_SQL).fetchall()))
    finally:
        con.close()
    return 0


def cmd_idle(args: argparse.Namespace) -> int:
    """The idle ladder from the warehouse snapshot: the policy, each open episode (done, next, when), and the runs idle
    at their latest sample that the ladder has not judged (exempt, or not judged yet)."""
    from wandb_assets.lib.acting.idle_actions import candidates, exempt_reason
    from wandb_assets.lib.acting.idle_policy import IdlePolicy
    from wandb_assets.lib.acting.idle_readout import OPEN_EPISODES_SQL, format_idle
    from wandb_assets.lib.clock import configured_time, utc_now
    from wandb_assets.lib.warehouse import has_table
    from wandb_assets.settings import alert_thresholds, idle_policy, pipeline_settings

    if args.policy and not args.preview:
        print("error: --policy is for --preview (the ladder itself reads WANDB_ASSETS_IDLE_POLICY).", file=sys.stderr)
        return 2
    if args.preview:
        return _idle_preview(args)
    configured = idle_policy()
    policy = configured or IdlePolicy(idle_gpu_pct=alert_thresholds().idle_gpu_pct)
    pipeline = pipeline_settings()
    now = configured_time(args.now, "--now") or utc_now()
    con = snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        episodes = con.execute(OPEN_EPISODES_SQL).fetchall() if has_table(con, "idle_actions") else []
        priced = has_table(con, "runs") and has_table(con, "gpu_price_periods")
        idle = candidates(con, policy, now) if priced else []
    finally:
        con.close()
    on_ladder = {(e, p, r) for e, p, r, *_ in episodes}
    teams = pipeline.team_directory.teams
    idle_now = [
        (
            run,
            exempt_reason(policy, run, teams.get(run.user or ""))
            or "not judged yet (its idle time not long enough, or the ladder has not run since)",
        )
        for run in idle
        if run.key not in on_ladder
    ]
    print(format_idle(policy, configured is not None, episodes, idle_now, now))
    return 0


def _idle_preview(args: argparse.Namespace) -> int:
    """``idle --preview``: the ladder's decisions and messages now, under ``--policy`` or the configured policy, sent
    nowhere (``defs.feed.idle.preview_ladder``)."""
    import os

    from wandb_assets.lib.clock import configured_time, utc_now
    from wandb_assets.settings import idle_policy

    environ = {**os.environ, "WANDB_ASSETS_IDLE_POLICY": args.policy} if args.policy else None
    policy = idle_policy(environ)
    if policy is None:
        print(
            "error: nothing to preview: give a policy file (--policy FILE) or set WANDB_ASSETS_IDLE_POLICY.",
            file=sys.stderr,
        )
        return 2
    from wandb_assets.defs.feed.idle import preview_ladder
    from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource, SlackResource
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.warehouse import has_table

    wandb = wandb_resource()
    resources = {
        "wandb": wandb,
        "slack": SlackResource(wandb=wandb),
        "channels": AlertChannelsResource(),
        "datadog": DatadogResource(wandb=wandb),
    }
    con = snapshot_or_exit(args.warehouse)
    if con is None:
        return 2
    try:
        if not has_table(con, "runs"):
            print("error: the warehouse holds no runs yet: run `uv run wandb-assets refresh` first.", file=sys.stderr)
            return 2
        where = f"policy {args.policy or os.environ.get('WANDB_ASSETS_IDLE_POLICY')}"
        now = configured_time(args.now, "--now") or utc_now()
        print(preview_ladder(con, policy, where, now, resources))
    finally:
        con.close()
    return 0


def cmd_pr_check(args: argparse.Namespace) -> int:
    """A pull request's throughput verdicts from the warehouse snapshot (``acting/pr_checks.py``), as a Markdown table;
    ``--fail-on-regression``: exit 1 when a metric regressed (a CI job gates on it without the GitHub App);
    ``--wait``: until the snapshot holds ended runs of the PR (the commit) and none still running."""
    from wandb_assets.lib.acting.pr_checks import REGRESSION, format_pr_table, judge_prs, pr_runs_running
    from wandb_assets.settings import ConfigError, alert_thresholds, load_settings
    from wandb_assets.warehouse import open_snapshot

    if args.baseline_runs < 2 or args.min_baseline < 2 or args.min_baseline > args.baseline_runs:
        raise ConfigError("--min-baseline must be at least 2 and at most --baseline-runs.")
    if args.wait is not None and args.wait < 0:
        raise ConfigError(f"--wait must be 0 or more minutes (got {args.wait:g}).")
    metric, where = alert_thresholds().sps_metric, f"PR {args.pr}" + (f" at {args.commit}" if args.commit else "")
    deadline = time.monotonic() + 60 * (args.wait or 0)
    while True:
        try:
            con = open_snapshot(args.warehouse)
        except FileNotFoundError as exc:
            if args.wait is None:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            con, rows, running = None, [], 0
        if con is not None:
            try:
                rows = judge_prs(
                    con,
                    datetime.now(UTC).replace(tzinfo=None),
                    metric,
                    k=args.baseline_runs,
                    min_n=args.min_baseline,
                    percent=args.percent,
                    pr=args.pr,
                    min_change_pct=load_settings().WANDB_ASSETS_PR_MIN_CHANGE_PCT,
                )
                running = pr_runs_running(con, args.pr, args.commit)
            finally:
                con.close()
        rows = [
            r
            for r in rows
            if args.commit is None or r["commit"].startswith(args.commit) or args.commit.startswith(r["commit"])
        ]
        if (rows and not running) or args.wait is None or time.monotonic() >= deadline:
            break
        ended = len({run for r in rows for run in r["pr_runs"]})
        print(
            f"Waiting for {where}: {ended} run(s) ended, {running} running in the snapshot "
            f"({max(0.0, deadline - time.monotonic()) / 60:.1f} min left) ...",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(args.poll_seconds)
    if not rows:
        waited = f" after waiting {args.wait:g} minute(s)" if args.wait else ""
        print(f"No ended run of {where} in the warehouse snapshot{waited}.")
        if args.fail_on_regression and not args.allow_missing:
            print("No verdict: the gate cannot pass without one (--allow-missing lets it).", file=sys.stderr)
            return 1
        return 0
    if running:
        print(f"note: {running} run(s) of {where} still running; judged on the ended ones.", file=sys.stderr)
    for commit in dict.fromkeys(r["commit"] for r in rows):
        print(f"PR {args.pr} at {commit}:")
        print(format_pr_table([r for r in rows if r["commit"] == commit], links=True))
    if args.dry_run:
        print_github_items(args.pr, rows, metric)
    regressed = [r for r in rows if r["verdict"] == REGRESSION]
    gating = [r for r in regressed if r["metric"] == metric]
    if regressed:
        print(
            f"{len(regressed)} metric(s) regressed against main on the same testbed; {metric} gates "
            f"({'regressed' if gating else 'did not regress'}), the others are reported."
        )
    return 1 if gating and args.fail_on_regression else 0


def print_github_items(pr: int, rows: list[dict], metric: str) -> None:
    """What the GitHub delivery would post for ``rows`` (``acting/pr_outbox.items_for``, the gate as configured): each
    check run with its commit, conclusion and title, and the PR comment. Nothing is sent."""
    from wandb_assets.lib.acting.pr_outbox import CHECK_NAME, COMMENT, items_for
    from wandb_assets.settings import github_target

    target = github_target()
    repo, gate = (target.repo, target.gate) if target is not None else ("(WANDB_ASSETS_GITHUB_REPO not set)", True)
    print(f"\nDry run: what the GitHub delivery would post to {repo} (nothing is sent):")
    for item in items_for(repo, [r | {"pr": pr} for r in rows], gate, metric):
        if item.item == COMMENT:
            print(f"PR {pr}'s comment (edited in place, or made once):\n{item.body}")
        else:
            print(f"check run {CHECK_NAME!r} on {item.commit}: {item.conclusion}: {item.title}")


def cmd_export(args: argparse.Namespace) -> int:
    from wandb_assets.lib import exports
    from wandb_assets.settings import ConfigError

    try:
        if args.what == "chargeback":
            month = exports.parse_month(args.month)
        else:
            since = parse_day(args.since, "--since")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    fmt = args.format or ("csv" if args.what == "chargeback" else "parquet")  # argparse checked --format
    out = Path(args.out)
    check_writable(out, "--out", folder=True)
    con = snapshot_or_exit(args.warehouse)  # a file's snapshot (never blocking the tick's writer), or the lake
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
        covered = None if done.rows else con.execute("SELECT min(day), max(day) FROM gpu_usage").fetchone()
        coverage = exports.month_coverage(con, month, datetime.now(UTC).date())
    finally:
        con.close()
    total = "no priced GPU-hours" if cents is None else f"${cents:,.2f}"
    print(
        f"Wrote the chargeback of {month:%Y-%m} to {done.path}: {done.rows} rows, {gpu_hours:,.1f} GPU-hours, {total}"
        + ("" if _same_cents(cents, usage) else f" (gpu_charges says ${usage or 0:,.2f}: rebuild the marts)")
    )
    if coverage:
        print(f"note: {coverage}")
    if covered is not None:  # an empty file reads as "nothing was used": say what the warehouse covers
        covers = f"from {covered[0]} to {covered[1]}" if covered[0] else "no GPU usage yet"
        print(
            f"note: the warehouse holds no GPU usage in {month:%Y-%m}: its data runs {covers} (UTC days); backfill "
            "the month to charge it (uv run wandb-assets backfill --start YYYY-MM-DD)."
        )
    return 0


def _same_cents(file_total: float | None, usage: float | None) -> bool:
    """The file's whole cents and gpu_usage's month rounded to the cent agree: equal, or a cent apart where the month
    is an exact half cent (the float sums' order decides the way it rounds)."""
    if file_total is None or usage is None:
        return file_total is usage
    return abs(file_total - usage) <= 0.01 + 1e-9


def cmd_compare(args: argparse.Namespace) -> int:
    from wandb_assets.compare import UnknownRunsError, compare_runs

    con = snapshot_or_exit(args.warehouse)
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

    since = parse_day(args.since, "--since") if args.since else None
    con = snapshot_or_exit(args.warehouse)
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
    from wandb_assets.lib.curves_warehouse import sps_metric_advice
    from wandb_assets.lib.warehouse import has_table
    from wandb_assets.settings import alert_thresholds, pipeline_settings
    from wandb_assets.warehouse import reading

    location = args.warehouse or pipeline_settings().warehouse
    with reading(location) as con:
        if con is None:
            return no_warehouse(location)
        now = datetime.now(UTC).replace(tzinfo=None)
        results = check_warehouse(con, now, alert_thresholds().idle_gpu_pct)
        runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if results else 0
        advice = sps_metric_advice(con, alert_thresholds().sps_metric) if has_table(con, "run_history") else None
    failed = 0
    for invariant, count, sample in results:
        if count:
            failed += 1
            print(f"FAILED {invariant.name}: {count} row(s) break '{invariant.promise}', e.g. {sample}")
        else:
            print(f"ok     {invariant.name}: {invariant.promise}")
    print(f"{len(results) - failed} of {len(results)} invariants hold over {runs:,} runs of {location}.")
    if advice:  # not an invariant (the data are right), but an empty column nobody would otherwise explain
        print(f"note: {advice}")
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
