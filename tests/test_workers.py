"""Fetched pages normalised in worker processes: the same rows as in the fetching process, failures loud.

``lib.workers.ProcessPool`` is driven directly with real worker processes; ``lib.staging.PageStager`` stages the
same pages in this process and in workers and the published files must be byte for byte the same; a real
backfill through the wandb client then loads identical warehouse rows either way.
"""

import json
import math
import os
import re
import signal
import threading
import time
from datetime import date, datetime

import pytest

from tests.conftest import child_processes
from tests.test_ingestion import staged_files, staged_metadata
from wandb_assets.lib import fetch as fetch_rules
from wandb_assets.lib import staging
from wandb_assets.lib.staging import Page, PageStager, RowRules, StagedFetch, day_file
from wandb_assets.lib.workers import ProcessPool, WorkerError
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill, failure_message
from wandb_assets.warehouse import query_read_only

# ------------------------------------------------------------------------------------------- the pool


def test_a_pool_returns_each_calls_result_to_its_callback():
    pool = ProcessPool(2)
    results: list = []
    try:
        for n in range(6):
            pool.submit(divmod, (10 * n + 7, 3), results.append)
        pool.join()
    finally:
        pool.close()
    assert sorted(results) == [(2, 1), (5, 2), (9, 0), (12, 1), (15, 2), (19, 0)]


def test_a_worker_imports_only_what_it_is_handed():
    pool = ProcessPool(1)
    seen: list = []
    try:  # eval is sent by name; the worker has not imported Dagster, wandb or DuckDB
        pool.submit(eval, ("sorted({'dagster', 'wandb', 'duckdb'} & set(__import__('sys').modules))",), seen.append)
        pool.join()
    finally:
        pool.close()
    assert seen == [[]]


def test_a_call_that_raises_fails_join_and_every_later_submit():
    pool = ProcessPool(1)
    try:
        pool.submit(divmod, (1, 0), lambda _: None)
        with pytest.raises(WorkerError, match=r"^divmod failed in a worker process: ZeroDivisionError: "):
            pool.join()
        with pytest.raises(WorkerError, match="ZeroDivisionError"):
            pool.submit(divmod, (4, 2), lambda _: None)
    finally:
        pool.close()


def test_a_worker_that_dies_is_reported_not_waited_for():
    pool = ProcessPool(1)
    try:
        pool.processes[0].kill()
        pool.submit(divmod, (4, 2), lambda _: None)
        with pytest.raises(WorkerError, match=r"^A worker process exited \(code -9\) during divmod\.$"):
            pool.join()
    finally:
        pool.close()
    assert pool.processes[0].returncode == -9


# ------------------------------------------------------------------------------------------- staging pages


def hostile_nodes() -> list[dict]:
    """Runs of 2026-06-01 and 02 with what real W&B data holds: NaN and Infinity, summaries JSON-encoded one to
    three times or sent as objects, lone surrogates, a malformed summary, nested configs, crashed and CI runs, no
    display name."""
    nodes = []
    for n in range(40):
        day = 1 + n % 2
        nodes.append(
            make_run_node(
                f"h{n:03d}",
                display_name=None if n % 3 == 0 else f"github.sky.main.abc{n}.ppo.{1780000000 + n}",
                state=("finished", "crashed", "running", "failed")[n % 4],
                created_at=datetime(2026, 6, day, n % 24, n % 60),
                heartbeat_at=datetime(2026, 6, day, 23, 0),
                config={
                    "compute.gpu_count": (8, "4", 2.5, None)[n % 4],
                    "lr": math.nan if n % 5 == 0 else 0.1,
                    "slurm": {"job_id": 1000 + n, "nodes": [{"host": f"gpu{n}"}]},  # nested
                },
                summary={"overview/sps": (math.nan, math.inf, 1234.5, "fast")[n % 4], "_step": n, "tag": "caf\udce9"}
                if n % 7
                else "{not json",
                summary_encoding=("json", "double", "triple", "object")[n % 4] if n % 7 else "raw",
                tags=[f"t{n}", "x\udce9"] if n % 6 == 0 else [f"t{n}"],
                system_metrics={f"system.gpu.{i}.gpu": 10.0 * i + n for i in range(n % 3)},
            )
        )
    return nodes


