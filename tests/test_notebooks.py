"""Notebooks: committed clean, executed headless against a synthetic warehouse, and never in the way of the
pipeline (a refresh in another process while a notebook reads; a reader holding the snapshot for good)."""

import os
import shutil
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import nbformat
import papermill
import pytest
from dagster import instance_for_test

from tests.conftest import API_KEY, ENTITY, PROJECT
from wandb_assets.localwandb import LocalWandbServer
from wandb_assets.localwandb.synthetic import generate_fleet
from wandb_assets.ticks import execute_backfill, run_tick
from wandb_assets.warehouse import open_snapshot, snapshot_path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CHARTS = {"fleet_overview": 3, "push_to_main_throughput": 2, "sweeps": 1}
NOW = datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def fleet_server() -> LocalWandbServer:
    return LocalWandbServer(generate_fleet(NOW, days=8, runs_per_day=60), entity=ENTITY, project=PROJECT).start()


def point_at(monkeypatch, server: LocalWandbServer) -> None:
    for name, value in {
        "WANDB_BASE_URL": server.url,
        "WANDB_API_KEY": API_KEY,
        "WANDB_ENTITY": ENTITY,
        "WANDB_PROJECT": PROJECT,
    }.items():
        monkeypatch.setenv(name, value)


def build_warehouse(instance) -> None:
    assert execute_backfill(instance, (NOW - timedelta(days=8)).date(), NOW.date()).success
    assert all(r.success for r in run_tick(instance, NOW.date()))


@pytest.fixture(scope="module")
def notebook_warehouse(tmp_path_factory) -> Path:
    """A synthetic warehouse's snapshot, copied where no other test touches it."""
    target = tmp_path_factory.mktemp("nb") / "analytics.duckdb"
    with pytest.MonkeyPatch.context() as monkeypatch, instance_for_test() as instance:
        server = fleet_server()
        try:
            point_at(monkeypatch, server)
            Path(os.environ["WANDB_ASSETS_DUCKDB"]).unlink(missing_ok=True)
            build_warehouse(instance)
        finally:
            server.stop()
        shutil.copyfile(snapshot_path(os.environ["WANDB_ASSETS_DUCKDB"]), snapshot_path(target))
    return target


def execute(notebook: Path, warehouse: Path, output: Path) -> nbformat.NotebookNode:
    papermill.execute_notebook(
        str(notebook),
        str(output),
        parameters={"warehouse_path": str(warehouse)},
        kernel_name="python3",
        progress_bar=False,
        cwd=str(REPO),
    )
    return nbformat.read(str(output), as_version=4)


def images(notebook: nbformat.NotebookNode) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def test_there_are_the_three_notebooks():
    assert [p.stem for p in NOTEBOOKS] == sorted(CHARTS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs_and_has_parameters(path):
    notebook = nbformat.read(str(path), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    assert any("warehouse.open_snapshot(warehouse_path)" in cell.source for cell in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless_and_draws_its_charts(path, notebook_warehouse, tmp_path):
    executed = execute(path, notebook_warehouse, tmp_path / path.name)
    assert images(executed) == CHARTS[path.stem]
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []


def test_notebook_and_refresh_in_another_process_both_succeed(monkeypatch, tmp_path, warehouse_path):
    server = fleet_server()
    try:
        point_at(monkeypatch, server)
        with instance_for_test() as instance:
            build_warehouse(instance)
        server.faults.latency_s = 0.5  # keep the refresh writing while the notebook reads
        env = {**os.environ}
        env.pop("DAGSTER_HOME", None)
        refresh = subprocess.Popen(
            [sys.executable, "-m", "wandb_assets.cli", "refresh", "--quiet"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        refresh_ended: list[datetime] = []
        watcher = threading.Thread(target=lambda: (refresh.wait(), refresh_ended.append(datetime.now())))
        watcher.start()
        notebook_started = datetime.now()
        executed = execute(REPO / "notebooks" / "fleet_overview.ipynb", warehouse_path, tmp_path / "out.ipynb")
        out, err = refresh.communicate(timeout=300)
        watcher.join()
        assert refresh.returncode == 0, err
        assert refresh_ended[0] > notebook_started  # the refresh was still writing while the notebook ran
        assert images(executed) == CHARTS["fleet_overview"]
        assert (
            duckdb.connect(str(snapshot_path(warehouse_path)), read_only=True)
            .execute("SELECT count(DISTINCT snapshot_at) FROM fleet_metrics")
            .fetchone()[0]
            == 2
        )
    finally:
        server.stop()


def test_a_reader_holding_the_snapshot_blocks_no_tick(monkeypatch, warehouse_path):
    server = fleet_server()
    try:
        point_at(monkeypatch, server)
        with instance_for_test() as instance:
            build_warehouse(instance)
            held = open_snapshot()  # an analyst's connection, never closed during the ticks
            before = held.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0]
            for minute in (15, 30):
                results = run_tick(instance, NOW.date(), snapshot_at=(NOW + timedelta(minutes=minute)).isoformat())
                assert all(r.success for r in results)
            assert held.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0] == before  # its own view
            fresh = open_snapshot()
            assert fresh.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0] == before + 40
    finally:
        server.stop()


def test_a_process_locking_the_warehouse_itself_gets_a_clear_error(monkeypatch, wandb_server, warehouse_path, instance):
    from tests.test_pipeline_e2e import dataset, failing_day_materialization

    wandb_server(dataset())
    monkeypatch.setenv("WANDB_ASSETS_LOCK_WAIT", "1")
    warehouse_path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('locked', flush=True); time.sleep(60)",
            str(warehouse_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        error = failing_day_materialization(instance)
        assert "is locked by another process" in error
        assert "gave up after 1 s (WANDB_ASSETS_LOCK_WAIT)" in error
    finally:
        holder.kill()
        holder.wait()


def test_open_snapshot_without_one_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="published after each successful tick or backfill"):
        open_snapshot(tmp_path / "none.duckdb")


def test_helpers_answer_the_common_questions(notebook_warehouse):
    from wandb_assets import warehouse

    con = open_snapshot(notebook_warehouse)
    assert list(warehouse.gauges_over_time(con).columns)[:1] == ["wandb.push_to_main.avg_duration_hours"]
    daily = warehouse.daily_fleet(con, start=date(2000, 1, 1))
    assert set(daily.category) == {"all", "push_to_main", "sweep", "regular"}
    total = con.execute("SELECT sum(gpu_hours) FROM gpu_hours WHERE category = 'all'").fetchone()[0]
    assert daily[daily.category == "all"].gpu_hours.sum() == pytest.approx(total)
    sps = warehouse.main_sps(con, "ppo_atari")
    assert list(sps.commit_order) == list(range(1, len(sps) + 1))
    assert warehouse.sps_regressions(con).bad_commit.tolist() == ["badc0de"]
    sweeps = warehouse.sweeps(con)
    assert sweeps.runs.sum() == con.execute("SELECT count(*) FROM runs WHERE category = 'sweep'").fetchone()[0]
    alive = warehouse.alive_runs(con)
    assert "stalled0001" in set(alive.run_id)
