"""End to end: the real wandb client (through wandb-core) against the local server, real Dagster
materializations, a real DuckDB file."""

import json
from datetime import date, datetime

import pytest
from dagster import materialize

from tests.conftest import API_KEY
from wandb_assets.defs.fleet.jobs import plan_tick
from wandb_assets.defs.wandb_runs.assets import runs, staged_runs
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.resources import warehouse_resource
from wandb_assets.lib import fetch as fetch_rules
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill, execute_refresh, failure_message
from wandb_assets.warehouse import query_read_only

DAY = date(2026, 6, 2)
#: Fetch, then load: the two assets of the mirror.
MIRROR = [staged_runs, runs]


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 6, day, hour, minute)


def ci_summary(sps: float) -> dict:
    return {"overview/sps": sps, "overview/steps_per_second": sps, "_step": 100}


def dataset() -> list[dict]:
    """Six runs on 2026-06-02 and one either side of it."""
    return [
        make_run_node(
            "before", display_name="train-a", state="finished", created_at=at(1, 23, 59), heartbeat_at=at(2, 1)
        ),
        make_run_node(
            "ci-ok",
            display_name="github.sky.main.aaa1111.ppo.1780000000",
            state="finished",
            created_at=at(2, 0, 0),
            heartbeat_at=at(2, 1),
            config={"compute.gpu_count": 8},
            summary=ci_summary(100.0),
        ),
        make_run_node(
            "ci-crash",
            display_name="github.sky.main.bbb2222.ppo.1780000000",
            state="crashed",
            created_at=at(2, 2),
            heartbeat_at=at(2, 4),
            config={"compute": {"gpu_count": 4}},
            summary=ci_summary(90.0),
            summary_encoding="double",
        ),
        make_run_node(
            "ci-fail",
            display_name="github.sky.pr7.ccc3333.ppo.1780000000",
            state="failed",
            created_at=at(2, 3),
            heartbeat_at=at(2, 5),
            summary={"overview/sps": "NaN", "_step": 1},
            summary_encoding="triple",
        ),
        make_run_node(
            "sweep-1",
            display_name="eager-1",
            state="finished",
            sweep="swp123",
            created_at=at(2, 6),
            heartbeat_at=at(2, 7),
            summary="",
            summary_encoding="raw",
        ),
        make_run_node(
            "nameless",
            display_name=None,
            state="running",
            created_at=at(2, 8),
            summary="[1, 2]",
            summary_encoding="raw",
        ),
        make_run_node("lastsec", display_name="x.sweep", state="pending", created_at=at(2, 23, 59)),
        make_run_node("after", display_name="train-b", state="finished", created_at=at(3, 0), heartbeat_at=at(3, 1)),
    ]


def resources():
    return {"wandb": wandb_resource(), "warehouse": warehouse_resource()}


def table(path, sql):
    return query_read_only(str(path), sql)


def failing_day_materialization(instance) -> str:
    """Materialize DAY, expect the run to fail, and return the failure's sentence."""
    result = materialize(
        MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance, raise_on_error=False
    )
    assert not result.success
    return failure_message(result)


ROWS_SQL = "SELECT * EXCLUDE (ingested_at) FROM runs ORDER BY run_id"


def test_partition_holds_exactly_that_days_runs(wandb_server, warehouse_path, instance, monkeypatch):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")  # one slice per day: the filter is the whole day
    server = wandb_server(dataset())
    result = materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    assert result.success
    rows = table(
        warehouse_path,
        "SELECT run_id, category, state, gpu_count, ended_at, sps_overview_sps, ci_branch,"
        " json(summary)::VARCHAR FROM runs ORDER BY created_at",
    )
    assert rows == [
        (
            "ci-ok",
            "push_to_main",
            "finished",
            8,
            at(2, 1),
            100.0,
            "main",
            '{"overview/sps":100.0,"overview/steps_per_second":100.0,"_step":100}',
        ),
        (
            "ci-crash",
            "push_to_main",
            "crashed",
            4,
            at(2, 4),
            90.0,
            "main",
            '{"overview/sps":90.0,"overview/steps_per_second":90.0,"_step":100}',
        ),
        ("ci-fail", "push_to_main", "failed", 1, at(2, 5), None, "pr7", '{"overview/sps":"NaN","_step":1}'),
        ("sweep-1", "sweep", "finished", 1, at(2, 7), None, None, "{}"),
        ("nameless", "regular", "running", 1, None, None, None, "{}"),
        ("lastsec", "sweep", "pending", 1, None, None, None, "{}"),
    ]
    assert result.asset_materializations_for_node("runs")[0].metadata["rows_written"].value == 6
    metadata = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert metadata["runs_fetched"].value == 6
    assert metadata["malformed_runs"].value == 2
    assert metadata["malformed_fields"].value == {"summary": 2}
    assert sorted(metadata["malformed_run_ids"].value) == ["nameless", "sweep-1"]
    # One server-side filtered query per page: the client never fetched runs outside the day.
    runs_queries = [v for op, v in server.requests if op == "Runs"]
    assert len(runs_queries) == 1
    assert (
        runs_queries[0]["filters"] == '{"createdAt": {"$gte": "2026-06-02T00:00:00Z", "$lt": "2026-06-03T00:00:00Z"}}'
    )
    assert runs_queries[0]["perPage"] == 1000


