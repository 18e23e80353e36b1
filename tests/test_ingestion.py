"""Ingestion at the limit: concurrent fetch, politeness under 429s, pages that fit, fetch and load apart.

The pure parts (throttle, page size, slicing, progress) are tested directly; the rest drives real backfills
through the real wandb client against the local server, which counts requests in flight.
"""

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterEventType

from tests.conftest import API_KEY
from wandb_assets.lib.fetch import classify, created_between, plan_slices
from wandb_assets.lib.progress import FetchProgress
from wandb_assets.lib.throttle import PageSize, Throttle
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill, failure_message
from wandb_assets.warehouse import query_read_only

ROWS_SQL = "SELECT * FROM runs ORDER BY run_id"


def fleet(days: int, per_day: int, summary_bytes: int = 0, name: str = "train") -> list[dict]:
    """``per_day`` finished runs on each of the ``days`` days from 2026-06-01, spread over the day."""
    padding = {"histogram": "x" * summary_bytes} if summary_bytes else {}
    return [
        make_run_node(
            f"r{day:02d}-{n:03d}",
            display_name=f"{name}-{n}",
            state="finished",
            created_at=datetime(2026, 6, day, (n * 24) // per_day, n % 60),
            heartbeat_at=datetime(2026, 6, day, 23, 59),
            summary={"loss": n, "_step": 10, **padding},
        )
        for day in range(1, days + 1)
        for n in range(per_day)
    ]


def staged_metadata(result) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node("staged_runs")[0].metadata.items()}


def staged_files(warehouse_path: Path) -> dict[str, bytes]:
    folder = warehouse_path.parent / "staging" / "runs"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------------------------- pure parts


def test_throttle_never_lets_more_than_the_limit_in_flight():
    throttle = Throttle(3)
    inside, peak, lock = [0], [0], threading.Lock()

    def request() -> None:
        with throttle.slot():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (peak[0], throttle.max_in_flight, throttle.requests) == (3, 3, 12)


def test_throttle_halves_once_per_burst_pauses_and_grows_back():
    now = [100.0]
    throttle = Throttle(8, clock=lambda: now[0])
    throttle.throttled(2.0)
    throttle.throttled(2.0)  # sent before the pause began: the same signal
    assert (throttle.allowed(), throttle.decreases, throttle.throttled_responses) == (4, 1, 2)
    now[0] = 102.5
    throttle.throttled(1.0)
    assert (throttle.allowed(), throttle.lowest_limit) == (2, 2)
    throttle.succeeded()
    throttle.succeeded()  # +1/limit each: 2 -> 2.5 -> 2.9
    assert throttle.allowed() == 2
    throttle.succeeded()  # -> 3.24: about one more per round of `limit` requests
    assert throttle.allowed() == 3
    for _ in range(50):
        throttle.succeeded()
    assert throttle.allowed() == 8  # never above the configured maximum


