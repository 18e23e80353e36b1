"""The fourth review's findings (B1-B12, ``code-review-2026-11d.md``), each as a test that failed on a12c3e6: the
numbers worked out by hand in each docstring."""

import json
import os
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest

from wandb_assets.lib.checks import broken
from wandb_assets.lib.curves import CurvesFolder, read_curves
from wandb_assets.lib.curves_warehouse import load_curves
from wandb_assets.lib.derived import rebuild_gpu_usage
from wandb_assets.lib.warehouse import (
    WHOLE_KEY,
    ensure_schema,
    load_runs_window,
    ndjson_lines,
    record_projects,
    unfinished_runs_by_project,
)

EPOCH = datetime(1970, 1, 1)


def _finished(con, run_id: str, start: datetime, end: datetime, gpus: int) -> None:
    con.execute(
        "INSERT INTO runs (entity, project, run_id, name, state, created_at, heartbeat_at, ended_at, gpu_count, "
        "gpu_model, url, ingested_at, source) VALUES ('e', 'p', $id, $id, 'finished', $s, $e, $e, $g, 'H100-80GB', "
        "'u', $e, 'wandb')",
        {"id": run_id, "s": start, "e": end, "g": gpus},
    )


def _load_stream(con, tmp_path: Path, run_id: str, events: list[dict], now: datetime) -> None:
    folder = CurvesFolder(tmp_path, "read")
    folder.add("e/p", {run_id: True}, {run_id: read_curves({"events": events}, [], now)})
    load_curves(con, [folder.publish()], "overview/sps", 5.0, now)


def test_b1_a_30_day_idle_run_sampled_500_times_is_idle_all_its_gpu_hours(memory_con, tmp_path):
    """8 GPUs idle from June 1 to July 1 (30 days = 720 h): 5,760 GPU-hours, and W&B's 500 samples of the stream are
    87 minutes apart. Each holds until the next (2 x the median gap is 174 min): 5,760 idle GPU-hours, $11,520 idle
    at $2. (a12c3e6 held each an hour at most: 3,913.)"""
    ensure_schema(memory_con)
    start, end, samples = datetime(2026, 6, 1), datetime(2026, 7, 1), 500
    _finished(memory_con, "big", start, end, 8)
    step = (end - start) / (samples - 1)
    events = [
        {"_timestamp": (start + k * step - EPOCH).total_seconds(), **{f"system.gpu.{g}.gpu": 0.0 for g in range(8)}}
        for k in range(samples)
    ]
    _load_stream(memory_con, tmp_path, "big", events, datetime(2026, 7, 2))
    rebuild_gpu_usage(memory_con, datetime(2026, 7, 2), {"H100-80GB": 2.0}, {})
    hours, idle, idle_usd = memory_con.execute(
        "SELECT sum(gpu_hours), sum(idle_gpu_hours), sum(idle_cost_usd) FROM gpu_usage"
    ).fetchone()
    assert (round(hours, 6), round(idle, 6), round(idle_usd, 4)) == (5760.0, 5760.0, 11520.0)


def test_b10_idle_time_across_utc_midnight_counts_on_both_days(memory_con, tmp_path):
    """1 GPU from 23:30 to 01:30, sampled hourly at 0 %: 0.5 idle GPU-hours on day 1, 1.5 on day 2 (the 23:30 sample's
    hold is cut at midnight and its second half counts on day 2)."""
    ensure_schema(memory_con)
    start = datetime(2026, 6, 1, 23, 30)
    _finished(memory_con, "r", start, start + timedelta(hours=2), 1)
    events = [
        {"_timestamp": (start + timedelta(hours=k) - EPOCH).total_seconds(), "system.gpu.0.gpu": 0.0} for k in range(3)
    ]
    _load_stream(memory_con, tmp_path, "r", events, datetime(2026, 6, 3))
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 3), {"H100-80GB": 2.0}, {})
    rows = memory_con.execute("SELECT day::VARCHAR, gpu_hours, idle_gpu_hours FROM gpu_usage ORDER BY day").fetchall()
    assert rows == [("2026-06-01", 0.5, 0.5), ("2026-06-02", 1.5, 1.5)]


