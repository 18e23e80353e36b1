"""``wandb-assets datadog``: the fleet's Datadog dashboard and monitors as code (``lib.datadog_assets``): written as
JSON (``--export``), or created and updated in Datadog (``--apply``), idempotently. No warehouse, no Dagster run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _export(folder: Path) -> int:
    from wandb_assets.lib.datadog_assets import dashboard, monitors
    from wandb_assets.settings import alert_thresholds

    folder.mkdir(parents=True, exist_ok=True)
    for name, document in (("dashboard.json", dashboard()), ("monitors.json", monitors(alert_thresholds()))):
        (folder / name).write_text(json.dumps(document, indent=2) + "\n")
    print(f"Wrote {folder / 'dashboard.json'} and {folder / 'monitors.json'}.")
    return 0


def cmd_datadog(args: argparse.Namespace) -> int:
    """Without options: what ``--apply`` would change. ``--apply``: create or update the dashboard and monitors this
    project manages (found by their mark, compared on the fields it sets, written only where they differ); exit 0,
    1 when Datadog refuses a call, 2 without the keys. ``--export DIR``: the JSON files."""
    if args.export:
        return _export(Path(args.export))
    from wandb_assets.defs.feed.resources import DatadogApiError, DatadogAssets, DatadogResource
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.lib.datadog_assets import (
        MANAGED_TAG,
        dashboard,
        differs,
        managed_dashboard_id,
        monitors,
        plan_monitors,
    )
    from wandb_assets.settings import ConfigError, alert_thresholds, load_settings

    feed = DatadogResource(wandb=wandb_resource())
    key = feed.api_key()
    app_key = load_settings().DD_APP_KEY
    if not key or app_key is None:
        raise ConfigError(
            "wandb-assets datadog needs DD_API_KEY and DD_APP_KEY (an application key: Datadog creates dashboards and "
            "monitors only with one)."
        )
    api = DatadogAssets(feed, key, app_key.get_secret_value())
    try:
        create, update, same = plan_monitors(monitors(alert_thresholds()), api.managed_monitors(MANAGED_TAG))
        for body in create:
            if args.apply:
                api.create_monitor(body)
            print(f"{'created' if args.apply else 'would create'} monitor {body['name']!r}")
        for monitor_id, body in update:
            if args.apply:
                api.update_monitor(monitor_id, body)
            print(f"{'updated' if args.apply else 'would update'} monitor {body['name']!r} ({monitor_id})")
        board, found = dashboard(), managed_dashboard_id(api.dashboard_summaries())
        board_changed = found is None or differs(board, api.dashboard(found))
        if found is None:
            made = api.create_dashboard(board) if args.apply else "-"
            print(f"{'created' if args.apply else 'would create'} dashboard {board['title']!r} ({made})")
        elif board_changed:
            if args.apply:
                api.update_dashboard(found, board)
            print(f"{'updated' if args.apply else 'would update'} dashboard {board['title']!r} ({found})")
    except DatadogApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    changed = len(create) + len(update) + board_changed
    print(
        f"Datadog: {changed} {'changed' if args.apply else 'to change'}, {same + (not board_changed)} as they "
        "should be (the monitors and the dashboard)."
    )
    return 0
