"""``vanished`` means last seen: only a run actually asked for by id and not returned is judged; it keeps its
GPU-hours and cost up to its last heartbeat (past days never change); one W&B returns again is restored.

Findings 1-3 of code-review-2026-11c (a concurrent load's run vanished by a tick that never asked for it, a
vanished run's past erased, every old running run vanished on the first tick after an upgrade)."""

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from wandb_assets.lib.derived import rebuild_gpu_hours, rebuild_gpu_usage
from wandb_assets.lib.gauges import compute_gauges
from wandb_assets.lib.warehouse import (
    ASKED_KEY,
    WHOLE_KEY,
    ensure_schema,
    load_runs_window,
    ndjson_lines,
    unfinished_runs_by_project,
)

DAY = timedelta(days=1)
PRICES = [("H100-80GB", 3.0)]


def stage(path: Path, rows: list[dict], fetched_at: datetime, asked: dict[str, list[str]] | None = None) -> str:
    """Rows staged as a fetch that began at ``fetched_at`` publishes them (header, modification time)."""
    header = {WHOLE_KEY: ["e/p"], **({ASKED_KEY: asked} if asked is not None else {})}
    path.write_text(json.dumps(header) + "\n" + "".join(ndjson_lines(rows, fetched_at)))
    stamp = fetched_at.replace(tzinfo=UTC).timestamp()
    os.utime(path, (stamp, stamp))
    return str(path)


def run(run_id: str, created: datetime, heartbeat: datetime, state: str = "running", gpus: int = 8) -> dict:
    return {
        "entity": "e",
        "project": "p",
        "run_id": run_id,
        "state": state,
        "created_at": created,
        "heartbeat_at": heartbeat,
        "gpu_count": gpus,
        "gpu_model": "H100-80GB",
        "anomalies": [],
    }


def test_a_run_loaded_by_a_concurrent_backfill_is_never_vanished_by_a_tick_that_did_not_ask_for_it(
    memory_con, tmp_path
):
    """A tick read its by-id list (empty) before a backfill loaded R, a 30-day training still running; the tick's
    load comes after the backfill's. R stays running: the tick never asked W&B for it."""
    today = datetime(2026, 11, 20)
    tick_start = today - DAY
    assert unfinished_runs_by_project(memory_con, tick_start) == {}  # what the tick asks for by id: nothing
    r = run("R", today - 30 * DAY, datetime(2026, 11, 20, 10))
    backfill = stage(tmp_path / "bf.ndjson", [r], datetime(2026, 11, 20, 10))
    load_runs_window(memory_con, [backfill], today - 30 * DAY, today - 29 * DAY)
    window = stage(tmp_path / "w.ndjson", [], datetime(2026, 11, 20, 10, 5))
    by_id = stage(tmp_path / "r.ndjson", [], datetime(2026, 11, 20, 10, 5), asked={"e/p": []})
    load_runs_window(memory_con, [window], tick_start, today + DAY, [by_id])
    assert memory_con.execute("SELECT run_id, state, anomalies FROM runs").fetchall() == [("R", "running", [])]
    assert unfinished_runs_by_project(memory_con, tick_start) == {"e/p": ["R"]}  # the next tick asks for it