def test_throttle_pause_holds_every_worker_for_the_wait():
    """After a 429 asking for 30 s, three workers all wait until the throttle's clock has passed the pause, then
    all go (the limit halved to 2 lets two in at once). The clock is injected: no wall-clock margin."""
    import threading

    now = [100.0]
    throttle = Throttle(4, clock=lambda: now[0])
    throttle.throttled(30.0)
    entered: list[float] = []
    inside = threading.Semaphore(0)

    def worker():
        with throttle.slot():
            entered.append(now[0])
            inside.release()

    workers = [threading.Thread(target=worker) for _ in range(3)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 30
    while len(throttle._cond._waiters) < 3 and time.monotonic() < deadline:  # all three are waiting
        time.sleep(0.01)
    assert (len(throttle._cond._waiters), entered) == (3, [])
    now[0] = 130.0
    with throttle._cond:
        throttle._cond.notify_all()
    for _ in range(3):
        assert inside.acquire(timeout=30)
    for w in workers:
        w.join(timeout=30)
    assert entered == [130.0, 130.0, 130.0] and throttle.max_in_flight <= 2


def test_page_size_halves_to_the_floor_once_per_failed_size():
    size = PageSize(1000, 25)
    assert size.shrink(1000) and size.size == 500
    assert size.shrink(1000) and size.size == 500  # a second worker failing at 1000 changes nothing
    for expected in (250, 125, 62, 31, 25):
        assert size.shrink(size.size) and size.size == expected
    assert not size.shrink(25)
    assert (size.size, size.shrinks) == (25, 6)


def test_plan_slices_days_or_parts_of_days():
    start, end = datetime(2026, 6, 1), datetime(2026, 6, 3)
    assert [s.filters for s in plan_slices(start, end, 1)] == [
        created_between(datetime(2026, 6, 1), datetime(2026, 6, 2)),
        created_between(datetime(2026, 6, 2), datetime(2026, 6, 3)),
    ]
    # two days, four workers: eight slices of six hours keep every worker busy twice
    four = plan_slices(start, end, 4)
    assert [s.filters["createdAt"]["$gte"][11:16] for s in four] == ["00:00", "06:00", "12:00", "18:00"] * 2
    assert [s.day for s in four] == ["2026-06-01"] * 4 + ["2026-06-02"] * 4
    assert [s.index for s in four] == list(range(8))
    assert len(plan_slices(datetime(2026, 4, 1), datetime(2026, 6, 1), 8)) == 61  # many days: one slice a day
    assert len(plan_slices(start, datetime(2026, 6, 2), 8)) == 24  # one day, eight workers: hours


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("POST http://h/graphql giving up after 2 attempt(s)\nwhile retrying: HTTP 429: slow down", "throttled"),
        ("POST http://h/graphql giving up after 2 attempt(s)\nwhile retrying: HTTP 502: bad gateway", "too_big"),
        ("Post http://h/graphql: context deadline exceeded (Client.Timeout exceeded)", "too_big"),
        ("Failed to execute API request: the service process is busy and did not respond in time.", "too_big"),
        ("Post http://h/graphql: dial tcp 127.0.0.1:9: connect: connection refused", "transient"),
        ("input: Cannot query field 'foo'", "fatal"),
        ("POST http://h/graphql giving up after 1 attempt(s)\nwhile retrying: HTTP 400: bad filter", "fatal"),
    ],
)
def test_classify_what_wandb_core_reports(message, kind):
    assert classify(RuntimeError(message)) == kind


def test_progress_line_counts_days_rate_and_eta():
    now = [0.0]
    progress = FetchProgress({"2026-06-01": 2, "2026-06-02": 1, "2026-06-03": 1}, clock=lambda: now[0])
    assert progress.line() == "fetched 0 runs; 0/3 days done; 0 runs/s; ETA unknown"
    progress.expect(0, 300)
    progress.add("2026-06-01", 300)
    progress.slice_done("2026-06-01")
    progress.expect(1, 100)
    progress.add("2026-06-01", 100)
    progress.slice_done("2026-06-01")
    now[0] = 2.0
    # 400 runs in 2 s; the two slices reported 400, so the two unstarted ones are expected to hold 400 more
    assert progress.estimated_total() == 800
    assert progress.line() == "fetched 400 runs; 1/3 days done; 200 runs/s; ETA 2 s"
    assert progress.bar(width=6) == "[##....] " + progress.line()
    # Every day done: how long it took, not an ETA beside "3/3 days done" (issue 33).
    for n, day in ((2, "2026-06-02"), (3, "2026-06-03")):
        progress.expect(n, 200)
        progress.add(day, 200)
        progress.slice_done(day)
    now[0] = 4.0
    assert progress.line() == "fetched 800 runs; 3/3 days done; 200 runs/s; in 4 s"


# ------------------------------------------------------------------------------------------- end to end


def test_requests_in_flight_never_exceed_the_configured_concurrency(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "3")
    server = wandb_server(fleet(days=6, per_day=5))
    server.faults.cost_per_request_s = 0.3  # slow enough that the workers overlap
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 6))
    assert result.success, failure_message(result)
    assert 1 <= server.max_in_flight <= 3  # the property; how many overlapped depends on the machine's load
    metadata = staged_metadata(result)
    assert metadata["max_requests_in_flight"] == server.max_in_flight
    # 6 pages; where the finished runs' wandb-metadata.json are comes with each page (none has one: no download)
    assert (metadata["requests"], metadata["slices"], server.pages_with_files) == (6, 6, 6)
    assert metadata["metadata_files"] == {"missing": 30}
    assert metadata["runs_fetched"] == 30
    assert query_read_only(str(warehouse_path), "SELECT count(*), count(DISTINCT run_id) FROM runs") == [(30, 30)]


def test_a_429_storm_slows_the_fetch_down_and_every_run_is_stored_once(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "4")
    server = wandb_server(fleet(days=8, per_day=6))
    server.faults.cost_per_request_s = 0.05
    server.faults.fail_status, server.faults.fail_count, server.faults.retry_after = 429, 10, 0.3
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 8))
    assert result.success, failure_message(result)
    metadata = staged_metadata(result)
    assert metadata["throttled_responses"] >= 1
    assert metadata["concurrency_decreases"] >= 1 and metadata["lowest_concurrency"] < 4
    assert server.count("Runs") == 8 + 10  # one page per day answered, ten refused
    assert query_read_only(str(warehouse_path), "SELECT count(*), count(DISTINCT run_id) FROM runs") == [(48, 48)]


