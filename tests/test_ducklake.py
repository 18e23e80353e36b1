"""The warehouse as a DuckLake: catalog in the test PostgreSQL, Parquet files in moto's S3 server.

The same fleet goes through a backfill and two ticks in file mode and in lake mode (each in its own
process: the warehouse resource is built from the environment at import), and the 24 gauges of every
snapshot, the open alerts and the feed's ledger must match exactly. A reader holding the lake open across a
tick sees only committed snapshots and blocks nothing; a second writer waits for the `warehouse` pool.
"""

import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import boto3
import duckdb
import pandas
import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import PG_PASSWORD, REPO
from wandb_assets import warehouse
from wandb_assets.lib import lake
from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.lake import Lake, is_conflict, parse_catalog, redact, retry_on_conflict
from wandb_assets.lib.schema_docs import comment_statements
from wandb_assets.localwandb import LocalWandbServer
from wandb_assets.localwandb.synthetic import add_curves, generate_fleet
from wandb_assets.settings import load_settings, warehouse_location
from wandb_assets.warehouse import open_snapshot

NOW = datetime(2026, 6, 10, 12, 0)
FIRST, LAST = "2026-06-06", "2026-06-10"
TICKS = ("2026-06-10T11:30:00Z", "2026-06-10T12:00:00Z")
KEY = "local-" + "k" * 40
BUCKET = "lake"


@pytest.fixture(scope="module")
def s3_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(scope="module")
def fleet():
    """A synthetic fleet (five days, incidents included) served by the local W&B server."""
    nodes = generate_fleet(NOW, days=4, runs_per_day=150)
    add_curves(nodes, NOW)  # the lake holds their curves as the file does (the driver runs the curves job)
    server = LocalWandbServer(nodes, entity="team", project="fleet").start()
    yield server
    server.stop()


def _s3_keys(endpoint: str, prefix: str) -> list[str]:
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def _catalog(postgres) -> str:
    """A fresh catalog database; returns its conninfo (no password: PGPASSWORD carries it)."""
    import psycopg2

    name = f"lake_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(
        host=postgres["host"], port=postgres["port"], user="postgres", password=PG_PASSWORD, dbname="postgres"
    )
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    admin.close()
    return f"host={postgres['host']} port={postgres['port']} user=postgres dbname={name}"