def test_rematerializing_a_partition_gives_identical_rows(wandb_server, warehouse_path, instance):
    wandb_server(dataset())
    materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    first = table(warehouse_path, ROWS_SQL)
    materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    assert table(warehouse_path, ROWS_SQL) == first
    assert len(first) == 6


def test_pages_are_followed(wandb_server, warehouse_path, instance, monkeypatch):
    monkeypatch.setattr(fetch_rules, "MIN_PAGE_SIZE", 1)  # pages smaller than users may ask for
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "2")
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")
    server = wandb_server(dataset())
    materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    assert table(warehouse_path, "SELECT count(*) FROM runs") == [(6,)]
    assert server.count("Runs") == 3


def test_run_going_from_running_to_finished_between_ticks(wandb_server, warehouse_path, instance):
    today = date(2026, 6, 10)
    long_run = dict(display_name="train-long", created_at=at(6, 12), config={"compute.gpu_count": 2})
    server = wandb_server([make_run_node("long", state="running", heartbeat_at=at(9, 12), **long_run)])
    assert execute_backfill(instance, date(2026, 6, 1), today).success
    assert execute_refresh(instance, today, snapshot_at="2026-06-10T12:00:00").success
    assert table(warehouse_path, "SELECT state, ended_at FROM runs") == [("running", None)]
    server.upsert_runs([make_run_node("long", state="finished", heartbeat_at=at(10, 11), **long_run)])
    # The run was created four days before "today": the tick must reach back to its day by itself.
    assert execute_refresh(instance, today, snapshot_at="2026-06-10T12:15:00").success
    assert table(warehouse_path, "SELECT state, ended_at, duration_hours FROM runs") == [("finished", at(10, 11), 95.0)]
    snapshots = table(
        warehouse_path,
        "SELECT snapshot_at, value FROM fleet_metrics WHERE metric IN ('wandb.runs.active') ORDER BY snapshot_at",
    )
    assert snapshots == [(at(10, 12), 1.0), (at(10, 12, 15), 0.0)]
    completed = table(
        warehouse_path,
        "SELECT value FROM fleet_metrics WHERE metric = 'wandb.runs.completed_24h'"
        " AND snapshot_at = '2026-06-10 12:15:00'",
    )
    assert completed == [(1.0,)]


def test_tick_builds_tables_and_snapshot(wandb_server, warehouse_path, instance):
    wandb_server(dataset())
    result = execute_refresh(instance, date(2026, 6, 3), snapshot_at="2026-06-03T00:00:00")
    assert result.success
    gauges = dict(table(warehouse_path, "SELECT metric, value FROM fleet_metrics"))
    # A first tick reads yesterday and today only (06-02, 06-03): "before" (06-01) is not in the warehouse.
    # W = (06-02 00:00, 06-03 00:00]: finished ci-ok, sweep-1; crashed ci-crash, failed ci-fail; "after" was
    # created at exactly T so it counts as recent, but it ended after T. Latest CI SPS: ci-crash at 04:00.
    assert gauges["wandb.runs.completed_24h"] == 2
    assert gauges["wandb.runs.failed_24h"] == 2
    assert gauges["wandb.runs.active"] == 1
    assert gauges["wandb.runs.total_recent"] == 7
    assert gauges["wandb.push_to_main.overview.sps"] == 90.0
    assert gauges["wandb.push_to_main.success_rate_pct"] == pytest.approx(100 / 3)
    assert gauges["wandb.sweep.runs_total_24h"] == 2
    # The UI's view: one narrow table per family, the gauge named first, values rounded with their units (the
    # warehouse keeps full precision).
    metadata = result.asset_materializations_for_node("fleet_snapshot")[0].metadata
    assert [k for k in metadata if k.startswith("gauges_") and k != "gauges_defined"] == [
        "gauges_runs",
        "gauges_training",
        "gauges_push_to_main",
        "gauges_sweep",
        "gauges_gpu",
    ]
    assert [c.name for c in metadata["gauges_runs"].schema.columns] == ["gauge", "value"]
    rows = {
        f"{key.removeprefix('gauges_')}.{r.data['gauge']}": r.data["value"]
        for key, table_value in metadata.items()
        if key.startswith("gauges_") and key != "gauges_defined"
        for r in table_value.records
    }
    assert len(rows) == 24
    assert rows["runs.active"] == "1 runs"
    assert rows["push_to_main.success_rate_pct"] == "33.33 %"
    assert rows["push_to_main.overview.sps"] == "90.00 steps/s"
    assert not any(key.startswith("wandb.") for key in metadata)  # no entry per gauge: their keys narrowed every table
    assert table(warehouse_path, "SELECT count(*) FROM push_to_main_sps") == [(3,)]
    assert table(
        warehouse_path, "SELECT completed, failed FROM success_rates WHERE day = '2026-06-02' AND category = 'all'"
    ) == [(2, 2)]