def test_an_oversized_page_is_split_and_the_size_that_worked_is_kept(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")  # one slice per day, in order
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "200")
    server = wandb_server(fleet(days=2, per_day=60, summary_bytes=1500))
    server.faults.max_page_bytes = 60_000  # about 35 runs: 200, 100 and 50 are refused, 25 fits
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2))
    assert result.success, failure_message(result)
    assert staged_metadata(result)["page_size_final"] == 25
    # Day one: three refused sizes (two attempts each inside wandb-core), then 3 pages of 25; day two starts
    # at 25 and is never refused.
    assert server.oversized_pages == 3 * 2
    assert server.count("Runs") == 3 * 2 + 3 + 3
    assert query_read_only(str(warehouse_path), "SELECT count(*), count(DISTINCT run_id) FROM runs") == [(120, 120)]


def test_a_fetch_failing_half_way_through_a_range_leaves_every_day_as_it_was(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "2")
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "50")
    server = wandb_server(fleet(days=4, per_day=5))
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 4)).success
    rows_before = query_read_only(str(warehouse_path), ROWS_SQL)
    files_before = staged_files(warehouse_path)
    assert len(rows_before) == 20 and len(files_before) == 5  # four days + the (empty) by-id file
    server.upsert_runs(fleet(days=4, per_day=5, name="renamed"))
    server.faults.fail_status, server.faults.fail_count, server.faults.fail_after = 500, -1, 2
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 4))
    assert not result.success
    assert failure_message(result).startswith("step staged_runs: wandb_assets.lib.fetch.WandbFetchError")
    assert query_read_only(str(warehouse_path), ROWS_SQL) == rows_before
    assert staged_files(warehouse_path) == files_before  # two days were fetched, none was published
    server.faults.fail_status = None
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 4)).success
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs WHERE name LIKE 'renamed-%'") == [(20,)]


