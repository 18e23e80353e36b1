"""Pull requests' throughput verdicts after each snapshot (``pr_checks``): every PR commit and config with ended runs,
judged per SPS metric against main on the same testbed (``lib/pr_checks.py``), the table replaced row by row."""

from collections import Counter

from dagster import MaterializeResult, MetadataValue, asset

from wandb_assets.defs.feed.assets import FEED, ClockConfig
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.pr_checks import REGRESSION, format_pr_table, judge_prs, record_pr_checks
from wandb_assets.settings import alert_thresholds


@asset(
    description="Each pull request's training throughput against main on the same testbed (GPU count and model): "
    "per PR commit, config and SPS metric, the PR runs' mean against the last 10 ended main runs' Student-t lower "
    "boundary at 99 % (Bencher's t_test); regression, improvement, no change, or no baseline (fewer than 5 main "
    "runs). `wandb-assets pr-check --pr N` prints the same from the snapshot.",
    kinds={"duckdb"},
    **FEED,
)
def pr_checks(config: ClockConfig, warehouse: WarehouseResource) -> MaterializeResult:
    now = config.resolve()
    with warehouse.get_connection() as con:
        rows = judge_prs(con, now, alert_thresholds().sps_metric)
        record_pr_checks(con, rows)
    latest = sorted(rows, key=lambda r: (-r["pr"], r["config"], r["metric"]))[:20]
    return MaterializeResult(
        metadata={
            "judged": len(rows),
            "by_verdict": MetadataValue.json(dict(Counter(r["verdict"] for r in rows))),
            "regressions": sum(r["verdict"] == REGRESSION for r in rows),
            "latest_verdicts": MetadataValue.md(format_pr_table(latest) if latest else "(no PR run has ended)"),
        }
    )
