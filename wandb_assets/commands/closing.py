"""``wandb-assets close``: close a month of the chargeback (a short write of its own, no Dagster run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_close(args: argparse.Namespace) -> int:
    """Rebuild gpu_usage and the booked ledger at now, then record the month as closed (``closing.close_month``):
    exit 0 with the month's totals, 1 with one sentence when it cannot be closed (not over, closed already, the
    warehouse held), 2 without a warehouse."""
    import duckdb

    from wandb_assets.commands.common import no_warehouse
    from wandb_assets.lib.accounting.closing import ClosingRefused, close_month
    from wandb_assets.lib.clock import configured_time, utc_now
    from wandb_assets.lib.derived import rebuild_gpu_usage
    from wandb_assets.lib.exports import parse_month
    from wandb_assets.lib.lake import is_lake
    from wandb_assets.lib.sql import transaction
    from wandb_assets.lib.warehouse import has_table
    from wandb_assets.settings import alert_thresholds, pipeline_settings
    from wandb_assets.warehouse import connect

    try:
        month = parse_month(args.month)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pipeline = pipeline_settings()
    location = args.warehouse or pipeline.warehouse
    now = configured_time(args.now, "--now") or utc_now()
    if not is_lake(str(location)) and not Path(location).exists():
        return no_warehouse(location)
    try:
        con = connect(location, read_only=False)
    except (duckdb.IOException, RuntimeError) as exc:
        print(f"error: the warehouse {location} cannot be written now ({str(exc).splitlines()[0]}).", file=sys.stderr)
        return 1
    try:
        if not has_table(con, "runs"):
            return no_warehouse(location)
        rebuild_gpu_usage(con, now, pipeline.gpu_prices, pipeline.teams, alert_thresholds().idle_gpu_pct)
        try:
            with transaction(con):
                record = close_month(con, month, now)
        except ClosingRefused as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    finally:
        con.close()
    dollars = "no priced GPU-hours" if record["cost_usd"] is None else f"${record['cost_usd']:,.2f}"
    days = f"usage days {record['first_day']} to {record['last_day']}" if record["first_day"] else "no usage"
    print(
        f"Closed {month:%Y-%m} at {now:%Y-%m-%d %H:%M} UTC: {record['gpu_hours']:,.1f} GPU-hours, {dollars}, {days}. "
        "Its chargeback never changes from now on: a late run, a price dated into it or a teams-file edit is billed "
        "as an adjustment in the first open month."
    )
    return 0
