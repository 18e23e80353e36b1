"""Fleet curves (issue 34): each run's sampled history and system stream, read for 20 runs a request, once after
the run ends (at most hourly while it runs), into run_history and run_gpu_samples, with the run's row."""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wandb_assets.lib.accounting.gpus import MAX_GPUS
from wandb_assets.lib.curves import gpu_rows, history_rows, history_specs, parse_reads
from wandb_assets.lib.curves_warehouse import due_curves
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill, execute_curves, execute_refresh
from wandb_assets.warehouse import query_read_only

DAY = datetime(2026, 6, 1)


def _history(steps: int, start: datetime, key: str = "overview/sps", every: int = 1) -> list[dict]:
    """Steps 0..steps-1, one a second; ``key`` = 100 + step on every ``every``-th step, ``loss`` on every one."""
    rows = []
    for step in range(steps):
        row = {"_step": step, "_timestamp": (start + timedelta(seconds=step)).timestamp(), "loss": 1.0 / (step + 1)}
        if step % every == 0:
            row[key] = 100.0 + step
        rows.append(row)
    return rows


def _events(samples: int, start: datetime, gpus: int = 2) -> list[dict]:
    """One system sample a minute; GPU i at utilisation 10*i + sample, memory 50, power 300."""
    rows = []
    for k in range(samples):
        row = {"_timestamp": (start + timedelta(minutes=k)).timestamp(), "system.cpu": 5.0}
        for gpu in range(gpus):
            row |= {f"system.gpu.{gpu}.gpu": 10.0 * gpu + k, f"system.gpu.{gpu}.memory": 50.0}
            row[f"system.gpu.{gpu}.powerWatts"] = 300.0
        rows.append(row)
    return rows


def _backfill_and_curves(instance) -> bool:
    """A backfill of DAY, then one run of the curves job (its schedule's, between the ticks)."""
    return execute_backfill(instance, DAY.date(), DAY.date()).success and execute_curves(instance).success


def _run(run_id: str, state: str, hours: float = 1.0, **curves) -> dict:
    return make_run_node(
        run_id,
        display_name=None,
        state=state,
        created_at=DAY + timedelta(hours=1),
        heartbeat_at=DAY + timedelta(hours=1 + hours),
        **curves,
    )


def test_the_local_server_samples_as_w_and_b_does(wandb_server, monkeypatch):
    """sampledHistory: per spec, only rows holding every key, at most N, the first and last step kept; events:
    the system stream sampled the same way, as JSON strings."""
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.settings import pipeline_settings

    monkeypatch.setenv("WANDB_ASSETS_HISTORY_KEYS", "overview/sps,loss")
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_SAMPLES", "10")
    start = DAY + timedelta(hours=1)
    server = wandb_server([_run("a", "finished", history=_history(100, start, every=3), events=_events(30, start))])
    read: dict[str, dict] = {}
    wandb_resource().due_curves(
        [("test-team", "test-project", "a", True)], lambda path, final, runs: read.update(runs), pipeline_settings()
    )
    curves = parse_reads({("test-team", "test-project", "a"): read["a"]})[("test-team", "test-project", "a")]
    assert curves["status"] == "read"
    sps = [step for metric, step, _, _ in curves["history"] if metric == "overview/sps"]
    loss = [step for metric, step, _, _ in curves["history"] if metric == "loss"]
    # 34 rows hold overview/sps (steps 0, 3, ..., 99); 10 of them, the first (0) and last (99) among them
    assert len(sps) == 10 and sps[0] == 0 and sps[-1] == 99 and all(step % 3 == 0 for step in sps)
    assert len(loss) == 10 and loss[0] == 0 and loss[-1] == 99
    first = next(row for row in curves["history"] if row[0] == "overview/sps")
    assert first == ["overview/sps", 0, "2026-06-01T01:00:00", 100.0]
    # 30 samples x 2 GPUs -> 10 samples (first and last kept) x 2 GPUs
    assert len(curves["gpu"]) == 20
    assert curves["gpu"][:2] == [
        ["2026-06-01T01:00:00", 0, 0.0, 50.0, 300.0],
        ["2026-06-01T01:00:00", 1, 10.0, 50.0, 300.0],
    ]
    assert curves["gpu"][-1] == ["2026-06-01T01:29:00", 1, 39.0, 50.0, 300.0]
    assert server.count("RunCurves") == 1


