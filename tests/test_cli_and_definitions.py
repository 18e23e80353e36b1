"""The code location loads, the schedule plans ticks, and the CLI behaves as the README says."""

import os
import subprocess
import sys
from datetime import UTC, date, datetime

import duckdb
from dagster import RunRequest, build_schedule_context

from tests.conftest import API_KEY
from tests.test_pipeline_e2e import at, dataset
from wandb_assets.definitions import defs
from wandb_assets.defs.fleet.schedules import every_15_minutes
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, env_updates: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_updates or {})}
    env.pop("DAGSTER_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_definitions_validate():
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "wandb_assets.definitions"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation successful" in done.stdout + done.stderr


def test_definitions_contents():
    assert {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()} == {
        "runs",
        "push_to_main_sps",
        "success_rates",
        "gpu_hours",
        "fleet_snapshot",
        "datadog_feed",
        "fleet_alerts",
        "warehouse_snapshot",
        "fleet_report",
    }
    schedule = defs.get_schedule_def("every_15_minutes")
    assert schedule.cron_schedule == "*/15 * * * *"
    assert schedule.default_status.value == "RUNNING"
    assert defs.resolve_job_def("refresh").tags["dagster/max_runtime"] == "900"
    assert {s.name for s in defs.sensors} == {"after_fleet_snapshot", "pipeline_failure_alert"}
    assert all(s.default_status.value == "RUNNING" for s in defs.sensors)


def test_every_warehouse_writer_is_in_the_single_slot_pool(tmp_path, monkeypatch):
    import yaml
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    graph = defs.resolve_asset_graph()
    pools = {key.to_user_string(): graph.get(key).pools for key in graph.get_all_asset_keys()}
    assert all(p == {"warehouse"} for p in pools.values()), pools
    config = yaml.safe_load(open(os.path.join(REPO, "dagster.yaml")))
    assert config["concurrency"]["pools"]["default_limit"] == 1
    monkeypatch.chdir(tmp_path)  # the instance's storage paths are relative to the working directory
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path), config_dir=REPO)) as instance:
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert instance.run_monitoring_enabled


def test_schedule_reaches_back_to_the_oldest_unfinished_run(wandb_server, instance):
    wandb_server(
        [
            make_run_node("old", display_name="train", state="running", created_at=at(3, 5)),
            make_run_node("done", display_name="train", state="finished", created_at=at(1, 5)),
        ]
    )
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 10)).success
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 6, 10, 12, 15, tzinfo=UTC)
    )
    request = every_15_minutes(context)
    assert isinstance(request, RunRequest)
    assert request.tags["dagster/asset_partition_range_start"] == "2026-06-03"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-06-10"


def test_schedule_on_an_empty_warehouse_reads_yesterday_and_today(instance):
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 6, 10, 0, 0, tzinfo=UTC)
    )
    request = every_15_minutes(context)
    assert (request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]) == (
        "2026-06-09",
        "2026-06-10",
    )


def test_cli_backfill_then_refresh(wandb_server, warehouse_path):
    server = wandb_server(dataset())
    done = run_cli("backfill", "--start", "2026-06-01", "--end", "2026-06-03")
    assert done.returncode == 0, done.stderr
    assert "Backfilled 2026-06-01..2026-06-03" in done.stdout
    done = run_cli("refresh")
    assert done.returncode == 0, done.stderr
    assert "wandb.push_to_main.overview.sps" in done.stdout
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 8
    assert con.execute("SELECT count(DISTINCT snapshot_at), count(*) FROM fleet_metrics").fetchone() == (1, 20)
    con.close()
    assert server.count("Runs") == 2


def test_cli_failure_is_one_clear_line_without_the_key(wandb_server):
    wandb_server(dataset())
    done = run_cli(
        "backfill", "--start", "2026-06-01", "--end", "2026-06-02", env_updates={"WANDB_PROJECT": "no-such-project"}
    )
    assert done.returncode == 1
    assert "W&B project test-team/no-such-project was not found: check WANDB_ENTITY and WANDB_PROJECT." in done.stderr
    assert "Traceback" not in done.stderr
    assert API_KEY not in done.stdout + done.stderr


def test_cli_rejected_key(wandb_server):
    wandb_server(dataset(), api_key="local-" + "r" * 40)
    done = run_cli("refresh")
    assert done.returncode == 1
    assert "WANDB_API_KEY was rejected by http://127.0.0.1:" in done.stderr
    assert "Traceback" not in done.stderr
    assert API_KEY not in done.stdout + done.stderr


def test_cli_without_project():
    done = run_cli("refresh", env_updates={"WANDB_API_KEY": API_KEY, "WANDB_PROJECT": ""})
    assert done.returncode == 1
    assert "WANDB_PROJECT is not set: export the W&B project to mirror" in done.stderr
    assert "Traceback" not in done.stderr
