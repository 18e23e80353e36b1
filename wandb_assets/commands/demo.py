"""``demo``: a synthetic fleet on the local W&B server, backfilled into the demo's own folder, one tick, the
gauges, costs and chargeback printed (and ``--ui``).
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from wandb_assets.commands.common import dagster_instance, exit_status, run_metadata, warehouse_rows
from wandb_assets.commands.reading import print_costs
from wandb_assets.commands.runs import run_one_tick
from wandb_assets.commands.servers import serve, start_dagster_dev, stop_dagster_dev

DEMO_ENTITY, DEMO_PROJECT = "demo-team", "fleet-demo"


#: The demo's other projects (a quarter of the main fleet's runs each, other seeds, no incidents): three projects
#: in two entities, mirrored as ``demo-team/*`` and one named project.
DEMO_OTHER_PROJECTS = (("demo-team", "vision", 11), ("research-lab", "llm-pretrain", 12))


DEMO_PROJECTS = f"{DEMO_ENTITY}/*,research-lab/llm-pretrain"


DEMO_KEY = "local-" + "d" * 40


#: The demo's teams: bob (whose run idles eight H100s) has a Slack id, research a channel (the idle ladder tells both).
#: The demo teams' monthly GPU budgets (WANDB_ASSETS_BUDGETS): research's grows in November.
DEMO_BUDGETS = """research:
  - {from: 2026-01, usd: 250000}
  - {from: 2026-11, usd: 300000}
applied: 200000
ci: 20000
"""

#: The demo's one price change: H100s cost this much less per GPU-hour from this many days ago (a dated period).
DEMO_H100_CUT, DEMO_H100_CUT_DAYS = 0.50, 10

DEMO_TEAMS = """research:
  channel: C0RESEARCH
  users: [alice, {user: bob, slack: U0BOB}]