def test_a_backfill_stores_each_ended_runs_curves_with_its_row_one_request_per_20_runs(
    wandb_server, warehouse_path, instance, monkeypatch
):
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_SAMPLES", "5")
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "2")
    start = DAY + timedelta(hours=1)
    ended = [
        _run(f"r{i:02d}", "finished", history=_history(20, start), events=_events(3, start, gpus=1)) for i in range(41)
    ]
    quiet = _run("quiet", "crashed")  # logged nothing: read, and 'none'
    pending = _run("pend", "pending")  # not read: nothing to read yet
    server = wandb_server([*ended, quiet, pending])
    server.faults.cost_per_request_s = 0.05  # slow enough that requests overlap
    assert _backfill_and_curves(instance)
    # 42 runs due (41 + quiet): 3 requests of at most 20 runs, in the fetch's budget of 2 in flight
    assert server.count("RunCurves") == 3
    assert server.max_in_flight <= 2
    statuses = dict(query_read_only(warehouse_path, "SELECT run_id, curves_status FROM runs"))
    assert statuses["r00"] == "read" and statuses["quiet"] == "none" and statuses["pend"] is None
    assert query_read_only(
        warehouse_path, "SELECT count(*), count(DISTINCT run_id), min(step), max(step) FROM run_history"
    ) == [(41 * 5, 41, 0, 19)]
    assert query_read_only(warehouse_path, "SELECT count(*), min(util_pct), max(util_pct) FROM run_gpu_samples") == [
        (41 * 3, 0.0, 2.0)
    ]
    # steady SPS, by hand: 5 of the 20 steps (0, 1, 7, 13, 19; overview/sps = 100 + step); warm-up is the first
    # 10% of the step range (steps below 1.9): the median of 107, 113 and 119 is 113
    assert query_read_only(
        warehouse_path,
        "SELECT DISTINCT sps_steady FROM runs WHERE run_id LIKE 'r%' UNION ALL "
        "SELECT sps_steady FROM runs WHERE run_id = 'quiet'",
    ) == [(113.0,), (None,)]
    # a second backfill of the same day reads none again: each ended run once (and keeps their steady SPS)
    assert _backfill_and_curves(instance)
    assert server.count("RunCurves") == 3
    assert query_read_only(warehouse_path, "SELECT count(*) FROM run_history") == [(41 * 5,)]
    assert query_read_only(warehouse_path, "SELECT count(*) FROM runs WHERE sps_steady = 113") == [(41,)]


def test_a_failed_read_is_retried_by_a_later_fetch_and_never_fails_the_run(
    wandb_server, warehouse_path, instance, monkeypatch
):
    start = DAY + timedelta(hours=1)
    server = wandb_server([_run("a", "finished", history=_history(10, start))])
    server.faults.fail_status, server.faults.fail_count = 500, -1
    server.faults.fail_operations = frozenset({"RunCurves"})
    assert _backfill_and_curves(instance)
    assert query_read_only(warehouse_path, "SELECT curves_status FROM runs") == [("failed",)]
    assert query_read_only(warehouse_path, "SELECT count(*) FROM run_history") == [(0,)]
    server.faults.fail_status = None
    assert _backfill_and_curves(instance)
    assert query_read_only(warehouse_path, "SELECT curves_status FROM runs") == [("read",)]
    assert query_read_only(warehouse_path, "SELECT count(*) FROM run_history") == [(10,)]


