"""The fleet report run, written offline and read back from its .wandb files; downsampling; run comparison."""

import json
import os
from datetime import datetime

import duckdb
import pytest

from tests.conftest import cli
from tests.fleet import fleet_row, load
from tests.test_feed_e2e import ci_runs
from wandb_assets.compare import UnknownRunsError, compare_runs
from wandb_assets.lib.downsample import downsample
from wandb_assets.lib.wandb_records import find_run_files, read_run
from wandb_assets.ticks import run_tick
from wandb_assets.warehouse import query_read_only

TODAY = datetime(2026, 6, 2).date()


def test_downsample_keeps_alert_points_and_the_last_one():
    points = list(range(1000))
    kept = downsample(points, 250, keep={3, 500, 777})
    assert len(kept) == 250
    assert {3, 500, 777, 999} <= set(kept)
    assert kept == sorted(kept)
    assert downsample(points[:10], 250) == points[:10]
    assert downsample(points, 3, keep={1, 2, 3, 4}) == [3, 4, 999]  # when the must-keep overflow, the latest win


def _snapshot_rows(path):
    run = read_run(path)
    return run, [row["fleet/snapshot_unix"] for row in run.history if "fleet/snapshot_unix" in row]


def test_report_run_publishes_each_snapshot_once_and_catches_up_in_order(wandb_server, monkeypatch, tmp_path, instance):
    wandb_server(ci_runs(failed=3))
    report_dir = tmp_path / "report"
    monkeypatch.setenv("WANDB_DIR", str(report_dir))
    report_dir.mkdir()
    monkeypatch.setenv("WANDB_ASSETS_REPORT_PROJECT", "fleet-report")
    monkeypatch.setenv("WANDB_ASSETS_REPORT_MODE", "offline")
    stamps = ["2026-06-02T12:00:00", "2026-06-02T12:15:00", "2026-06-02T12:30:00"]
    unix = [1780401600, 1780402500, 1780403400]

    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at=stamps[0], now=stamps[0]))
    monkeypatch.delenv("WANDB_ASSETS_REPORT_PROJECT")  # the report is off (or W&B is down) for one tick
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at=stamps[1], now=stamps[1]))
    monkeypatch.setenv("WANDB_ASSETS_REPORT_PROJECT", "fleet-report")
    results = run_tick(instance, TODAY, snapshot_at=stamps[2], now=stamps[2])
    assert all(r.success for r in results)
    report = results[1].asset_materializations_for_node("fleet_report")[0].metadata
    assert (report["snapshots_published"].value, report["first"].value) == ("2", "2026-06-02T12:15:00Z")

    files = find_run_files(report_dir)
    assert len(files) == 2 and all(f.name == "run-fleet-report.wandb" for f in files)
    (first, first_rows), (second, second_rows) = (_snapshot_rows(f) for f in files)
    assert first_rows == [unix[0]] and second_rows == unix[1:]  # none twice, none skipped, in order

    assert {"name": "", "glob_name": "fleet/*", "step_metric": "fleet/snapshot_unix"} in second.metrics
    gauges = next(row for row in second.history if row.get("fleet/snapshot_unix") == unix[2])
    assert gauges["fleet/wandb.push_to_main.success_rate_pct"] == 50
    assert second.summary["fleet/last_snapshot_unix"] == unix[2]
    assert second.summary["fleet/wandb.runs.completed_24h"] == 3
    logged = {k for row in second.history for k in row}
    assert {"tables/alerts._type", "tables/push_to_main_sps._type", "sps/ppo_table._type", "dashboard._type"} <= logged
    media = next(row for row in second.history if "dashboard._type" in row)
    assert (media["dashboard._type"], media["tables/alerts._type"]) == ("html-file", "table-file")
    assert media["tables/alerts.nrows"] == 1 and media["sps/ppo_table.nrows"] == 3
    # The warehouse artifact goes out once a UTC day: with the first publication (12:00), not again at 12:30.
    assert "fleet-warehouse" not in [a["name"] for a in second.artifacts]
    warehouse_artifact = next(a for a in first.artifacts if a["name"] == "fleet-warehouse")
    assert warehouse_artifact["type"] == "warehouse"
    assert warehouse_artifact["files"] == ["warehouse.duckdb"]
    assert warehouse_artifact["metadata"]["snapshot_at"] == "2026-06-02T12:00:00Z"
    assert warehouse_artifact["metadata"]["row_counts"]["runs"] == 6
    assert warehouse_artifact["metadata"]["raw"] is False
    assert warehouse_artifact["ttl_duration_seconds"] == 30 * 86400
    assert "snapshot-1780401600" in warehouse_artifact["aliases"]
    published = query_read_only(
        os.environ["WANDB_ASSETS_DUCKDB"], "SELECT snapshot_at, artifact FROM report_publications ORDER BY 1"
    )
    assert published == [
        (datetime(2026, 6, 2, 12, 0), "fleet-warehouse:snapshot-1780401600"),
        (datetime(2026, 6, 2, 12, 15), None),
        (datetime(2026, 6, 2, 12, 30), None),
    ]
    dashboard = next(a for a in second.artifacts if a["name"] == "fleet-dashboard")
    assert (dashboard["type"], dashboard["files"]) == ("dashboard", ["dashboard.html"])
    page = next(report_dir.rglob("media/html/dashboard_*.html")).read_text()
    assert "<svg" in page and "push_to_main_success_rate_low" in page and "<script" not in page


