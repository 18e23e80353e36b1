"""A whole tick through Dagster: refresh, then the feed (Datadog + alerts + webhook), and the failure path."""

from datetime import date, datetime

import pytest
from dagster import DagsterEventType, RunRequest, build_sensor_context

from tests.conftest import API_KEY, DD_KEY
from tests.test_pipeline_e2e import at
from wandb_assets.definitions import defs
from wandb_assets.defs.feed.sensors import after_fleet_snapshot
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import run_tick
from wandb_assets.warehouse import query_read_only

TODAY = date(2026, 6, 2)
SNAPSHOT, NOW = "2026-06-02T12:00:00", "2026-06-02T12:00:30"


def ci_runs(failed: int) -> list[dict]:
    """Six push-to-main runs ended this morning, ``failed`` of them failed."""
    return [
        make_run_node(
            f"ci{i}",
            display_name=f"github.sky.main.c{i:06d}.ppo.1780000000",
            state="failed" if i < failed else "finished",
            created_at=at(2, 2 + i),
            heartbeat_at=at(2, 3 + i),
            summary={"overview/sps": 100.0},
        )
        for i in range(6)
    ]


def query(path, sql):
    return query_read_only(str(path), sql)


def all_messages(instance) -> str:
    return "\n".join(
        str(record.message) + str(record.dagster_event.event_specific_data if record.dagster_event else "")
        for run in instance.get_runs()
        for record in instance.all_logs(run.run_id)
    )


def test_tick_pushes_the_snapshot_and_raises_the_alert_once(wandb_server, capture, warehouse_path, instance):
    wandb_server(ci_runs(failed=3))
    results = run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW)
    assert [r.success for r in results] == [True, True]
    (series,) = capture.bodies("/api/v2/series")
    by_name = {s["metric"]: s for s in series["series"]}
    assert by_name["wandb.push_to_main.success_rate_pct"]["points"] == [{"timestamp": 1780401600, "value": 50.0}]
    assert by_name["wandb.runs.completed_24h"]["tags"] == [
        "source:wandb-assets",
        "entity:test-team",
        "project:test-project",
        "env:test",
    ]
    hooks = capture.bodies("/hook/")
    assert hooks == [
        {
            "text": ":rotating_light: [warning] push_to_main_success_rate_low (test-team/test-project:push_to_main): "
            "test-team/test-project: Push-to-main success rate is 50.0% over the last 24 h (6 runs finished, failed "
            "or crashed; threshold 80%)."
        }
    ]
    (event,) = capture.bodies("/api/v1/events")
    assert event["alert_type"] == "warning"

    # The next tick: the condition still holds -> a new snapshot goes out, but no new notification.
    results = run_tick(instance, TODAY, snapshot_at="2026-06-02T12:15:00", now="2026-06-02T12:15:30")
    assert all(r.success for r in results)
    assert len(capture.bodies("/api/v2/series")) == 2
    assert len(capture.bodies("/hook/")) == 1
    assert query(warehouse_path, "SELECT status, count(*) FROM datadog_deliveries GROUP BY 1") == [("delivered", 2)]
    assert query(warehouse_path, "SELECT alert_key, opened_at, last_seen_at FROM alerts") == [
        (
            "push_to_main_success_rate_low:test-team/test-project:push_to_main",
            datetime(2026, 6, 2, 12, 0, 30),
            datetime(2026, 6, 2, 12, 15, 30),
        )
    ]
    checks = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in results[0].all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    }
    assert checks == {"success_rate_low_check": False, "sps_regression_check": True}
    # Each result says what was found, pass or fail (the finding, not the pass condition), and lists findings.
    found = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data
        for e in results[0].all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    }
    assert found["success_rate_low_check"].description == (  # a warning, said in words: the UI labels it "Failed"
        "Warning (the alert is open; nothing failed to run): test-team/test-project: Push-to-main success rate is "
        "50.0% over the last 24 h (6 runs finished, failed or crashed; threshold 80%)."
    )
    assert found["success_rate_low_check"].severity.value == "WARN"
    (finding,) = found["success_rate_low_check"].metadata["findings"].records
    assert finding.data["subject"] == "test-team/test-project:push_to_main" and finding.data["severity"] == "warning"
    assert found["sps_regression_check"].description == (
        "No unrecovered overview/sps regression in 1 CI config(s) on main (3 runs with a value, up to "
        "2026-06-02 12:15 UTC)."
    )
    assert found["sps_regression_check"].metadata["findings"].records == []
    text = all_messages(instance)
    assert DD_KEY not in text and API_KEY not in text and "secret" not in text