def _env(tmp_path: Path, fleet: LocalWandbServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_ASSETS_", "AWS_", "DAGSTER_"))}
    env.update(
        WANDB_BASE_URL=fleet.url,
        WANDB_API_KEY=KEY,
        WANDB_ENTITY="team",
        WANDB_PROJECT="fleet",
        WANDB_ASSETS_START_DATE=FIRST,
        WANDB_ASSETS_STAGING_DIR=str(tmp_path / "staging"),
        WANDB_ASSETS_FETCH_CONCURRENCY="2",
        WANDB_DIR=str(tmp_path),
        WANDB_ASSETS_ANALYTICS="false",  # the driver builds the dbt models once, after its ticks
        **extra,
    )
    return env


@pytest.fixture
def lake_env(postgres, s3_endpoint, fleet, tmp_path):
    prefix = f"wh-{uuid.uuid4().hex[:8]}/"
    return _env(
        tmp_path,
        fleet,
        WANDB_ASSETS_DUCKDB=f"ducklake:postgres:{_catalog(postgres)}",
        WANDB_ASSETS_DUCKLAKE_DATA_PATH=f"s3://{BUCKET}/{prefix}",
        PGPASSWORD=PG_PASSWORD,
        AWS_ACCESS_KEY_ID="k",
        AWS_SECRET_ACCESS_KEY="s",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL_S3=s3_endpoint,
    )


@pytest.fixture
def folder_lake_env(postgres, fleet, tmp_path):
    """A lake whose catalog is in PostgreSQL and whose files are in a local folder: for the tests of readers and
    writers, where S3 (covered by the test above) would only add moto's cost."""
    return _env(
        tmp_path,
        fleet,
        WANDB_ASSETS_DUCKDB=f"ducklake:postgres:{_catalog(postgres)}",
        WANDB_ASSETS_DUCKLAKE_DATA_PATH=str(tmp_path / "lake-files") + "/",
        PGPASSWORD=PG_PASSWORD,
    )


def _drive(env: dict[str, str], *snapshots: str, first: str = FIRST) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.lake_driver", first, LAST, *snapshots],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_backfill_and_ticks_on_the_lake_give_what_file_mode_gives(lake_env, tmp_path, fleet, s3_endpoint):
    file_env = _env(tmp_path / "file", fleet, WANDB_ASSETS_DUCKDB=str(tmp_path / "file" / "w.duckdb"))
    file_mode = _drive(file_env, *TICKS)  # the dbt project on a file: test_analytics
    lake_mode = _drive({**lake_env, "LAKE_DRIVER_ANALYTICS": "1"}, *TICKS)
    # Hand-checked shape: 2 snapshots x 24 gauges; the fleet's three incidents are open; both snapshots sent
    # (dry run: no Datadog key); every fetched run once.
    assert len(file_mode["metrics"]) == len(lake_mode["metrics"]) == 48
    assert {m[0] for m in file_mode["metrics"]} == {"2026-06-10T11:30:00", "2026-06-10T12:00:00"}
    assert file_mode["deliveries"] == [["dry_run", 2]]
    assert file_mode["runs"][0] == file_mode["runs"][1] > 200
    assert file_mode["curves"][0] > 0 and file_mode["curves"][2] > 0 and file_mode["curves"][4] > 0  # then equal
    assert [key.split(":")[0] for (key,) in file_mode["alerts"]] == [
        "idle_gpus",  # the synthetic fleet's eight idle H100s
        "push_to_main_success_rate_low",
        "sps_regression",
        "stalled_run",
    ]
    # The same gauges; floating-point sums may differ in the last bits (rows are summed in another order
    # from Parquet files than from DuckDB's own storage), so values match to 1e-12, names and times exactly.
    lake_values = {(at, name): value for at, name, value in lake_mode.pop("metrics")}
    file_values = {(at, name): value for at, name, value in file_mode.pop("metrics")}
    assert lake_values.keys() == file_values.keys()
    differing = {
        key: (file_values[key], lake_values[key]) for key in file_values if lake_values[key] != file_values[key]
    }
    assert lake_values == pytest.approx(file_values, rel=1e-12, abs=1e-9), differing
    # The analysts' dbt models (and their docs) built on the lake: each month's chargeback is the lake's gpu_usage's,
    # and a run per row of runs in stg_runs and run_efficiency
    lake_marts = lake_mode.pop("marts")
    file_mode.pop("marts")
    assert lake_marts["chargeback"] and all(usage == mart for _, usage, mart in lake_marts["chargeback"])
    (efficiency, days, budgets, staged), runs = lake_marts["rows"][0], lake_mode["runs"][0]
    assert efficiency == staged == runs and days > 0 and budgets > 0
    assert lake_mode == file_mode
    # The lake's data are Parquet files in S3; in lake mode no snapshot copy and no DuckDB file are made.
    prefix = lake_env["WANDB_ASSETS_DUCKLAKE_DATA_PATH"].removeprefix(f"s3://{BUCKET}/")
    keys = _s3_keys(s3_endpoint, prefix)
    assert any(k.startswith(f"{prefix}main/runs/") and k.endswith(".parquet") for k in keys), keys
    assert sorted(p.name for p in tmp_path.rglob("*.duckdb")) == ["w.duckdb", "w.snapshot.duckdb"]  # file mode's
    # The analysts' door: open_snapshot() attaches the lake read-only; writing through it is refused.
    con = _open_snapshot_in(lake_env)
    file_con = open_snapshot(tmp_path / "file" / "w.duckdb")
    try:
        assert con.execute("SELECT count(*) FROM fleet_metrics").fetchone()[0] == 48
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("DELETE FROM fleet_metrics")
        # The notebook helpers answer the same on both.
        for helper in (warehouse.daily_fleet, warehouse.main_sps, warehouse.sps_regressions, warehouse.ci_runs):
            lake_frame, file_frame = helper(con), helper(file_con)
            assert len(file_frame) > 0, helper.__name__
            if helper is warehouse.daily_fleet:  # GPU-hours of still-running runs count up to the wall clock
                lake_frame, file_frame = (f.drop(columns=["gpu_runs", "gpu_hours"]) for f in (lake_frame, file_frame))
            if "run_id" in file_frame:
                lake_frame, file_frame = (f.sort_values("run_id", ignore_index=True) for f in (lake_frame, file_frame))
            pandas.testing.assert_frame_equal(lake_frame, file_frame, check_exact=False, rtol=1e-12)
    finally:
        con.close()
        file_con.close()


def _open_snapshot_in(env: dict[str, str]):
    """``open_snapshot()`` as an analyst with these variables would call it (in this process)."""
    from wandb_assets.warehouse import open_snapshot

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("WANDB_ASSETS_", "AWS_", "PG"))})
    try:
        return open_snapshot()
    finally:
        os.environ.clear()
        os.environ.update(saved)