def test_the_warehouse_artifact_is_a_reduced_copy(memory_con, tmp_path):
    from wandb_assets.report import reduced_copy
    from wandb_assets.warehouse import publish_snapshot

    source = tmp_path / "w.duckdb"
    con = duckdb.connect(str(source))
    con.execute("SET TimeZone = 'UTC'")
    row = fleet_row("a", "finished", "regular", datetime(2026, 6, 1, 10), datetime(2026, 6, 1, 12))
    row.update(config=json.dumps({"token": "hunter2-config-secret"}), summary=json.dumps({"note": "summary-secret"}))
    load(con, [row])
    snapshot = publish_snapshot(con, source)
    con.close()
    reduced, raw = tmp_path / "reduced.duckdb", tmp_path / "raw.duckdb"
    assert reduced_copy(snapshot, reduced, raw=False)["runs"] == 1
    assert reduced_copy(snapshot, raw, raw=True)["runs"] == 1
    check = duckdb.connect(str(reduced), read_only=True)
    assert check.execute("SELECT run_id, config, summary, state FROM runs").fetchall() == [
        ("a", None, None, "finished")
    ]
    assert check.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall() == [
        ("alive_runs",),
        ("daily_fleet",),
        ("main_sps_by_config",),
        ("push_to_main_sps",),  # a view of runs: its rows without copying them
        ("sweep_summary",),
    ]
    assert check.execute("SELECT run_id FROM push_to_main_sps").fetchall() == []  # "a" is a regular run
    check.close()
    assert b"hunter2-config-secret" not in reduced.read_bytes() and b"summary-secret" not in reduced.read_bytes()
    assert b"hunter2-config-secret" in raw.read_bytes()  # the same bytes check does see them when they are there


def test_publications_are_recorded_before_the_run_is_finished(memory_con, monkeypatch, tmp_path):
    """A crash in ``finish()`` (after the data went out) must not publish the snapshots again."""
    import wandb

    from wandb_assets.lib.sql import reusing
    from wandb_assets.lib.warehouse import record_snapshot
    from wandb_assets.report import publish_report

    load(memory_con, [fleet_row("a", "finished", "regular", datetime(2026, 6, 1, 10), datetime(2026, 6, 1, 12))])
    record_snapshot(memory_con, datetime(2026, 6, 1, 12))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    real_finish = wandb.sdk.wandb_run.Run.finish

    def crash(self, *args, **kwargs):
        real_finish(self, *args, **kwargs)
        raise RuntimeError("killed in finish()")

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "finish", crash)
    with pytest.raises(RuntimeError, match="killed in finish"):
        publish_report(reusing(memory_con), None, "fleet-report", run_id="r1", mode="offline")
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "finish", real_finish)
    assert memory_con.execute("SELECT snapshot_at FROM report_publications").fetchall() == [(datetime(2026, 6, 1, 12),)]
    assert publish_report(reusing(memory_con), None, "fleet-report", run_id="r1", mode="offline").published == []