HOLD_READER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("open", flush=True)
sys.stdin.readline()  # hold the file until told to close (or the test ends)
con.close()
print(f"closed {time.time()}", flush=True)
"""


def _hold_warehouse(path: Path) -> subprocess.Popen:
    """Another process holding the warehouse read-only until ``_release`` (no wall-clock margin)."""
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLD_READER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout.readline().strip() == "open"
    return reader


def _release(reader: subprocess.Popen) -> float:
    """Tell the reader to close; returns when it closed (epoch seconds)."""
    reader.stdin.write("close\n")
    reader.stdin.flush()
    closed_at = float(reader.stdout.readline().split()[1])
    reader.wait(timeout=60)
    return closed_at


def _step_ends(instance, run_id: str) -> dict[str, float]:
    return {
        entry.step_key: entry.timestamp
        for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE})
    }


def test_a_reader_holding_the_warehouse_does_not_stop_the_fetch_and_the_load_waits_for_it(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """While an analyst's read-only connection is open (another process), the fetch runs (it only reads,
    read-only) and the load waits for the lock, up to WANDB_ASSETS_LOCK_WAIT, then writes."""
    server = wandb_server(fleet(days=2, per_day=5))
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2)).success
    server.upsert_runs(fleet(days=2, per_day=5, name="renamed"))
    reader = _hold_warehouse(warehouse_path)
    earlier = {r.run_id for r in instance.get_runs()}
    done: list = []
    backfill = threading.Thread(
        target=lambda: done.append(execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2)))
    )
    backfill.start()
    try:  # the reader closes only once the fetch step has succeeded: the fetch cannot have needed it closed
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not done:
            runs = [r.run_id for r in instance.get_runs() if r.run_id not in earlier]
            if runs and "staged_runs" in _step_ends(instance, runs[0]):
                break
            time.sleep(0.2)
    finally:
        closed_at = _release(reader)
        backfill.join(timeout=300)
    (result,) = done
    assert result.success, failure_message(result)
    ends = _step_ends(instance, result.run_id)
    assert ends["staged_runs"] < closed_at < ends["runs"]  # fetched while the reader held it; loaded after
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs WHERE name LIKE 'renamed-%'") == [(10,)]


def test_a_reader_holding_the_warehouse_longer_than_the_lock_wait_fails_only_the_load(
    wandb_server, warehouse_path, instance, monkeypatch
):
    server = wandb_server(fleet(days=2, per_day=5))
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2)).success
    rows_before = query_read_only(str(warehouse_path), ROWS_SQL)
    server.upsert_runs(fleet(days=2, per_day=5, name="renamed"))
    monkeypatch.setenv("WANDB_ASSETS_LOCK_WAIT", "1")
    reader = _hold_warehouse(warehouse_path)
    try:
        result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2))
    finally:
        _release(reader)
    assert not result.success
    message = failure_message(result)
    assert message.startswith("step runs: RuntimeError: The warehouse ") and "is locked by another process" in message
    assert "staged_runs" in _step_ends(instance, result.run_id)  # the fetch itself succeeded
    assert b"renamed-0" in staged_files(warehouse_path)["2026-06-01.ndjson"]
    assert query_read_only(str(warehouse_path), ROWS_SQL) == rows_before
    assert API_KEY not in message


def test_loading_a_day_that_was_never_fetched_says_what_to_do(wandb_server, warehouse_path, instance):
    from dagster import materialize

    from wandb_assets.defs.wandb_runs.assets import runs
    from wandb_assets.defs.warehouse.resources import warehouse_resource

    result = materialize(
        [runs],
        partition_key="2026-06-01",
        resources={"warehouse": warehouse_resource()},
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    assert "No staged runs for 1 day(s) (2026-06-01.ndjson)" in failure_message(result)
    assert "materialize staged_runs for them first" in failure_message(result)


def test_cli_backfill_draws_a_progress_bar_on_a_terminal(wandb_server, dagster_home, capsys, monkeypatch):
    import wandb_assets.commands.runs as runs_commands
    import wandb_assets.defs.wandb_runs.assets as runs_module
    from tests.conftest import cli

    wandb_server(fleet(days=3, per_day=4))
    monkeypatch.setattr(runs_commands, "is_terminal", lambda stream: True)
    monkeypatch.setattr(runs_module, "PROGRESS_LOG_EVERY_S", 0.0)
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-03")
    assert code == 0, err
    assert "\r\x1b[K[" + "#" * 30 + "] fetched 12 runs; 3/3 days done; " in err
    assert "Fetch progress" not in err  # the run's progress lines went to its log at DEBUG, not to the terminal


def test_cli_backfill_logs_progress_lines_when_not_on_a_terminal(wandb_server, dagster_home, capsys, monkeypatch):
    import wandb_assets.defs.wandb_runs.assets as runs_module
    from tests.conftest import cli

    wandb_server(fleet(days=3, per_day=4))
    monkeypatch.setattr(runs_module, "PROGRESS_LOG_EVERY_S", 0.0)  # a line at every report, not every 10 s
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-03")
    assert code == 0, err
    assert "\r" not in err
    assert "staged_runs - Fetch progress: fetched " in err
    assert "Fetched 12 runs created 2026-06-01 .. 2026-06-04 (exclusive) for test-team/test-project: " in err
    assert "fetched 12 runs; 3/3 days done; " in err


def test_runs_refreshed_by_id_never_replace_a_copy_fetched_later(memory_con, tmp_path):
    """Reloading an old staged file cannot turn back the clock on an older unfinished run."""
    from wandb_assets.lib.warehouse import load_runs_window, ndjson_lines

    def staged(name: str, state: str, fetched_at: datetime) -> str:
        path = tmp_path / name
        row = {"run_id": "old-run", "state": state, "created_at": datetime(2026, 5, 1), "anomalies": []}
        row.update(entity="team", project="proj")
        path.write_text("".join(ndjson_lines([row], fetched_at)))
        return str(path)

    empty = tmp_path / "empty.ndjson"
    empty.write_text("")
    window = (datetime(2026, 6, 1), datetime(2026, 6, 2))
    load_runs_window(memory_con, [str(empty)], *window, [staged("a", "finished", datetime(2026, 6, 1, 12))])
    load_runs_window(memory_con, [str(empty)], *window, [staged("b", "running", datetime(2026, 6, 1, 9))])
    assert memory_con.execute("SELECT state, ingested_at FROM runs").fetchall() == [
        ("finished", datetime(2026, 6, 1, 12))
    ]
    load_runs_window(memory_con, [str(empty)], *window, [staged("c", "crashed", datetime(2026, 6, 1, 13))])
    assert memory_con.execute("SELECT state FROM runs").fetchall() == [("crashed",)]


def _staged_at(
    path: Path, runs: list[tuple], fetched_at: datetime, source: str | None = None, asked: list[str] | None = None
) -> str:
    """A staged file of ``(run_id, state, created_at)`` rows fetched at ``fetched_at`` (naive UTC), whose
    modification time says so, as ``StagedFetch.publish`` sets it. ``asked``: the run ids of ``team/proj`` the fetch
    asked for by id (a header as a by-id file has)."""
    import json
    import os
    from datetime import UTC

    from wandb_assets.lib.warehouse import ASKED_KEY, WHOLE_KEY, ndjson_lines

    rows = [
        {
            "entity": "team",
            "project": "proj",
            "run_id": r,
            "state": st,
            "created_at": c,
            "anomalies": [],
            "source": source,
        }
        for r, st, c in runs
    ]
    header = json.dumps({WHOLE_KEY: ["team/proj"], ASKED_KEY: {"team/proj": asked}}) + "\n" if asked is not None else ""
    path.write_text(header + "".join(ndjson_lines(rows, fetched_at)))
    stamp = fetched_at.replace(tzinfo=UTC).timestamp()
    os.utime(path, (stamp, stamp))
    return str(path)


def test_a_stale_window_file_loaded_last_cannot_turn_back_the_clock(memory_con, tmp_path):
    """A slow fetch that began at 10:14 is loaded after a tick that fetched at 10:15: the tick's newer state of
    a run stays, and a run the tick found (created after the slow fetch read its page) is not judged. A run the
    stale file lacks that was fetched before it began is kept, marked vanished (W&B no longer has it)."""
    from wandb_assets.lib.warehouse import load_runs_window

    day = datetime(2026, 6, 1)
    window = (day, day + timedelta(days=1))
    early = _staged_at(tmp_path / "early", [("gone", "finished", day + timedelta(hours=1))], datetime(2026, 6, 1, 9))
    load_runs_window(memory_con, [early], *window)
    slow = tmp_path / "slow.ndjson"
    tick = _staged_at(
        tmp_path / "tick",
        [("r1", "finished", day + timedelta(hours=8)), ("r2", "running", day + timedelta(hours=10))],
        datetime(2026, 6, 1, 10, 15),
    )
    _staged_at(slow, [("r1", "running", day + timedelta(hours=8))], datetime(2026, 6, 1, 10, 14))
    assert load_runs_window(memory_con, [tick], *window) == 2
    assert load_runs_window(memory_con, [str(slow)], *window) == 0  # its only row is older than the tick's copy
    got = memory_con.execute("SELECT run_id, state, anomalies, ingested_at FROM runs ORDER BY run_id").fetchall()
    assert got == [
        ("gone", "finished", ["vanished"], datetime(2026, 6, 1, 9)),  # ended: its state (and counts) as they were
        ("r1", "finished", [], datetime(2026, 6, 1, 10, 15)),
        ("r2", "running", [], datetime(2026, 6, 1, 10, 15)),
    ]
    # A fresher file replaces r1, and r2 (fetched before it began, no longer in W&B's answer) is last seen.
    fresh = _staged_at(tmp_path / "fresh", [("r1", "crashed", day + timedelta(hours=8))], datetime(2026, 6, 1, 11))
    load_runs_window(memory_con, [fresh], *window)
    assert memory_con.execute("SELECT run_id, state, anomalies FROM runs ORDER BY 1").fetchall() == [
        ("gone", "finished", ["vanished"]),
        ("r1", "crashed", []),
        ("r2", "vanished", ["vanished"]),
    ]


def test_an_alive_run_w_and_b_no_longer_returns_by_id_is_marked_vanished(memory_con, tmp_path):
    """The by-id refresh asks for every run held alive before the window; one W&B did not return (deleted or
    moved) becomes ``vanished`` (counted in its anomalies) instead of running forever. Offline rows are never
    asked for, never vanish, and do not pull the tick's look-back."""
    from wandb_assets.lib.warehouse import load_runs_window, read_oldest_unfinished_day, unfinished_run_ids

    old = datetime(2026, 5, 20)
    first = _staged_at(
        tmp_path / "first",
        [("alive1", "running", old), ("alive2", "running", old + timedelta(days=1)), ("done", "finished", old)],
        datetime(2026, 5, 22),
    )
    load_runs_window(memory_con, [first], old, old + timedelta(days=3))
    offline = _staged_at(tmp_path / "offline", [("off1", "running", old)], datetime(2026, 5, 22), source="offline")
    memory_con.execute(f"INSERT INTO runs BY NAME SELECT * FROM read_json('{offline}')")
    start = datetime(2026, 6, 1)
    assert unfinished_run_ids(memory_con, start) == ["alive1", "alive2"]
    assert read_oldest_unfinished_day(memory_con) == old.date()
    empty = _staged_at(tmp_path / "window", [], datetime(2026, 6, 1, 12))
    by_id = _staged_at(
        tmp_path / "by-id",
        [("alive2", "finished", old + timedelta(days=1))],
        datetime(2026, 6, 1, 12),
        asked=["alive1", "alive2"],
    )
    load_runs_window(memory_con, [empty], start, start + timedelta(days=1), [by_id])
    got = memory_con.execute("SELECT run_id, state, anomalies FROM runs ORDER BY run_id").fetchall()
    assert got == [
        ("alive1", "vanished", ["vanished"]),
        ("alive2", "finished", []),
        ("done", "finished", []),
        ("off1", "running", []),
    ]
    assert unfinished_run_ids(memory_con, start) == [] and read_oldest_unfinished_day(memory_con) is None
    # An old by-id file (fetched before alive1 was last seen) vanishes nothing.
    memory_con.execute("UPDATE runs SET state = 'running', anomalies = [] WHERE run_id = 'alive1'")
    stale = _staged_at(tmp_path / "stale", [], datetime(2026, 5, 21), asked=["alive1"])
    load_runs_window(memory_con, [empty], start, start + timedelta(days=1), [stale])
    assert memory_con.execute("SELECT state FROM runs WHERE run_id = 'alive1'").fetchall() == [("running",)]


