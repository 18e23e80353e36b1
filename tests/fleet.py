"""Hand-built warehouse rows for the gauge and table tests."""

import json
from datetime import datetime, timedelta

from wandb_assets.lib.normalize import ENDED_STATES


def fleet_row(
    run_id: str,
    state: str,
    category: str,
    created: datetime,
    ended: datetime | None = None,
    gpus: int = 1,
    entity: str = "test-team",
    project: str = "test-project",
    **sps: float | None,
) -> dict:
    """A ``runs`` row; ``ended`` is the heartbeat of an ended run; SPS keyword args name the columns."""
    return {
        "entity": entity,
        "project": project,
        "run_id": run_id,
        "name": run_id,
        "state": state,
        "category": category,
        "created_at": created,
        "heartbeat_at": ended or created,
        "ended_at": ended if state in ENDED_STATES else None,
        "duration_hours": (ended - created).total_seconds() / 3600 if ended and state in ENDED_STATES else None,
        "gpu_count": gpus,
        "tags": [],
        "summary": "{}",
        "config": "{}",
        "anomalies": [],
        **{f"sps_{k}": v for k, v in sps.items()},
    }


def load(con, rows: list[dict]) -> None:
    """Put hand-built rows in the warehouse, replacing whatever it held (a load keeps what W&B stopped returning,
    marked vanished: a test's fleet is replaced whole)."""
    from wandb_assets.lib.warehouse import ensure_schema, replace_runs_window

    ensure_schema(con)
    con.execute("DELETE FROM runs")
    replace_runs_window(con, rows, datetime(2000, 1, 1), datetime(2100, 1, 1))


#: Issue 45's hand-worked fleet: the judging moment, and ten steady main runs of ppo on 8 H100s (mean 1,000, standard
#: deviation sqrt(386 / 9) = 6.549).
T = datetime(2026, 11, 20, 12, 0)
MAIN_SPS = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1008.0, 992.0, 1000.0]


def ci_run(run_id: str, branch: str, commit: str, sps: float, hours_ago: float, model: str = "H100-80GB") -> dict:
    created = T - timedelta(hours=hours_ago)
    row = fleet_row(run_id, "finished", "push_to_main", created, created + timedelta(minutes=30), gpus=8)
    return row | {
        "name": f"github.sky.{branch}.{commit}.ppo.{int(created.timestamp())}",
        "ci_branch": branch,
        "ci_commit": commit,
        "ci_config": "ppo",
        "ci_timestamp": created,
        "gpu_model": model,
        "url": f"https://wandb.example/test-team/test-project/runs/{run_id}",
        "sps_overview_sps": sps,
        "summary": json.dumps({"overview/sps": sps}),
    }


def pr_fleet() -> list[dict]:
    """Ten main runs on 8 H100s (``MAIN_SPS``), twelve slower ones on 8 A100s (~600), three on 4 L4s; PR 7 (H100,
    850: -15 %), PR 8 (H100, 995, twice), PR 9 (4 L4s: three main runs only)."""
    rows = [ci_run(f"m{i}", "main", f"c{i:02d}", sps, 100 - i) for i, sps in enumerate(MAIN_SPS)]
    rows += [ci_run(f"a{i}", "main", f"a{i:02d}", 600.0 + i, 200 - i, "A100-80GB") for i in range(12)]
    rows += [ci_run(f"l{i}", "main", f"l{i:02d}", 100.0, 150 - i, "L4") for i in range(3)]
    for row in rows[-3:]:
        row["gpu_count"] = 4
    return rows + [
        ci_run("p7", "pr7", "deadbeef", 850.0, 1),
        ci_run("p8a", "pr8", "cafe0001", 990.0, 1),
        ci_run("p8b", "pr8", "cafe0001", 1000.0, 0.5),
        ci_run("p9", "pr9", "f00d0001", 50.0, 1, "L4") | {"gpu_count": 4},
    ]