def _staged(folder: Path, name: str, rows: list[dict], fetched_at: datetime, whole: list[str]) -> str:
    path = folder / name
    with open(path, "w") as handle:
        handle.write(json.dumps({WHOLE_KEY: whole}) + "\n")
        handle.writelines(ndjson_lines(rows, fetched_at))
    stamp = (fetched_at - EPOCH).total_seconds()
    os.utime(path, (stamp, stamp))
    return str(path)


def _row(project: str, day: datetime, state: str = "finished", **extra) -> dict:
    ended = day + timedelta(hours=11) if state == "finished" else None
    return {
        "entity": "e",
        "project": project,
        "run_id": "r1",
        "name": "r1",
        "state": state,
        "created_at": day + timedelta(hours=1),
        "heartbeat_at": day + timedelta(hours=11),
        "ended_at": ended,
        "gpu_count": 8,
        "gpu_model": "H100-80GB",
        "url": "u",
    } | extra


def test_b2_a_finished_run_moved_to_another_project_counts_once_and_back_again(memory_con, tmp_path):
    """8 GPUs x 10 h = 80 GPU-hours at $3 = $240, in e/a; moved to e/b: 80 GPU-hours and $240 in e/b only, the e/a copy
    ``moved`` (0 GPU-hours, $0); moved back: in e/a only again."""
    ensure_schema(memory_con)
    day, prices, both = datetime(2026, 11, 1), [("H100-80GB", 3.0)], ["e/a", "e/b"]
    window = (day, day + timedelta(days=1))
    for n, project in enumerate(("a", "b", "a"), start=1):
        path = _staged(tmp_path, f"{n}-2026-11-01.ndjson", [_row(project, day)], day + timedelta(days=n), both)
        load_runs_window(memory_con, [path], *window, projects=[("e", "a"), ("e", "b")], prices=prices)
        rebuild_gpu_usage(memory_con, day + timedelta(days=n), dict(prices), {})
        usage = memory_con.execute("SELECT project, sum(gpu_hours), sum(cost_usd) FROM gpu_usage GROUP BY 1").fetchall()
        assert usage == [(project, 80.0, 240.0)]
        states = memory_con.execute(
            "SELECT project, state, cost_usd, state_changed_at IS NOT NULL FROM runs ORDER BY 1"
        ).fetchall()
        other = "b" if project == "a" else "a"
        # The moved copy was marked, not loaded (state_changed_at); the copy W&B returned is as loaded.
        moved = [(other, "moved", 0.0, True)] if n > 1 else []
        assert sorted(states) == sorted([(project, "finished", 240.0, False), *moved])
        assert broken(memory_con, day + timedelta(days=n)) == []


@pytest.mark.breaks_invariants  # it stops before the fetch that asks again (no_run_left_unmirrored names r1 till then)
def test_b3_a_project_back_in_the_mirror_set_has_its_running_runs_asked_for_again(memory_con):
    """r1 runs in e/p, created before the next tick's window; e/p leaves the mirror set for one fetch (r1: vanished,
    unmirrored) and comes back: the next tick asks W&B for r1 by id."""
    ensure_schema(memory_con)
    t0 = datetime(2026, 11, 1)
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, name, state, created_at, heartbeat_at, gpu_count, url, "
        "ingested_at, source) VALUES ('e', 'p', 'r1', 'r1', 'running', $t, $h, 8, 'u', $h, 'wandb')",
        {"t": t0, "h": t0 + timedelta(days=5)},
    )
    p, q = ({"entity": "e", "project": name, "error": None} for name in ("p", "q"))
    record_projects(memory_con, [p], t0 + timedelta(days=5))
    record_projects(memory_con, [q], t0 + timedelta(days=5, hours=1))
    assert memory_con.execute("SELECT state, anomalies, state_changed_at > ingested_at FROM runs").fetchall() == [
        ("vanished", ["unmirrored"], True)  # marked when the mirror set changed, not loaded
    ]
    record_projects(memory_con, [p, q], t0 + timedelta(days=5, hours=2))
    assert unfinished_runs_by_project(memory_con, t0 + timedelta(days=4)) == {"e/p": ["r1"]}