@pytest.mark.slow
def test_a_running_run_is_read_at_most_hourly_and_once_more_after_it_ends(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Ticks read a running run's curves again only when the last read is WANDB_ASSETS_HISTORY_REFRESH_MINUTES old;
    once it ends, they are read once more (the whole run) and replace the partial ones, never added to them."""
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    today = now.date()
    start = now - timedelta(hours=1)
    node = make_run_node(
        "live", display_name=None, state="running", created_at=start, heartbeat_at=now, history=_history(4, start)
    )
    server = wandb_server([node])
    assert execute_refresh(instance, today).success and execute_curves(instance).success
    assert server.count("RunCurves") == 1
    assert execute_refresh(instance, today).success and execute_curves(instance).success  # minutes later: not again
    assert server.count("RunCurves") == 1
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_REFRESH_MINUTES", "0.001")  # an hour later, as far as the rule goes
    assert execute_refresh(instance, today).success and execute_curves(instance).success
    assert server.count("RunCurves") == 2
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_REFRESH_MINUTES", "60")
    ends = datetime.now(UTC).replace(tzinfo=None, microsecond=0) + timedelta(seconds=2)  # after the last read
    ended = dict(node, state="finished", heartbeatAt=ends.isoformat() + "Z")
    ended["_history"] = _history(8, start)
    server.upsert_runs([ended])
    assert execute_refresh(instance, today).success and execute_curves(instance).success
    assert server.count("RunCurves") == 3  # once after it ended
    assert execute_refresh(instance, today).success and execute_curves(instance).success
    assert server.count("RunCurves") == 3  # and never again
    assert query_read_only(
        warehouse_path, "SELECT count(*), max(step) FROM run_history WHERE metric = 'overview/sps'"
    ) == [(8, 7)]


def test_curves_off_reads_none(wandb_server, warehouse_path, instance, monkeypatch):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_HISTORY", "false")
    server = wandb_server([_run("a", "finished", history=_history(10, DAY))])
    assert _backfill_and_curves(instance)
    assert server.count("RunCurves") == 0
    assert query_read_only(warehouse_path, "SELECT curves_status FROM runs") == [(None,)]


REFRESH = timedelta(hours=1)
NOW = datetime(2026, 6, 2, 12)


@pytest.mark.parametrize(
    ("state", "known", "due"),
    [
        ("finished", None, True),  # never read
        ("finished", ("failed", NOW, False), True),  # the last read failed
        ("finished", ("read", NOW - timedelta(minutes=1), False), True),  # read while it ran: once more
        ("finished", ("read", NOW + timedelta(seconds=1), True), False),  # read after its end: done
        ("crashed", ("none", NOW - timedelta(days=3), True), False),  # whatever the clocks say
        ("preempted", None, True),
        ("running", ("read", NOW - timedelta(minutes=59), False), False),
        ("running", ("read", NOW - timedelta(minutes=60), False), True),
        ("running", ("failed", NOW, False), True),
        ("running", None, True),
        ("pending", None, False),  # nothing to read yet
        ("vanished", None, False),  # W&B has it no more
    ],
)
def test_when_a_runs_curves_are_due(state, known, due):
    """``DUE_CURVES_SQL``, the one rule, on a warehouse row."""
    import duckdb

    from wandb_assets.lib.warehouse import ensure_schema

    con = duckdb.connect()
    ensure_schema(con)
    status, read_at, final = known or (None, None, None)
    con.execute(
        "INSERT INTO runs (entity, project, run_id, state, created_at, curves_status, curves_read_at, curves_final) "
        "VALUES ('e', 'p', 'r', $state, $created, $status, $read_at, $final)",
        {"state": state, "created": NOW - timedelta(hours=2), "status": status, "read_at": read_at, "final": final},
    )
    assert due_curves(con, NOW, REFRESH, 10) == (([("e", "p", "r", state != "running")], 1) if due else ([], 0))


@settings(deadline=None)  # each call parses in a DuckDB of its own (tens of ms on a busy machine)
@given(st.lists(st.one_of(st.none(), st.integers(), st.floats(), st.text(), st.dictionaries(st.text(), st.floats()))))
def test_history_and_system_rows_never_raise_and_keep_only_finite_numbers(junk):
    rows = history_rows(["m"], [junk])
    assert all(isinstance(v, float) and v == v and abs(v) != float("inf") for *_, v in rows)
    gpu_rows(junk)
    gpu_rows([json.dumps(x) if x is not None else "not json" for x in junk])


def test_one_spec_per_key_with_step_and_time():
    assert [json.loads(s) for s in history_specs(["a", "b"], 7)] == [
        {"keys": ["_step", "_timestamp", "a"], "samples": 7},
        {"keys": ["_step", "_timestamp", "b"], "samples": 7},
    ]


def _two_gpus_partly_idle() -> dict:
    """2 GPUs for 40 minutes, a sample every 10 minutes: GPU 0 at 0, 50, 0, 0 %; GPU 1 at 0, 0, 50, 0 %."""
    start = DAY + timedelta(hours=1)
    utils = [(0.0, 0.0), (50.0, 0.0), (0.0, 50.0), (0.0, 0.0)]
    events = [
        {"_timestamp": (start + timedelta(minutes=10 * k)).timestamp()}
        | {f"system.gpu.{gpu}.gpu": util for gpu, util in enumerate(pair)}
        for k, pair in enumerate(utils)
    ]
    return make_run_node(
        "idle2",
        display_name=None,
        state="finished",
        created_at=start,
        heartbeat_at=start + timedelta(minutes=40),
        config={"compute": {"gpu_count": 2}},
        events=events,
    )


def test_idle_and_partly_idle_gpu_hours_come_from_an_ended_runs_whole_sampled_stream(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """By hand: 2 GPUs for 40 minutes (1.333 GPU-hours), a sample every 10 minutes. GPU 0 at 0, 50, 0, 0 %; GPU 1 at
    0, 0, 50, 0 %; idle below 5 %. Idle GPUs per sample: 2, 1, 1, 2, each for 10 minutes: 60 GPU-minutes = 1.0 idle
    GPU-hour, of which 20 minutes (the two samples where the other GPU was busy) = 0.333 partly idle. No tick ever
    sampled this run: before curves, it counted no idle time at all."""
    wandb_server([_two_gpus_partly_idle()])
    assert _backfill_and_curves(instance)
    ((gpu_hours, idle, partly),) = query_read_only(
        warehouse_path, "SELECT gpu_hours, idle_gpu_hours, partly_idle_gpu_hours FROM gpu_usage"
    )
    assert (round(gpu_hours, 6), round(idle, 6), round(partly, 6)) == (round(80 / 60, 6), 1.0, round(20 / 60, 6))


def test_a_backlog_is_read_a_share_per_run_newest_ended_first_and_never_by_a_tick(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """45 ended runs, WANDB_ASSETS_HISTORY_RUNS_PER_TICK=20. The backfill and the ticks read no curves (their own job
    does, between the ticks); its first run reads the 20 that ended last (one request), the next the 20 before them,
    the third the last 5; a fourth, with nothing due, sends no RunCurves at all."""
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_RUNS_PER_TICK", "20")
    monkeypatch.setenv("WANDB_ASSETS_HISTORY_SAMPLES", "3")
    start = DAY + timedelta(hours=1)
    ended = [_run(f"r{i:02d}", "finished", hours=0.1 + i / 100, history=_history(3, start)) for i in range(45)]
    server = wandb_server(ended)
    assert execute_backfill(instance, DAY.date(), DAY.date()).success
    assert execute_refresh(instance, datetime.now(UTC).date()).success
    assert server.count("RunCurves") == 0
    assert execute_curves(instance).success
    assert server.count("RunCurves") == 1
    read_first = query_read_only(
        warehouse_path, "SELECT min(run_id), max(run_id), count(*) FROM runs WHERE curves_status = 'read'"
    )
    assert read_first == [("r25", "r44", 20)]  # r44 ended last
    for requests, read in ((2, 40), (3, 45), (3, 45)):
        assert execute_curves(instance).success
        assert server.count("RunCurves") == requests
        assert query_read_only(warehouse_path, "SELECT count(*) FROM runs WHERE curves_status = 'read'") == [(read,)]
    assert query_read_only(warehouse_path, "SELECT count(*) FROM run_history") == [(45 * 3,)]


def test_changing_the_idle_threshold_judges_the_curves_idle_hours_again(wandb_server, warehouse_path, instance):
    """The run of the idle test, judged at 5 % (1.0 idle GPU-hour, 0.333 partly idle), then at 60 %: every sample of
    both GPUs (0 or 50 %) is idle, 2 GPUs x 40 minutes = 1.333 idle GPU-hours, none partly idle. gpu_usage never
    mixes the two thresholds."""
    import duckdb

    from wandb_assets.lib.derived import rebuild_gpu_usage

    wandb_server([_two_gpus_partly_idle()])
    assert _backfill_and_curves(instance)
    idle_sql = "SELECT round(sum(idle_gpu_hours), 6), round(sum(partly_idle_gpu_hours), 6) FROM gpu_usage"
    assert query_read_only(warehouse_path, idle_sql) == [(1.0, round(20 / 60, 6))]
    with duckdb.connect(str(warehouse_path)) as con:
        rebuild_gpu_usage(con, datetime(2026, 6, 2), {}, {}, idle_pct=60.0)
    assert query_read_only(warehouse_path, idle_sql) == [(round(80 / 60, 6), 0.0)]
    assert query_read_only(warehouse_path, "SELECT DISTINCT idle_pct FROM run_curve_idle") == [(60.0,)]


def test_the_curves_command_reads_the_whole_backlog_round_after_round(
    wandb_server, warehouse_path, instance, monkeypatch, capsys
):
    """After a backfill and one curves run (20 of 45 runs' curves), `wandb-assets curves` reads the other 25 in two
    rounds of at most 20 (two requests), says so, and stops when none is due; `--once` with nothing due asks
    nothing."""
    from wandb_assets.cli import main

    monkeypatch.setenv("WANDB_ASSETS_HISTORY_RUNS_PER_TICK", "20")
    start = DAY + timedelta(hours=1)
    server = wandb_server([_run(f"r{i:02d}", "finished", history=_history(3, start)) for i in range(45)])
    assert _backfill_and_curves(instance)
    capsys.readouterr()
    assert main(["curves"]) == 0
    out = capsys.readouterr().out
    assert server.count("RunCurves") == 3
    assert "Curves: 20 run(s) read in 1 request(s) {'read': 20}; 5 more due" in out
    assert "Curves: 5 run(s) read in 1 request(s) {'read': 5}; 0 more due" in out
    assert "Read the curves of 25 run(s) in 2 round(s)" in out
    assert query_read_only(warehouse_path, "SELECT count(*) FROM runs WHERE curves_status = 'read'") == [(45,)]
    assert main(["curves", "--once"]) == 0
    assert server.count("RunCurves") == 3


def test_the_curves_command_says_when_curves_are_off(monkeypatch, capsys, instance):
    from wandb_assets.cli import main

    monkeypatch.setenv("WANDB_ASSETS_FETCH_HISTORY", "false")
    assert main(["curves"]) == 2
    assert capsys.readouterr().err == (
        "error: WANDB_ASSETS_FETCH_HISTORY is false: set it to true to read the runs' curves.\n"
    )


def test_the_curves_schedule_skips_while_curves_are_off_and_never_stacks_runs(instance, monkeypatch):
    from dagster import DagsterRunStatus, RunRequest, SkipReason, build_schedule_context

    from wandb_assets.defs.fleet.schedules import curves_between_ticks

    with build_schedule_context(instance=instance) as context:
        assert isinstance(curves_between_ticks(context), RunRequest)
        monkeypatch.setenv("WANDB_ASSETS_FETCH_HISTORY", "false")
        assert "WANDB_ASSETS_FETCH_HISTORY is false" in curves_between_ticks(context).skip_message
        monkeypatch.setenv("WANDB_ASSETS_FETCH_HISTORY", "true")
        from wandb_assets.definitions import defs

        job = defs.resolve_job_def("curves")
        instance.create_run_for_job(job, status=DagsterRunStatus.STARTED)
        skipped = curves_between_ticks(context)
        assert isinstance(skipped, SkipReason) and "still in flight" in skipped.skip_message


def _ci_series(con, summary: list[float], steady: list[float | None]) -> None:
    """Main-branch runs of one CI config, one an hour, with their summary overview/sps and their steady SPS."""
    for k, (final, calm) in enumerate(zip(summary, steady, strict=True)):
        at = DAY + timedelta(hours=k)
        con.execute(
            "INSERT INTO runs (entity, project, run_id, name, category, ci_branch, ci_config, ci_commit, ci_timestamp, "
            "state, created_at, ended_at, summary, sps_steady, curves_status) VALUES ('e', 'p', $id, $id, "
            "'push_to_main', 'main', 'ppo', $commit, $at, 'finished', $at, $at + INTERVAL 30 MINUTE, $summary, $calm, "
            "CASE WHEN $calm IS NULL THEN NULL ELSE 'read' END)",
            {
                "id": f"r{k:02d}",
                "commit": f"c{k:02d}",
                "at": at,
                "summary": json.dumps({"overview/sps": final}),
                "calm": calm,
            },
        )


def test_the_detector_judges_steady_sps_where_the_curves_are_of_its_metric():
    """24 main runs whose summaries (their last epoch) hold ~1,000 SPS throughout, while their curves' steady SPS
    falls from ~1,000 to ~700 at run 18: the detector finds that 30 % drop, first slow commit c18, on steady SPS; on
    the summaries alone (curves of another metric, or none recorded) it finds nothing."""
    import duckdb

    from wandb_assets.lib.alerts import find_change_points
    from wandb_assets.lib.curves_warehouse import STEADY_METRIC_KEY
    from wandb_assets.lib.warehouse import ensure_schema

    con = duckdb.connect()
    ensure_schema(con)
    wobble = [990.0, 1010.0] * 12
    _ci_series(con, wobble, [w if k < 18 else 0.7 * w for k, w in enumerate(wobble)])
    at = DAY + timedelta(days=2)
    assert find_change_points(con, at, "overview/sps") == []  # no metric recorded: the summaries
    con.execute("INSERT INTO warehouse_meta VALUES ($k, 'charts/SPS')", {"k": STEADY_METRIC_KEY})
    assert find_change_points(con, at, "overview/sps") == []  # steady SPS of another metric: the summaries
    con.execute("UPDATE warehouse_meta SET value = 'overview/sps' WHERE key = $k", {"k": STEADY_METRIC_KEY})
    (found,) = find_change_points(con, at, "overview/sps")
    assert (found["first_slow_commit"], found["last_good_commit"], round(found["change_pct"])) == ("c18", "c17", -30)


def test_a_changed_sps_metric_restates_every_runs_steady_sps_at_the_next_load():
    """A run with curves of two metrics, its steady SPS of overview/sps (50) recorded; WANDB_ASSETS_SPS_METRIC becomes
    charts/SPS: the next load (with nothing new to load) restates it from charts/SPS, 100 + step over steps 0..10:
    warm-up is steps below 1, so the median of 101..110 = 105.5, and records the metric."""
    import duckdb

    from wandb_assets.lib.curves_warehouse import load_curves, steady_metric
    from wandb_assets.lib.warehouse import ensure_schema

    con = duckdb.connect()
    ensure_schema(con)
    con.execute(
        "INSERT INTO runs (entity, project, run_id, curves_status, sps_steady) VALUES ('e', 'p', 'r', 'read', 50)"
    )
    for step in range(11):
        con.execute(
            "INSERT INTO run_history VALUES ('e', 'p', 'r', 'charts/SPS', $s, NULL, 100 + $s), "
            "('e', 'p', 'r', 'overview/sps', $s, NULL, 50)",
            {"s": step},
        )
    assert load_curves(con, [], "overview/sps", 5.0, NOW)["steady_restated"] == 1  # first load: recorded
    assert (steady_metric(con), con.execute("SELECT sps_steady FROM runs").fetchone()) == ("overview/sps", (50.0,))
    assert load_curves(con, [], "overview/sps", 5.0, NOW)["steady_restated"] == 0
    assert load_curves(con, [], "charts/SPS", 5.0, NOW)["steady_restated"] == 1
    assert (steady_metric(con), con.execute("SELECT sps_steady FROM runs").fetchone()) == ("charts/SPS", (105.5,))


def test_an_sps_metric_no_curve_holds_is_named_with_the_key_the_runs_log(tmp_path, capsys):
    """The organisation logs overview/steps_per_second, WANDB_ASSETS_SPS_METRIC says overview/sps: steady SPS is
    empty for every run; the curves job's log and `check` say which key to set (issue 43)."""
    import duckdb

    from tests.conftest import cli
    from wandb_assets.lib.curves_warehouse import sps_metric_advice
    from wandb_assets.lib.warehouse import ensure_schema

    path = tmp_path / "w.duckdb"
    con = duckdb.connect(str(path))
    ensure_schema(con)
    assert sps_metric_advice(con, "overview/sps") is None  # no curves yet: nothing to say
    con.execute(
        "INSERT INTO run_history VALUES ('e', 'p', 'a', 'overview/steps_per_second', 1, NULL, 9), "
        "('e', 'p', 'a', 'overview/steps_per_second', 2, NULL, 9), ('e', 'p', 'b', 'overview/steps_per_second', 1, "
        "NULL, 9), ('e', 'p', 'c', 'timing_cumulative/sps', 1, NULL, 9)"
    )
    advice = (
        "No run's curves hold WANDB_ASSETS_SPS_METRIC='overview/sps', so steady SPS is empty; 2 run(s)' curves hold "
        "'overview/steps_per_second': set WANDB_ASSETS_SPS_METRIC=overview/steps_per_second (the sps_regression alert "
        "then watches it too)."
    )
    assert sps_metric_advice(con, "overview/sps") == advice
    assert sps_metric_advice(con, "timing_cumulative/sps") is None  # one run logs it: the setting is in use
    con.close()
    code, out, _ = cli(capsys, "check", "--warehouse", str(path))
    assert code == 0 and out.splitlines()[-1] == f"note: {advice}"


_KEYS = ["overview/sps", "a~b", "m"]
_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 1.5, 1e19, -1, 253402300799, 253402300800, 1780401600.25, 2**63, -(2**63)]),
)
_VALUES = st.one_of(st.booleans(), st.none(), st.text(max_size=3), st.just([1]), st.just({"x": 1}))
_MOSTLY_NUMBERS = st.one_of(_NUMBERS, _NUMBERS, _NUMBERS, _VALUES)
_POINT = st.fixed_dictionaries({}, optional={key: _MOSTLY_NUMBERS for key in ("_step", "_timestamp", *_KEYS, "other")})
_GPU_KEYS = [
    "system.gpu.0.gpu", "system.gpu.0.memory", "system.gpu.1.powerWatts", "system.gpu.1.gpu", "system.gpu.7.temp",
    "system.gpu.4096.gpu", "system.gpu.12345.gpu", "system.gpu.x.gpu", "system.gpu.2.gpu_x", "system.cpu",
    "system.gpu.01.gpu", "system.gpu.0.GPU", "System.gpu.0.gpu", "system.gpu.4095.memory",
]  # fmt: skip
_EVENT = st.fixed_dictionaries(
    {"_timestamp": _MOSTLY_NUMBERS}, optional={key: _MOSTLY_NUMBERS for key in _GPU_KEYS}
) | st.dictionaries(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=4), _MOSTLY_NUMBERS)
#: An event whose values are all numbers (W&B's own: each takes the parse's fast path).
_NUMBERS_EVENT = st.fixed_dictionaries({"_timestamp": _NUMBERS}, optional=dict.fromkeys(_GPU_KEYS, _NUMBERS))
_HAND_WRITTEN_NUMBERS = [
    "0", "-0", "1E2", "1.0e+2", "-12.5e-1", "123456789012345678", "-123456789012345678", "1234567890123456789",
    "1e400", "-1e400", "1e-400", "0.1e1", "01", "1.", ".5", "+1", "0x1", "1e", "--1",
]  # fmt: skip
#: The same as text the way other writers put it: without spaces, over lines, or with a number written by hand.
_NUMBERS_TEXT = st.one_of(
    _NUMBERS_EVENT.map(lambda event: json.dumps(event, separators=(",", ":"))),
    _NUMBERS_EVENT.map(lambda event: json.dumps(event, indent=1)),
    st.builds(
        lambda number, at: f'{{"_timestamp":{at},"system.gpu.3.gpu" :\t{number} }} ',
        st.sampled_from(_HAND_WRITTEN_NUMBERS),
        st.sampled_from(["5", "5.5", "-1", "253402300799.5", "253402300800"]),
    ),
)
_SERIES = st.lists(st.one_of(_POINT, _POINT, _POINT, _VALUES), max_size=6)
#: An event's text with one more key, maybe one it holds already (W&B's own never does; the first value stands) or
#: written with an escape (``\\u0075``: ``u``), its value a number or not.
_TWICE = st.builds(
    lambda event, key, value: f"{json.dumps(event)[:-1]}{', ' if event else ''}{key}: {json.dumps(value)}}}",
    _EVENT,
    st.sampled_from([json.dumps(key) for key in ("_timestamp", *_GPU_KEYS)] + ['"system.gpu.0.gp\\u0075"']),
    _MOSTLY_NUMBERS,
)