def test_local_server_index_selects_exactly_what_a_full_scan_does():
    """The local server narrows createdAt ranges and id lists by index (as a real server would); the answer
    must equal a scan of every run, including bounds that fall exactly on a run's creation time."""
    import json

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.filters import matches, sort_runs

    nodes = fleet(days=3, per_day=10) + [make_run_node("undated", display_name="u", state="running", created_at=None)]
    store = LocalWandbServer(nodes)._projects[("demo-team", "demo-project")]
    queries = [
        created_between(datetime(2026, 6, 1, 2, 1), datetime(2026, 6, 2, 12)),  # starts on r01-001's time
        {"createdAt": {"$gt": "2026-06-01T02:01:00Z", "$lte": "2026-06-02T12:05:00Z"}},
        {"createdAt": {"$gte": "2026-06-03T00:00:00Z"}},
        {"name": {"$in": ["r02-003", "nope", "r01-000", "r02-003"]}},
        {"createdAt": {"$gte": "2026-06-01T00:00:00Z"}, "state": "finished"},
    ]
    for filters in queries:
        every = sort_runs([r for r in store.records.values() if matches(r, filters)], "+created_at")
        indexed = store.select(json.dumps(filters), "+created_at")
        assert [r["node"]["name"] for r in indexed] == [r["node"]["name"] for r in every], filters
    # runs are created at 00:00, 02:01, 04:02, 07:03, 09:04, 12:05, ... each day
    assert len(store.select(json.dumps(queries[0]), "+created_at")) == 9 + 5
    assert len(store.select(json.dumps(queries[1]), "+created_at")) == 8 + 6


