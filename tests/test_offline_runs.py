"""Offline W&B run logs into the warehouse: logs written by the installed wandb (and one in the older Python
client's format) read back exactly; damaged logs keep what precedes the damage; idempotence; the mirrored copy
wins; the Dagster job, its metadata and the sensor."""

import json
import math
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from dagster import build_sensor_context

from tests.fleet import fleet_row
from tests.offline_logs import legacy_log_bytes, legacy_records, log_of, write_offline_run
from wandb_assets.lib.offline_runs import find_run_logs, offline_node, read_changed_logs, read_offline_run
from wandb_assets.lib.warehouse import load_offline_runs, replace_runs_window, stage_rows

STALL = timedelta(minutes=30)
ROWS = {"ci": 600, "failed": 5, "sweep": 3, "killed": 2000}


@pytest.fixture(scope="module")
def offline_tree(tmp_path_factory):
    """Four offline runs written by the installed wandb, and when (UTC) they were written."""
    root = tmp_path_factory.mktemp("offline")
    before = datetime.now(UTC).replace(tzinfo=None)
    for scenario, rows in ROWS.items():
        write_offline_run(root, scenario, rows)
    return root, before, datetime.now(UTC).replace(tzinfo=None)


def rows_by_id(report) -> dict:
    return {row["run_id"]: row for row in report.rows}


def test_offline_runs_are_read_back_exactly(offline_tree):
    root, before, after = offline_tree
    report = read_changed_logs([root], {}, now=after + timedelta(hours=1), stall=STALL, default_gpus=1)
    assert report.found == 4 and report.unchanged == 0 and report.missing == []
    rows = rows_by_id(report)
    assert sorted(rows) == ["ci0001", "fail0001", "kill0001", "sweep0001"]

    ci = rows["ci0001"]
    assert (ci["state"], ci["category"], ci["name"]) == (
        "finished",
        "push_to_main",
        "github.sky.main.abc1234.ppo_atari.20261120T101010",
    )
    assert (ci["ci_branch"], ci["ci_commit"], ci["ci_config"], ci["ci_timestamp"]) == (
        "main",
        "abc1234",
        "ppo_atari",
        datetime(2026, 11, 20, 10, 10, 10),
    )
    # The five SPS keys: the last of 600 rows (i = 599).
    assert [ci[c] for c in ("sps_overview_steps_per_second", "sps_overview_epoch_steps_per_second")] == [1599, 2599]
    assert [ci[c] for c in ("sps_overview_sps", "sps_timing_cumulative_sps", "sps_timing_per_epoch_sps")] == [
        3599,
        4599,
        5599,
    ]
    assert (ci["gpu_count"], ci["gpu_type"], ci["tags"], ci["group_name"], ci["job_type"]) == (
        8,
        "H100",
        ["ci", "main"],
        "g1",
        "bench",
    )
    assert (ci["source"], ci["url"], ci["log_path"]) == ("offline", None, str(log_of(root, "ci0001").resolve()))
    assert ci["cli_version"] == "0.31.0" and ci["summary_step"] == 600 and ci["anomalies"] == []
    config = json.loads(ci["config"])
    assert config == {
        "lr": 0.001,
        "compute": {"gpu_count": 8, "gpu_type": "H100"},
        "nested": {"a": {"b": [1, 2]}},
        "unicode": "h\u00e9llo \u2713",
        "inf": math.inf,
    }
    summary = json.loads(ci["summary"])
    assert summary["loss"] == 0.0  # the summary write, not the history's 1/600
    assert summary["first_only"] == 1  # logged once, first: ~10,000 items earlier
    assert summary["eval"] == {"acc": 5.99}  # a nested history key, its last value
    assert (summary["best"], summary["neg_inf"], summary["emoji"], summary["_step"]) == (
        42.5,
        -math.inf,
        "\u2713 \u00fcn\u00ef",
        600,
    )
    assert summary["nan"] is None  # wandb-core writes a NaN summary value as null
    assert before <= ci["created_at"] <= ci["heartbeat_at"] == ci["ended_at"] <= after
    assert 0 <= ci["duration_hours"] < 0.1

    assert (rows["fail0001"]["state"], rows["fail0001"]["category"]) == ("failed", "regular")
    assert json.loads(rows["fail0001"]["summary"])["loss"] == 4.0
    sweep = rows["sweep0001"]
    assert (sweep["state"], sweep["category"], sweep["sweep_id"]) == ("finished", "sweep", "sw123abc")
    killed = rows["kill0001"]
    assert (killed["state"], killed["ended_at"]) == ("crashed", killed["heartbeat_at"])  # no exit, log > 30 min old
    assert json.loads(killed["config"]) == {"lr": 0.5}
    step = json.loads(killed["summary"])["_step"]
    assert json.loads(killed["summary"])["loss"] == step and 0 <= step <= 1999
    # The same killed log seen a minute after its last record: still running.
    run = read_offline_run(log_of(root, "kill0001"))
    # SIGKILL can land while wandb-core is writing: the log may end mid-record (kept up to there) or not.
    assert run.exit_code is None and [d.kind for d in run.damage] in ([], ["truncated"])
    assert offline_node(run, run.last_record_at + timedelta(minutes=1), STALL)["state"] == "running"