def test_b3_a_returning_run_w_and_b_no_longer_has_is_asked_once_then_vanished(memory_con, tmp_path):
    """Asked for by id after its project came back, r1 is not returned: it is ``vanished`` for good (never asked
    again)."""
    ensure_schema(memory_con)
    day = datetime(2026, 11, 1)
    path = _staged(tmp_path, "2026-11-01.ndjson", [_row("p", day, "running")], day + timedelta(hours=12), ["e/p"])
    load_runs_window(memory_con, [path], day, day + timedelta(days=1))
    record_projects(memory_con, [{"entity": "e", "project": "q", "error": None}], day + timedelta(hours=13))
    empty = tmp_path / "ids.ndjson"
    empty.write_text(json.dumps({WHOLE_KEY: [], "__asked__": {"e/p": ["r1"]}}) + "\n")
    stamp = (day + timedelta(days=3) - EPOCH).total_seconds()
    os.utime(empty, (stamp, stamp))
    later = day + timedelta(days=3)
    window = _staged(tmp_path, "2026-11-04.ndjson", [], later, ["e/p"])
    load_runs_window(memory_con, [window], later, later + timedelta(days=1), refreshed=[str(empty)])
    assert memory_con.execute("SELECT state, anomalies FROM runs").fetchall() == [
        ("vanished", ["unmirrored", "vanished"])
    ]
    assert unfinished_runs_by_project(memory_con, later) == {}


def test_b9_a_run_of_a_project_that_left_costs_its_hours_to_its_last_heartbeat(memory_con, tmp_path):
    """8 GPUs from t0, last heartbeat t0 + 48 h, read at t0 + 72 h ($1,152 at $2 while running). Its project leaves:
    it costs 8 x 48 x 2 = $768, and ``check`` holds."""
    ensure_schema(memory_con)
    t0 = datetime(2026, 11, 1)
    row = _row("p", t0 - timedelta(hours=1), "running", heartbeat_at=t0 + timedelta(hours=48), created_at=t0)
    path = _staged(tmp_path, "2026-11-01.ndjson", [row], t0 + timedelta(hours=72), ["e/p"])
    load_runs_window(memory_con, [path], t0, t0 + timedelta(days=1), prices=[("H100-80GB", 2.0)])
    record_projects(memory_con, [{"entity": "e", "project": "p", "error": None}], t0 + timedelta(hours=72))
    assert memory_con.execute("SELECT cost_usd FROM runs").fetchone() == (1152.0,)
    record_projects(memory_con, [{"entity": "e", "project": "q", "error": None}], t0 + timedelta(hours=73))
    assert memory_con.execute("SELECT state, cost_usd FROM runs").fetchall() == [("vanished", 768.0)]
    assert broken(memory_con, t0 + timedelta(hours=74)) == []


def _curves_of(due: list[str], monkeypatch) -> dict[str, str]:
    """One read of ``due``'s curves through the real client against the local server: ``{run id: status}``."""
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.settings import pipeline_settings

    monkeypatch.setenv("WANDB_ASSETS_HTTP_RETRIES", "0")
    read: dict[str, dict] = {}
    wandb_resource().due_curves(
        [("test-team", "test-project", run_id, True) for run_id in due],
        lambda path, final, runs: read.update(runs),
        pipeline_settings(),
    )
    from wandb_assets.lib.curves import parse_reads

    parsed = parse_reads({("test-team", "test-project", run_id): curves for run_id, curves in read.items()})
    return {run_id: curves["status"] for (_, _, run_id), curves in parsed.items()}