def test_429_then_success_recovers(wandb_server, warehouse_path, instance, monkeypatch):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")
    server = wandb_server(dataset())
    server.faults.fail_status, server.faults.fail_count, server.faults.retry_after = 429, 2, 1
    result = materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    assert result.success
    # wandb-core tries twice (waiting the Retry-After second between), reports the 429; the fetch pauses, retries.
    assert server.count("Runs") == 3
    assert result.asset_materializations_for_node("staged_runs")[0].metadata["throttled_responses"].value == 1
    assert table(warehouse_path, "SELECT count(*) FROM runs") == [(6,)]


def test_persistent_500_fails_loudly_and_keeps_previous_rows(wandb_server, warehouse_path, instance, monkeypatch):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "50")
    server = wandb_server(dataset())
    materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance)
    before = table(warehouse_path, ROWS_SQL)
    server.upsert_runs([make_run_node("ci-ok", display_name="changed", state="failed", created_at=at(2, 0))])
    server.faults.fail_status, server.faults.fail_count = 500, -1
    failure = failing_day_materialization(instance)
    assert "Fetching W&B runs of test-team/test-project created 2026-06-02T00:00:00Z..2026-06-03T00:00:00Z" in failure
    assert "500" in failure
    assert API_KEY not in failure
    # The first materialization; then (two attempts each, inside wandb-core) the page at 50, at 25 (the
    # smallest size), and the two retries at 25.
    assert server.count("Runs") == 1 + 2 * 4
    assert "(page size 25)" in failure
    assert table(warehouse_path, ROWS_SQL) == before
    # The next attempt after the outage recovers by itself.
    server.faults.fail_count = 0
    assert materialize(MIRROR, partition_key=DAY.isoformat(), resources=resources(), instance=instance).success
    assert table(warehouse_path, "SELECT name FROM runs WHERE run_id = 'ci-ok'") == [("changed",)]


