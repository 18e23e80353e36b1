"""Notebooks: committed clean, executed headless against a synthetic warehouse, and never in the way of the
pipeline (a refresh in another process while a notebook reads; a reader holding the snapshot for good)."""

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import nbconvert
import nbformat
import papermill
import pytest
from dagster import instance_for_test

from tests.conftest import API_KEY, ENTITY, PROJECT
from wandb_assets.lib.warehouse import replay_snapshots
from wandb_assets.localwandb import LocalWandbServer
from wandb_assets.localwandb.synthetic import add_curves, generate_fleet
from wandb_assets.ticks import execute_analytics, execute_backfill, execute_curves, run_tick
from wandb_assets.warehouse import connect, open_snapshot, snapshot_path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CHARTS = {
    "fleet_overview": 3,
    "gpu_costs": 3,
    "push_to_main_throughput": 2,
    "sweeps": 1,
    "team_budgets": 1,
    "training_curves": 3,
}
ARTIFACTS = REPO / "test-artifacts" / "notebooks"
NOW = datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def fleet_server() -> LocalWandbServer:
    nodes = generate_fleet(NOW, days=8, runs_per_day=60)
    add_curves(nodes, NOW)  # the last days' runs carry curves, as the demo's do
    return LocalWandbServer(nodes, entity=ENTITY, project=PROJECT).start()


def point_at(monkeypatch, server: LocalWandbServer) -> None:
    for name, value in {
        "WANDB_BASE_URL": server.url,
        "WANDB_API_KEY": API_KEY,
        "WANDB_ENTITY": ENTITY,
        "WANDB_PROJECT": PROJECT,
    }.items():
        monkeypatch.setenv(name, value)


def build_warehouse(instance) -> None:
    """A backfill, a run of the curves job, 48 replayed hourly snapshots (what the demo does, so the gauges chart has
    a history), a tick."""
    assert execute_backfill(instance, (NOW - timedelta(days=8)).date(), NOW.date()).success
    assert execute_curves(instance).success
    last_hour = NOW.replace(minute=0, second=0)
    con = connect(os.environ["WANDB_ASSETS_DUCKDB"], read_only=False)
    try:
        replay_snapshots(con, [last_hour - timedelta(hours=k) for k in range(48, 0, -1)], NOW)
    finally:
        con.close()
    assert all(r.success for r in run_tick(instance, NOW.date()))
    assert execute_analytics(instance, docs=False).success  # the analysts' dbt marts (team_budgets.ipynb reads one)


@pytest.fixture(scope="session")
def golden_warehouse(tmp_path_factory) -> Path:
    """The 8-day synthetic warehouse and its snapshot, built once per test session (a backfill and a tick)."""
    target = tmp_path_factory.mktemp("golden") / "warehouse.duckdb"
    with pytest.MonkeyPatch.context() as monkeypatch, instance_for_test() as instance:
        server = fleet_server()
        try:
            point_at(monkeypatch, server)
            Path(os.environ["WANDB_ASSETS_DUCKDB"]).unlink(missing_ok=True)
            build_warehouse(instance)
        finally:
            server.stop()
        shutil.copyfile(os.environ["WANDB_ASSETS_DUCKDB"], target)
        shutil.copyfile(snapshot_path(os.environ["WANDB_ASSETS_DUCKDB"]), snapshot_path(target))
    return target


@pytest.fixture
def notebook_warehouse(golden_warehouse) -> Path:
    """The golden warehouse's path: notebooks only open its snapshot, read-only."""
    return golden_warehouse


@pytest.fixture
def built_warehouse(golden_warehouse, warehouse_path) -> Path:
    """A private copy of the golden warehouse (and snapshot) at WANDB_ASSETS_DUCKDB, for tests that write."""
    warehouse_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(golden_warehouse, warehouse_path)
    shutil.copyfile(snapshot_path(golden_warehouse), snapshot_path(warehouse_path))
    return warehouse_path


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