def _node(run_id: str, hour: int, events: list | None = None) -> dict:
    from wandb_assets.localwandb import make_run_node

    start = datetime(2026, 6, 1, hour)
    history = [{"_step": s, "_timestamp": (start - EPOCH).total_seconds() + s, "overview/sps": 100.0} for s in range(3)]
    return make_run_node(
        run_id,
        display_name=None,
        state="finished",
        created_at=start,
        heartbeat_at=start + timedelta(hours=1),
        history=history,
        events=events or [],
    )


def test_b7_a_run_w_and_b_cannot_serve_fails_alone_and_the_runs_after_it_are_read(wandb_server, monkeypatch):
    """Five runs in one request, created a, b, poison, d, e; the server answers 500 for any page holding poison: a, b,
    d and e are read, poison alone is failed, and asked again it fails alone."""
    server = wandb_server([_node(run_id, hour) for hour, run_id in enumerate(["a", "b", "poison", "d", "e"], 1)])
    server.faults.poison_curves = frozenset({"poison"})
    order = ["a", "b", "poison", "d", "e"]
    assert _curves_of(order, monkeypatch) == {"a": "read", "b": "read", "poison": "failed", "d": "read", "e": "read"}
    assert _curves_of(["poison", "d"], monkeypatch) == {"poison": "failed", "d": "read"}


def test_b4_an_integer_too_large_for_a_float_skips_that_value_and_the_round_reads_every_run(wandb_server, monkeypatch):
    """A 401-digit utilisation in one system sample (JSON allows it): the round reads all three runs; the poison run
    keeps its other two samples (the bad value is no reading)."""
    huge = int("1" + "0" * 400)
    start = datetime(2026, 6, 1, 2)
    events = [
        {"_timestamp": (start - EPOCH).total_seconds() + 60 * k, "system.gpu.0.gpu": huge if k == 1 else 50.0}
        for k in range(3)
    ]
    wandb_server([_node("good1", 1), _node("poison", 2, events), _node("good2", 3)])
    assert _curves_of(["good1", "poison", "good2"], monkeypatch) == {"good1": "read", "poison": "read", "good2": "read"}

    from wandb_assets.lib.curves import gpu_rows

    assert [row[2] for row in gpu_rows([json.dumps(e) for e in events])] == [50.0, 50.0]