READER = """
import os, sys, time
from wandb_assets.warehouse import open_snapshot
con = open_snapshot()
con.execute("BEGIN TRANSACTION")
count = "SELECT count(DISTINCT snapshot_at) FROM fleet_metrics"
print(con.execute(count).fetchone()[0], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print(con.execute(count).fetchone()[0], flush=True)  # same transaction: the snapshot it began with
con.execute("COMMIT")
print(con.execute(count).fetchone()[0], flush=True)  # a new transaction: the tick's commit
con.close()
"""


@pytest.mark.slow
def test_a_reader_holding_the_lake_open_across_a_tick_blocks_nothing(folder_lake_env, tmp_path):
    lake_env = folder_lake_env
    _drive(lake_env, TICKS[0], first=LAST)  # a lake with one snapshot (one day backfilled is enough here)
    go = tmp_path / "go"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(go)], env=lake_env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline().strip() == "1"  # attached, inside a transaction
        started = time.monotonic()
        tick = _drive(lake_env, TICKS[1], first=LAST)  # a whole tick while the reader holds the lake
        assert reader.poll() is None, "the reader must still be holding the lake"
        assert {m[0] for m in tick["metrics"]} == {"2026-06-10T11:30:00", "2026-06-10T12:00:00"}
        go.touch()
        assert [reader.stdout.readline().strip() for _ in range(2)] == ["1", "2"]
        assert reader.wait(timeout=60) == 0
        assert time.monotonic() - started < 300
    finally:
        reader.kill()


@pytest.mark.slow
def test_a_second_writer_waits_for_the_warehouse_pool(folder_lake_env, tmp_path, postgres):
    """A refresh against the PostgreSQL instance, while another run holds the one `warehouse` slot: it fetches
    (outside the pool) but does not write until the slot is free, then completes."""
    import psycopg2
    from dagster import DagsterInstance

    admin = psycopg2.connect(
        host=postgres["host"], port=postgres["port"], user="postgres", password=PG_PASSWORD, dbname="postgres"
    )
    admin.autocommit = True
    db = f"dagster_{uuid.uuid4().hex[:8]}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {db}")
    admin.close()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy" / "postgres" / "dagster.yaml").read_text())
    pg = {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_HOST": postgres["host"],
        "DAGSTER_PG_PORT": str(postgres["port"]),
        "DAGSTER_PG_USERNAME": "postgres",
        "DAGSTER_PG_PASSWORD": PG_PASSWORD,
        "DAGSTER_PG_DB": db,
    }
    saved = dict(os.environ)
    os.environ.update(pg)
    try:
        instance = DagsterInstance.get()
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default("warehouse")
        claim = storage.claim_concurrency_slot("warehouse", "other-writer", "runs")
        assert claim.slot_status.name == "CLAIMED"
        env = {**folder_lake_env, **pg}
        writer = subprocess.Popen(
            [sys.executable, "-m", "wandb_assets.cli", "refresh", "--quiet"],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            staging = Path(folder_lake_env["WANDB_ASSETS_STAGING_DIR"]) / "runs"
            deadline = time.monotonic() + 120
            while not list(staging.glob("*.ndjson")) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert list(staging.glob("*.ndjson")), "the fetch (outside the pool) should have staged its days"
            # Wait for the event itself: the refresh's `runs` step queued for the pool's slot (not a fixed sleep,
            # after which "nothing written" could mean "not there yet" as well as "held back by the pool").
            deadline, waiting = time.monotonic() + 120, []
            while not waiting and time.monotonic() < deadline and writer.poll() is None:
                waiting = [
                    step.step_key
                    for step in storage.get_concurrency_info("warehouse").pending_steps
                    if step.run_id != "other-writer"
                ]
                time.sleep(0.2)
            assert waiting == ["runs"], "the refresh's load should be queued for the warehouse slot"
            assert writer.poll() is None, "the writer must be waiting for the pool"
            assert _lake_tables(folder_lake_env) == set()  # nothing written: the `runs` step never got the slot
            storage.free_concurrency_slots_for_run("other-writer")
            output, _ = writer.communicate(timeout=300)
            assert writer.returncode == 0, output[-3000:]
        finally:
            writer.kill()
        assert "runs" in _lake_tables(folder_lake_env)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _lake_tables(env: dict[str, str]) -> set[str]:
    """The lake's tables, read straight from its catalog (no lake yet: none)."""
    try:
        con = _open_snapshot_in(env)
    except lake.LakeMissingError:
        return set()
    try:
        rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'warehouse'").fetchall()
        return {name for (name,) in rows}
    finally:
        con.close()


def test_a_lost_commit_is_retried_and_an_undecorated_one_fails(postgres, tmp_path, monkeypatch):
    location = Lake(catalog=_catalog(postgres), data_path=str(tmp_path / "data") + "/")
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)  # restored after the test: it must not leak into later ones
    first, second = lake.connect(location), lake.connect(location)
    try:
        first.execute("CREATE TABLE counters (name VARCHAR, value INTEGER)")
        first.execute("INSERT INTO counters VALUES ('ticks', 1)")
        attempts = []

        def bump(con) -> None:
            attempts.append(1)
            con.execute("BEGIN TRANSACTION")
            value = con.execute("SELECT value FROM counters WHERE name = 'ticks'").fetchone()[0]
            con.execute("DELETE FROM counters WHERE name = 'ticks'")
            con.execute("INSERT INTO counters VALUES ('ticks', $v)", {"v": value + 1})
            if len(attempts) == 1:  # another writer replaces the same row and commits first
                second.execute("BEGIN TRANSACTION; DELETE FROM counters; INSERT INTO counters VALUES ('ticks', 10);")
                second.execute("COMMIT")
            con.execute("COMMIT")

        with pytest.raises(duckdb.TransactionException) as lost:
            bump(first)
        assert is_conflict(lost.value)
        attempts.clear()
        retry_on_conflict(bump, first_wait_s=0.01)(first)
        assert len(attempts) == 2
        assert first.execute("SELECT name, value FROM counters").fetchall() == [("ticks", 11)]
    finally:
        first.close()
        second.close()


