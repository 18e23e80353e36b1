"""Hand-built warehouse rows for the gauge and table tests."""

from datetime import datetime

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