def test_b5_a_step_beyond_bigint_is_left_out_and_a_folder_the_tables_cannot_hold_is_set_aside(memory_con, tmp_path):
    """A step of 1e19 (above 2^63) is no whole step the tables hold: that point is left out, the run's others load.
    A folder that cannot load whatever the cause (here a point file cut short) is set aside with its runs failed,
    and the folder after it loads: good (3 points) and later (2 points)."""
    from wandb_assets.lib.curves import history_rows, published_folders
    from wandb_assets.lib.curves_warehouse import load_curves_setting_aside

    assert history_rows(["s"], [[{"_step": 1e19, "s": 1.0}, {"_step": 2, "s": 1.0}]]) == [["s", 2, None, 1.0]]
    ensure_schema(memory_con)
    for run_id in ("good", "bad", "later"):
        _finished(memory_con, run_id, datetime(2026, 6, 1, 10), datetime(2026, 6, 1, 11), 1)
    now = datetime(2026, 6, 2)

    def hist(steps):
        return [[{"_step": s, "_timestamp": 1780300000 + s, "overview/sps": 100.0} for s in steps]]

    first = CurvesFolder(tmp_path, "20260602T000000000000-aaaa")
    first.add("e/p", {"bad": True}, {"bad": read_curves({"sampledHistory": hist([0, 1])}, ["overview/sps"], now)})
    published = first.publish()
    (history,) = published.glob("history-*.parquet")
    history.write_bytes(history.read_bytes()[: len(history.read_bytes()) // 2])  # cut short: no Parquet footer
    second = CurvesFolder(tmp_path, "20260602T010000000000-bbbb")
    second.add(
        "e/p",
        {"good": True, "later": True},
        {
            "good": read_curves({"sampledHistory": hist([0, 1, 2])}, ["overview/sps"], now),
            "later": read_curves({"sampledHistory": hist([0, 1])}, ["overview/sps"], now),
        },
    )
    second.publish()
    counts, rejected = load_curves_setting_aside(memory_con, published_folders(tmp_path), "overview/sps", 5.0, now)
    assert [folder.name for folder in rejected] == ["20260602T000000000000-aaaa"]
    assert memory_con.execute("SELECT run_id, count(*) FROM run_history GROUP BY 1 ORDER BY 1").fetchall() == [
        ("good", 3),
        ("later", 2),
    ]
    statuses = memory_con.execute("SELECT run_id, curves_status FROM runs ORDER BY 1").fetchall()
    assert statuses == [("bad", "failed"), ("good", "read"), ("later", "read")]
    assert counts["rejected_folders"] == 1


def test_b8_pipeline_failure_follows_the_order_runs_ended_and_ignores_cancels():
    """(a) B1 created before B2 fails after B2 succeeded: B1's failure opens, and B3's success resolves it. (b) A
    cancelled run opens nothing, so the success after it resolves nothing."""
    from dagster import DagsterInstance, DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from wandb_assets.defs.feed.pipeline_failure import previous_run_failed

    with DagsterInstance.ephemeral() as instance:
        create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.SUCCESS)
        b1 = create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.STARTED)
        create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.SUCCESS)
        instance.report_run_failed(b1)
        assert not previous_run_failed(instance, "backfill", b1.run_id)  # the first failure of a streak pages
        b3 = create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.SUCCESS)
        assert previous_run_failed(instance, "backfill", b3.run_id)
    with DagsterInstance.ephemeral() as instance:
        create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.SUCCESS)
        create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.CANCELED)
        ok = create_run_for_test(instance, job_name="backfill", status=DagsterRunStatus.SUCCESS)
        assert not previous_run_failed(instance, "backfill", ok.run_id)


def test_b6_an_offline_log_read_again_replaces_its_curves(memory_con, tmp_path):
    """Five reads of a growing log (3, 4, 5, 6, then 7 steps): run_history holds steps 0..6 once, run_gpu_samples 7."""
    from wandb_assets.lib.curves_warehouse import load_curves_in_transaction
    from wandb_assets.lib.warehouse import load_offline_runs, stage_rows

    ensure_schema(memory_con)
    t0 = datetime(2026, 6, 1, 10)
    for n, steps in enumerate((3, 4, 5, 6, 7)):
        state = "finished" if steps == 7 else "running"
        row = {
            "entity": "team",
            "project": "p",
            "run_id": "off1",
            "name": "off1",
            "state": state,
            "created_at": t0,
            "heartbeat_at": t0.replace(minute=steps),
            "ended_at": t0.replace(minute=steps) if state == "finished" else None,
            "gpu_count": 1,
            "log_path": "/logs/run-off1.wandb",
        }
        node = {
            "sampledHistory": [
                [{"_step": s, "_timestamp": t0.timestamp() + 60 * s, "loss": 1.0} for s in range(steps)]
            ],
            "events": [{"_timestamp": t0.timestamp() + 60 * s, "system.gpu.0.gpu": 0.0} for s in range(steps)],
        }
        curves = read_curves(node, ["loss"], t0) | {"final": state == "finished"}
        staged, _ = stage_rows([row], folder=str(tmp_path))
        folder = CurvesFolder(tmp_path / str(n), "logs")
        folder.add("team/p", {"off1": curves["final"]}, {"off1": curves})
        published = folder.publish()
        load_offline_runs(
            memory_con,
            staged,
            [],
            t0.replace(hour=12),
            then=lambda c, published=published: load_curves_in_transaction(
                c, [published], "loss", 5.0, t0.replace(hour=12), source="offline"
            ),
        )
    steps = [r[0] for r in memory_con.execute("SELECT step FROM run_history ORDER BY step").fetchall()]
    assert steps == list(range(7))
    assert memory_con.execute("SELECT count(*) FROM run_gpu_samples").fetchone() == (7,)


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://169.254.169.254/latest/meta-data/", "another host than W&B's named by its IP address"),
        ("https://10.0.0.5:8443/internal", "another host than W&B's named by its IP address"),
        ("https://[::1]/admin", "another host than W&B's named by its IP address"),
        (
            "https://localhost/admin",
            "another host than W&B's on a local or private network (127.0.0.1): WANDB_ASSETS_FILE_HOSTS allows it",
        ),
        ("https://storage.example.com/bucket/wandb-metadata.json?sig=1", None),  # not resolvable here: not refused
        ("https://wandb.example.com/files/x", None),  # W&B's own origin
    ],
)
def test_b11_downloads_refuse_ip_literals_and_names_on_a_local_network(url, refused):
    from wandb_assets.lib.fetch import metadata_url_refused

    assert metadata_url_refused(url, "https://wandb.example.com") == refused


