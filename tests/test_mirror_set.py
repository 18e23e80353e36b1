"""A changed mirror set never changes what a number means: gauges, Datadog series and alerts count the projects
mirrored now; a project that left keeps its rows (its past GPU-hours too), its alive runs last seen when it left; a
failed ``entity/*`` listing changes nothing of that entity's projects.

Findings 6 and 13 of code-review-2026-11c, and issue 32's switch from ``WANDB_ASSETS_PROJECTS`` to one project."""

from datetime import date, datetime, timedelta

import pytest

from wandb_assets.lib.alerts import AlertThresholds, evaluate_rules
from wandb_assets.lib.derived import rebuild_gpu_hours, rebuild_gpu_usage
from wandb_assets.lib.gauges import compute_gauges, compute_project_gauges
from wandb_assets.lib.warehouse import ensure_schema, record_projects, record_snapshot

T0 = datetime(2026, 11, 1)
IDLE = [{"gpu_index": i, "utilisation": 0.0, "memory": 0.0} for i in range(8)]


def _insert(con, project: str, run_id: str, state: str = "running", created: datetime = T0) -> None:
    con.execute(
        "INSERT INTO runs (entity, project, run_id, name, state, category, created_at, heartbeat_at, gpu_count, "
        "latest_gpu_sample, url, ingested_at, anomalies, source) VALUES ('e', $p, $r, $r, $s, 'push_to_main', $t, $t, "
        "8, $g, 'u', $t, [], 'wandb')",
        {"p": project, "r": run_id, "s": state, "t": created, "g": IDLE},
    )


def _report(*projects: str, error: str | None = None) -> list[dict]:
    return [{"entity": "e", "project": p, "error": error} for p in projects]


