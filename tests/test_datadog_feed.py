"""The Datadog feed through the official client against a loopback capture server, with an injected clock."""

from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest

from tests.fleet import load
from tests.test_gauges import EXPECTED, FLEET, T
from wandb_assets.defs.feed.resources import DatadogResource
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.lib.datadog_feed import (
    deliver_pending,
    enqueue_snapshots,
    feed_tags,
    record_dry_run,
    snapshot_payload,
)
from wandb_assets.lib.sql import reusing
from wandb_assets.lib.warehouse import record_snapshot

KEY = "dd" + "0123456789abcdef" * 2
TAGS = feed_tags("team-x", "proj-y", "prod")
T15, T30 = T + timedelta(minutes=15), T + timedelta(minutes=30)


@pytest.fixture
def capture(datadog_capture):
    return datadog_capture


@pytest.fixture
def con(memory_con):
    load(memory_con, FLEET)
    return memory_con


def send_with(key: str, timeout_s: float = 10.0):
    datadog = DatadogResource(wandb=wandb_resource(), timeout_s=timeout_s)
    return lambda payload: datadog.submit_series(key, payload)


def tick(con, at: datetime, now: datetime, key: str = KEY, timeout_s: float = 10.0):
    """What the feed does after a snapshot taken at ``at``: record it, enqueue, deliver."""
    record_snapshot(con, at)
    enqueue_snapshots(con, now, dry_run=False)
    return deliver_pending(reusing(con), send_with(key, timeout_s), now, TAGS)


def ledger(con):
    return con.execute("SELECT snapshot_at, status, attempts FROM datadog_deliveries ORDER BY 1").fetchall()


def test_exact_payload(con, capture):
    report = tick(con, T, T + timedelta(seconds=20))
    assert report.delivered == [T] and report.problem is None
    (request,) = capture.requests
    assert request["path"] == "/api/v2/series"
    assert request["headers"]["DD-API-KEY"] == KEY
    timestamp = int(datetime(2026, 6, 10, 12, 0, tzinfo=UTC).timestamp())
    expected = [
        {
            "metric": name,
            "type": 3,
            "points": [{"timestamp": timestamp, "value": pytest.approx(value)}],
            "tags": ["source:wandb-assets", "entity:team-x", "project:proj-y", "env:prod"],
        }
        for name, value in sorted(EXPECTED.items())
        if value is not None
    ]
    assert sorted(request["body"]["series"], key=lambda s: s["metric"]) == expected
    skipped = set(EXPECTED) - {s["metric"] for s in request["body"]["series"]}
    assert skipped == {  # the three gauges that are NULL in this fleet (see tests/test_gauges.py) are not sent
        "wandb.push_to_main.overview.epoch_steps_per_second",
        "wandb.push_to_main.timing_per_epoch.sps",
        "wandb.gpu.cost_usd_24h",  # nothing priced: NULL, never a 0 that reads as free
    }
    assert ledger(con) == [(T, "delivered", 1)]


def test_no_duplicate_delivery_across_ticks(con, capture):
    tick(con, T, T)
    tick(con, T15, T15)
    deliver_pending(reusing(con), send_with(KEY), T15 + timedelta(minutes=1), TAGS)
    sent = [s["series"][0]["points"][0]["timestamp"] for s in capture.bodies("/api/v2/series")]
    assert len(sent) == 2 and sent[0] < sent[1]
    assert [row[1] for row in ledger(con)] == ["delivered", "delivered"]


def test_outage_then_recovery_delivers_pending_snapshots_in_order(con, capture):
    capture.answer = 503
    first = tick(con, T, T)
    assert first.still_pending == [T]
    assert first.problem.startswith("Datadog intake unavailable (HTTP 503")
    second = tick(con, T15, T15)
    assert second.still_pending == [T, T15]
    assert len(capture.requests) == 2  # one try per tick: delivery stops at the first failure, keeping order
    capture.answer = 202
    third = tick(con, T30, T30)
    assert third.delivered == [T, T15, T30]
    stamps = [body["series"][0]["points"][0]["timestamp"] for body in capture.bodies("/api/v2/series")[2:]]
    assert stamps == sorted(stamps) and len(stamps) == 3
    # T was tried at every tick; T15 waited behind it and went through on its first try.
    assert ledger(con) == [(T, "delivered", 3), (T15, "delivered", 1), (T30, "delivered", 1)]


def test_snapshot_pending_for_over_an_hour_expires_with_the_reason(con, capture):
    capture.answer = 500
    tick(con, T, T)
    capture.answer = 202
    report = deliver_pending(reusing(con), send_with(KEY), T + timedelta(minutes=61), TAGS)
    assert report.expired == [T] and report.delivered == []
    assert len(capture.requests) == 1
    status, error = con.execute("SELECT status, last_error FROM datadog_deliveries").fetchone()
    assert status == "expired"
    assert "Datadog's intake refuses points older than one hour" in error