def test_a_vanished_run_keeps_its_gpu_hours_and_cost_up_to_its_last_heartbeat_and_is_restored_when_seen_again(
    memory_con, tmp_path
):
    """8 GPUs from 2026-06-01 00:00, last heartbeat 2026-06-06 00:00: 5 days x 24 h x 8 = 960 GPU-hours, at 3 USD =
    2,880 USD. Read at 06:00 (cost then 126 h x 8 x 3 = 3,024), then asked for by id and not returned: vanished,
    960 GPU-hours and 2,880 USD, nothing after its heartbeat, the past days as they were."""
    created, heartbeat = datetime(2026, 6, 1), datetime(2026, 6, 6)
    first = stage(tmp_path / "1.ndjson", [run("R", created, heartbeat)], datetime(2026, 6, 6, 6))
    load_runs_window(memory_con, [first], created, created + DAY, prices=PRICES)
    assert memory_con.execute("SELECT cost_usd FROM runs").fetchone() == (3024.0,)
    now = datetime(2026, 6, 8, 12)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 6), dict(PRICES), {})
    rebuild_gpu_hours(memory_con)
    before = memory_con.execute("SELECT day, gpu_hours FROM gpu_hours WHERE category = 'all' ORDER BY day").fetchall()
    assert [h for _, h in before] == [192.0] * 5

    window = stage(tmp_path / "w.ndjson", [], datetime(2026, 6, 8))
    by_id = stage(tmp_path / "r.ndjson", [], datetime(2026, 6, 8), asked={"e/p": ["R"]})
    marking = datetime.now(UTC).replace(tzinfo=None)
    load_runs_window(memory_con, [window], datetime(2026, 6, 7), datetime(2026, 6, 9), [by_id], prices=PRICES)
    marked = datetime.now(UTC).replace(tzinfo=None)
    assert memory_con.execute("SELECT state, anomalies, cost_usd, ingested_at FROM runs").fetchall() == [
        ("vanished", ["vanished"], 2880.0, datetime(2026, 6, 6, 6))  # marked, not loaded
    ]
    # When the lifecycle marked it (check: an alert evaluated before this saw it alive), to the microsecond.
    changed = memory_con.execute("SELECT state_changed_at FROM runs").fetchone()[0]
    assert marking <= changed <= marked
    rebuild_gpu_usage(memory_con, now, dict(PRICES), {})
    rebuild_gpu_hours(memory_con)
    assert (
        memory_con.execute("SELECT day, gpu_hours FROM gpu_hours WHERE category = 'all' ORDER BY day").fetchall()
        == before
    )
    rebuild_gpu_usage(memory_con, now, dict(PRICES), {})
    assert memory_con.execute("SELECT sum(gpu_hours), sum(cost_usd) FROM gpu_usage").fetchone() == (960.0, 2880.0)
    gauges = compute_gauges(memory_con, now)
    assert gauges["wandb.runs.active"] == 0 and gauges["wandb.training.total_gpu_hours_24h"] == 0
    assert unfinished_runs_by_project(memory_con, datetime(2026, 6, 7)) == {}  # not alive: never asked again

    # W&B returns it again (a backfill of its day): the row is restored, as W&B says it is now.
    back = stage(tmp_path / "b.ndjson", [run("R", created, heartbeat, state="finished")], datetime(2026, 6, 9))
    load_runs_window(memory_con, [back], created, created + DAY, prices=PRICES)
    assert memory_con.execute("SELECT state, anomalies, state_changed_at FROM runs").fetchall() == [
        ("finished", [], None)  # as loaded
    ]


def test_the_first_tick_after_an_upgrade_asks_for_the_old_running_runs_by_the_project_of_their_url(tmp_path):
    """A warehouse written before runs carried their project, with WANDB_ASSETS_PROJECTS set on the first tick:
    its alive runs are listed under the project of their URL (not under "", which a multi-project tick drops), so
    they are asked for by id; and a load whose fetch asked for none of them vanishes none."""
    from tests.test_projects import _old_warehouse

    path = tmp_path / "old.duckdb"
    _old_warehouse(path, offline_row=False)
    con = duckdb.connect(str(path))
    con.execute(
        "UPDATE runs SET state = 'running', ended_at = NULL WHERE run_id IN (SELECT run_id FROM runs ORDER BY run_id "
        "LIMIT 2)"
    )
    alive = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE state = 'running' ORDER BY 1").fetchall()]
    start = con.execute("SELECT max(created_at)::DATE + 5 FROM runs").fetchone()[0]
    start = datetime.combine(start, datetime.min.time())
    assert unfinished_runs_by_project(con, start) == {"team/fleet": alive}
    fetched = con.execute("SELECT max(ingested_at) FROM runs").fetchone()[0] + timedelta(hours=1)
    ensure_schema(con)  # the runs step's writer migrates the table ...
    window = stage(tmp_path / "w.ndjson", [], fetched)
    by_id = stage(tmp_path / "r.ndjson", [], fetched, asked={})  # ... after a fetch that asked for none of them
    load_runs_window(con, [window], start, start + 2 * DAY, [by_id])
    assert len(alive) == 4
    assert con.execute("SELECT run_id FROM runs WHERE state = 'running' ORDER BY 1").fetchall() == [(r,) for r in alive]
    con.close()