def test_an_older_unfinished_run_is_refreshed_by_id_not_by_re_reading_its_days(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """A run left ``running`` for weeks does not make every tick re-read every day since it was created: the tick
    reads yesterday and today whole, and the run alone by id."""
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")  # one slice per day: the filter is the whole day
    zombie = make_run_node("zombie", display_name="train-z", state="running", created_at=datetime(2026, 5, 10, 8))
    fresh = make_run_node("fresh", display_name="train-f", state="finished", created_at=at(9, 8), heartbeat_at=at(9, 9))
    server = wandb_server([zombie, fresh])
    assert execute_backfill(instance, date(2026, 5, 10), date(2026, 6, 10)).success
    server.upsert_runs(
        [
            make_run_node(
                "zombie",
                display_name="train-z",
                state="crashed",
                created_at=datetime(2026, 5, 10, 8),
                heartbeat_at=at(10, 1),
            )
        ]
    )
    server.requests.clear()
    result = execute_refresh(instance, date(2026, 6, 10), snapshot_at="2026-06-10T12:00:00")
    assert result.success
    assert (
        result.dagster_run.tags["dagster/asset_partition_range_start"],
        result.dagster_run.tags["dagster/asset_partition_range_end"],
    ) == ("2026-06-09", "2026-06-10")
    filters = [json.loads(v["filters"]) for op, v in server.requests if op == "Runs"]
    assert filters == [
        {"createdAt": {"$gte": f"2026-06-{d:02d}T00:00:00Z", "$lt": f"2026-06-{d + 1:02d}T00:00:00Z"}}
        for d in range(9, 11)
    ] + [{"name": {"$in": ["zombie"]}}]
    assert table(warehouse_path, "SELECT run_id, state FROM runs ORDER BY run_id") == [
        ("fresh", "finished"),
        ("zombie", "crashed"),
    ]
    metadata = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert metadata["older_unfinished_refreshed"].value == 1


def test_a_tick_after_an_outage_reads_the_days_it_missed(wandb_server, warehouse_path, instance, monkeypatch):
    """Ticks stopped after the one of June 6th (its snapshot taken); a run created and finished on the 7th, with no
    run left unfinished to pull the window back: the tick of June 10th reads the 6th through the 10th, not yesterday
    and today alone, and the run is in the warehouse; the tick after it reads yesterday and today again."""
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")  # one slice per day: the filter is the whole day
    server = wandb_server([make_run_node("early", display_name="train-e", state="finished", created_at=at(5, 8))])
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 6)).success
    assert execute_refresh(instance, date(2026, 6, 6), snapshot_at="2026-06-06T12:00:00").success
    server.upsert_runs([make_run_node("missed", display_name="train-m", state="finished", created_at=at(7, 8))])
    server.requests.clear()
    assert plan_tick(date(2026, 6, 10))[2] == "the last tick's snapshot was taken 2026-06-06: catching up from that day"
    result = execute_refresh(instance, date(2026, 6, 10), snapshot_at="2026-06-10T12:00:00")
    assert result.success
    tags = result.dagster_run.tags
    assert (tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]) == (
        "2026-06-06",
        "2026-06-10",
    )
    assert table(warehouse_path, "SELECT run_id FROM runs ORDER BY run_id") == [("early",), ("missed",)]
    again = execute_refresh(instance, date(2026, 6, 10), snapshot_at="2026-06-10T12:15:00")
    assert again.dagster_run.tags["dagster/asset_partition_range_start"] == "2026-06-09"


def test_a_corrupt_warehouse_is_reported_as_corrupt_not_locked(wandb_server, warehouse_path, instance):
    wandb_server(dataset())
    warehouse_path.parent.mkdir(parents=True, exist_ok=True)
    warehouse_path.write_bytes(b"this is not a DuckDB file" * 100)
    error = failing_day_materialization(instance)
    assert "looks damaged or is not a DuckDB file" in error
    assert "locked" not in error


def test_many_older_unfinished_runs_are_refreshed_in_chunks(wandb_server, warehouse_path, instance, monkeypatch):
    import wandb_assets.defs.wandb_runs.assets as runs_module

    zombies = [
        make_run_node(f"z{i}", display_name="train-z", state="running", created_at=datetime(2026, 5, 10, 8 + i))
        for i in range(3)
    ]
    server = wandb_server(zombies)
    assert execute_backfill(instance, date(2026, 5, 10), date(2026, 5, 10)).success
    monkeypatch.setattr(runs_module, "IDS_PER_REQUEST", 2)
    server.requests.clear()
    assert execute_refresh(instance, date(2026, 6, 10), snapshot_at="2026-06-10T12:00:00").success
    by_id = [
        json.loads(v["filters"])["name"]["$in"] for op, v in server.requests if op == "Runs" and "name" in v["filters"]
    ]
    assert sorted(by_id) == [["z0", "z1"], ["z2"]]


def test_slow_server_mode_charges_per_page_and_counts_requests_in_flight(wandb_server):
    """The benchmark's slow server: a fixed cost per Runs request plus a cost per run returned."""
    import threading
    import time
    import urllib.request

    server = wandb_server(dataset())  # 8 runs
    server.faults.cost_per_request_s, server.faults.cost_per_run_s = 0.3, 0.05
    query = "query Runs($project: String!, $entity: String!) { project { runs { edges { node { name } } } } }"
    body = json.dumps(
        {"query": query, "variables": {"entity": "test-team", "project": "test-project", "perPage": 4}}
    ).encode()

    def post() -> float:
        started = time.perf_counter()
        request = urllib.request.Request(server.url + "/graphql", data=body, method="POST")
        request.add_header(
            "Authorization", "Basic " + __import__("base64").b64encode(f"api:{API_KEY}".encode()).decode()
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert len(json.loads(response.read())["data"]["project"]["runs"]["edges"]) == 4
        return time.perf_counter() - started

    assert post() >= 0.3 + 4 * 0.05
    assert server.max_in_flight == 1
    threads = [threading.Thread(target=post) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.max_in_flight == 3
    deadline = time.monotonic() + 5  # a handler counts itself out just after its answer is sent
    while server.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.in_flight == 0