def test_a_new_lakes_schema_is_one_commit(folder_lake_env, monkeypatch):
    """Every table, view and comment of a new lake in one transaction: one snapshot, not one per statement
    (~150 catalog commits, each a snapshot the lake keeps until expired)."""
    from wandb_assets.lib.warehouse import ensure_schema

    catalog = warehouse_location(value=folder_lake_env["WANDB_ASSETS_DUCKDB"]).catalog
    location = Lake(catalog, folder_lake_env["WANDB_ASSETS_DUCKLAKE_DATA_PATH"])
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    con = lake.connect(location)
    try:
        ensure_schema(con)
        ensure_schema(con)  # current: no commit at all
        snapshots = con.execute("SELECT snapshot_id FROM ducklake_snapshots('warehouse') ORDER BY 1").fetchall()
        assert snapshots == [(0,), (1,)]  # the lake's creation, then the schema
        assert {"runs", "fleet_metrics", "alerts", "datadog_deliveries"} <= {
            name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        }
    finally:
        con.close()


def test_extensions_are_signature_checked_by_the_first_connection_of_a_process(monkeypatch):
    """The first lake connection loads the wheels' extensions with DuckDB's signature check; only after that do
    connections skip it (hashing 41 MB per connection); a connection that skipped it never counts as a check."""
    monkeypatch.setattr(lake, "_VERIFIED", set())
    assert lake.connection_config(None) == {"custom_user_agent": "wandb-assets"}
    unchecked = duckdb.connect(":memory:", config={"allow_unsigned_extensions": True})
    lake.load_extensions(unchecked, None)
    unchecked.close()
    assert lake.connection_config(None) == {"custom_user_agent": "wandb-assets"}
    checked = duckdb.connect(":memory:", config=lake.connection_config(None))
    lake.load_extensions(checked, None)
    checked.close()
    assert lake.connection_config(None) == {"custom_user_agent": "wandb-assets", "allow_unsigned_extensions": True}
    s3 = lake.S3Options(region="us-east-1")
    assert "allow_unsigned_extensions" not in lake.connection_config(s3)  # httpfs not checked yet