def test_nan_follows_one_rule_offline_and_mirrored(offline_tree, memory_con, tmp_path):
    """NaN on both paths: what the client recorded is kept. A NaN logged with ``run.log`` reaches the summary
    as the token NaN and is stored as NaN; an explicit ``run.summary.update({k: nan})`` or a NaN config value is
    written by the wandb client itself as null (wandb.util.json_friendly, online and offline alike), so W&B's
    copy holds null too. The offline log and the node the server returns for the same run load identically."""
    from wandb.proto import wandb_internal_pb2

    from wandb_assets.lib.normalize import run_row
    from wandb_assets.lib.offline_runs import read_frames
    from wandb_assets.lib.warehouse import load_offline_runs, stage_rows

    root, _, after = offline_tree
    log = log_of(root, "fail0001")
    written = {}
    for frame in read_frames(log.read_bytes())[0]:
        record = wandb_internal_pb2.Record.FromString(bytes(frame))
        for item in record.summary.update if record.HasField("summary") else []:
            written[item.key or "/".join(item.nested_key)] = item.value_json
    assert (written["grad_norm"], written["final_loss"]) == ("NaN", "null")  # the client's own encoding

    report = read_changed_logs([log], {}, now=after + timedelta(hours=1), stall=STALL, default_gpus=1)
    staged, _ = stage_rows(report.rows, str(tmp_path))
    load_offline_runs(memory_con, staged, report.files, after)
    (offline,) = report.rows
    node = {  # the same run as W&B's server returns it once synced: the values the records hold
        "name": "fail0001-mirrored",
        "state": "failed",
        "createdAt": offline["created_at"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "heartbeatAt": offline["heartbeat_at"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "config": '{"lr": {"value": 0.1}, "clip": {"value": null}}',
        "summaryMetrics": '{"loss": 4.0, "grad_norm": NaN, "final_loss": null, "_step": 4}',
    }
    mirrored = run_row(node, entity="e", project="p", app_url="http://127.0.0.1", default_gpus=1)
    staged, _ = stage_rows([mirrored], str(tmp_path))
    load_offline_runs(memory_con, staged, [], after)  # the same load, so only the values differ, not the SQL
    got = memory_con.execute(
        "SELECT run_id, isnan((summary->'grad_norm')::DOUBLE), json_type(summary->'final_loss'), "
        "(summary->'loss')::DOUBLE, json_type(config->'clip'), (config->'lr')::DOUBLE FROM runs ORDER BY run_id"
    ).fetchall()
    assert got == [
        ("fail0001", True, "NULL", 4.0, "NULL", 0.1),
        ("fail0001-mirrored", True, "NULL", 4.0, "NULL", 0.1),
    ]


def test_a_log_cut_mid_write_keeps_every_record_before_the_cut(offline_tree, tmp_path):
    root, _, _ = offline_tree
    data = log_of(root, "ci0001").read_bytes()
    cut = tmp_path / "run-ci0001.wandb"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    run = read_offline_run(cut)
    assert [d.kind for d in run.damage] == ["truncated"]
    assert (run.run_id, run.exit_code) == ("ci0001", None)
    assert run.config["compute"] == {"gpu_count": 8, "gpu_type": "H100"}
    step = run.summary["_step"]  # row i of the loop is step i + 1 (step 0 logged first_only)
    assert 1 < step < 600
    assert (run.summary["overview/sps"], run.summary["timing_per_epoch/sps"]) == (2999 + step, 4999 + step)
    assert run.summary["first_only"] == 1


def test_a_corrupt_block_is_skipped_and_the_rest_of_the_log_is_kept(offline_tree, tmp_path):
    root, _, _ = offline_tree
    data = bytearray(log_of(root, "ci0001").read_bytes())
    assert len(data) > 3 * 32768  # the damage is in the second block, the exit record in a later one
    data[32768 + 200] ^= 0xFF
    damaged = tmp_path / "run-ci0001.wandb"
    damaged.write_bytes(bytes(data))
    run = read_offline_run(damaged)
    assert [d.kind for d in run.damage] == ["corrupt"]
    assert 32768 <= run.damage[0].offset < 2 * 32768
    assert run.exit_code == 0 and run.summary["_step"] == 600 and run.summary["overview/sps"] == 3599
    intact = read_offline_run(log_of(root, "ci0001"))
    assert 0 < intact.records - run.records < 32768 // 50  # one block's worth of records lost, no more


def test_what_is_not_a_log_is_counted_not_loaded(tmp_path):
    (tmp_path / "run-bogus.wandb").write_bytes(b"not a wandb log at all")
    report = read_changed_logs([tmp_path], {}, now=datetime(2026, 1, 1), stall=STALL, default_gpus=1)
    assert report.rows == []
    (entry,) = report.files
    assert (entry["loaded"], [d["kind"] for d in entry["damage"]]) == ("no run record", ["bad_header"])
    assert report.damage_counts() == {"bad_header": 1}


@pytest.mark.parametrize("header", [True, False], ids=["0.10-0.16 Python client", "0.10 pre-release, no header"])
def test_a_log_in_the_older_python_clients_format(tmp_path, header):
    start = 1_700_000_000
    path = tmp_path / "run-legacy01.wandb"
    path.write_bytes(legacy_log_bytes(legacy_records(300, start), header=header))
    assert path.stat().st_size > 2 * 32768  # block padding and a record split over blocks are exercised
    report = read_changed_logs([tmp_path], {}, now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
    (row,) = report.rows
    assert report.files[0]["damage"] == []
    assert (row["run_id"], row["name"], row["state"], row["gpu_count"], row["cli_version"]) == (
        "legacy01",
        "legacy-run",
        "finished",
        2,
        "0.10.33",
    )
    assert (row["tags"], row["group_name"], row["job_type"]) == (["old"], "grp", "train")
    summary = json.loads(row["summary"])
    # The summary record wins for loss/_step; the history's last row fills _timestamp, _runtime and big.
    assert {k: v for k, v in summary.items() if k != "big"} == {
        "loss": 0.5,
        "accuracy": 0.9,
        "_step": 299,
        "_timestamp": start + 299,
        "_runtime": 299,
    }
    assert summary["big"] == "x" * 40000
    created = datetime(2023, 11, 14, 22, 13, 20)  # 1_700_000_000 s
    assert (row["created_at"], row["heartbeat_at"]) == (created, created + timedelta(seconds=305))  # exit runtime


def test_finding_logs_in_files_run_directories_and_trees(offline_tree, tmp_path):
    root, _, _ = offline_tree
    ci_log = log_of(root, "ci0001")
    files, missing = find_run_logs([ci_log, ci_log.parent, root, tmp_path / "nope"])
    assert sorted(f.name for f in files) == [f"run-{i}.wandb" for i in ("ci0001", "fail0001", "kill0001", "sweep0001")]
    assert len(set(files)) == 4  # the file, its directory and the tree name it once
    assert missing == [str(tmp_path / "nope")]


# -- the warehouse, the Dagster job, the CLI and the sensor --------------------------------------------------


@pytest.fixture
def offline_env(monkeypatch, tmp_path, offline_tree):
    root, _, _ = offline_tree
    tree = tmp_path / "tree"
    shutil.copytree(root, tree, symlinks=True)  # wandb/latest-run is a symlink to the last run
    monkeypatch.setenv("WANDB_ASSETS_OFFLINE_DIRS", str(tree))
    return tree


def table(con, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def test_the_offline_job_loads_runs_once_and_the_mirrored_copy_wins(
    offline_env, offline_tree, instance, warehouse_path
):
    from wandb_assets.ticks import execute_offline

    # The clock pinned a minute after the logs were written: the killed run is still within the stall threshold
    # however long the session has been running.
    soon = (offline_tree[2] + timedelta(minutes=1)).isoformat()
    result = execute_offline(instance, [], now=soon)
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("offline_runs")[0].metadata.items()}
    assert (meta["logs_found"], meta["logs_read"], meta["runs_loaded"]) == (4, 4, 4)
    # Only the SIGKILLed run's log may be damaged (cut mid-record, when the kill beat wandb-core's flush).
    assert {Path(r.data["path"]).name for r in meta["damage"].records} <= {"run-kill0001.wandb"}
    con = duckdb.connect(str(warehouse_path), read_only=True)
    runs_sql = "SELECT * EXCLUDE (ingested_at) FROM runs ORDER BY run_id"
    first = table(con, runs_sql)
    stamps = table(con, "SELECT run_id, ingested_at FROM runs ORDER BY run_id")
    assert table(con, "SELECT run_id, source, state FROM runs ORDER BY run_id") == [
        ("ci0001", "offline", "finished"),
        ("fail0001", "offline", "failed"),
        ("kill0001", "offline", "running"),  # its log ended seconds ago: within the 30-minute stall threshold
        ("sweep0001", "offline", "finished"),
    ]
    assert table(con, "SELECT run_id, sps_overview_sps FROM push_to_main_sps") == [("ci0001", 3599.0)]
    assert table(con, "SELECT count(DISTINCT snapshot_at) FROM fleet_metrics") == [(1,)]
    con.close()

    # Again: nothing read, nothing written.
    again = execute_offline(instance, [], now=soon)
    meta = {k: v.value for k, v in again.asset_materializations_for_node("offline_runs")[0].metadata.items()}
    assert (meta["logs_read"], meta["logs_unchanged"], meta["runs_loaded"]) == (0, 4, 0)
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert table(con, runs_sql) == first
    assert table(con, "SELECT run_id, ingested_at FROM runs ORDER BY run_id") == stamps
    con.close()

    # W&B mirrors fail0001 (finished there) and a tick reloads the window holding all four offline runs.
    con = duckdb.connect(str(warehouse_path))
    created = table(con, "SELECT created_at FROM runs WHERE run_id = 'fail0001'")[0][0]
    mirrored = fleet_row(  # the same run in the same project the offline log names
        "fail0001",
        "finished",
        "regular",
        created,
        created + timedelta(minutes=5),
        entity="offline-team",
        project="offline-proj",
    )
    replace_runs_window(con, [mirrored], created - timedelta(days=1), created + timedelta(days=1))
    assert table(con, "SELECT run_id, source, state FROM runs ORDER BY run_id") == [
        ("ci0001", "offline", "finished"),
        ("fail0001", "wandb", "finished"),
        ("kill0001", "offline", "running"),
        ("sweep0001", "offline", "finished"),
    ]
    con.close()

    # The offline log of fail0001 grows: it is read again, but the mirrored row stays.
    log = next(offline_env.rglob("run-fail0001.wandb"))
    with log.open("ab") as handle:
        handle.write(b"\x00" * 10)
    grown = execute_offline(instance, [], now=soon)
    meta = {k: v.value for k, v in grown.asset_materializations_for_node("offline_runs")[0].metadata.items()}
    assert (meta["logs_read"], meta["runs_loaded"], meta["runs_kept_mirrored"]) == (1, 0, 1)
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert table(con, "SELECT source, state FROM runs WHERE run_id = 'fail0001'") == [("wandb", "finished")]
    assert table(con, f"SELECT loaded FROM offline_log_files WHERE path = '{log.resolve()}'") == [("kept mirrored",)]
    con.close()


def test_damage_is_counted_in_the_metadata_and_never_stops_the_other_runs(offline_env, instance, warehouse_path):
    from wandb_assets.ticks import execute_offline

    log = next(offline_env.rglob("run-ci0001.wandb"))
    log.write_bytes(log.read_bytes()[: int(log.stat().st_size * 0.6)])
    (offline_env / "junk").mkdir()
    (offline_env / "junk" / "run-junk.wandb").write_bytes(b"junk")
    result = execute_offline(instance, [])
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("offline_runs")[0].metadata.items()}
    found = sorted((r["kind"], Path(r["path"]).name) for r in (rec.data for rec in meta["damage"].records))
    found = [entry for entry in found if entry[1] != "run-kill0001.wandb"]  # (see the test above)
    assert (meta["logs_found"], meta["runs_loaded"], meta["reader"]) == (5, 4, "native")
    assert found == [("bad_header", "run-junk.wandb"), ("truncated", "run-ci0001.wandb")]
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert table(con, "SELECT state, list_contains(anomalies, 'log_damaged') FROM runs WHERE run_id = 'ci0001'") == [
        ("running", True)  # no exit record, last record seconds ago
    ]
    con.close()


def test_the_sensor_launches_on_new_or_grown_logs_only(offline_env, instance):
    from wandb_assets.defs.wandb_runs.offline import offline_run_logs

    context = build_sensor_context(instance=instance)
    first = offline_run_logs(context)
    assert first.__class__.__name__ == "RunRequest" and first.tags["wandb_assets/offline_logs_changed"] == "4"
    context = build_sensor_context(instance=instance, cursor=context.cursor)
    assert offline_run_logs(context).__class__.__name__ == "SkipReason"
    log = next(offline_env.rglob("run-sweep0001.wandb"))
    with log.open("ab") as handle:
        handle.write(b"\x00")
    context = build_sensor_context(instance=instance, cursor=context.cursor)
    grown = offline_run_logs(context)
    assert grown.__class__.__name__ == "RunRequest" and grown.tags["wandb_assets/offline_logs_changed"] == "1"
    assert grown.run_key != first.run_key


def test_a_running_runs_log_that_goes_quiet_is_read_again_and_the_run_is_crashed(offline_env, instance, warehouse_path):
    """kill0001 (SIGKILLed: no exit record) is ``running`` when its log is minutes old. Its bytes never change
    again, but 31 minutes after its last record it is past the 30-minute stall threshold: the next ingest reads
    that log again (only that one) and the run is ``crashed``; the one after reads nothing."""
    from wandb_assets.ticks import execute_offline

    def ingest(now: str = "") -> dict:
        result = execute_offline(instance, [], now=now)
        assert result.success
        return {k: v.value for k, v in result.asset_materializations_for_node("offline_runs")[0].metadata.items()}

    def kill_state() -> list[tuple]:
        con = duckdb.connect(str(warehouse_path), read_only=True)
        try:
            return table(con, "SELECT state, heartbeat_at FROM runs WHERE run_id = 'kill0001'")
        finally:
            con.close()

    assert ingest()["logs_read"] == 4
    [(state, last_record)] = kill_state()
    assert state == "running"
    # 29 minutes after the last record: not quiet yet, nothing read
    meta = ingest((last_record + timedelta(minutes=29)).isoformat())
    assert (meta["logs_read"], meta["logs_gone_quiet"]) == (0, 0)
    meta = ingest((last_record + timedelta(minutes=31)).isoformat())
    assert (meta["logs_read"], meta["logs_unchanged"], meta["logs_gone_quiet"], meta["runs_loaded"]) == (1, 3, 1, 1)
    assert kill_state() == [("crashed", last_record)]
    meta = ingest((last_record + timedelta(minutes=45)).isoformat())
    assert (meta["logs_read"], meta["logs_gone_quiet"]) == (0, 0)


def test_the_sensor_launches_when_a_log_goes_quiet(offline_env, instance):
    """A log unchanged since the last look, last written 40 minutes ago, was 20 minutes old at that look: it
    has just passed the 30-minute stall threshold, so the sensor launches the job (once)."""
    import os

    from wandb_assets.defs.wandb_runs.offline import offline_run_logs

    log = next(offline_env.rglob("run-kill0001.wandb"))
    written = time.time() - 40 * 60
    os.utime(log, (written, written))
    context = build_sensor_context(instance=instance)
    offline_run_logs(context)
    cursor = json.loads(context.cursor)
    context = build_sensor_context(instance=instance, cursor=json.dumps({**cursor, "at": written + 20 * 60}))
    request = offline_run_logs(context)
    assert request.__class__.__name__ == "RunRequest"
    assert (request.tags["wandb_assets/offline_logs_changed"], request.tags["wandb_assets/offline_logs_quiet"]) == (
        "0",
        "1",
    )
    context = build_sensor_context(instance=instance, cursor=context.cursor)
    assert offline_run_logs(context).__class__.__name__ == "SkipReason"


def test_ingest_offline_with_a_missing_path_exits_2_with_one_sentence(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "ingest-offline", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'nope'} does not exist: give .wandb files, run directories or folders to scan."
    )


def test_an_air_gapped_tick_feeds_datadog_without_reaching_wandb(offline_env, instance, monkeypatch):
    """No W&B key, W&B unreachable: the offline job and the feed still run, and the points carry the entity and
    project from WANDB_ENTITY / WANDB_PROJECT (the logs' own: logs of any other project are not loaded)."""
    from tests.capture import CaptureServer
    from tests.conftest import free_port
    from wandb_assets.ticks import execute_feed, execute_offline

    for name in ("WANDB_API_KEY", "WANDB_ASSETS_SLACK_WEBHOOK_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("WANDB_ENTITY", "offline-team")
    monkeypatch.setenv("WANDB_PROJECT", "offline-proj")
    capture = CaptureServer()
    try:
        monkeypatch.setenv("DD_API_KEY", "0123456789abcdef0123456789abcdef")
        monkeypatch.setenv("WANDB_ASSETS_DATADOG_URL", capture.url)
        assert execute_offline(instance, []).success
        assert execute_feed(instance).success
        (series,) = capture.bodies("/api/v2/series")
    finally:
        capture.stop()
    by_name = {s["metric"]: s for s in series["series"]}
    assert by_name["wandb.push_to_main.overview.sps"]["points"][0]["value"] == 3599.0
    assert by_name["wandb.runs.failed_24h"]["tags"] == [
        "source:wandb-assets",
        "entity:offline-team",
        "project:offline-proj",
    ]


@pytest.mark.parametrize(
    ("fixture", "version"),
    [
        ("wandb-0.10.33-offline-run-old01033.wandb.gz", "0.10.33"),
        ("wandb-0.15.12-offline-run-old01512.wandb.gz", "0.15.12"),
    ],
)
def test_logs_written_by_old_wandb_releases_themselves(fixture, version, tmp_path):
    """Real logs from wandb 0.10.33 and 0.15.12 (tests/fixtures/README.md has the script that wrote them)."""
    import gzip

    from tests.conftest import REPO

    path = tmp_path / fixture.removesuffix(".gz")
    path.write_bytes(gzip.decompress((REPO / "tests" / "fixtures" / fixture).read_bytes()))
    report = read_changed_logs([tmp_path], {}, now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
    (row,) = report.rows
    assert report.files[0]["damage"] == []
    assert (row["run_id"], row["state"], row["category"], row["cli_version"]) == (
        "old" + version.replace(".", "").rjust(5, "0"),
        "finished",
        "push_to_main",
        version,
    )
    assert (row["ci_commit"], row["tags"], row["group_name"], row["job_type"], row["gpu_count"]) == (
        "def5678",
        ["legacy"],
        "g",
        "bench",
        4,
    )
    assert (row["sps_overview_sps"], row["sps_timing_cumulative_sps"], row["summary_step"]) == (399.0, 499.0, 299)
    assert json.loads(row["config"]) == {"compute": {"gpu_count": 4}, "lr": 0.01, "nested": {"a": 1}}
    summary = json.loads(row["summary"])
    assert {k: summary[k] for k in ("loss", "eval", "best", "inf", "_step")} == {
        "loss": 1.0 / 300,
        "eval": {"acc": 299 / 300},
        "best": 7.5,
        "inf": math.inf,
        "_step": 299,
    }
    assert datetime(2026, 11, 23, 6, 48) <= row["created_at"] <= row["heartbeat_at"] < datetime(2026, 11, 23, 6, 49)


def test_a_key_logged_once_first_survives_a_later_key_its_nested_key_contains(tmp_path):
    """``train.loss`` is logged once, then ``loss`` 3,000 times (12,000 history items): the final summary has
    both. (The reader before the native one folded only the last 4,096 items after counting key encodings;
    ``train``/``loss`` contains ``loss``'s encoding, so the count came out even and ``train`` was lost.)"""
    write_offline_run(tmp_path, "early", 3000)
    run = read_offline_run(log_of(tmp_path, "early0001"))
    assert run.history_items == 4 * 3001  # train.loss, then loss; with _step, _runtime, _timestamp every row
    assert {k: run.summary[k] for k in ("train", "loss", "_step")} == {
        "train": {"loss": 5.0},
        "loss": 1 / 3000,
        "_step": 3000,
    }


def _read_both(path: Path, monkeypatch) -> tuple[str, str]:
    """The run read by the native reader and by the Python one, as comparable text (NaN-safe, order kept)."""
    from dataclasses import asdict

    from wandb_assets.lib import offline_runs

    native = json.dumps(asdict(read_offline_run(path)), default=str)
    with monkeypatch.context() as patch:
        patch.setattr(offline_runs, "_native", None)
        python = json.dumps(asdict(read_offline_run(path)), default=str)
    return native, python


def test_the_native_reader_is_built_and_in_use():
    """CI builds it (setup.py); a silent fallback to the Python reader would make the benchmark's numbers false."""
    from wandb_assets.lib import offline_runs

    assert offline_runs.reader() == "native"


def test_the_native_and_python_readers_agree_on_every_log_and_every_damage(offline_tree, tmp_path, monkeypatch):
    """The same run, field for field (damage list included), from both readers: every test log, the old
    releases' logs, the older format with and without a header, and per log 32 damaged copies (15 cut at random
    points, 15 with random bits flipped, junk appended, a block zeroed) plus up to 6 with parse-level damage
    behind a valid CRC (a key made invalid UTF-8, a length made impossible)."""
    import gzip
    import random

    from tests.conftest import REPO
    from tests.offline_logs import full_chunks, with_payload_byte

    root, _, _ = offline_tree
    logs = {run_id: log_of(root, run_id).read_bytes() for run_id in ("ci0001", "fail0001", "sweep0001", "kill0001")}
    for fixture in sorted((REPO / "tests" / "fixtures").glob("*.wandb.gz")):
        logs[fixture.name] = gzip.decompress(fixture.read_bytes())
    for header in (True, False):
        logs[f"legacy-{header}"] = legacy_log_bytes(legacy_records(300, 1795900000), header=header)
    rng = random.Random(13)
    compared, kinds = 0, set()
    for name, data in logs.items():
        copies = [data, data + b"junk after the end", data[: len(data) // 2] + bytes(32768) + data[len(data) // 2 :]]
        copies += [data[: rng.randrange(1, len(data))] for _ in range(15)]
        for _ in range(15):
            flipped = bytearray(data)
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            copies.append(bytes(flipped))
        chunks = (
            [c for c in full_chunks(data) if b"loss" in data[c[0] + 7 : c[0] + 7 + c[1]]]
            if name != "legacy-False"
            else []
        )
        for chunk in chunks[:: max(1, len(chunks) // 3)][:3]:
            at = data.index(b"loss", chunk[0] + 7) - chunk[0] - 7
            copies.append(with_payload_byte(data, chunk, at, 0xFF))  # not UTF-8: the record is unparsable
            copies.append(with_payload_byte(data, chunk, at - 1, 0x7F))  # a length running past the record
        for index, copy in enumerate(copies):
            path = tmp_path / f"{name}-{index}.wandb"
            path.write_bytes(copy)
            native, python = _read_both(path, monkeypatch)
            assert native == python, (name, index)
            kinds |= {d["kind"] for d in json.loads(native)["damage"]}
            compared += 1
    assert compared > 300
    assert kinds == {"corrupt", "truncated", "unparsable", "bad_header"}


def test_a_surrogate_in_a_logs_value_or_path_loses_no_log_of_the_scan(tmp_path, memory_con):
    """An offline log whose config holds a lone surrogate (as Python's json.dumps writes a surrogateescape'd
    path) under a folder whose name is not UTF-8: both logs of the scan land, the bad text is U+FFFD and counted,
    and the next scan finds the ledger's (mended) path unchanged and reads nothing."""
    import os

    from wandb_assets.lib.warehouse import load_offline_runs, read_offline_file_states, stage_rows

    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    records = legacy_records(3, 1_700_000_000)
    item = records[0].run.config.update.add()
    item.key, item.value_json = "data_dir", '"/data/caf\\udce9"'
    (folder / "run-legacy01.wandb").write_bytes(legacy_log_bytes(records))
    clean = legacy_records(3, 1_700_000_000)
    clean[0].run.run_id = "legacy02"
    (tmp_path / "run-legacy02.wandb").write_bytes(legacy_log_bytes(clean))

    report = read_changed_logs([tmp_path], {}, now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
    staged, _ = stage_rows(report.rows, str(tmp_path))
    assert load_offline_runs(memory_con, staged, report.files, datetime(2030, 1, 1))["loaded"] == 2
    got = memory_con.execute(
        "SELECT run_id, config->>'data_dir', log_path, anomalies FROM runs ORDER BY run_id"
    ).fetchall()
    assert got == [
        ("legacy01", "/data/caf\ufffd", str(tmp_path / "caf\ufffd" / "run-legacy01.wandb"), ["text_encoding"]),
        ("legacy02", None, str(tmp_path / "run-legacy02.wandb"), []),
    ]
    again = read_changed_logs(
        [tmp_path], read_offline_file_states(memory_con), now=datetime(2030, 1, 1), stall=STALL, default_gpus=1
    )
    assert (again.found, again.unchanged, again.rows) == (2, 2, [])


def test_logs_of_another_project_are_recorded_but_not_loaded(offline_tree):
    """A shared tree holds many teams' logs: with WANDB_ENTITY/WANDB_PROJECT set, only that project's runs are
    loaded into its gauges; the others are counted and recorded in the ledger as such."""
    root, _, after = offline_tree
    scan = dict(now=after + timedelta(hours=1), stall=STALL, default_gpus=1)
    other = read_changed_logs([root], {}, entity="offline-team", project="another-proj", **scan)
    assert (other.rows, other.other_project, len(other.files)) == ([], 4, 4)
    # wandb 0.31 records a run started under WANDB_SWEEP_ID offline with no entity and a project of its own
    # guess (the name of the folder it ran in): where a sync would put it, so another project's run too.
    sweep_project = read_offline_run(log_of(root, "sweep0001")).project
    assert sweep_project not in ("", "offline-proj")
    assert sorted(f["loaded"] for f in other.files) == sorted(
        [f"other project: /{sweep_project}", *["other project: offline-team/offline-proj"] * 3]
    )
    assert read_changed_logs([root], {}, entity="someone-else", project="offline-proj", **scan).other_project == 4
    same = read_changed_logs([root], {}, entity="offline-team", project="offline-proj", **scan)
    assert (sorted(r["run_id"] for r in same.rows), same.other_project) == (["ci0001", "fail0001", "kill0001"], 1)


def test_an_older_log_of_a_run_read_later_never_replaces_the_newer_logs_row(tmp_path, memory_con):
    """Two logs of one (resumed) run: the newer one's row stays when only the older log changes and is read
    again in a later scan; the ledger says why."""
    from wandb_assets.lib.warehouse import load_offline_runs, read_offline_file_states, stage_rows

    def scan(known):
        report = read_changed_logs([tmp_path], known, now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
        staged, _ = stage_rows(report.rows, str(tmp_path))
        return report, load_offline_runs(memory_con, staged, report.files, datetime(2030, 1, 1))

    old, new = tmp_path / "a" / "run-legacy01.wandb", tmp_path / "b" / "run-legacy01.wandb"
    for path, start in ((old, 1_700_000_000), (new, 1_700_100_000)):
        path.parent.mkdir()
        path.write_bytes(legacy_log_bytes(legacy_records(3, start)))
    first, counts = scan({})
    assert (len(first.files), counts["loaded"]) == (2, 1)
    newest = memory_con.execute("SELECT heartbeat_at, log_path FROM runs").fetchall()
    assert newest[0][1] == str(new)
    old.write_bytes(old.read_bytes() + b"\x00" * 7)  # the older log changes (a trailing block of padding)
    second, counts = scan(read_offline_file_states(memory_con))
    assert ([f["path"] for f in second.files], counts["loaded"], counts["kept_newer"]) == ([str(old)], 0, 1)
    assert memory_con.execute("SELECT heartbeat_at, log_path FROM runs").fetchall() == newest
    ledger = memory_con.execute("SELECT loaded FROM offline_log_files WHERE path = $p", {"p": str(old)}).fetchall()
    assert ledger == [("kept newer log",)]


def test_a_running_run_whose_log_vanished_is_crashed_past_the_stall_threshold(tmp_path, memory_con):
    """A killed job's log that is then deleted or moved is never read again: its run, still running in the
    warehouse, is crashed (``log_missing``) once its last record is older than the stall threshold, and only a
    log under the scanned folders counts as gone."""
    from wandb_assets.lib.warehouse import load_offline_runs, read_offline_file_states, stage_rows

    start = 1_700_000_000
    folder = tmp_path / "scanned"
    folder.mkdir()
    log = folder / "run-legacy01.wandb"
    log.write_bytes(legacy_log_bytes(legacy_records(3, start)[:-1]))  # no exit record: a job still running
    last = datetime.fromtimestamp(start + 2, UTC).replace(tzinfo=None)
    report = read_changed_logs([folder], {}, now=last + timedelta(minutes=1), stall=STALL, default_gpus=1)
    staged, _ = stage_rows(report.rows, str(tmp_path))
    load_offline_runs(memory_con, staged, report.files, last)
    assert memory_con.execute("SELECT state FROM runs").fetchall() == [("running",)]
    log.unlink()

    def rescan(paths, now):
        known = read_offline_file_states(memory_con)
        again = read_changed_logs(paths, known, now=now, stall=STALL, default_gpus=1)
        return again, load_offline_runs(memory_con, None, again.files, now, again.vanished, now - STALL)

    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    assert rescan([elsewhere], last + timedelta(hours=2))[0].vanished == []  # not under the scanned folder
    again, counts = rescan([folder], last + timedelta(minutes=10))  # gone, but not quiet long enough yet
    assert (again.vanished, counts["crashed_log_gone"]) == ([str(log)], 0)
    again, counts = rescan([folder], last + timedelta(minutes=31))
    assert counts["crashed_log_gone"] == 1
    got = memory_con.execute("SELECT state, ended_at, anomalies FROM runs").fetchall()
    assert got == [("crashed", last, ["log_missing"])]


def _log(folder: Path, run_id: str, project: str, start: int) -> Path:
    """A legacy offline log of ``team/<project>``'s run ``run_id``, three history rows from ``start``."""
    records = legacy_records(3, start)
    records[0].run.run_id, records[0].run.entity, records[0].run.project = run_id, "team", project
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{run_id}.wandb"
    path.write_bytes(legacy_log_bytes(records))
    return path


def test_the_same_run_id_in_two_projects_is_two_offline_runs_and_a_superseded_log_says_so(memory_con, tmp_path):
    """Finding 5 of code-review-2026-11c: offline runs were keyed by run id alone, so team/proj-a's exp1 was lost
    beside team/proj-b's while the ledger said "loaded". Now: two runs; of two logs of proj-a's exp1, the one that
    ends later is loaded and the other's ledger entry says "kept newer log"."""
    from wandb_assets.lib.projects import parse_projects

    old_a = _log(tmp_path / "a-old", "exp1", "proj-a", 1_700_000_000)
    new_a = _log(tmp_path / "a-new", "exp1", "proj-a", 1_700_000_500)
    b = _log(tmp_path / "b", "exp1", "proj-b", 1_700_000_000)
    scan = dict(now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
    report = read_changed_logs([tmp_path], {}, **scan)
    assert sorted((r["project"], r["log_path"]) for r in report.rows) == [("proj-a", str(new_a)), ("proj-b", str(b))]
    assert sorted((f["path"], f["loaded"]) for f in report.files) == sorted(
        [(str(old_a), "kept newer log"), (str(new_a), "loaded"), (str(b), "loaded")]
    )
    staged, _ = stage_rows(report.rows, str(tmp_path))
    assert load_offline_runs(memory_con, staged, report.files, datetime(2030, 1, 1))["loaded"] == 2
    assert memory_con.execute("SELECT project, run_id FROM runs ORDER BY ALL").fetchall() == [
        ("proj-a", "exp1"),
        ("proj-b", "exp1"),
    ]
    assert memory_con.execute("SELECT path, loaded FROM offline_log_files ORDER BY path").fetchall() == sorted(
        [(str(old_a), "kept newer log"), (str(new_a), "loaded"), (str(b), "loaded")]
    )
    # With WANDB_ASSETS_PROJECTS naming team/proj-b, only its log is loaded (the environment's WANDB_PROJECT unset).
    only_b = read_changed_logs([tmp_path], {}, selection=parse_projects("team/proj-b"), **scan)
    assert [r["project"] for r in only_b.rows] == ["proj-b"] and only_b.other_project == 2
    every = read_changed_logs([tmp_path], {}, selection=parse_projects("team/*"), **scan)
    assert len(every.rows) == 2


def test_a_newer_offline_row_of_one_project_never_blocks_the_same_run_id_of_another(memory_con):
    """Project A holds a newer row of exp1 than this scan's (older) A log; B's log of exp1 grew and finished: B is
    updated (it was kept at 08:00, running), A keeps its newer row."""
    import os
    import tempfile

    from wandb_assets.lib.warehouse import ensure_schema, ndjson_lines

    ensure_schema(memory_con)
    insert = (
        "INSERT INTO runs (entity, project, run_id, state, created_at, heartbeat_at, source, log_path) "
        "VALUES ('e', $p, 'exp1', $s, $c, $hb, 'offline', $log)"
    )
    # two runs named exp1 (started apart: one run, entity + id + creation time, is never counted in two projects)
    a_at, b_at = datetime(2026, 6, 1, 7), datetime(2026, 6, 1, 7, 30)
    memory_con.execute(
        insert, {"p": "A", "s": "finished", "c": a_at, "hb": datetime(2026, 6, 1, 12), "log": "/A-new/run.wandb"}
    )
    memory_con.execute(
        insert, {"p": "B", "s": "running", "c": b_at, "hb": datetime(2026, 6, 1, 8), "log": "/B/run.wandb"}
    )
    rows = [
        {
            "entity": "e",
            "project": p,
            "run_id": "exp1",
            "state": s,
            "created_at": created,
            "heartbeat_at": hb,
            "source": "offline",
            "log_path": log,
        }
        for p, s, created, hb, log in (
            ("A", "running", a_at, datetime(2026, 6, 1, 10), "/A-old/run.wandb"),
            ("B", "finished", b_at, datetime(2026, 6, 1, 11), "/B/run.wandb"),
        )
    ]
    fd, path = tempfile.mkstemp(suffix=".ndjson")
    with os.fdopen(fd, "w") as handle:
        handle.writelines(ndjson_lines(rows, datetime(2026, 6, 1, 13)))
    counts = load_offline_runs(memory_con, path, [], datetime(2026, 6, 1, 13))
    os.unlink(path)
    assert counts == {"loaded": 1, "kept_mirrored": 0, "kept_newer": 1, "crashed_log_gone": 0}
    assert memory_con.execute("SELECT project, state, heartbeat_at FROM runs ORDER BY 1").fetchall() == [
        ("A", "finished", datetime(2026, 6, 1, 12)),
        ("B", "finished", datetime(2026, 6, 1, 11)),
    ]


def test_only_regular_files_inside_the_tree_are_opened_so_a_fifo_never_hangs_the_job(tmp_path):
    """S3 of code-review-2026-11c: a FIFO named files/wandb-metadata.json blocked the offline job (holding the
    warehouse) for good. A FIFO, or a link leading out of the tree, is never opened; a link inside it is followed."""
    import os
    import threading

    from wandb_assets.lib.offline_runs import local_metadata

    tree, outside = tmp_path / "tree", tmp_path / "outside"
    run = _log(tree / "run-a", "a1", "p", 1_700_000_000)
    (run.parent / "files").mkdir()
    os.mkfifo(run.parent / "files" / "wandb-metadata.json")
    os.mkfifo(tree / "run-fifo.wandb")
    secret = _log(outside, "s1", "p", 1_700_000_000)
    (tree / "run-s1.wandb").symlink_to(secret)
    (tree / "run-a1-again.wandb").symlink_to(run)
    got: list = []
    reader_thread = threading.Thread(target=lambda: got.append(local_metadata(run)), daemon=True)
    reader_thread.start()
    reader_thread.join(5)
    assert got == [{"status": "malformed"}]
    assert find_run_logs([tree]) == ([run.resolve()], [])
    report = read_changed_logs([tree], {}, now=datetime(2030, 1, 1), stall=STALL, default_gpus=1)
    assert [r["run_id"] for r in report.rows] == ["a1"]


def test_an_offline_run_and_the_same_run_read_online_give_the_same_curves(
    offline_env, offline_tree, instance, warehouse_path, wandb_server, monkeypatch
):
    """The ci run's log (600 steps of overview/sps = 3000 + i and loss = 1/(i + 1), after a first row holding neither)
    read offline, and the same history served by the local W&B server as a mirrored run and read by the curves job:
    with 50 samples, the same 50 points per metric, the first (step 1) and last (step 600) among them, and the same
    steady SPS (the median after warm-up)."""
    from wandb_assets.lib.wandb_records import read_run
    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill, execute_curves, execute_offline

    monkeypatch.setenv("WANDB_ASSETS_HISTORY_KEYS", "overview/sps,loss")
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_SAMPLES", "50")
    soon = (offline_tree[2] + timedelta(minutes=1)).isoformat()
    assert execute_offline(instance, [], now=soon).success  # before the server: no WANDB_PROJECT, every log loads
    log = read_run(log_of(offline_env, "ci0001"))
    started = datetime.fromtimestamp(log.history[0]["_timestamp"], UTC).replace(tzinfo=None, microsecond=0)
    online = make_run_node(
        "cionline",
        display_name="github.sky.main.abc1234.ppo_atari.20261120T101010",
        state="finished",
        created_at=started,
        heartbeat_at=started + timedelta(minutes=5),
        history=log.history,
    )
    wandb_server([online])
    assert execute_backfill(instance, started.date(), started.date()).success
    assert execute_curves(instance).success
    con = duckdb.connect(str(warehouse_path), read_only=True)
    points = 'SELECT metric, step, "timestamp", value FROM run_history WHERE run_id = $r ORDER BY ALL'
    offline, mirrored = (con.execute(points, {"r": r}).fetchall() for r in ("ci0001", "cionline"))
    steady = dict(con.execute("SELECT run_id, sps_steady FROM runs WHERE run_id IN ('ci0001', 'cionline')").fetchall())
    statuses = table(con, "SELECT run_id, curves_status FROM runs WHERE run_id IN ('ci0001', 'cionline') ORDER BY 1")
    con.close()
    assert offline == mirrored
    sps = [step for metric, step, _, _ in offline if metric == "overview/sps"]
    assert (len(sps), sps[0], sps[-1]) == (50, 1, 600)
    assert len([p for p in offline if p[0] == "loss"]) == 50
    assert statuses == [("ci0001", "read"), ("cionline", "read")]
    assert steady["ci0001"] == steady["cionline"] is not None


def test_a_failing_curves_load_leaves_the_logs_unread_and_their_runs_out(
    offline_env, offline_tree, instance, warehouse_path, monkeypatch
):
    """The logs' curves are loaded in their runs' transaction: when that load fails, neither the runs nor the ledger
    entries are written, so the next run reads the logs again and loses nothing."""
    from wandb_assets.defs.wandb_runs import offline
    from wandb_assets.ticks import execute_offline

    soon = (offline_tree[2] + timedelta(minutes=1)).isoformat()

    def broken(*args, **kwargs):
        raise OSError("disk full while loading the curves")

    monkeypatch.setattr(offline, "load_curves_in_transaction", broken)
    assert not execute_offline(instance, [], now=soon).success
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert table(con, "SELECT count(*) FROM runs") == table(con, "SELECT count(*) FROM offline_log_files") == [(0,)]
    con.close()
    monkeypatch.undo()
    monkeypatch.setenv("WANDB_ASSETS_OFFLINE_DIRS", str(offline_env))
    result = execute_offline(instance, [], now=soon)
    meta = {k: v.value for k, v in result.asset_materializations_for_node("offline_runs")[0].metadata.items()}
    assert (meta["logs_read"], meta["runs_loaded"]) == (4, 4)
    # only the ci run logs the default SPS keys; none has GPU stats; the sweep run's log names no entity ("")
    assert meta["curves"] == {"read": 1, "none": 3}