def test_failed_tick_opens_pipeline_failure_and_a_good_tick_resolves_it(
    wandb_server, capture, warehouse_path, instance
):
    server = wandb_server(ci_runs(failed=0))
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW))
    server.faults.fail_status, server.faults.fail_count = 500, -1
    (failed,) = run_tick(instance, TODAY, snapshot_at="2026-06-02T12:15:00", now="2026-06-02T12:15:30")
    assert not failed.success
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 1 and hooks[0].startswith(
        ":rotating_light: [critical] pipeline_failure (refresh): Dagster run "
    )
    assert "Fetching W&amp;B runs of test-team/test-project" in hooks[0]  # Slack shows &amp; as &
    server.faults.fail_count = 0
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:30:00", now="2026-06-02T12:30:30")
    )
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 2 and hooks[1].startswith(":white_check_mark: Resolved pipeline_failure (refresh).")
    assert query(warehouse_path, "SELECT rule, resolved_at IS NOT NULL FROM alerts") == [("pipeline_failure", True)]


@pytest.mark.slow
def test_a_feed_failing_three_ticks_in_a_row_notifies_once_per_channel(
    wandb_server, capture, warehouse_path, instance, monkeypatch
):
    wandb_server(ci_runs(failed=0))
    # The report step fails on every tick (a mistyped WANDB_ASSETS_REPORT_MODE): the feed job fails after
    # fleet_alerts has run, which once resolved pipeline_failure:feed only for the sensor to reopen it.
    monkeypatch.setenv("WANDB_ASSETS_REPORT_PROJECT", "fleet-report")
    monkeypatch.setenv("WANDB_ASSETS_REPORT_MODE", "offlne")
    for minute in (0, 15, 30):
        results = run_tick(
            instance, TODAY, snapshot_at=f"2026-06-02T12:{minute:02d}:00", now=f"2026-06-02T12:{minute:02d}:30"
        )
        assert [r.success for r in results] == [True, False]
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    events = [e["title"] for e in capture.bodies("/api/v1/events")]
    assert [h.split(" Dagster run")[0] for h in hooks] == [":rotating_light: [critical] pipeline_failure (feed):"]
    assert len(events) == 1 and events[0].startswith("[critical] pipeline_failure (feed): Dagster run")
    assert query(warehouse_path, "SELECT alert_key, resolved_at FROM alerts") == [("pipeline_failure:feed", None)]
    monkeypatch.setenv("WANDB_ASSETS_REPORT_MODE", "offline")
    results = run_tick(instance, TODAY, snapshot_at="2026-06-02T12:45:00", now="2026-06-02T12:45:30")
    assert [r.success for r in results] == [True, True]
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 2 and hooks[1].startswith(":white_check_mark: Resolved pipeline_failure (feed).")
    assert len(capture.bodies("/api/v1/events")) == 2
    # a further good tick launches no alert run at all
    run_tick(instance, TODAY, snapshot_at="2026-06-02T13:00:00", now="2026-06-02T13:00:30")
    assert len(capture.bodies("/hook/")) == 2
    assert len([r for r in instance.get_runs() if r.job_name == "pipeline_alert"]) == 4


def test_snapshot_sensor_requests_one_feed_run_per_snapshot(wandb_server, capture, instance):
    wandb_server(ci_runs(failed=0))

    def evaluate(cursor):
        context = build_sensor_context(instance=instance, definitions=defs, cursor=cursor)
        produced = list(after_fleet_snapshot(context) or [])
        return [r for r in produced if isinstance(r, RunRequest)], context.cursor

    first_tick = run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW)[0]
    requests, cursor = evaluate(None)
    assert [r.run_key.split(":")[1] for r in requests] == [first_tick.run_id]
    assert evaluate(cursor)[0] == []  # nothing new: nothing requested
    second_tick = run_tick(instance, TODAY, snapshot_at="2026-06-02T12:15:00", now="2026-06-02T12:15:30")[0]
    requests, _ = evaluate(cursor)
    assert [r.run_key.split(":")[1] for r in requests] == [second_tick.run_id]
    assert after_fleet_snapshot.job_name == "feed"


def test_datadog_down_does_not_fail_the_tick(wandb_server, capture, warehouse_path, instance):
    wandb_server(ci_runs(failed=0))
    capture.answer = 503
    results = run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW)
    assert [r.success for r in results] == [True, True]
    assert query(warehouse_path, "SELECT status, attempts FROM datadog_deliveries") == [("pending", 1)]
    feed_metadata = results[1].asset_materializations_for_node("datadog_feed")[0].metadata
    assert feed_metadata["problem"].value.startswith("Datadog intake unavailable (HTTP 503")
    (passed,) = [
        e.asset_check_evaluation_data
        for e in results[0].all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == "success_rate_low_check"
    ]
    assert passed.passed and passed.description == (
        "test-team/test-project: Push-to-main success rate 100.0% over the 24 h before 2026-06-02 12:00 UTC "
        "(6 runs finished, failed or crashed): at or above the 80% threshold."
    )