def test_a_project_that_leaves_the_mirror_set_keeps_its_past_and_leaves_every_gauge_and_alert(memory_con):
    """``e/old`` and ``e/new`` mirrored, each with a run of 8 GPUs running since 2026-11-01 00:00 (last heartbeat
    then, 01:00 after a refresh). ``e/old`` leaves at 01:00: its run is vanished (unmirrored), last seen 01:00, 8
    GPU-hours kept; a day later the gauges count e/new alone (1 active, 192 GPU-hours in 24 h) and no alert names
    e/old. The change is reported as (left, came)."""
    ensure_schema(memory_con)
    _insert(memory_con, "old", "r1")
    _insert(memory_con, "new", "r2")
    memory_con.execute("UPDATE runs SET heartbeat_at = $t", {"t": T0 + timedelta(hours=1)})
    rows, left, came = record_projects(memory_con, _report("old", "new"), T0)
    assert (left, came) == ([], [])  # the first record is no change
    rows, left, came = record_projects(memory_con, _report("new", "other"), T0 + timedelta(hours=1))
    assert (left, came) == (["e/old"], ["e/other"])
    assert memory_con.execute("SELECT project, mirrored FROM wandb_projects ORDER BY 1").fetchall() == [
        ("new", True),
        ("old", False),
        ("other", True),
    ]
    assert memory_con.execute("SELECT project, state, anomalies FROM runs ORDER BY 1").fetchall() == [
        ("new", "running", []),
        ("old", "vanished", ["unmirrored"]),
    ]
    at = T0 + timedelta(days=1)
    for k in range(4):
        gauges = record_snapshot(memory_con, at + timedelta(minutes=15 * k))
    assert gauges["wandb.runs.active"] == 1 and gauges["wandb.gpu.idle_gpus"] == 8
    assert gauges["wandb.training.total_gpu_hours_24h"] == 192.0
    assert set(compute_project_gauges(memory_con, at)) == {("e", "new")}
    keys = {c.key for c in evaluate_rules(memory_con, at + timedelta(minutes=45), AlertThresholds(by_project=True))}
    assert keys and not any("e/old" in key for key in keys), keys
    rebuild_gpu_usage(memory_con, at, {}, {})
    rebuild_gpu_hours(memory_con)
    assert memory_con.execute(
        "SELECT project, sum(gpu_hours) FROM gpu_hours WHERE category = 'all' GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("new", 192.0), ("old", 8.0)]


@pytest.mark.breaks_invariants  # records e/b and e/c back without the fetch that asks their runs again
def test_switching_from_several_projects_to_one_counts_the_one_alone(memory_con):
    """A unit that forgot ``WANDB_ASSETS_PROJECTS`` mirrors one project: the gauges count its 1 run, not all 3."""
    ensure_schema(memory_con)
    for project in ("a", "b", "c"):
        _insert(memory_con, project, f"{project}1")
    record_projects(memory_con, _report("a", "b", "c"), T0)
    assert compute_gauges(memory_con, T0 + timedelta(hours=1))["wandb.runs.active"] == 3
    _, left, came = record_projects(memory_con, _report("a"), T0 + timedelta(hours=1))
    assert (left, came) == (["e/b", "e/c"], [])
    assert compute_gauges(memory_con, T0 + timedelta(hours=2))["wandb.runs.active"] == 1
    _, left, came = record_projects(memory_con, _report("a", "b", "c"), T0 + timedelta(hours=2))
    assert (left, came) == ([], ["e/b", "e/c"])


def test_a_failed_entity_listing_leaves_its_projects_as_they_were_and_no_phantom_project(memory_con):
    """Tick 1: e/a and e/b fine, e/c failing since 12:00. Tick 2 (12:15): listing e/* fails. Tick 3 (12:30): the
    listing works again. e/c's failure keeps its start (12:00); no project was "no longer mirrored"; ``*`` is gone."""
    ensure_schema(memory_con)
    noon = datetime(2026, 11, 20, 12)
    record_projects(memory_con, [*_report("a", "b"), *_report("c", error="HTTP 403")], noon)
    table = "SELECT project, mirrored, failing_since, last_error FROM wandb_projects ORDER BY 1"
    first = memory_con.execute(table).fetchall()
    _, left, _ = record_projects(
        memory_con, _report("*", error="Listing the projects of 'e' failed: HTTP 502"), noon + timedelta(minutes=15)
    )
    assert left == []
    during = memory_con.execute(table).fetchall()
    assert during == [("*", True, noon + timedelta(minutes=15), "Listing the projects of 'e' failed: HTTP 502")] + first
    record_projects(memory_con, [*_report("a", "b"), *_report("c", error="HTTP 403")], noon + timedelta(minutes=30))
    assert memory_con.execute(table).fetchall() == first
    assert first[2] == ("c", True, noon, "HTTP 403")


def test_the_unmirrored_runs_past_days_do_not_move(memory_con):
    """The billing tables keep every project: a run of e/old that ran two days before leaving keeps both days."""
    ensure_schema(memory_con)
    _insert(memory_con, "old", "r1", created=T0)
    memory_con.execute("UPDATE runs SET heartbeat_at = $t", {"t": T0 + timedelta(days=2)})
    record_projects(memory_con, _report("old"), T0)
    rebuild_gpu_usage(memory_con, T0 + timedelta(days=2), {}, {})
    rebuild_gpu_hours(memory_con)
    day_rows = "SELECT day, gpu_hours FROM gpu_hours WHERE category = 'all' ORDER BY day"
    before = memory_con.execute(day_rows).fetchall()
    assert before == [(date(2026, 11, 1), 192.0), (date(2026, 11, 2), 192.0)]
    record_projects(memory_con, _report("new"), T0 + timedelta(days=2))
    rebuild_gpu_usage(memory_con, T0 + timedelta(days=5), {}, {})
    rebuild_gpu_hours(memory_con)
    assert memory_con.execute(day_rows).fetchall() == before


def test_switching_a_warehouse_to_one_project_warns_and_counts_that_project_alone(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Issue 32: a unit that forgot WANDB_ASSETS_PROJECTS (three projects) and mirrors one WANDB_PROJECT exited 0
    without a word, its gauges counting all three under the one project's tag. Now the run warns, naming what left,
    and the gauges and per-project series count the one project."""
    from tests.test_projects import _nodes
    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    def running(prefix: str) -> list[dict]:
        return [
            make_run_node(f"{prefix}{n}", display_name=f"{prefix}-{n}", state="running", created_at=T0)
            for n in range(2)
        ]

    server = wandb_server(running("r"))  # test-team/test-project
    server.add_project("test-team", "vision", running("v"))
    server.add_project("lab", "rl", _nodes("l", 1, "rl"))
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/*, lab/rl")
    day = T0.date()
    assert execute_backfill(instance, day, day).success
    monkeypatch.delenv("WANDB_ASSETS_PROJECTS")  # WANDB_PROJECT=test-project remains
    result = execute_backfill(instance, day, day)
    assert result.success
    warnings = [
        e.message
        for e in instance.all_logs(result.run_id)
        if e.level >= 30 and "mirrored projects changed" in e.message
    ]
    assert warnings == [
        "The mirrored projects changed: no longer mirrored: lab/rl, test-team/vision (their rows stay, out of the "
        "gauges and alerts; their alive runs are last seen now)"
    ]
    import duckdb

    con = duckdb.connect(str(warehouse_path), read_only=True)
    try:
        now = T0 + timedelta(hours=1)
        assert compute_gauges(con, now)["wandb.runs.active"] == 2
        assert list(compute_project_gauges(con, now)) == [("test-team", "test-project")]
    finally:
        con.close()
    assert query_read_only(warehouse_path, "SELECT entity, project, run_id FROM alive_runs ORDER BY ALL") == [
        ("test-team", "test-project", "r0"),
        ("test-team", "test-project", "r1"),
    ]