def test_there_are_the_six_notebooks():
    assert [p.stem for p in NOTEBOOKS] == sorted(CHARTS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs_and_has_parameters(path):
    notebook = nbformat.read(str(path), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    assert any("warehouse.open_snapshot(warehouse_path)" in cell.source for cell in code)


def alt_texts(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        output.get("metadata", {}).get("image/png", {}).get("alt", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless_and_draws_its_charts(path, notebook_warehouse, tmp_path, chromium):
    """Executed against the synthetic warehouse, exported to HTML and opened in Chromium: every chart is an image
    with alt text, drawn (not broken), and the page is saved as a screenshot under test-artifacts/notebooks/."""
    executed = execute(path, notebook_warehouse, tmp_path / path.name)
    assert images(executed) == CHARTS[path.stem]
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    alts = alt_texts(executed)
    assert all(len(alt) > 60 for alt in alts), alts
    html, _ = nbconvert.HTMLExporter(template_name="classic").from_notebook_node(executed)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page_file = ARTIFACTS / f"{path.stem}.html"
    page_file.write_text(html)
    chromium.goto(page_file.as_uri())
    shown = chromium.eval_on_selector_all(
        "img", "imgs => imgs.map(i => ({alt: i.alt, width: i.naturalWidth, height: i.naturalHeight}))"
    )
    chromium.screenshot(path=str(ARTIFACTS / f"{path.stem}.png"), full_page=True)
    assert [i["alt"] for i in shown] == alts
    assert all(i["width"] > 500 and i["height"] > 200 for i in shown), shown


WRITER = """
import sys, time
from pathlib import Path
from wandb_assets.defs.warehouse.resources import WarehouseResource

stop = Path(sys.argv[2])
with WarehouseResource(database=sys.argv[1]).get_connection() as con:
    con.execute("BEGIN TRANSACTION")
    print("writing", time.time(), flush=True)
    written = 0
    while not stop.exists():
        con.execute("INSERT INTO fleet_metrics VALUES (TIMESTAMP '2000-01-01' + to_seconds(?), 'writer.probe', 1)",
                    [written])
        written += 1
        time.sleep(0.05)
    con.execute("COMMIT")
    print("committed", written, time.time(), flush=True)
"""


@pytest.mark.slow
def test_a_notebook_runs_while_another_process_holds_the_writer(built_warehouse, tmp_path):
    """A writer in another process is inside a transaction for the notebook's whole run: both succeed."""
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(built_warehouse), str(stop)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        first = writer.stdout.readline().split()
        assert first[0] == "writing", first
        write_started = float(first[1])
        probe = subprocess.run(
            [sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1])", str(built_warehouse)],
            capture_output=True,
            text=True,
        )
        assert "lock" in probe.stderr.lower()  # the warehouse itself really is taken
        notebook_started = time.time()
        executed = execute(REPO / "notebooks" / "fleet_overview.ipynb", built_warehouse, tmp_path / "out.ipynb")
        notebook_ended = time.time()
        assert writer.poll() is None  # still inside its transaction when the notebook finished
        stop.touch()
        committed = writer.stdout.readline().split()
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
    assert write_started < notebook_started < notebook_ended < float(committed[2])
    assert images(executed) == CHARTS["fleet_overview"]
    written = int(committed[1])
    con = duckdb.connect(str(built_warehouse), read_only=True)
    assert con.execute("SELECT count(*) FROM fleet_metrics WHERE metric = 'writer.probe'").fetchone()[0] == written > 0
    con.close()


@pytest.mark.slow
def test_a_reader_holding_the_snapshot_blocks_no_tick(monkeypatch, built_warehouse):
    server = fleet_server()
    try:
        point_at(monkeypatch, server)
        with instance_for_test() as instance:
            held = open_snapshot()  # an analyst's connection, never closed during the ticks
            before = held.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0]
            for minute in (15, 30):
                results = run_tick(instance, NOW.date(), snapshot_at=(NOW + timedelta(minutes=minute)).isoformat())
                assert all(r.success for r in results)
            assert held.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0] == before  # its own view
            fresh = open_snapshot()
            assert fresh.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0] == before + 2 * 24
            fresh.close()
            held.close()
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