def test_report_is_off_without_a_project(wandb_server, instance):
    wandb_server(ci_runs(failed=0))
    results = run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:00")
    report = results[1].asset_materializations_for_node("fleet_report")[0].metadata
    assert report["status"].value == "disabled (set WANDB_ASSETS_REPORT_PROJECT)"


def _with_json(row, summary, config):
    row.update(summary=json.dumps(summary), config=json.dumps(config), url=f"http://w/{row['run_id']}")
    return row


def test_compare_runs(memory_con):
    load(
        memory_con,
        [
            _with_json(
                fleet_row(
                    "a",
                    "finished",
                    "push_to_main",
                    datetime(2026, 6, 1, 10),
                    datetime(2026, 6, 1, 12),
                    gpus=8,
                    overview_sps=100.0,
                ),
                {"loss": 0.5, "acc": 0.9, "_step": 10, "only_a": 1, "nested": {"x": 2}},
                {"lr": 0.1, "seed": 1, "model": {"depth": 4}},
            ),
            _with_json(
                fleet_row(
                    "b",
                    "crashed",
                    "push_to_main",
                    datetime(2026, 6, 1, 11),
                    datetime(2026, 6, 1, 12),
                    gpus=4,
                    overview_sps=80.0,
                ),
                {"loss": 0.7, "acc": "n/a", "_step": 12, "nested": {"x": 3}},
                {"lr": 0.2, "seed": 1, "model": {"depth": 6}, "extra": True},
            ),
        ],
    )
    comparison = compare_runs(memory_con, ["a", "b"])
    rows = dict(comparison.rows)
    assert rows["state"] == ["finished", "crashed"]
    assert rows["duration_hours"] == [2.0, 1.0]
    assert rows["gpu_hours"] == [16.0, 4.0]
    assert rows["overview/sps"] == [100.0, 80.0]
    assert rows["overview/steps_per_second"] == [None, None]
    assert [f for f, _ in comparison.rows if f.startswith("summary.")] == ["summary.loss", "summary.nested.x"]
    assert [f for f, _ in comparison.rows if f.startswith("config.")] == [
        "config.extra",
        "config.lr",
        "config.model.depth",
    ]
    assert rows["url"] == ["http://w/a", "http://w/b"]
    assert comparison.to_frame().loc["summary.loss", "b"] == 0.7
    assert comparison.headings() == ["a", "b"]  # a display name equal to the id (as here) is not repeated
    comparison.names = ["train-resnet", None]  # two runs in three have no display name: the id alone
    assert comparison.headings() == ["train-resnet (a)", "b"]
    with pytest.raises(UnknownRunsError, match=r"^Unknown run id\(s\): zz, yy\. "):
        compare_runs(memory_con, ["a", "zz", "yy"])