def test_dry_run_records_and_logs_without_sending(con, capture):
    record_snapshot(con, T)
    record_snapshot(con, T15)
    new = enqueue_snapshots(con, T15, dry_run=True)
    lines: list[str] = []
    report = record_dry_run(con, new, TAGS, lines.append)
    assert report.dry_run == [T, T15]
    assert capture.requests == []
    assert ledger(con) == [(T, "dry_run", 0), (T15, "dry_run", 0)]
    # one short line per snapshot, the tags intact for the second one too (they were once split into letters)
    assert lines == [
        f"Datadog dry run (no DD_API_KEY configured): would send 21 gauges for {t} with tags "
        "source:wandb-assets,entity:team-x,project:proj-y,env:prod"
        for t in ("2026-06-10T12:00:00Z", "2026-06-10T12:15:00Z")
    ]
    # A later live pass never sends dry-run snapshots: they were history when they were taken.
    assert deliver_pending(reusing(con), send_with(KEY), T15, TAGS).delivered == []
    assert enqueue_snapshots(con, T15, dry_run=True) == []  # nothing new: no empty executemany either


def test_snapshots_stranded_as_pending_become_dry_run_when_no_key_is_configured(con, capture):
    record_snapshot(con, T)
    enqueue_snapshots(con, T, dry_run=False)  # a tick whose configured key could not be read
    record_snapshot(con, T15)
    assert enqueue_snapshots(con, T15, dry_run=True) == [T, T15]  # now nothing is configured anywhere
    assert ledger(con) == [(T, "dry_run", 0), (T15, "dry_run", 0)]


def test_the_warehouse_is_closed_while_points_are_sent(con, capture):
    record_snapshot(con, T)
    record_snapshot(con, T15)
    enqueue_snapshots(con, T15, dry_run=False)
    open_now = []
    seen_while_sending = []

    @contextmanager
    def connect():
        open_now.append(1)
        try:
            yield con
        finally:
            open_now.pop()

    send = send_with(KEY)

    def watched_send(payload):
        seen_while_sending.append(len(open_now))
        return send(payload)

    report = deliver_pending(connect, watched_send, T15 + timedelta(minutes=1), TAGS)
    assert report.delivered == [T, T15]
    assert seen_while_sending == [0, 0]
    assert ledger(con) == [(T, "delivered", 1), (T15, "delivered", 1)]


def test_bad_key_is_one_clear_sentence_without_the_key(con, capture):
    capture.answer = 403
    report = tick(con, T, T)
    assert report.problem == (
        "Datadog refused DD_API_KEY (403 Forbidden): set a valid API key for DD_SITE; "
        "1 snapshot(s) wait and expire after one hour."
    )
    stored = con.execute("SELECT last_error FROM datadog_deliveries").fetchone()[0]
    assert stored == "HTTP 403: Forbidden"
    assert KEY not in report.problem + stored


def test_hanging_intake_times_out_and_the_snapshot_stays_pending(con, capture):
    capture.answer, capture.hang_s = "hang", 3
    report = tick(con, T, T, timeout_s=1)
    assert report.still_pending == [T]
    assert "timed out" in report.problem
    assert ledger(con) == [(T, "pending", 1)]


def test_several_projects_send_the_fleet_series_and_a_bounded_number_of_project_series(memory_con, capture):
    """The mixed fleet of tests/test_projects.py (GPU-hours in 24 h: team/a 4, lab/c 4, team/b 3; active runs:
    team/a 1, lab/c 0). With room for two projects: the fleet-wide series tagged scope:fleet, then team/a's and
    lab/c's own (the tie broken by active runs); team/b is in the fleet's values only. Three tag sets at most."""
    from tests.test_projects import MIXED_FLEET, T_MIXED

    load(memory_con, MIXED_FLEET)
    record_snapshot(memory_con, T_MIXED)
    enqueue_snapshots(memory_con, T_MIXED, dry_run=False)
    fleet_tags = feed_tags(None, None, "prod")
    assert fleet_tags == ["source:wandb-assets", "scope:fleet", "env:prod"]
    report = deliver_pending(reusing(memory_con), send_with(KEY), T_MIXED, fleet_tags, project_series=2)
    assert report.delivered == [T_MIXED]
    (request,) = capture.requests
    series = request["body"]["series"]
    tag_sets = {tuple(s["tags"]) for s in series}
    assert tag_sets == {
        ("source:wandb-assets", "scope:fleet", "env:prod"),
        ("source:wandb-assets", "scope:project", "entity:team", "project:a", "env:prod"),
        ("source:wandb-assets", "scope:project", "entity:lab", "project:c", "env:prod"),
    }
    value = {
        (s["metric"], s["tags"][-2] if "scope:project" in s["tags"] else "fleet"): s["points"][0]["value"]
        for s in series
    }
    assert value[("wandb.runs.active", "fleet")] == 1
    assert value[("wandb.runs.active", "project:a")] == 1
    assert value[("wandb.runs.active", "project:c")] == 0
    assert value[("wandb.training.total_gpu_hours_24h", "fleet")] == pytest.approx(11.0)
    assert value[("wandb.training.total_gpu_hours_24h", "project:a")] == pytest.approx(4.0)
    assert value[("wandb.push_to_main.success_rate_pct", "fleet")] == pytest.approx(80.0)
    assert value[("wandb.push_to_main.success_rate_pct", "project:a")] == pytest.approx(50.0)
    assert ("wandb.push_to_main.success_rate_pct", "project:c") not in value  # NULL there: not sent
    fleet_count = sum(s["tags"] == fleet_tags for s in series)
    assert fleet_count == memory_con.execute("SELECT count(*) FROM fleet_metrics WHERE value IS NOT NULL").fetchone()[0]
    # No room for projects: the fleet's series alone.
    assert {tuple(s["tags"]) for s in snapshot_payload(memory_con, T_MIXED, fleet_tags, 0)["series"]} == {
        tuple(fleet_tags)
    }