def test_b11_a_storage_host_on_a_private_network_is_fetched_when_allowed():
    from wandb_assets.lib.fetch import metadata_url_refused

    assert metadata_url_refused("https://localhost/files/x", "https://wandb.example.com", ("LOCALHOST",)) is None


def test_b12_idle_and_failed_cents_follow_the_rows_cents_and_a_month_is_not_exported_twice_silently(tmp_path):
    """Two fully idle rows of 0.6 cents each: the month is 1.2 cents -> 1 cent, which goes to one row (A, the key
    breaks the tie); idle cents follow the same rule: A 0.01 idle of 0.01, B 0.00 of 0.00. Exported again, the month's
    file stays as it was unless forced."""
    import duckdb

    from wandb_assets.lib.exports import export_chargeback

    con = duckdb.connect()
    con.execute("CREATE SCHEMA analytics")
    con.execute(
        "CREATE TABLE analytics.team_gpu_cost_monthly (month DATE, team VARCHAR, entity VARCHAR, project VARCHAR, "
        "gpu_model VARCHAR, price_basis VARCHAR, users BIGINT, gpu_hours DOUBLE, cost_usd DOUBLE, "
        "unpriced_gpu_hours DOUBLE, idle_gpu_hours DOUBLE, idle_cost_usd DOUBLE, failed_gpu_hours DOUBLE, "
        "failed_cost_usd DOUBLE, last_day DATE, price_from DATE, usd_per_gpu_hour DOUBLE, "
        "charge_category VARCHAR DEFAULT 'usage', adjustment_of DATE, first_day DATE DEFAULT DATE '2026-10-01')"
    )
    con.execute("CREATE TABLE closed_months (month DATE)")
    for model in ("A-model", "B-model"):
        con.execute(
            "INSERT INTO analytics.team_gpu_cost_monthly (month, team, entity, project, gpu_model, price_basis, users, "
            "gpu_hours, cost_usd, unpriced_gpu_hours, idle_gpu_hours, idle_cost_usd, failed_gpu_hours, "
            "failed_cost_usd, last_day) VALUES ('2026-10-01', 'research', 'e', 'p', $m, 'list', 1, "
            "0.002, 0.006, 0, 0.002, 0.006, 0.002, 0.006, '2026-10-31')",
            {"m": model},
        )
    done = export_chargeback(con, date(2026, 10, 1), tmp_path)
    lines = done.path.read_text().splitlines()
    assert [line.split(",")[7:9] + line.split(",")[13:] for line in lines[1:]] == [  # model, basis, users, ...
        ["A-model", "list", "1", "0.0", "0.01", "0.0", "0.0", "0.01", "0.0", "0.01"],
        ["B-model", "list", "1", "0.0", "0.00", "0.0", "0.0", "0.00", "0.0", "0.00"],
    ]
    first = done.path.read_text()
    con.execute("UPDATE analytics.team_gpu_cost_monthly SET cost_usd = 100.0")
    with pytest.raises(FileExistsError, match="pass --force to write it again"):
        export_chargeback(con, date(2026, 10, 1), tmp_path)
    assert done.path.read_text() == first
    assert "100.00" in export_chargeback(con, date(2026, 10, 1), tmp_path, force=True).path.read_text()