@pytest.mark.slow
def test_helpers_answer_the_common_questions(notebook_warehouse):
    """Expectations from how the synthetic fleet is made (8 days, 60 runs a day, seed 7), not from the tables."""
    from wandb_assets import warehouse

    con = open_snapshot(notebook_warehouse)
    assert list(warehouse.gauges_over_time(con).columns)[:1] == ["wandb.gpu.cost_usd_24h"]  # sorted by name
    daily = warehouse.daily_fleet(con, start=date(2000, 1, 1))
    assert set(daily.category) == {"all", "push_to_main", "sweep", "regular"}
    sps = warehouse.main_sps(con, "ppo_atari")
    # the three regressed runs are the newest main commits of their config
    assert sps.ci_commit.iloc[-3:].tolist() == ["badc0de", "badc0e1", "badc0f2"]
    regressions = warehouse.sps_regressions(con)
    assert regressions[["ci_config", "last_good_commit", "first_slow_commit", "confirming_runs"]].values.tolist() == [
        ["ppo_atari", sps.ci_commit.iloc[-4], "badc0de", 3]  # last good: the main commit before badc0de
    ]
    backtest = warehouse.change_points(con, config="ppo_atari")
    assert backtest[["first_slow_commit", "detected_commit", "recovered_commit"]].values.tolist() == [
        ["badc0de", "badc0f2", None]
    ]
    # the tick's alert evaluation recorded it, and the helper read it from there (the series has not changed)
    recorded = con.execute("SELECT ci_config, first_slow_commit, recovered FROM sps_change_points").fetchall()
    assert recorded == [("ppo_atari", "badc0de", False)]
    from wandb_assets.lib import alerts

    latest = con.execute("SELECT max(ended_at) FROM runs").fetchone()[0]
    assert alerts._recorded_mark(con) == alerts._series_mark(con, latest, "overview/sps")
    sweeps = warehouse.sweeps(con)
    # two sweep ids a day for 8 days, plus the runs known only by a ".sweep" name (3 of 15 a day)
    assert len(sweeps) == 2 * 8 + 1
    assert sweeps.set_index("sweep").loc["(no sweep id)", "runs"] == 3 * 8
    alive = warehouse.alive_runs(con)
    assert "stalled0001" in set(alive.run_id)


@pytest.mark.slow
def test_cli_regressions_backtest(notebook_warehouse, capsys):
    from tests.conftest import cli

    code, out, err = cli(capsys, "regressions", "--warehouse", str(notebook_warehouse), "--config", "ppo_atari")
    assert code == 0, err
    (line,) = out.splitlines()
    # the generator makes the regressed runs 30% slower than ppo_atari's level (3,640 vs 5,200), plus noise; their
    # curves (synthetic.add_curves: the summary's SPS within 3 % a point) make the detector's "after" their steady SPS
    found = re.match(r"ppo_atari: -(2[5-9]|3[0-5])\.\d% \([\d,.]+ -> ([\d,.]+)\) from \w+ to badc0de \(", line)
    assert found and abs(float(found.group(2).replace(",", "")) - 3640.0) <= 0.03 * 3640.0, line
    assert line.endswith("paged at badc0f2 after 3 slow run(s); still slow")
    tomorrow = (NOW + timedelta(days=1)).date().isoformat()
    code, out, _ = cli(capsys, "regressions", "--warehouse", str(notebook_warehouse), "--since", tomorrow)
    assert (code, out) == (0, "No SPS regression found on main.\n")
    code, _, err = cli(capsys, "regressions", "--warehouse", str(notebook_warehouse), "--since", "soon")
    assert code == 2 and err == "error: --since must be a day like 2026-06-01 (got 'soon').\n"


def test_partial_days_are_a_late_first_day_and_the_day_of_the_latest_snapshot(memory_con):
    from tests.fleet import fleet_row, load
    from wandb_assets.lib.warehouse import record_snapshot
    from wandb_assets.warehouse import partial_days

    load(memory_con, [fleet_row("a", "finished", "regular", datetime(2026, 6, 9, 13, 30), datetime(2026, 6, 9, 15))])
    record_snapshot(memory_con, datetime(2026, 6, 11, 8, 15))
    assert partial_days(memory_con) == {date(2026, 6, 9): "data starts 13:30 UTC", date(2026, 6, 11): "until 08:15 UTC"}
    # A first run at 00:40 starts a whole day; a snapshot on that same day is still "so far".
    load(memory_con, [fleet_row("b", "finished", "regular", datetime(2026, 6, 11, 0, 40), datetime(2026, 6, 11, 1))])
    assert partial_days(memory_con) == {date(2026, 6, 11): "until 08:15 UTC"}
    load(memory_con, [fleet_row("c", "finished", "regular", datetime(2026, 6, 11, 6, 0), datetime(2026, 6, 11, 7))])
    assert partial_days(memory_con) == {date(2026, 6, 11): "data starts 06:00 UTC, until 08:15 UTC"}