applied: [carol, dan, erin]
ci: [ci-bot]
"""


#: The demo's own folder: its warehouse, staging files and Dagster instance, nothing else.
DEMO_DIR = "data/demo"


#: What the demo keeps of the environment it starts in: nothing that names a warehouse, an instance, a W&B
#: project, a secret or a channel (an operator's shell holds the real ones).
DEMO_DROPPED_PREFIXES = ("WANDB_", "DD_", "DAGSTER_", "AWS_", "PG")


#: The demo's W&B server port: fixed, so the run URLs stored in the warehouse stay valid from one demo to the next.
DEMO_WANDB_PORT = 8765


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
        return replay_snapshots(con, moments, now, th.idle_gpu_pct)
    finally:
        con.close()


def _demo_environment(folder: Path, warehouse: str | None) -> str:
    """Make this process's environment the demo's own: every variable that could point at something real (a
    warehouse, a staging folder, a Dagster instance, Datadog, Slack, a secret, a lake's credentials) is removed,
    and the warehouse, staging folder and instance are set inside ``folder``. Only an explicit ``--warehouse``
    points elsewhere (then the lake's credentials in the environment are kept). Returns the warehouse."""
    import yaml

    from wandb_assets.lib.lake import is_lake
    from wandb_assets.settings import SHIPPED_GPU_PRICES

    keep_lake = warehouse is not None and is_lake(warehouse)
    for name in list(os.environ):
        if name.startswith(DEMO_DROPPED_PREFIXES) and name not in ("WANDB_SILENT",):
            if keep_lake and (name.startswith(("AWS_", "PG")) or name == "WANDB_ASSETS_DUCKLAKE_DATA_PATH"):
                continue
            del os.environ[name]
    folder = folder.resolve()
    home = folder / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    template = Path(__file__).resolve().parents[2] / "dagster.yaml"
    instance = yaml.safe_load(template.read_text()) if template.exists() else {"telemetry": {"enabled": False}}
    storage = instance.setdefault("storage", {"sqlite": {}})
    (storage["custom"]["config"] if "custom" in storage else storage["sqlite"])["base_dir"] = str(home / "storage")
    for key in ("local_artifact_storage", "compute_logs"):
        if key in instance:
            instance[key]["config"]["base_dir"] = str(home / key)
    instance.setdefault("concurrency", {"pools": {"default_limit": 1}})
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    warehouse = warehouse or str(folder / "demo.duckdb")
    teams = folder / "teams.yaml"  # the synthetic fleet's users in teams (dollars by team; the idle ladder's Slack)
    teams.write_text(DEMO_TEAMS)
    budgets = folder / "budgets.yaml"
    budgets.write_text(DEMO_BUDGETS)
    prices = folder / "gpu_prices.yaml"  # the shipped list, with one dated change: H100s cheaper from 10 days ago
    listed = yaml.safe_load(SHIPPED_GPU_PRICES.read_text())
    cut = (datetime.now(UTC) - timedelta(days=DEMO_H100_CUT_DAYS)).date()
    listed["H100-80GB"] = [
        {"usd": listed["H100-80GB"]},
        {"from": cut.isoformat(), "usd": round(listed["H100-80GB"] - DEMO_H100_CUT, 2)},
    ]
    prices.write_text(yaml.safe_dump(listed, sort_keys=False))
    policy = folder / "idle_policy.yaml"  # the documented example: the default ladder, stopping off
    policy.write_text((Path(__file__).resolve().parents[2] / "docs" / "examples" / "idle_policy.yaml").read_text())
    os.environ.update(
        DAGSTER_HOME=str(home),
        WANDB_ASSETS_DUCKDB=warehouse,
        WANDB_ASSETS_STAGING_DIR=str(folder / "staging"),
        WANDB_ASSETS_TEAMS=str(teams),
        WANDB_ASSETS_IDLE_POLICY=str(policy),
        WANDB_ASSETS_BUDGETS=str(budgets),
        WANDB_ASSETS_GPU_PRICES=str(prices),
        WANDB_ASSETS_CLOSE_AFTER_DAYS="0",  # last month closes at the backfill: what comes later is an adjustment
    )
    return warehouse


def cmd_demo(args: argparse.Namespace) -> int:
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.slack import LocalSlack
    from wandb_assets.localwandb.synthetic import add_curves, generate_fleet

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
    slack = LocalSlack(token="xoxb-demo")  # the idle ladder's messages land here, printed below
    os.environ.update(
        WANDB_ASSETS_SLACK_BOT_TOKEN=slack.token,
        WANDB_ASSETS_SLACK_API_URL=slack.url,
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
    # --ui: the UI comes up while the warehouse builds (its runs appear as they finish), not after a minute or two
    ui = start_dagster_dev(args.port, args.verbose, in_home=True) if args.ui else None
    try:
        code = _build_demo(args, slack, first, now, warehouse)
    except BaseException:
        if ui is not None:
            stop_dagster_dev(ui)
        raise
    if code:
        if ui is not None:
            stop_dagster_dev(ui)
        return code
    if ui is not None:
        print(f"Run links (the runs table, the alerts) open on the demo's W&B server {server.url} while this runs.")
        return serve(ui)
    server.stop()
    slack.stop()
    print(
        "Browse the same data in the Dagster UI: uv run wandb-assets demo --ui  (then http://127.0.0.1:3000); "
        f"the run links open on {server.url} while it runs."
    )
    return 0


def _build_demo(args: argparse.Namespace, slack, first: date, now: datetime, warehouse: str) -> int:
    """The demo's warehouse: the backfill, the curves, the replayed history, one tick, the idle ladder, the costs."""
    from wandb_assets.lib.lake import is_lake
    from wandb_assets.settings import pipeline_settings
    from wandb_assets.ticks import execute_backfill

    print(f"Backfilling {first}..{now.date()} in one run ...", flush=True)
    code = exit_status(execute_backfill(dagster_instance(), first, now.date()), "backfill")
    if code == 0 and pipeline_settings().fetch_history:
        code = _demo_curves()
    if code == 0 and args.history_hours > 0:
        replayed = _replay_history(now, args.history_hours)
        print(f"Replayed {replayed} hourly fleet snapshots (the last {args.history_hours} h) for the charts.")
    if code == 0:
        print("Running one tick (refresh, then the Datadog feed and the alerts) ...", flush=True)
        code = run_one_tick(now.date())
    if code == 0:
        code = _demo_idle_ladder(slack)
    if code:
        return code
    _demo_pr_checks()
    print_costs("team", args.days)
    if pipeline_settings().analytics:
        shown = os.path.relpath(warehouse)
        shown = warehouse if shown.startswith("..") else shown
        print_chargeback(now.date().replace(day=1), None if is_lake(warehouse) else shown)
    print(f"\nWarehouse: {pipeline_settings().warehouse if is_lake(warehouse) else Path(warehouse).resolve()}")
    return 0


#: This month's spend per team against its budget, from the analysts' marts (what `export chargeback` writes in full).
CHARGEBACK_BY_TEAM_SQL = """
SELECT c.team, sum(c.gpu_hours), sum(c.cost_usd), sum(c.idle_cost_usd), sum(c.failed_cost_usd),
       any_value(b.budget_usd), any_value(b.pct_of_budget)
FROM analytics.team_gpu_cost_monthly c LEFT JOIN analytics.team_budget_vs_spend b USING (month, team)
WHERE c.month = $month GROUP BY c.team ORDER BY sum(c.cost_usd) DESC NULLS LAST, c.team
"""


def print_chargeback(month: date, warehouse: str | None = None) -> None:
    """This month's spend by team; ``warehouse``: named in the export hint (the demo's is not the default)."""
    where = f" --warehouse {warehouse}" if warehouse else ""
    from wandb_assets.lib.exports import has_chargeback
    from wandb_assets.warehouse import reading

    def usd(value) -> str:
        return "-" if value is None else f"${value:,.0f}"

    with reading() as con:
        if con is None or not has_chargeback(con):
            return
        rows = con.execute(CHARGEBACK_BY_TEAM_SQL, {"month": month}).fetchall()
        periods = con.execute(
            "SELECT model, usd, valid_from FROM gpu_price_periods WHERE dated AND match_on IS NULL ORDER BY ALL"
        ).fetchall()
        closed = con.execute(
            "SELECT c.month, c.closed_at, c.closed_by, c.cost_usd, sum(a.cost_usd) FROM closed_months c "
            "LEFT JOIN gpu_charges a ON a.adjustment_of = c.month GROUP BY ALL ORDER BY c.month"
        ).fetchall()
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
    for model, price, since in periods:
        print(f"  Price change: {model} ${price:,.2f} per GPU-hour from {since} (dated; the days before keep theirs).")
    for closed_month, at, how, cost, adjusted in closed:
        print(
            f"  Closed: {closed_month:%Y-%m} at {at:%Y-%m-%d %H:%M} UTC ({how}), {usd(cost)}; changes to it since "
            f"(idle hours read later, runs that ended after) are billed in {month:%Y-%m} as adjustments: "
            f"{'none' if adjusted is None else f'${adjusted:,.2f}'}."
        )


def _demo_idle_ladder(slack) -> int:
    """What the tick's idle ladder told in (the demo's local) Slack, then the feed again as it runs 16 minutes later,
    past the grace: the idle run's stop step, which with stopping off is only recorded."""
    from wandb_assets.ticks import execute_feed

    def told(messages: list[dict]) -> None:
        for k, message in enumerate(messages):  # the first whole, the rest's start
            text = message["text"] if k == 0 else message["text"][:100] + " ..."
            print(f"  to {message['channel']}: {text}")

    print(f"\nThe idle ladder told {len(slack.messages())} in Slack (the demo's own, on loopback; docs/alerts.md):")
    told(slack.messages())
    before = len(slack.messages())
    # sixteen minutes after the tick's feed told them (the demo's start is minutes earlier on a slow machine)
    later = datetime.now(UTC).replace(tzinfo=None, microsecond=0) + timedelta(minutes=16)
    print(f"Sixteen minutes later ({later:%H:%M} UTC, past the grace), the feed again ...", flush=True)
    code = exit_status(execute_feed(dagster_instance(), now=later.isoformat()), "feed")
    if code == 0:
        from wandb_assets.warehouse import reading

        with reading() as con:
            stops = (
                con.execute(
                    "SELECT entity || '/' || project || '/' || run_id, reason FROM idle_actions "
                    "WHERE audience = 'stop' ORDER BY ALL"
                ).fetchall()
                if con
                else []
            )
        for path, reason in stops:
            print(f"  {path}: {reason} (stop_runs: true in the policy stops it through W&B)")
        told(slack.messages()[before:])
        print("  (uv run wandb-assets idle: each open idle episode, what was done and the next step.)")
    return code


def _demo_pr_checks() -> None:
    """What the tick judged of the pull requests (``pr_checks``): the verdicts counted, the three latest PRs."""
    from collections import Counter

    from wandb_assets.settings import alert_thresholds

    rows = warehouse_rows(
        'SELECT c.pr, c."commit", c.config, c.testbed, c.pr_value, c.baseline_median, c.baseline_n, c.change_pct, '
        "c.verdict, (SELECT max(r.created_at) FROM runs r WHERE list_contains(c.pr_runs, r.run_id)) AS latest "
        f"FROM pr_checks c WHERE c.metric = '{alert_thresholds().sps_metric}' ORDER BY latest DESC, c.pr DESC"
    )
    if not rows:
        return
    counted = Counter(row[8] for row in rows)
    print(
        f"\nPull requests judged against main on the same testbed (pr_checks; docs/pr-checks.md): {len(rows)} PR "
        f"commits and configs, " + ", ".join(f"{n} {verdict}" for verdict, n in counted.most_common()) + ". The latest:"
    )
    for pr, commit, config, testbed, value, median, n, change, verdict, _ in rows[:3]:
        against = f"main's median {median:,.1f} [{n} runs], {change:+.1f}%" if median is not None else f"{n} main runs"
        print(f"  PR {pr} at {commit}: {config} on {testbed}: {value:,.1f} SPS against {against}: {verdict}")
    shown = next((row[0] for row in rows[:3] if row[8] == "regression"), rows[0][0])
    print(f"  (uv run wandb-assets pr-check --pr {shown} --fail-on-regression: the table, and exit 1 on a regression.)")


def _demo_curves() -> int:
    """One run of the curves job, as its schedule does between the ticks: the newest ended runs' curves."""
    from wandb_assets.ticks import execute_curves

    print("Reading the newest runs' curves (the curves job, between the ticks) ...", flush=True)
    result = execute_curves(dagster_instance())
    code = exit_status(result, "curves")
    if code == 0:
        meta = run_metadata(result, "staged_curves")
        print(
            f"Read the curves of {meta['runs_due']:,} runs in {meta['requests']} requests {meta.get('by_status', {})}; "
            f"{meta['more_due']:,} older ones wait for the next runs."
        )
    return code