def test_backfills_never_push(wandb_server, capture, instance):
    from wandb_assets.ticks import execute_backfill

    wandb_server(ci_runs(failed=3))
    assert execute_backfill(instance, date(2026, 6, 1), TODAY).success
    assert capture.requests == []


def test_the_sensors_request_the_alert_job(wandb_server, capture, warehouse_path, instance):
    from dagster import DagsterEventType, build_run_status_sensor_context

    from wandb_assets.defs.feed.pipeline_failure import (
        pipeline_alert_run_config,
        pipeline_failure_opens,
        pipeline_failure_resolves,
    )
    from wandb_assets.ticks import _execute, execute_refresh

    def sensor_context(result, event_type):
        event = next(e for e in result.all_events if e.event_type == event_type)
        return build_run_status_sensor_context(
            sensor_name="pipeline_failure",
            dagster_event=event,
            dagster_instance=instance,
            dagster_run=instance.get_run_by_id(result.run_id),
        )

    server = wandb_server(ci_runs(failed=0))
    server.faults.fail_status, server.faults.fail_count = 500, -1
    failed = execute_refresh(instance, TODAY, snapshot_at=SNAPSHOT)
    assert not failed.success
    request = pipeline_failure_opens(sensor_context(failed, DagsterEventType.RUN_FAILURE).for_run_failure())
    assert request.run_key == f"opened:{failed.run_id}"
    config = request.run_config["ops"]["record_pipeline_failure"]["config"]
    assert (config["job_name"], config["event"]) == ("refresh", "opened")
    assert config["error"].startswith("step staged_runs: wandb_assets.lib.fetch.WandbFetchError: Fetching W&B runs of")
    # The fetch failed before anything opened the warehouse, and the sensor itself writes nothing.
    assert not warehouse_path.exists()
    assert _execute(instance, "pipeline_alert", request.run_config).success
    assert query(warehouse_path, "SELECT alert_key, resolved_at FROM alerts") == [("pipeline_failure:refresh", None)]
    (hook,) = capture.bodies("/hook/")
    assert hook["text"].startswith(
        f":rotating_light: [critical] pipeline_failure (refresh): Dagster run {failed.run_id}"
    )

    server.faults.fail_count = 0
    good = execute_refresh(instance, TODAY, snapshot_at=SNAPSHOT)
    request = pipeline_failure_resolves(sensor_context(good, DagsterEventType.RUN_SUCCESS))
    assert request.run_key == f"resolved:{good.run_id}"
    assert _execute(instance, "pipeline_alert", request.run_config).success
    assert query(warehouse_path, "SELECT alert_key, resolved_at IS NULL FROM alerts") == [
        ("pipeline_failure:refresh", False)
    ]
    again = execute_refresh(instance, TODAY, snapshot_at=SNAPSHOT)
    assert pipeline_failure_resolves(sensor_context(again, DagsterEventType.RUN_SUCCESS)) is None
    # the sensors watch every job of the code location and pass over those whose failure does not page: the alert
    # job's own failure opens nothing (nor does it loop)
    bogus = _execute(instance, "pipeline_alert", pipeline_alert_run_config("refresh", good.run_id, "bogus"))
    assert not bogus.success
    assert pipeline_failure_opens(sensor_context(bogus, DagsterEventType.RUN_FAILURE).for_run_failure()) is None


@pytest.mark.parametrize("mode", ["live", "dry_run"])
def test_a_sensor_launched_feed_after_a_tick_that_sent_everything_succeeds_and_sends_nothing(
    mode, wandb_server, capture, warehouse_path, instance, monkeypatch
):
    """What `demo --ui` does: the CLI tick already ran the feed; the daemon's after_fleet_snapshot sensor then
    launches the feed again for the same snapshot. Nothing is left to send: the run succeeds and sends nothing."""
    from wandb_assets.ticks import _execute

    if mode == "dry_run":
        monkeypatch.delenv("DD_API_KEY")
    wandb_server(ci_runs(failed=3))
    assert [r.success for r in run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW)] == [True, True]
    sent = (len(capture.bodies("/api/v2/series")), len(capture.bodies("/hook/")), len(capture.bodies("/api/v1/events")))
    assert sent == ((1, 1, 1) if mode == "live" else (0, 1, 0))
    context = build_sensor_context(instance=instance, definitions=defs)
    (request,) = [r for r in after_fleet_snapshot(context) or [] if isinstance(r, RunRequest)]
    feed = _execute(instance, after_fleet_snapshot.job_name, request.run_config)
    assert feed.success
    assert (
        len(capture.bodies("/api/v2/series")),
        len(capture.bodies("/hook/")),
        len(capture.bodies("/api/v1/events")),
    ) == sent
    metadata = feed.asset_materializations_for_node("datadog_feed")[0].metadata
    assert (metadata["delivered_now"].value, metadata["pending"].value) == (0, 0)
    status = "delivered" if mode == "live" else "dry_run"
    assert query(warehouse_path, "SELECT status, count(*) FROM datadog_deliveries GROUP BY 1") == [(status, 1)]


