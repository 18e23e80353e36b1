"""The Datadog dashboard and monitors of the fleet gauges, as code (``wandb-assets datadog``), and the plan that applies
them idempotently. No Dagster, no network here.

Datadog titles are not unique and its dashboard listing cannot filter by title, so what this project made is found by
a mark it leaves: monitors by the tag ``MANAGED_TAG`` (``list_monitors(monitor_tags=...)``), the dashboard by
``DASHBOARD_MARK`` at the end of its description. Applying compares each desired object with what Datadog holds on the
fields this project sets only (Datadog adds read-only ones: ids, creation times, states) and writes only what
differs: a second apply writes nothing.

The gauges are pushed every 15 minutes (the tick): every monitor evaluates over 30 minutes (two pushes), and says
what missing data means: the feed's own monitor notifies when the gauges stop arriving; the others show it and leave
the notice to that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wandb_assets.lib.alerts import AlertThresholds

#: The tag on every monitor this project manages (and how it finds them again).
MANAGED_TAG = "managed_by:wandb-assets"
#: The end of the dashboard's description: how the dashboard is found again.
DASHBOARD_MARK = "(managed_by:wandb-assets)"
DASHBOARD_TITLE = "W&B fleet (wandb-assets)"

#: The fleet-wide series of the feed (one project mirrored: its own; several: ``scope:fleet``), never the per-project
#: ones, in the environment the template variable picks.
_FLEET = "{source:wandb-assets,!scope:project,$env}"
_MONITOR_SCOPE = "{source:wandb-assets,!scope:project}"
#: The evaluation window of every monitor: two pushes of the 15-minute tick.
WINDOW = "last_30m"

#: The dashboard's groups: (title, [(widget title, [metrics])]).
_GROUPS: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    (
        "Runs",
        (
            ("Runs alive now", ("wandb.runs.active",)),
            ("Runs ended in the last 24 h", ("wandb.runs.completed_24h", "wandb.runs.failed_24h")),
            ("Average duration (hours)", ("wandb.training.avg_duration_hours",)),
        ),
    ),
    (
        "Push-to-main CI",
        (
            ("Success rate (%)", ("wandb.push_to_main.success_rate_pct",)),
            (
                "CI runs in the last 24 h",
                ("wandb.push_to_main.runs_completed_24h", "wandb.push_to_main.runs_failed_24h"),
            ),
            ("Steps per second", ("wandb.push_to_main.overview.sps", "wandb.push_to_main.timing_cumulative.sps")),
        ),
    ),
    (
        "GPUs and dollars",
        (
            ("GPU cost, last 24 h (USD)", ("wandb.gpu.cost_usd_24h",)),
            ("GPU-hours, last 24 h", ("wandb.training.total_gpu_hours_24h", "wandb.gpu.unpriced_gpu_hours_24h")),
            ("Idle GPU-hours, last 24 h", ("wandb.gpu.idle_gpu_hours_24h",)),
            ("Idle GPUs now", ("wandb.gpu.idle_gpus",)),
        ),
    ),
    (
        "Sweeps",
        (
            ("Sweep runs alive now", ("wandb.sweep.runs_active",)),
            ("Sweep success rate (%)", ("wandb.sweep.success_rate_pct",)),
        ),
    ),
)


def dashboard() -> dict[str, Any]:
    """The dashboard's JSON (the body of Datadog's ``POST /api/v1/dashboard``)."""
    groups = []
    for title, widgets in _GROUPS:
        groups.append(
            {
                "definition": {
                    "type": "group",
                    "title": title,
                    "layout_type": "ordered",
                    "widgets": [
                        {
                            "definition": {
                                "type": "timeseries",
                                "title": name,
                                "requests": [
                                    {"q": f"avg:{metric}{_FLEET}", "display_type": "line"} for metric in metrics
                                ],
                            }
                        }
                        for name, metrics in widgets
                    ],
                }
            }
        )
    return {
        "title": DASHBOARD_TITLE,
        "description": "The fleet gauges wandb-assets pushes every 15 minutes: runs, push-to-main CI, GPU cost and "
        f"idle, sweeps. Edits are overwritten by `wandb-assets datadog --apply`. {DASHBOARD_MARK}",
        "layout_type": "ordered",
        "template_variables": [{"name": "env", "prefix": "env", "default": "*"}],
        "widgets": groups,
    }


def _monitor(name: str, query: str, message: str, on_missing: str, rule: str) -> dict[str, Any]:
    return {
        "name": f"[wandb-assets] {name}",
        "type": "metric alert",
        "query": query,
        "message": message,
        "tags": [MANAGED_TAG, "source:wandb-assets", f"rule:{rule}"],
        "options": {
            "on_missing_data": on_missing,
            "require_full_window": False,
            "include_tags": True,
            "notify_audit": False,
            "renotify_interval": 0,
        },
    }


def monitors(th: AlertThresholds | None = None) -> list[dict[str, Any]]:
    """The monitors' JSON (bodies of ``POST /api/v1/monitor``), by the alert rules' thresholds ``th``."""
    th = th or AlertThresholds()
    low = th.success_rate_min_pct
    found = [
        _monitor(
            "The fleet gauges stopped arriving",
            f"max({WINDOW}):max:wandb.runs.total_recent{_MONITOR_SCOPE} < 0",
            "No fleet gauge has arrived for 30 minutes (two 15-minute ticks): the pipeline's tick or its Datadog feed "
            "is not running. Look at the Dagster UI's runs and the pipeline_failure alert.",
            "show_and_notify_no_data",
            "feed",
        ),
        _monitor(
            "Push-to-main success rate low",
            f"max({WINDOW}):max:wandb.push_to_main.success_rate_pct{_MONITOR_SCOPE} < {low:g}",
            f"The push-to-main CI success rate of the last 24 hours is below {low:g}% (the "
            "push_to_main_success_rate_low rule): `uv run wandb-assets alerts` names the failing runs.",
            "show_no_data",
            "push_to_main_success_rate_low",
        ),
        _monitor(
            "GPUs idle",
            f"min({WINDOW}):min:wandb.gpu.idle_gpus{_MONITOR_SCOPE} > 0",
            "Running runs have had idle GPUs for 30 minutes (the idle_gpus rule): `uv run wandb-assets idle` lists "
            "them with their owners and the idle ladder's next step.",
            "show_no_data",
            "idle_gpus",
        ),
        _monitor(
            "GPU-hours without a price",
            f"min({WINDOW}):min:wandb.gpu.unpriced_gpu_hours_24h{_MONITOR_SCOPE} > 0",
            "Some GPU-hours of the last 24 hours have no price and are not in the dollars: `uv run wandb-assets "
            "costs` names the models; price them in WANDB_ASSETS_GPU_PRICES.",
            "show_no_data",
            "unpriced",
        ),
    ]
    for monitor in found:
        threshold = monitor["query"].rsplit(" ", 1)[1]
        monitor["options"]["thresholds"] = {"critical": float(threshold)}
    return found


def differs(desired: Any, current: Any) -> bool:
    """Whether ``current`` (what Datadog holds) differs from ``desired`` on the fields ``desired`` sets (recursively
    in objects; lists compared item by item; numbers by value)."""
    if isinstance(desired, Mapping):
        if not isinstance(current, Mapping):
            return True
        return any(differs(value, current.get(key)) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(current, list) or len(desired) != len(current):
            return True
        return any(differs(d, c) for d, c in zip(desired, current, strict=True))
    if isinstance(desired, (int, float)) and not isinstance(desired, bool) and isinstance(current, (int, float)):
        return float(desired) != float(current)
    return desired != current


def plan_monitors(desired: list[dict], existing: list[dict]) -> tuple[list[dict], list[tuple[int, dict]], int]:
    """``(to create, [(id, to update)], unchanged)``: each desired monitor matched by name with one this project made
    (``existing``: those tagged ``MANAGED_TAG``). A managed monitor no longer desired is left alone (a person may rely
    on it): said by the command, never deleted."""
    by_name = {m.get("name"): m for m in existing}
    create, update, same = [], [], 0
    for monitor in desired:
        current = by_name.get(monitor["name"])
        if current is None:
            create.append(monitor)
        elif differs(monitor, current):
            update.append((current["id"], monitor))
        else:
            same += 1
    return create, update, same


def managed_dashboard_id(summaries: list[Mapping[str, Any]]) -> str | None:
    """The id of the dashboard this project made, among the listing's summaries (its description's mark), or None."""
    found = [s for s in summaries if str(s.get("description") or "").endswith(DASHBOARD_MARK)]
    return str(found[0]["id"]) if found else None
