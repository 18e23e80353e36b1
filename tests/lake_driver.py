"""Run a backfill, a run of the curves job and ticks in a fresh process (the warehouse resource is built from the
environment at import time, so each warehouse mode gets its own process), then print what the warehouse holds as
JSON.

    python -m tests.lake_driver FIRST_DAY LAST_DAY SNAPSHOT_AT [SNAPSHOT_AT ...]

With LAKE_DRIVER_ANALYTICS set, it then builds the analysts' dbt project (with its docs) and reports its marts.
"""

import json
import os
import sys
from datetime import date

from dagster import DagsterInstance

from wandb_assets.ticks import execute_analytics, execute_backfill, execute_curves, failure_message, run_tick
from wandb_assets.warehouse import query_read_only


def main(first: str, last: str, *snapshots: str) -> None:
    with DagsterInstance.ephemeral() as instance:
        backfill = execute_backfill(instance, date.fromisoformat(first), date.fromisoformat(last))
        if not backfill.success:
            sys.exit(f"backfill failed: {failure_message(backfill)}")
        curves = execute_curves(instance)
        if not curves.success:
            sys.exit(f"curves failed: {failure_message(curves)}")
        for snapshot_at in snapshots:
            results = run_tick(instance, date.fromisoformat(snapshot_at[:10]), snapshot_at=snapshot_at, now=snapshot_at)
            if not results[-1].success:
                sys.exit(f"tick failed: {failure_message(results[-1])}")
        if os.environ.get("LAKE_DRIVER_ANALYTICS"):  # with its docs: dbt reads the catalog of a lake too
            analytics = execute_analytics(instance)
            if not analytics.success:
                sys.exit(f"analytics failed: {failure_message(analytics)}")
    metrics = query_read_only(
        None, "SELECT strftime(snapshot_at, '%Y-%m-%dT%H:%M:%S'), metric, value FROM fleet_metrics ORDER BY ALL"
    )
    alerts = query_read_only(None, "SELECT alert_key FROM alerts WHERE resolved_at IS NULL ORDER BY alert_key")
    deliveries = query_read_only(None, "SELECT status, count(*) FROM datadog_deliveries GROUP BY ALL ORDER BY ALL")
    runs = query_read_only(None, "SELECT count(*), count(DISTINCT run_id) FROM runs")[0]
    curves = query_read_only(
        None,
        "SELECT (SELECT count(*) FROM run_history), (SELECT round(sum(value), 3) FROM run_history), "
        "(SELECT count(*) FROM run_gpu_samples), (SELECT round(sum(idle_gpu_hours), 6) FROM run_curve_idle), "
        "(SELECT count(*) FROM runs WHERE curves_status = 'read'), (SELECT round(sum(sps_steady), 3) FROM runs)",
    )[0]
    marts = (
        {}
        if not os.environ.get("LAKE_DRIVER_ANALYTICS")
        else {
            "chargeback": query_read_only(
                None,
                "SELECT strftime(u.month, '%Y-%m'), round(u.cost, 2), round(c.cost, 2) FROM "
                "(SELECT date_trunc('month', day)::DATE AS month, sum(cost_usd) AS cost FROM gpu_usage GROUP BY 1) u "
                "FULL JOIN (SELECT month, sum(cost_usd) AS cost FROM analytics.team_gpu_cost_monthly GROUP BY 1) c "
                "USING (month) ORDER BY 1",
            ),
            "rows": query_read_only(
                None,
                "SELECT (SELECT count(*) FROM analytics.run_efficiency), "
                "(SELECT count(*) FROM analytics.fleet_health_daily), "
                "(SELECT count(*) FROM analytics.team_budget_vs_spend), "
                "(SELECT count(*) FROM analytics.stg_runs)",
            ),
        }
    )
    print(
        json.dumps(
            {
                "marts": marts,
                "metrics": metrics,
                "alerts": alerts,
                "deliveries": deliveries,
                "runs": runs,
                "curves": curves,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
