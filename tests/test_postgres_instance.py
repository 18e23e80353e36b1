"""The Dagster instance on a real PostgreSQL (deploy/postgres/dagster.yaml): the CLI's tick and backfill, the
run-failure bookkeeping and the daemon's sensor ticks all land in PostgreSQL, none in SQLite.

A PostgreSQL 15 server is started for this module from the machine's binaries (``initdb`` as the
``postgres`` user into a temporary folder, ``pg_ctl`` on a free loopback port) and stopped at the end.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PG_PASSWORD as PASSWORD
from tests.conftest import REPO, cli, free_port
from tests.test_pipeline_e2e import dataset

SENSORS = ("after_fleet_snapshot", "pipeline_failure_opens", "pipeline_failure_resolves")


@pytest.fixture
def pg_home(postgres, tmp_path, monkeypatch):
    """DAGSTER_HOME holding deploy/postgres/dagster.yaml, the DAGSTER_PG_* variables set, a fresh database."""
    import psycopg2

    admin = psycopg2.connect(
        host=postgres["host"], port=postgres["port"], user="postgres", password=PASSWORD, dbname="postgres"
    )
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute("DROP DATABASE IF EXISTS dagster WITH (FORCE)")
        cursor.execute("CREATE DATABASE dagster")
    admin.close()
    shutil.copy(REPO / "deploy" / "postgres" / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    for name, key in (("HOST", "host"), ("PORT", "port"), ("USERNAME", "user"), ("PASSWORD", "password"), ("DB", "db")):
        monkeypatch.setenv(f"DAGSTER_PG_{name}", str(postgres[key]))
    return tmp_path


def _pg_query(postgres: dict, sql: str) -> list[tuple]:
    import psycopg2

    con = psycopg2.connect(
        host=postgres["host"], port=postgres["port"], user="postgres", password=PASSWORD, dbname=postgres["db"]
    )
    try:
        with con.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall()
    finally:
        con.close()


def test_cli_backfill_tick_and_failure_alert_are_recorded_in_postgres(
    postgres, pg_home, wandb_server, warehouse_path, capsys
):
    server = wandb_server(dataset())
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-03")
    assert code == 0, err
    code, out, err = cli(capsys, "refresh", "--quiet")
    assert code == 0, err
    # A failed backfill: the run fails (exit 1) and the pipeline_failure alert job runs, both recorded.
    server.faults.fail_status, server.faults.fail_count, server.faults.fail_after = 500, -1, 1
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 1
    jobs = _pg_query(postgres, "SELECT pipeline_name, status FROM runs ORDER BY create_timestamp")
    assert jobs == [
        ("backfill", "SUCCESS"),
        ("refresh", "SUCCESS"),
        ("feed", "SUCCESS"),
        ("backfill", "FAILURE"),
        ("pipeline_alert", "SUCCESS"),
    ]
    materialized = {
        row[0]
        for row in _pg_query(
            postgres, "SELECT DISTINCT asset_key FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
        )
    }
    assert {'["staged_runs"]', '["runs"]', '["fleet_snapshot"]', '["datadog_feed"]'} <= materialized
    # The warehouse pool's single slot is PostgreSQL's too.
    assert _pg_query(postgres, "SELECT concurrency_key, count(*) FROM concurrency_slots GROUP BY 1") == [
        ("warehouse", 1)
    ]
    assert not list(pg_home.rglob("*.db"))  # nothing went to SQLite
    assert PASSWORD not in out + err


def test_the_daemon_keeps_sensor_ticks_and_cursors_in_postgres(postgres, pg_home, wandb_server, capsys):
    """A real ``dagster-daemon`` against the PostgreSQL instance: the run-failure sensor sees a failed CLI run
    and its ticks and cursor are stored in PostgreSQL."""
    server = wandb_server(dataset())
    server.faults.fail_status, server.faults.fail_count, server.faults.fail_after = 500, -1, 1
    workspace = pg_home / "workspace.yaml"
    workspace.write_text(
        f"load_from:\n  - python_module:\n      module_name: wandb_assets.definitions\n"
        f"      working_directory: {REPO}\n"
    )
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
        cwd=pg_home,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        code, _, _ = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
        assert code == 1
        deadline = time.monotonic() + 150
        sensors: set[str] = set()
        while time.monotonic() < deadline:
            bodies = _pg_query(postgres, "SELECT tick_body FROM job_ticks WHERE type = 'SENSOR'")
            sensors = {name for (body,) in bodies for name in SENSORS if f'"{name}"' in body}
            if sensors == set(SENSORS):
                break
            time.sleep(3)
        assert sensors == set(SENSORS), f"sensor ticks in PostgreSQL: {sorted(sensors)}"
        # the run-status sensors keep their cursor (the last run they saw) in PostgreSQL
        cursors = _pg_query(postgres, "SELECT instigator_body FROM instigators WHERE instigator_type = 'SENSOR'")
        assert sum('"cursor"' in body and "pipeline_failure_opens" in body for (body,) in cursors) == 1
        # the daemon registered the schedule's state there too (its ticks come at the quarter hour)
        states = _pg_query(postgres, "SELECT instigator_type, count(*) FROM instigators GROUP BY 1 ORDER BY 1")
        assert states == [("SCHEDULE", 1), ("SENSOR", 3)]
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def test_the_images_code_server_serves_the_definitions_to_the_deploy_workspace(postgres, pg_home):
    """The Dockerfile's entry point, run here without Docker (no engine on this machine) on a loopback port,
    serves the code location that deploy/workspace.yaml (host and port pointed at it) loads and validates."""
    import json
    import re

    import yaml

    dockerfile = (REPO / "Dockerfile").read_text()
    entry_point = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
    assert entry_point[:3] == ["dagster", "code-server", "start"]
    port = free_port()
    workspace = yaml.safe_load((REPO / "deploy" / "workspace.yaml").read_text())
    workspace["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=port)
    local_workspace = pg_home / "workspace.yaml"
    local_workspace.write_text(yaml.safe_dump(workspace))
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen(
        [str(bin_dir / entry_point[0]), *entry_point[1:], "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, done = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            done = subprocess.run(
                [str(bin_dir / "dagster"), "definitions", "validate", "-w", str(local_workspace)],
                env=os.environ.copy(),
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                break
            time.sleep(2)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Validation successful for code location wandb_assets" in done.stderr + done.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