def test_writer_hold_is_measured_per_writer_connection(warehouse_path):
    """Each step reports how long its own writer connection was open: not an earlier, longer one of the same
    run (one resource serves every step), and not a read-only connection."""
    from wandb_assets.defs.warehouse.resources import warehouse_resource

    warehouse = warehouse_resource()
    with warehouse.get_connection():  # the schema is created here, outside what is measured below (a fresh
        pass  # interpreter's first parameterised statement alone took 2.2 s in review)
    with warehouse.get_connection():
        time.sleep(0.3)
    first = warehouse.last_writer_hold_s()
    assert first >= 0.3
    with warehouse.get_connection():
        pass
    second = warehouse.last_writer_hold_s()
    assert second < first  # the second step's own, shorter connection, not the earlier one
    with warehouse.get_read_connection():
        time.sleep(0.3)
    assert warehouse.last_writer_hold_s() == second  # a reader is not a writer: the value is untouched


def _fetch_with(server, slices, handle_page, enrich, concurrency: int = 1):
    """``lib.fetch.fetch_slices`` through the real client against ``server``, ``concurrency`` requests at most."""
    import wandb

    from wandb_assets.lib.fetch import FetchPolicy, fetch_slices

    api = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
    progress = FetchProgress({piece.day: 1 for piece in slices})
    stats = fetch_slices(
        api,
        server.entity,
        server.project,
        slices,
        FetchPolicy(concurrency=concurrency),
        handle_page,
        progress=progress,
        enrich=enrich,
        with_metadata_file=True,
    )
    return stats, progress


