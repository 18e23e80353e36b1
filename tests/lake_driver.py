"""Run a backfill and ticks in a fresh process (the warehouse resource is built from the environment at
import time, so each warehouse mode gets its own process), then print what the warehouse holds as JSON.

    python -m tests.lake_driver FIRST_DAY LAST_DAY SNAPSHOT_AT [SNAPSHOT_AT ...]
"""

import json
import sys
from datetime import date

from dagster import DagsterInstance

from wandb_assets.ticks import execute_backfill, failure_message, run_tick
from wandb_assets.warehouse import query_read_only


def main(first: str, last: str, *snapshots: str) -> None:
    with DagsterInstance.ephemeral() as instance:
        backfill = execute_backfill(instance, date.fromisoformat(first), date.fromisoformat(last))
        if not backfill.success:
            sys.exit(f"backfill failed: {failure_message(backfill)}")
        for snapshot_at in snapshots:
            results = run_tick(instance, date.fromisoformat(snapshot_at[:10]), snapshot_at=snapshot_at, now=snapshot_at)
            if not results[-1].success:
                sys.exit(f"tick failed: {failure_message(results[-1])}")
    metrics = query_read_only(
        None, "SELECT strftime(snapshot_at, '%Y-%m-%dT%H:%M:%S'), metric, value FROM fleet_metrics ORDER BY ALL"
    )
    alerts = query_read_only(None, "SELECT alert_key FROM alerts WHERE resolved_at IS NULL ORDER BY alert_key")
    deliveries = query_read_only(None, "SELECT status, count(*) FROM datadog_deliveries GROUP BY ALL ORDER BY ALL")
    runs = query_read_only(None, "SELECT count(*), count(DISTINCT run_id) FROM runs")[0]
    print(json.dumps({"metrics": metrics, "alerts": alerts, "deliveries": deliveries, "runs": runs}))


if __name__ == "__main__":
    main(*sys.argv[1:])
