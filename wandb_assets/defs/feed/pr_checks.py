"""Pull requests' throughput verdicts after each snapshot (``pr_checks``): every PR commit and config with ended runs,
judged per SPS metric against main on the same testbed (``lib/acting/pr_checks.py``), the table replaced row by row."""

from collections import Counter
from datetime import timedelta

from dagster import MaterializeResult, MetadataValue, asset

from wandb_assets.defs.feed.assets import FEED, ClockConfig
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.acting.pr_checks import (
    REGRESSION,
    format_pr_table,
    held_verdicts,
    judge_changed,
    latest_verdicts,
    prs_with_runs_ended_since,
    record_judged,
)
from wandb_assets.lib.acting.pr_outbox import items_for, queue
from wandb_assets.settings import alert_thresholds, github_target, load_settings


@asset(
    description="Each pull request's training throughput against main on the same testbed (GPU count and model): "
    "per PR commit, config and SPS metric, the PR runs' mean against the last 10 ended main runs' Student-t lower "
    "boundary at 99 % (Bencher's t_test); regression, improvement, no change, or no baseline (fewer than 5 main "
    "runs). A verdict is given when a PR run ends (a run more of the same commit judges it again) and then stands. "
    "With WANDB_ASSETS_GITHUB_REPO, what GitHub should show is queued for `github_checks` (only for PRs with a run "
    "ended within WANDB_ASSETS_GITHUB_MAX_AGE_DAYS: a backfill's history is kept, never sent). `wandb-assets pr-check "
    "--pr N` prints the same from the snapshot. A run whose name is not a valid PR number and hex commit is skipped "
    "and counted (skipped_runs).",
    kinds={"duckdb"},
    **FEED,
)
@names_the_warehouse
def pr_checks(config: ClockConfig, warehouse: WarehouseResource) -> MaterializeResult:
    now, target, metric = config.resolve(), github_target(), alert_thresholds().sps_metric
    skipped: Counter = Counter()
    with (
        judge_changed(  # the warehouse released while judging: the history's first judging takes minutes
            warehouse.get_connection,
            now,
            metric,
            repo=target and target.repo,
            min_change_pct=load_settings().WANDB_ASSETS_PR_MIN_CHANGE_PCT,
            skipped=skipped,
            config=warehouse.connection_config,
        ) as judged,
        warehouse.get_connection() as con,
    ):
        by_verdict, judged_prs = judged.by_verdict, judged.prs
        record_judged(con, judged)
        since = now - timedelta(days=load_settings().WANDB_ASSETS_GITHUB_MAX_AGE_DAYS)
        told = sorted(judged_prs & prs_with_runs_ended_since(con, since)) if target is not None else []
        verdicts = held_verdicts(con, told)
        queued = queue(con, items_for(target.repo, verdicts, target.gate, metric), now) if target is not None else 0
        latest = latest_verdicts(con)
    return MaterializeResult(
        metadata={
            "judged": by_verdict.total(),
            "queued_for_github": queued if target is not None else "off (WANDB_ASSETS_GITHUB_REPO not set)",
            # judged now, but no run of theirs ended within WANDB_ASSETS_GITHUB_MAX_AGE_DAYS: kept, never sent
            "prs_too_old_for_github": len(judged_prs) - len(told) if target is not None else 0,
            "by_verdict": MetadataValue.json(dict(by_verdict)),
            "regressions": by_verdict[REGRESSION],
            "skipped_runs": MetadataValue.json(dict(skipped)),  # names that cannot be a PR run: never judged
            "latest_verdicts": MetadataValue.md(format_pr_table(latest) if latest else "(no PR run has ended yet)"),
        }
    )