@settings(deadline=None, max_examples=150)
@given(
    keys=st.sampled_from([_KEYS, ["_step", "m"], ["Loss", "loss", "m"]]),
    sampled=st.one_of(st.lists(st.one_of(_SERIES, _SERIES, _SERIES, _VALUES), max_size=4), _VALUES),
    events=st.one_of(
        st.lists(
            st.one_of(
                _EVENT,
                _EVENT.map(json.dumps),
                _NUMBERS_EVENT,
                _NUMBERS_EVENT.map(json.dumps),
                _NUMBERS_TEXT,
                _TWICE,
                _VALUES,
                st.just("{bad"),
                st.just(" {}"),
            ),
            max_size=6,
        ),
        _VALUES,
    ),
)
@example(
    keys=_KEYS, sampled=[[{"_step": 1.5, "overview/sps": 1.0}]], events=[{"_timestamp": 5, "system.gpu.0.gpu": None}]
)
@example(
    keys=_KEYS,
    sampled=[
        [
            {"_step": 1, "_timestamp": 253402300800, "overview/sps": 1},
            {"_step": 2, "_timestamp": -0.5, "overview/sps": 2},
        ]
    ],
    events=[
        {"_timestamp": 9, "system.gpu.1.gpu": 1, "system.gpu.0.gpu": 2},
        {"_timestamp": 8, "system.gpu.0.memory": 3},
    ],
)
@example(  # GPU 1 read under two keys, the larger stands; a key twice: its first value; -Infinity: no reading
    keys=_KEYS,
    sampled=[],
    events=[
        {"_timestamp": 5, "system.gpu.01.gpu": 3, "system.gpu.1.gpu": 7, "system.gpu.2.gpu": float("-inf")},
        '{"_timestamp": 6, "system.gpu.0.gpu": 1, "system.gpu.0.gpu": 2, "system.gpu.0.memory": -1e400}',
        '{"_timestamp": 7, "system.gpu.0.gpu": 1, "system.gpu.0.gpu": 2, "x": "y"}',
        {"_timestamp": 8, "system.gpu.01.gpu": 3, "system.gpu.1.gpu": 7, "x": "y"},
    ],
)
@example(keys=_KEYS, sampled=[], events=[{"_timestamp": 5, "system.gpu.0.gpu": 1, "system.gpu.0.GPU": 2}])
@example(  # the same as W&B's texts: the native scan leaves the first (a GPU index written "01") to DuckDB
    keys=_KEYS,
    sampled=[],
    events=[
        '{"_timestamp": 5, "system.gpu.1.gpu": 3, "system.gpu.01.gpu": 7}',
        '{"_timestamp":6,"system.gpu.0.gpu":1,"system.gpu.0.gpu":2,"system.gpu.2.temp":1e2,"_timestamp":7}',
        '{"_timestamp": 8, "system.gpu.0.gpu": 1, "system.gpu.0.memory": -1e400}',
        '{"_timestamp": 9, "system.gpu.0.gpu": 12345678901234567890}',
    ],
)
@example(  # two objects in one text, apart by the control character the parse joins a run's texts with: no JSON
    keys=_KEYS,
    sampled=[],
    events=['{"_timestamp": 5, "system.gpu.0.gpu": 1}\x1e{"_timestamp": 6, "system.gpu.0.gpu": 2}', {"_timestamp": 7}],
)
@example(  # the same, every event a string (as W&B sends them): checked on the joined texts
    keys=_KEYS,
    sampled=[],
    events=['{"_timestamp": 5, "system.gpu.0.gpu": 1}\x1e{"_timestamp": 6, "system.gpu.0.gpu": 2}', "{}"],
)
@example(  # a lone surrogate's escape (DuckDB refuses it: read as U+FFFD), in one of a run's string events
    keys=_KEYS,
    sampled=[],
    events=['{"_timestamp": 5, "system.gpu.0.gpu": 1, "x\\ud800": 2}', '{"_timestamp": 6, "system.gpu.1.gpu": 3}'],
)
@example(
    keys=_KEYS,
    sampled=[[1, {"_step": 2, "overview/sps": 3, "_timestamp": 4}], [{"_step": 3, "a~b": -1e999}], 5],
    events=[],
)
@example(  # booleans are no numbers; an integer beyond a double is none either
    keys=_KEYS,
    sampled=[
        [{"_step": True, "overview/sps": 1}, {"_step": 2, "overview/sps": False}, {"_step": 3, "overview/sps": 4}],
        [{"_step": 3, "a~b": 1, "_timestamp": True}, {"_step": 4, "a~b": 2**2000}, {"_step": 2**2000, "a~b": 5}],
    ],
    events=[],
)
@example(keys=["_step", "m"], sampled=[[{"_step": 1, "_timestamp": 5}], [{"_step": 1, "m": 2}]], events=[])
@example(  # a step twice in a series (1; 3 and 3.0): its first point stands
    keys=_KEYS,
    sampled=[
        [{"_step": 1, "overview/sps": 5}, {"_step": 1, "overview/sps": 6}, {"_step": 2, "overview/sps": 7}],
        [{"_step": 3, "a~b": 1, "x": "y"}, {"_step": 3.0, "a~b": 2}],
    ],
    events=[],
)
@example(keys=["Loss", "loss", "m"], sampled=[[{"_step": 1, "Loss": 2}], [{"_step": 1, "loss": 3}]], events=[])
def test_the_sql_parse_of_curves_gives_what_the_python_parse_gave_for_any_input(keys, sampled, events):
    """The parse in DuckDB (issue 54: moved there from Python point by point), by either path (text of numbers alone
    into structs, the rest as JSON values typed one by one), keeps every rule of the Python it replaced
    (tests/reference/curves.py): which points, which GPUs, which values, their order; so does the native scan
    (``_curves_scan.c``) with DuckDB parsing what it leaves, and DuckDB alone without it."""
    from tests.reference import curves as reference
    from wandb_assets.lib import curves

    assert curves.scanner() == "native"  # built by the install (setup.py); CI has a compiler
    assert curves._native.MAX_GPUS == MAX_GPUS  # the C's bound is the one rule's
    points, samples = reference.history_rows(keys, sampled), reference.gpu_rows(events)
    assert (history_rows(keys, sampled), gpu_rows(events)) == (points, samples)
    with patch.object(curves, "_native", None):
        assert (history_rows(keys, sampled), gpu_rows(events)) == (points, samples)