@pytest.mark.slow
def test_the_documented_export_keeps_the_alt_text_and_writes_outside_the_repository(notebook_warehouse, tmp_path):
    """docs/analysts.md's own nbconvert command, as a user runs it (the demo's path replaced by the test
    warehouse): the HTML has every chart with its alt text, and lands under TMPDIR, not in the repository."""
    docs = (REPO / "docs" / "analysts.md").read_text()
    (command,) = [line for line in docs.splitlines() if "jupyter nbconvert" in line]
    assert command in (REPO / "notebooks" / "README.md").read_text()  # the two pages give the same command
    before = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True)
    done = subprocess.run(
        ["bash", "-c", command.replace("data/demo/demo.duckdb", str(notebook_warehouse))],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alt" not in done.stderr.lower()  # nbconvert warns when a template drops the alt text
    html = (tmp_path / "wandb-assets-notebooks" / "gpu_costs.html").read_text()
    alts = re.findall(r'<img[^>]* alt="([^"]*)"', html)
    assert len(re.findall(r"<img ", html)) == len(alts) == CHARTS["gpu_costs"]
    assert all(len(alt) > 60 for alt in alts), alts
    assert "have no price and are not counted" in alts[0]
    after = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True)
    assert after.stdout == before.stdout


@pytest.mark.slow
def test_the_chargeback_of_the_demo_fleet_equals_gpu_usage_and_the_demo_prints_it(built_warehouse, capsys):
    """The synthetic fleet the demo serves, built as the demo builds it (dbt marts included): every month's chargeback
    file adds up to gpu_usage to the cent, and the demo's closing lines show this month's spend by team."""
    from wandb_assets.commands.demo import print_chargeback
    from wandb_assets.lib import exports

    con = open_snapshot(built_warehouse)
    try:
        months = [
            m
            for (m,) in con.execute("SELECT DISTINCT month FROM analytics.team_gpu_cost_monthly ORDER BY 1").fetchall()
        ]
        teams = {t for (t,) in con.execute("SELECT DISTINCT team FROM analytics.team_gpu_cost_monthly").fetchall()}
        assert months and teams
        for month in months:
            cents, usage, gpu_hours = exports.chargeback_totals(con, month)
            assert cents == usage and usage > 0 and gpu_hours > 0, (month, cents, usage)
    finally:
        con.close()
    capsys.readouterr()
    print_chargeback(months[-1])
    out = capsys.readouterr().out
    assert f"Chargeback {months[-1]:%Y-%m} so far, by team (the analysts' dbt marts" in out
    assert {line.split()[0] for line in out.splitlines()[2:] if line.strip()} >= teams


def test_training_curves_runs_on_a_warehouse_without_curves_and_says_what_fills_them(
    wandb_server, warehouse_path, instance, tmp_path
):
    """After a tick and before the curves job (issue 43: `TypeError: 'NoneType' object is not subscriptable`):
    the notebook runs through, and each of its three charts says in itself and in its alt text what is missing and
    which command fills it."""
    from datetime import date

    from tests.test_pipeline_e2e import dataset
    from wandb_assets.ticks import run_tick

    wandb_server(dataset())
    assert all(r.success for r in run_tick(instance, date(2026, 6, 2)))
    executed = execute(REPO / "notebooks" / "training_curves.ipynb", warehouse_path, tmp_path / "out.ipynb")
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    not_read = (
        "No run's curves are read yet: the curves job reads each ended run's once between the ticks; "
        "`uv run wandb-assets curves` reads them all now (WANDB_ASSETS_FETCH_HISTORY must be true)."
    )
    assert alt_texts(executed) == [
        not_read,
        not_read,
        "No GPU stream is stored yet: the curves job reads each ended run's GPU stream with its curves "
        "(`uv run wandb-assets curves`).",
    ]