def test_a_project_out_of_the_mirror_set_keeps_its_alerts_open_unwatched_and_they_go_on_when_it_returns(memory_con):
    """Open stalled_run alerts in e/a and e/b. An evaluation while only e/a is mirrored (a refresh with
    WANDB_PROJECT=a) finds e/a's run healthy and nothing of e/b: e/a's alert resolves, e/b's stays open, marked
    unwatched, with no page. Back in the mirror set with its run still stalled: the same alert goes on, no 'opened'."""
    from wandb_assets.lib.alerts import Condition, reconcile

    ensure_schema(memory_con)
    t0 = datetime(2026, 11, 1, 12)

    def stalled(project: str) -> Condition:
        details = {"entity": "e", "project": project, "run_id": "r"}
        return Condition("stalled_run", f"e/{project}:r", "warning", f"r of e/{project} stalled", details)

    both = [{"entity": "e", "project": p, "error": None} for p in ("a", "b")]
    record_projects(memory_con, both, t0)
    opened = reconcile(memory_con, [stalled("a"), stalled("b")], {"stalled_run"}, t0, [])
    assert [(t.event, t.condition.subject) for t in opened] == [("opened", "e/a:r"), ("opened", "e/b:r")]
    record_projects(memory_con, [both[0]], t0 + timedelta(minutes=15))
    narrowed = reconcile(memory_con, [], {"stalled_run"}, t0 + timedelta(minutes=15), [])
    assert [(t.event, t.condition.subject) for t in narrowed] == [("resolved", "e/a:r")]
    still = memory_con.execute(
        "SELECT alert_key, details->>'unwatched' FROM alerts WHERE resolved_at IS NULL ORDER BY 1"
    ).fetchall()
    assert still == [("stalled_run:e/b:r", "true")]
    record_projects(memory_con, both, t0 + timedelta(minutes=30))
    back = reconcile(memory_con, [stalled("b")], {"stalled_run"}, t0 + timedelta(minutes=30), [])
    assert back == []
    assert memory_con.execute("SELECT count(*) FROM alerts WHERE alert_key = 'stalled_run:e/b:r'").fetchone() == (1,)


def test_an_offline_run_read_with_its_curves_counts_its_gpu_hours_and_idle_hours_once(memory_con):
    """An offline run (1 GPU, 10:00-12:00) whose log gave both its idle hours per day (log_idle_gpu_hours: 2.0) and
    its curves (run_curve_idle: 2.0, from the same stream): 2 GPU-hours, 2 idle. (a12c3e6 joined both sources:
    4 GPU-hours and 4 idle hours in gpu_usage.)"""
    from wandb_assets.lib.derived import rebuild_gpu_usage

    ensure_schema(memory_con)
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, state, created_at, heartbeat_at, ended_at, gpu_count, source, "
        "log_idle_gpu_hours, anomalies) VALUES ('e', 'p', 'o', 'finished', '2026-06-01 10:00', '2026-06-01 12:00', "
        "'2026-06-01 12:00', 1, 'offline', [{'day': DATE '2026-06-01', 'idle_gpu_hours': 2.0}], [])"
    )
    memory_con.execute(
        "INSERT INTO run_gpu_samples VALUES ('e', 'p', 'o', '2026-06-01 10:00', 0, 0, 0, 0), "
        "('e', 'p', 'o', '2026-06-01 11:00', 0, 0, 0, 0), ('e', 'p', 'o', '2026-06-01 12:00', 0, 0, 0, 0)"
    )
    memory_con.execute("INSERT INTO run_curve_idle VALUES ('e', 'p', 'o', '2026-06-01', 5, 2.0, 0)")
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 2), {}, {})
    assert memory_con.execute("SELECT gpu_hours, idle_gpu_hours FROM gpu_usage").fetchall() == [(2.0, 2.0)]