@settings(deadline=None, max_examples=150)
@given(
    sampled=st.lists(st.one_of(_SERIES, _SERIES, _VALUES), max_size=4),
    events=st.lists(st.one_of(_EVENT, _EVENT.map(json.dumps), _NUMBERS_EVENT.map(json.dumps), _TWICE), max_size=4),
)
@example(  # NaN and an infinity (orjson refuses them: json.loads reads the answer), integers beyond 64 bits
    sampled=[[{"_step": 2**64 + 1, "overview/sps": 2**70 + 1}, {"_step": 2, "overview/sps": float("nan")}]],
    events=['{"_timestamp": 5, "system.gpu.0.gpu": 1}'],
)
@example(sampled=[[{"_step": 1, "overview/sps": 2**2000, "_timestamp": 2**64}]], events=['{"x\ud800": 1}'])
def test_a_curves_answer_read_by_orjson_gives_the_points_json_loads_gives(sampled, events):
    """The curves' answers are read by orjson (``parse_answer``, a third of ``json.loads``' time) where it reads them,
    else by ``json.loads``: the same points and GPU samples either way."""
    from wandb_assets.lib.curves import parse_answer

    text = json.dumps({"name": "r", "sampledHistory": sampled, "events": events})
    fast, slow = parse_answer(text), json.loads(text)
    assert history_rows(_KEYS, fast["sampledHistory"]) == history_rows(_KEYS, slow["sampledHistory"])
    assert gpu_rows(fast["events"]) == gpu_rows(slow["events"])