def test_a_warehouse_locked_for_an_hour_pages_once_and_resolves_once(
    wandb_server, capture, warehouse_path, instance, monkeypatch
):
    """Issue 32: when the warehouse itself is what failed (held by another process), the failed tick's
    pipeline_failure still reaches the channels, although the warehouse cannot record it; four failed ticks (an hour)
    page once; the first good tick resolves once."""
    from tests.test_ingestion import _hold_warehouse, _release

    wandb_server(ci_runs(failed=0))
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW))
    monkeypatch.setenv("WANDB_ASSETS_LOCK_WAIT", "0.5")
    reader = _hold_warehouse(warehouse_path)
    try:
        for minute in (15, 30, 45):
            (failed,) = run_tick(
                instance, TODAY, snapshot_at=f"2026-06-02T12:{minute}:00", now=f"2026-06-02T12:{minute}:30"
            )
            assert not failed.success
        (failed,) = run_tick(instance, TODAY, snapshot_at="2026-06-02T13:00:00", now="2026-06-02T13:00:30")
        assert not failed.success
    finally:
        _release(reader)
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 1 and hooks[0].startswith(
        ":rotating_light: [critical] pipeline_failure (refresh): Dagster run "
    )
    assert "is locked by another process" in hooks[0]
    assert [e["title"][:40] for e in capture.bodies("/api/v1/events")] == ["[critical] pipeline_failure (refresh): D"]
    results = run_tick(instance, TODAY, snapshot_at="2026-06-02T13:15:00", now="2026-06-02T13:15:30")
    assert all(r.success for r in results)
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 2 and hooks[1].startswith(":white_check_mark: Resolved pipeline_failure (refresh).")
    assert len(capture.bodies("/api/v1/events")) == 2


def test_a_run_named_with_an_at_handle_notifies_nobody_through_datadog_events(wandb_server, capture, instance):
    """The suspected point S4 of code-review-2026-11c: an ``@handle`` in a Datadog event notifies that handle, and
    run names (in alert texts) are anyone's to choose. The event says it with a zero-width space after the ``@``."""
    from wandb_assets.defs.feed.resources import DatadogResource
    from wandb_assets.defs.wandb_runs.resources import wandb_resource

    datadog = DatadogResource(wandb=wandb_resource())
    result = datadog.send_event(
        DD_KEY, "[warning] stalled_run (@pagerduty-infra)", "Run @oncall looks stalled", False, []
    )
    assert result.accepted
    (event,) = capture.bodies("/api/v1/events")
    assert (event["title"], event["text"]) == (
        "[warning] stalled_run (@\u200bpagerduty-infra)",
        "Run @\u200boncall looks stalled",
    )


def test_the_sps_detector_runs_once_a_tick(wandb_server, capture, warehouse_path, instance, monkeypatch):
    """Issue 54: the refresh's SPS check and the feed's fleet_alerts each ran the detector over every main series (at a
    million runs 1.4 s and 0.7 s a tick); the check now records what it found for the snapshot and fleet_alerts reads
    it. Two ticks of six CI runs: the first detects; the second re-reads the same runs unchanged, so what the first
    recorded stands (the series' digest is of what they read, not of when they were fetched): no detection."""
    from wandb_assets.lib import alerts

    calls = []
    detect = alerts._change_points_and_checkpoints  # what find_change_points and record_change_points run
    monkeypatch.setattr(alerts, "_change_points_and_checkpoints", lambda *a: calls.append(a[1]) or detect(*a))
    wandb_server(ci_runs(failed=0))
    assert all(r.success for r in run_tick(instance, TODAY, snapshot_at=SNAPSHOT, now=NOW))
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:15:00", now="2026-06-02T12:15:30")
    )
    assert calls == [datetime(2026, 6, 2, 12, 0)]