def test_lake_settings_and_their_errors(tmp_path):
    settings = load_settings(
        {
            "WANDB_ASSETS_DUCKDB": "ducklake:postgres:host=db port=5432 dbname=lake user=lake",
            "WANDB_ASSETS_DUCKLAKE_DATA_PATH": "s3://bucket/wh/",
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        }
    )
    location = warehouse_location(settings)
    assert location == Lake(
        catalog="host=db port=5432 dbname=lake user=lake",
        data_path="s3://bucket/wh/",
        s3=lake.S3Options(key_id="AKIDEXAMPLE", secret="s3cr3t", endpoint_url="http://127.0.0.1:9000"),
    )
    assert "s3cr3t" not in repr(location) and "s3cr3t" not in str(location)
    assert str(location) == "ducklake:postgres:host=db port=5432 dbname=lake user=lake"
    local = warehouse_location(
        load_settings({"WANDB_ASSETS_DUCKDB": "ducklake:postgres:dbname=x", "WANDB_ASSETS_DUCKLAKE_DATA_PATH": "d"})
    )
    assert local.s3 is None and local.data_path == str(Path("d").resolve()) + "/"
    assert parse_catalog("ducklake:postgres:dbname=lake") == "dbname=lake"
    for bad, message in (
        ("ducklake:sqlite:lake.db", "only a PostgreSQL catalog"),
        ("ducklake:postgres:dbname=lake password=hunter2", "PGPASSWORD"),
        ("ducklake:postgres:postgresql://u:hunter2@db/lake", "PGPASSWORD"),
        ("ducklake:postgres:postgresql://lake@db/lake?password=hunter2", "PGPASSWORD"),
        ("ducklake:postgres:postgresql://lake@db/lake?sslmode=require&password=hunter2", "PGPASSWORD"),
        ("ducklake:postgres:host=db sslpassword=hunter2 user=lake", "PGPASSWORD"),
        ("ducklake:postgres:host=db\tpassword = hunter2", "PGPASSWORD"),
        ("ducklake:postgres:host='db password=hunter2", "not a valid libpq conninfo"),
    ):
        with pytest.raises(ConfigError, match=message) as error:
            warehouse_location(load_settings({"WANDB_ASSETS_DUCKDB": bad}))
        assert "hunter2" not in str(error.value)
    assert (
        redact("connect failed: host=db password=hunter2 dbname=x") == "connect failed: host=db password=*** dbname=x"
    )
    assert redact("postgresql://u:hunter2@db/x") == "postgresql://u:***@db/x"
    assert redact("postgresql://u@db/x?password=hunter2&sslmode=require") == (
        "postgresql://u@db/x?password=***&sslmode=require"
    )
    assert redact("host=db sslpassword=hunter2") == "host=db sslpassword=***"
    assert redact("CREATE SECRET s (TYPE s3, KEY_ID 'AKID', SECRET 'it''s', SESSION_TOKEN 'tok')") == (
        "CREATE SECRET s (TYPE s3, KEY_ID '***', SECRET '***', SESSION_TOKEN '***')"
    )
    # Whatever got into a Lake, its text (CLI output, errors, metadata) never shows a password.
    assert str(Lake(catalog="host=db password=hunter2")) == "ducklake:postgres:host=db password=***"


def test_cli_refuses_a_password_in_the_catalog_with_exit_2(tmp_path):
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "WANDB_ASSETS_DUCKDB": "ducklake:postgres:dbname=lake password=hunter2",
        "DAGSTER_HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "refresh"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "PGPASSWORD" in done.stderr and "hunter2" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) == 1


def test_lake_comments_fold_view_columns_into_the_view_comment():
    file_mode, lake_mode = comment_statements(), comment_statements(lake=True)
    assert 'COMMENT ON COLUMN daily_fleet."gpu_hours" IS' in "\n".join(file_mode)
    assert not any(s.startswith("COMMENT ON COLUMN daily_fleet.") for s in lake_mode)
    view = next(s for s in lake_mode if s.startswith("COMMENT ON VIEW daily_fleet IS"))
    assert "Columns: day: " in view and "gpu_hours: " in view
    # tables keep their column comments in the lake
    assert any(s.startswith('COMMENT ON COLUMN runs."run_id"') for s in lake_mode)


def test_a_warehouse_file_from_a_newer_duckdb_fails_with_one_sentence(tmp_path, monkeypatch):
    """A file DuckDB 2.0.0 wrote (tests/fixtures: one table, made with the duckdb 2.0.0 wheel) cannot be opened by
    the pinned 1.5.5; the error names the fix instead of DuckDB's storage-version text."""
    import gzip
    import shutil

    from wandb_assets.defs.warehouse.resources import WarehouseResource
    from wandb_assets.warehouse import open_snapshot

    path = tmp_path / "newer.duckdb"
    fixture = REPO / "tests" / "fixtures" / "written-by-duckdb-2.0.0.duckdb.gz"
    with gzip.open(fixture) as source, open(path, "wb") as out:
        shutil.copyfileobj(source, out)
    resource = WarehouseResource(database=str(path))
    with pytest.raises(RuntimeError) as error, resource.get_connection():
        pass
    assert str(error.value) == (
        f"The warehouse {path} was written by a newer DuckDB than this one ({duckdb.__version__}, pinned for the "
        "DuckLake extensions): move it away and rebuild it with `uv run wandb-assets backfill`."
    )
    with pytest.raises(RuntimeError, match="rebuild it with `uv run wandb-assets backfill`"):
        open_snapshot(path, exact=True)