def test_a_pages_metadata_is_read_while_the_next_pages_are_fetched(wandb_server, monkeypatch, tmp_path):
    """With one request in flight, the first page's enrichment (its downloads) waits while the fetch goes on: it
    runs beside the fetch, not in its request slot, and the fetch stops after the pages that may wait (two per
    worker: the second page waiting, the third fetched and held back). Every page is handled once, every day done."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = wandb_server(fleet(days=4, per_day=3))
    slices = plan_slices(datetime(2026, 6, 1), datetime(2026, 6, 5), concurrency=1)
    assert len(slices) == 4
    saw_pages: list[int] = []
    handled: list[tuple[str, int]] = []
    lock = threading.Lock()

    def enrich(piece, nodes):
        if not saw_pages:  # the first page: wait for the fetch to go on without it
            deadline = time.monotonic() + 10
            while server.count("Runs") < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)  # were the backlog unbounded, the fourth page would be asked meanwhile
            saw_pages.append(server.count("Runs"))

    def handle_page(piece, nodes):
        with lock:
            handled.append((piece.day, len(nodes)))

    stats, progress = _fetch_with(server, slices, handle_page, enrich)
    assert saw_pages == [3]
    assert sorted(handled) == [("2026-06-01", 3), ("2026-06-02", 3), ("2026-06-03", 3), ("2026-06-04", 3)]
    assert (stats.requests, stats.max_in_flight, progress.runs, server.pages_with_files) == (4, 1, 12, 4)
    assert "4/4 days done" in progress.line()


def test_a_page_that_cannot_be_handled_fails_the_fetch_and_stops_it(wandb_server, monkeypatch, tmp_path):
    """A failure while handling a page (here: the staging disk) is raised by the fetch, which asks no more pages."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = wandb_server(fleet(days=6, per_day=2))
    slices = plan_slices(datetime(2026, 6, 1), datetime(2026, 6, 7), concurrency=1)

    def handle_page(piece, nodes):
        time.sleep(0.2)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        _fetch_with(server, slices, handle_page, lambda piece, nodes: None)
    assert server.count("Runs") < 6


def test_prune_staged_deletes_only_day_files_older_than_the_retention_and_never_what_was_just_read(tmp_path):
    from wandb_assets.lib.staging import RUNS_FOLDER, prune_staged

    folder = tmp_path / RUNS_FOLDER
    (folder / ".fetch-abc").mkdir(parents=True)
    names = [
        "2026-05-30.ndjson",
        "2026-05-31.ndjson",
        "refreshed-before-2026-05-31.ndjson",
        "2026-06-01.ndjson",
        "refreshed-before-2026-06-01.ndjson",
        "2026-06-02.ndjson",
        "notes.ndjson",
    ]
    fetched = datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp()  # (as publish stamps them: when their fetch began)
    for name in names:
        (folder / name).write_text("{}\n")
        os.utime(folder / name, (fetched, fetched))
    (tmp_path / "projects.json").write_text("{}")
    # A backfill just published an old day, not yet loaded (a tick's load may run between its fetch and its load):
    # its fetch is today's, so it stays (finding 14 of code-review-2026-11c).
    (folder / "2026-05-29.ndjson").write_text("{}\n")
    today = date(2026, 6, 3)
    assert prune_staged(tmp_path, today, 0) == []
    assert prune_staged(tmp_path, today, 2, keep=[folder / "2026-05-30.ndjson"]) == []  # fetched 06-01: too new
    pruned = prune_staged(tmp_path, date(2026, 6, 4), 2, keep=[folder / "2026-05-30.ndjson"])  # cutoff 2026-06-02
    assert [p.name for p in pruned] == [
        "2026-05-31.ndjson",
        "2026-06-01.ndjson",
        "refreshed-before-2026-05-31.ndjson",
        "refreshed-before-2026-06-01.ndjson",
    ]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [".fetch-abc", "2026-05-29.ndjson", "2026-05-30.ndjson", "2026-06-02.ndjson", "notes.ndjson"]
    )
    assert (tmp_path / "projects.json").exists()


