"""Pull requests' throughput verdicts after each snapshot (``pr_checks``): every PR commit and config with ended runs,
judged per SPS metric against main on the same testbed (``lib/pr_checks.py``), the table replaced row by row."""

from collections import Counter

from dagster import MaterializeResult, MetadataValue, asset

from wandb_assets.defs.feed.assets import FEED, ClockConfig
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.pr_checks import (
    REGRESSION,
    format_pr_table,
    held_verdicts,
    judge_prs,
    latest_verdicts,
    record_pr_checks,
    unjudged,
)
from wandb_assets.lib.pr_outbox import items_for, queue
from wandb_assets.settings import alert_thresholds, github_target


@asset(
    description="Each pull request's training throughput against main on the same testbed (GPU count and model): "
    "per PR commit, config and SPS metric, the PR runs' mean against the last 10 ended main runs' Student-t lower "
    "boundary at 99 % (Bencher's t_test); regression, improvement, no change, or no baseline (fewer than 5 main "
    "runs). A verdict is given when a PR run ends (a run more of the same commit judges it again) and then stands. "
    "With WANDB_ASSETS_GITHUB_REPO, what GitHub should show is queued for `github_checks`. `wandb-assets pr-check "
    "--pr N` prints the same from the snapshot.",
    kinds={"duckdb"},
    **FEED,
)
def pr_checks(config: ClockConfig, warehouse: WarehouseResource) -> MaterializeResult:
    now, target = config.resolve(), github_target()
    with warehouse.get_connection() as con:
        rows = unjudged(con, judge_prs(con, now, alert_thresholds().sps_metric, repo=target and target.repo))
        record_pr_checks(con, rows)
        queued = (
            queue(con, items_for(target.repo, held_verdicts(con, sorted({r["pr"] for r in rows})), target.gate), now)
            if target is not None
            else 0
        )
        latest = latest_verdicts(con)
    return MaterializeResult(
        metadata={
            "judged": len(rows),
            "queued_for_github": queued if target is not None else "off (WANDB_ASSETS_GITHUB_REPO not set)",
            "by_verdict": MetadataValue.json(dict(Counter(r["verdict"] for r in rows))),
            "regressions": sum(r["verdict"] == REGRESSION for r in rows),
            "latest_verdicts": MetadataValue.md(format_pr_table(latest) if latest else "(no PR run has ended yet)"),
        }
    )