def _stage(tmp_path, name: str, processes: int, from_runs: int, nodes: list[dict]):
    """Stage ``nodes`` as pages of 7 over two one-day slices, then publish; the day files and the tally."""
    staging_dir = tmp_path / name
    staged = StagedFetch(staging_dir)
    stager = PageStager(staged, RowRules("http://w.example", 1, ("compute.gpu_count",)), processes, from_runs)
    at = datetime(2026, 6, 3, 12, 0)
    try:
        for index, day in enumerate(("2026-06-01", "2026-06-02")):
            of_day = [node for node in nodes if node["createdAt"].startswith(day)]
            for page in range(0, len(of_day), 7):
                chunk = of_day[page : page + 7]
                stager.stage(Page(index, page // 7 + 1, (day,), "team", "proj", chunk, [None] * len(chunk), at))
        tally = stager.finish()
        staged.publish({day_file(staging_dir, d): [(i, d)] for i, d in enumerate(("2026-06-01", "2026-06-02"))})
    finally:
        stager.close()
        staged.discard()
    return {d: day_file(staging_dir, d).read_bytes() for d in ("2026-06-01", "2026-06-02")}, tally


def test_pages_staged_by_worker_processes_are_the_bytes_staged_in_process(tmp_path):
    nodes = hostile_nodes()
    here, here_tally = _stage(tmp_path, "here", processes=0, from_runs=0, nodes=nodes)
    there, there_tally = _stage(tmp_path, "workers", processes=2, from_runs=7, nodes=nodes)  # page 1 here
    assert there == here
    lines = {day: [json.loads(line) for line in text.splitlines()] for day, text in here.items()}
    assert [len(rows) for rows in lines.values()] == [20, 20]
    assert [row["run_id"] for row in lines["2026-06-01"]][:3] == ["h000", "h002", "h004"]  # pages in order
    h001 = next(row for row in lines["2026-06-02"] if row["run_id"] == "h001")
    assert (h001["slurm_job_id"], json.loads(h001["config"])["slurm"]["nodes"]) == ("1001", [{"host": "gpu1"}])
    assert sorted(there_tally.malformed) == sorted(here_tally.malformed)
    assert there_tally.categories == here_tally.categories == {"push_to_main": 26, "regular": 14}
    assert there_tally.runs_by_day == here_tally.runs_by_day == {"2026-06-01": 20, "2026-06-02": 20}
    # summary: the 6 runs n % 7 == 0 ("{not json"); text_encoding: the other 34 summaries hold "caf\udce9", and
    # h000 a tag "x\udce9"; overview/sps NaN or Infinity (n % 4 < 2) in 17 of the 34; compute.gpu_count 2.5
    # (n % 4 == 2) in 10; every run has at least one, so all 40 are malformed
    expected = {"summary": 6, "text_encoding": 35, "sps_overview_sps": 17, "gpu_count": 10}
    assert there_tally.anomalies == here_tally.anomalies == expected
    assert len(there_tally.malformed) == len(here_tally.malformed) == 40


def test_a_page_failing_in_a_worker_fails_the_staging(tmp_path):
    staged = StagedFetch(tmp_path / "s")
    stager = PageStager(staged, RowRules("http://w.example", 1, ()), processes=1, from_runs=0)
    try:
        stager.stage(Page(0, 1, ("2026-06-01",), "team", "proj", [{"name": "x"}], [], datetime(2026, 6, 1)))
        with pytest.raises(WorkerError, match=r"^stage_page failed in a worker process: ValueError: zip\(\) "):
            stager.finish()
    finally:
        stager.close()
        staged.discard()


def test_a_backfill_normalising_in_worker_processes_loads_the_same_rows(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setattr(fetch_rules, "MIN_PAGE_SIZE", 1)  # pages smaller than users may ask for
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "5")
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")  # one slice per day, its pages in order
    monkeypatch.setattr(staging, "PROCESSES_FROM_RUNS", 10)  # the first pages here, the rest in 2 workers
    wandb_server(hostile_nodes())
    submitted: list = []

    class CountingPool(ProcessPool):
        def submit(self, function, args, on_result):
            submitted.append(args[1].page)
            super().submit(function, args, on_result)

    monkeypatch.setattr(staging, "ProcessPool", CountingPool)
    rows, pages = {}, {}
    for processes in ("0", "2"):
        warehouse_path.unlink(missing_ok=True)
        monkeypatch.setenv("WANDB_ASSETS_STAGING_PROCESSES", processes)
        result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2))
        assert result.success, failure_message(result)
        metadata = staged_metadata(result)
        assert (metadata["runs_fetched"], metadata["malformed_runs"]) == (40, 40)
        rows[processes] = query_read_only(
            warehouse_path, "SELECT * EXCLUDE (ingested_at, curves_read_at) FROM runs ORDER BY run_id"
        )
        pages[processes], submitted[:] = len(submitted), []
    # 8 pages of 5 runs: the first two (10 runs) staged here, the other six by the workers
    assert pages == {"0": 0, "2": 6}
    assert len(rows["2"]) == 40 and rows["2"] == rows["0"]


def _kill_a_worker_when_it_starts(stop: threading.Event) -> None:
    """Kill the first page worker of this process that appears (SIGKILL, as the kernel's OOM killer would)."""
    while not stop.is_set():
        for pid, command in child_processes().items():
            if b"wandb_assets.lib.workers" in command:
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.01)


def test_a_worker_killed_mid_fetch_fails_the_backfill_and_leaves_the_warehouse_and_staging_as_they_were(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setattr(fetch_rules, "MIN_PAGE_SIZE", 1)  # pages smaller than users may ask for
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "5")
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")
    server = wandb_server(hostile_nodes())
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2)).success  # in process: 40 runs < 1,000
    rows_before = query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY run_id")
    files_before = staged_files(warehouse_path)
    monkeypatch.setattr(staging, "PROCESSES_FROM_RUNS", 10)
    server.faults.cost_per_request_s = 0.2  # 8 pages: time for the killer to find the worker
    stop = threading.Event()
    killer = threading.Thread(target=_kill_a_worker_when_it_starts, args=(stop,), daemon=True)
    killer.start()
    try:
        result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 2))
    finally:
        stop.set()
        killer.join()
    assert not result.success
    assert re.search(r"WorkerError: A worker process exited \(code -9\) during stage_page\.", failure_message(result))
    assert query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY run_id") == rows_before
    assert staged_files(warehouse_path) == files_before


def test_cancelling_a_pool_kills_a_worker_whose_call_hangs_instead_of_waiting_for_it():
    """code-review-2026-11c: a worker that hangs blocked ProcessPool.close() for good (the feeder's join had no
    timeout), so a backfill (no max_runtime) hung with it. Cancelled, the pool kills it after its grace."""
    pool = ProcessPool(1)
    pool.submit(time.sleep, (3600,), lambda result: None)
    time.sleep(0.5)  # the call is running in the worker
    started = time.monotonic()
    pool.close(cancel=True, grace_s=1.0)
    assert time.monotonic() - started < 10
    assert all(process.poll() is not None for process in pool.processes)