def test_a_load_prunes_staged_days_past_the_retention_and_a_runs_only_reload_of_its_window_still_works(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Days of June 2026 are months old: the first backfill keeps its own files (it just read them), the second
    prunes the first's; reloading the second's window from staging alone works, reloading a pruned day says
    what to do, and the warehouse keeps every row."""
    from dagster import materialize

    from wandb_assets.defs.wandb_runs.assets import runs
    from wandb_assets.defs.warehouse.resources import warehouse_resource

    monkeypatch.setenv("WANDB_ASSETS_STAGING_RETENTION_DAYS", "30")
    wandb_server(fleet(days=5, per_day=2))
    first = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 3))
    assert first.success, failure_message(first)
    loaded = first.asset_materializations_for_node("runs")[0].metadata
    assert loaded["staged_files_pruned"].value == 0
    assert sorted(staged_files(warehouse_path)) == [
        "2026-06-01.ndjson",
        "2026-06-02.ndjson",
        "2026-06-03.ndjson",
        "refreshed-before-2026-06-01.ndjson",
    ]
    long_ago = datetime(2026, 6, 4, tzinfo=UTC).timestamp()  # fetched months ago, as their days were
    for path in (warehouse_path.parent / "staging" / "runs").iterdir():
        os.utime(path, (long_ago, long_ago))
    second = execute_backfill(instance, date(2026, 6, 4), date(2026, 6, 5))
    assert second.success, failure_message(second)
    assert second.asset_materializations_for_node("runs")[0].metadata["staged_files_pruned"].value == 4
    assert sorted(staged_files(warehouse_path)) == [
        "2026-06-04.ndjson",
        "2026-06-05.ndjson",
        "refreshed-before-2026-06-04.ndjson",
    ]
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs") == [(10,)]

    def reload(partitions: str):
        return materialize(
            [runs],
            partition_key=partitions,
            resources={"warehouse": warehouse_resource()},
            instance=instance,
            raise_on_error=False,
        )

    assert reload("2026-06-05").success
    gone = reload("2026-06-01")
    assert "No staged runs for 1 day(s) (2026-06-01.ndjson)" in failure_message(gone)
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs") == [(10,)]


@pytest.mark.parametrize("folder", ["staging[1]", "stag*ing", "stag?ng"])
def test_a_staging_folder_named_with_glob_characters_loads_its_own_files_only(memory_con, tmp_path, folder):
    """Finding 16 of code-review-2026-11c: DuckDB's reader globbed the path, so ``staging[1]`` loaded ``staging1``."""
    from wandb_assets.lib.warehouse import load_runs_window

    paths = {}
    for name in (folder, "staging1", "stagging", "stagXng", "staging"):
        (tmp_path / name).mkdir(exist_ok=True)
        paths[name] = _staged_at(
            tmp_path / name / "2026-06-01.ndjson", [(name, "finished", datetime(2026, 6, 1, 1))], datetime(2026, 6, 2)
        )
    load_runs_window(memory_con, [paths[folder]], datetime(2026, 6, 1), datetime(2026, 6, 2))
    assert memory_con.execute("SELECT run_id FROM runs").fetchall() == [(folder,)]


def test_a_fetch_removes_the_private_folders_of_fetches_that_were_killed(tmp_path):
    """code-review-2026-11c: ``.fetch-*`` folders of a killed fetch (SIGKILL, OOM: no ``finally``) leaked for good
    outside Helm. A new fetch removes those whose process is gone, and any older than two days; a live one stays."""
    import subprocess
    import sys

    from wandb_assets.lib.staging import StagedFetch

    folder = tmp_path / "runs"
    folder.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = folder / f".fetch-{gone.stdout.strip()}-abc"
    live = folder / f".fetch-{os.getpid()}-def"
    old = folder / ".fetch-legacy1"
    for path in (killed, live, old):
        path.mkdir()
        (path / "part-00000-000001.ndjson").write_text("{}\n")
    three_days_ago = time.time() - 3 * 86400
    os.utime(old, (three_days_ago, three_days_ago))
    fetch = StagedFetch(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted([live.name, fetch.work.name])
    fetch.discard()


def test_two_fetches_at_once_on_one_staging_folder_each_read_their_own_projects_report(tmp_path):
    """code-review-2026-11c (suspected, §3): two fetches on one staging folder each replaced ``projects.json``, so a
    ``wandb_projects`` step could record the other fetch's findings. Each run now reads the report its own fetch left
    (the shared one stays for a step run alone)."""
    from wandb_assets.lib.staging import read_projects_report, write_projects_report

    write_projects_report(tmp_path, datetime(2026, 6, 1, 10), ["e/a"], {}, run_id="run-a")
    write_projects_report(tmp_path, datetime(2026, 6, 1, 11), ["e/b"], {"e/c": "HTTP 500"}, run_id="run-b")
    a = read_projects_report(tmp_path, "run-a")
    assert (a[0], [(p["project"], p["error"]) for p in a[1]]) == (datetime(2026, 6, 1, 10), [("a", None)])
    b = read_projects_report(tmp_path, "run-b")
    assert [(p["project"], p["error"]) for p in b[1]] == [("b", None), ("c", "HTTP 500")]
    assert read_projects_report(tmp_path, "run-c")[0] == datetime(2026, 6, 1, 11)  # no report of its own: the last