def test_fetch_warehouse_downloads_the_published_artifact(wandb_server, monkeypatch, tmp_path, instance, capsys):
    """Publish offline, put the artifact the run wrote on the local W&B server, fetch it with the CLI."""
    from tests.conftest import PROJECT
    from wandb_assets.warehouse import open_snapshot

    server = wandb_server(ci_runs(failed=3))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "report"))
    (tmp_path / "report").mkdir()
    monkeypatch.setenv("WANDB_ASSETS_REPORT_PROJECT", PROJECT)
    monkeypatch.setenv("WANDB_ASSETS_REPORT_MODE", "offline")
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00"))
    (path,) = find_run_files(tmp_path / "report")
    published = next(a for a in read_run(path).artifacts if a["name"] == "fleet-warehouse")
    files = {name: open(local, "rb").read() for name, local in published["local_paths"].items()}
    server.add_artifact("fleet-warehouse", "warehouse", files, published["metadata"], ["snapshot-1780401600"])

    code, out, err = cli(capsys, "fetch-warehouse", "--dest", str(tmp_path / "fetched"))
    assert code == 0, err
    target = tmp_path / "fetched" / "warehouse.duckdb"
    assert out.splitlines()[0] == (
        f"Downloaded test-team/{PROJECT}/fleet-warehouse:latest (snapshot 2026-06-02T12:00:00Z) to {target}"
    )
    con = open_snapshot(target, exact=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == published["metadata"]["row_counts"]["runs"] == 6
    assert con.execute("SELECT count(*) FROM runs WHERE config IS NOT NULL").fetchone()[0] == 0  # no raw JSON
    assert server.downloads == ["__manifest__", "warehouse.duckdb"]

    code, _, err = cli(capsys, "fetch-warehouse", "--version", "v7", "--dest", str(tmp_path / "none"))
    assert code == 1
    assert err.startswith(f"error: could not fetch test-team/{PROJECT}/fleet-warehouse:v7: ")


def test_cli_publish_and_compare(wandb_server, monkeypatch, tmp_path, instance, dagster_home, capsys):
    wandb_server(ci_runs(failed=3))
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00"))

    code, out, err = cli(capsys, "publish")
    assert (code, out) == (2, "")
    assert err == "error: WANDB_ASSETS_REPORT_PROJECT is not set: name the W&B project the report publishes to.\n"
    monkeypatch.setenv("WANDB_ASSETS_REPORT_PROJECT", "fleet-report")
    monkeypatch.setenv("WANDB_ASSETS_REPORT_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    code, out, err = cli(capsys, "publish")
    assert code == 0, err
    summary = out.strip().splitlines()[-1]
    # offline mode writes a local run directory: it is not "published" until `wandb sync` uploads it
    assert summary.startswith("status: written offline (upload it with `wandb sync`), snapshots_published: 1, run: ")
    assert summary.endswith("warehouse_artifact: fleet-warehouse:snapshot-1780401600")
    code, out, _ = cli(capsys, "publish")
    assert out.strip().splitlines()[-1] == "status: up to date, snapshots_published: 0"
    from dagster import DagsterInstance

    with DagsterInstance.get() as recorded:  # publish wrote through the pool-bound report job, twice
        assert [r.job_name for r in recorded.get_runs()] == ["report", "report"]

    code, out, err = cli(capsys, "compare", "ci0", "ci5")
    assert code == 0, err
    lines = out.splitlines()  # each column headed by the run's display name and its id
    assert lines[0].split() == [
        "github.sky.main.c000000.ppo.1780000000",
        "(ci0)",
        "github.sky.main.c000005.ppo.1780000000",
        "(ci5)",
    ]
    assert lines[1].split() == ["state", "failed", "finished"]
    code, _, err = cli(capsys, "compare", "ci0", "nope")
    assert code == 1 and err.startswith("error: Unknown run id(s): nope. ")


def test_the_warehouse_is_closed_while_the_report_talks_to_wandb(memory_con, monkeypatch, tmp_path):
    from contextlib import contextmanager

    import wandb

    from wandb_assets.lib.warehouse import record_snapshot
    from wandb_assets.report import publish_report

    load(memory_con, [fleet_row("a", "finished", "regular", datetime(2026, 6, 1, 10), datetime(2026, 6, 1, 12))])
    record_snapshot(memory_con, datetime(2026, 6, 1, 12))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    open_now, seen = [], {}

    @contextmanager
    def connect():
        open_now.append(1)
        try:
            yield memory_con
        finally:
            open_now.pop()

    def watch(name, original):
        def watched(*args, **kwargs):
            seen.setdefault(name, []).append(len(open_now))
            return original(*args, **kwargs)

        return watched

    monkeypatch.setattr(wandb, "init", watch("init", wandb.init))
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", watch("log", wandb.sdk.wandb_run.Run.log))
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "finish", watch("finish", wandb.sdk.wandb_run.Run.finish))
    result = publish_report(connect, None, "fleet-report", run_id="r2", mode="offline")
    assert result.published == [datetime(2026, 6, 1, 12)]
    assert seen == {"init": [0], "log": [0, 0], "finish": [0]}