@pytest.mark.slow
def test_daily_maintenance_merges_the_lakes_files_expires_its_snapshots_and_keeps_every_row(
    folder_lake_env, monkeypatch
):
    """A backfill and a tick leave a snapshot per commit and small (or inlined) writes. Maintenance a month
    later (the retention is 7 days) keeps only the current snapshot, leaves fewer live data files, deletes the
    files nothing refers to, and every row of every table is as it was. The daily job runs it in the pool."""
    from datetime import timedelta

    from wandb_assets.lib.clock import utc_now
    from wandb_assets.lib.maintenance import maintain_lake

    _drive(folder_lake_env, TICKS[0], first=LAST)  # one day backfilled and a tick: enough commits
    done = subprocess.run(  # the job, as the schedule starts it (now: nothing old enough to expire)
        [
            sys.executable,
            "-c",
            "from wandb_assets.definitions import defs; "
            "print(defs.get_job_def('warehouse_maintenance').execute_in_process().success)",
        ],
        env=folder_lake_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]
    merged = re.search(r"DuckLake maintenance: (\d+) -> (\d+) snapshots, (\d+) -> (\d+) data files", done.stderr)
    assert merged, done.stderr[-2000:]
    snapshots, snapshots_now, files, files_now = map(int, merged.groups())
    assert snapshots_now > snapshots, merged.group(0)  # its own commits (flush, rewrite, merge)
    catalog = warehouse_location(value=folder_lake_env["WANDB_ASSETS_DUCKDB"]).catalog
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    con = lake.connect(Lake(catalog, folder_lake_env["WANDB_ASSETS_DUCKLAKE_DATA_PATH"]))
    try:
        listed = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'warehouse'").fetchall()
        tables = [name for (name,) in listed]
        before = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables}
        assert len(before["runs"]) > 10 and len(before["fleet_metrics"]) == 24
        result = maintain_lake(con, utc_now() + timedelta(days=30), timedelta(days=7))
        after = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables}
    finally:
        con.close()
    assert after == before
    assert result["snapshots_before"] > 10 and result["snapshots_after"] == 1
    assert result["data_files_after"] == result["data_files_before"] == files_now  # nothing left to merge
    assert result["files_deleted"] > 0


def test_maintenance_merges_the_small_files_of_window_rewrites(tmp_path):
    """Three delete-and-insert windows of 500 rows leave three small files: merged into one, rows unchanged, and
    (a month later) the older snapshots expired and the replaced files deleted from the folder."""
    from datetime import timedelta

    from wandb_assets.lib.clock import utc_now
    from wandb_assets.lib.maintenance import maintain_lake

    con = duckdb.connect(config=lake.connection_config(None))
    lake.load_extensions(con, None)
    con.execute(f"ATTACH 'ducklake:{tmp_path}/catalog.ducklake' AS w (DATA_PATH '{tmp_path}/files/')")
    con.execute("USE w")
    con.execute("CREATE TABLE t (a INTEGER, window_id INTEGER)")
    for window in (0, 1, 2, 0, 1, 2):  # the second round replaces the first
        con.execute("BEGIN")
        con.execute("DELETE FROM t WHERE window_id = ?", [window])
        con.execute("INSERT INTO t SELECT range, ? FROM range(500)", [window])
        con.execute("COMMIT")

    def files() -> list[str]:
        return sorted(p.name for p in (tmp_path / "files").rglob("*.parquet"))

    assert len(files()) == 6
    done = maintain_lake(con, utc_now() + timedelta(days=30), timedelta(days=7))
    assert (done["data_files_before"], done["data_files_after"]) == (3, 1)
    assert (done["snapshots_before"], done["snapshots_after"]) == (8, 1)  # creation, table, 6 windows; then 1
    assert done["files_deleted"] == 6 and len(files()) == 1
    assert con.execute("SELECT count(*), sum(a), count(DISTINCT window_id) FROM t").fetchone() == (1500, 374250, 3)