@settings(max_examples=400)
@given(text=st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True))
def test_the_native_scan_reads_every_number_as_python_does(text):
    """The native scan's numbers (a fast path for short ones, Python's own reader for the others) are Python's float()
    of the text to the bit; an integer of more than 18 digits or a number beyond a double is left to DuckDB."""
    from wandb_assets.lib import _curves_scan

    *columns, rest = _curves_scan.gpu_samples([[f'{{"_timestamp": 1, "system.gpu.0.gpu": {text}}}']])
    whole = not any(c in text for c in ".eE")
    if (whole and len(text.lstrip("-")) > 18) or not math.isfinite(float(text)):
        assert rest and columns[4] == b""
        return
    value = float(int(text)) if whole else float(text)
    assert not rest and columns[4] == struct.pack("<d", value)


def test_a_folder_staged_as_csv_before_the_upgrade_still_loads(memory_con, tmp_path):
    """Point files were CSV before issue 54: a read staged then, waiting when the code is upgraded, loads as before
    (1 history point, 1 GPU sample), besides a Parquet folder of today (2 history points)."""
    from wandb_assets.lib.curves import CurvesFolder, published_folders, read_curves
    from wandb_assets.lib.curves_warehouse import load_curves
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(memory_con)
    for run_id in ("old", "new"):
        memory_con.execute(
            "INSERT INTO runs (entity, project, run_id, state, created_at) VALUES ('e', 'p', $r, 'finished', $c)",
            {"r": run_id, "c": DAY},
        )
    old = tmp_path / "curves" / "20260601T000000000000-aaaa"
    old.mkdir(parents=True)
    (old / "reads-000001.csv").write_text(
        "entity,project,run_id,status,read_at,final\ne,p,old,read,2026-06-02T00:00:00,true\n"
    )
    (old / "history-000001.csv").write_text(
        "entity,project,run_id,metric,step,timestamp,value\ne,p,old,overview/sps,5,2026-06-01T01:00:00,100.0\n"
    )
    (old / "gpu-000001.csv").write_text(
        "entity,project,run_id,timestamp,gpu,util_pct,memory_pct,power_w\ne,p,old,2026-06-01T01:00:00,0,50.0,\\N,\\N\n"
    )
    new = CurvesFolder(tmp_path, "20260601T010000000000-bbbb")
    points = [[{"_step": s, "_timestamp": DAY.timestamp() + s, "overview/sps": 7.0} for s in (0, 1)]]
    new.add("e/p", {"new": True}, {"new": read_curves({"sampledHistory": points}, ["overview/sps"], DAY)})
    new.publish()
    counts = load_curves(memory_con, published_folders(tmp_path), "overview/sps", 5.0, DAY + timedelta(days=1))
    assert counts["read"] == 2 and counts["points"] == 4
    assert memory_con.execute(
        "SELECT run_id, count(*), sum(value) FROM run_history GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("new", 2, 14.0), ("old", 1, 100.0)]
    assert memory_con.execute("SELECT run_id, util_pct, memory_pct FROM run_gpu_samples").fetchall() == [
        ("old", 50.0, None)
    ]
