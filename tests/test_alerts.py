"""Each alert rule opening, staying quiet while it holds, and resolving, on hand-built fleets; the outbox."""

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from tests.capture import CaptureServer
from tests.fleet import fleet_row, load
from wandb_assets.lib.accounting.gpus import UNKNOWN_TESTBED
from wandb_assets.lib.acting.channels import post_webhook
from wandb_assets.lib.alerts import (
    PIPELINE_FAILURE,
    RULE_FUNCTIONS,
    RULES,
    AlertThresholds,
    Condition,
    change_points,
    drain_outbox,
    evaluate_rules,
    find_change_points,
    pipeline_failure,
    reconcile,
    record_change_points,
    sps_regression,
)
from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.sql import reusing
from wandb_assets.settings import alert_thresholds

T = datetime(2026, 6, 10, 12, 0)
TH = AlertThresholds()
ALL_RULES = set(RULE_FUNCTIONS)


def test_the_nine_rules():
    assert RULES == (
        "push_to_main_success_rate_low",
        "sps_regression",
        "failure_spike",
        "stalled_run",
        "ci_silent",
        "long_running",
        "idle_gpus",
        "project_unreachable",
        "pipeline_failure",
    )


def ago(hours: float) -> datetime:
    return T - timedelta(hours=hours)


def ci(
    run_id: str, state: str, ended_hours_ago: float, sps: float | None = None, config: str = "ppo", branch: str = "main"
) -> dict:
    row = fleet_row(run_id, state, "push_to_main", ago(ended_hours_ago + 1), ago(ended_hours_ago), overview_sps=sps)
    row.update(ci_branch=branch, ci_config=config, ci_commit=f"c-{run_id}", url=f"http://wandb.local/runs/{run_id}")
    return row


def fresh_ci() -> list[dict]:
    """Keeps ci_silent quiet: one CI run created an hour before T, still running and heartbeating."""
    row = fleet_row("ci-fresh", "running", "push_to_main", ago(1), T + timedelta(hours=2))
    row.update(ci_branch="pr1", ci_config="other")
    return [row]


@pytest.fixture
def con(memory_con):
    return memory_con


def keys(con, at=T, th=TH) -> list[str]:
    return sorted(c.key for c in evaluate_rules(con, at, th))


def test_success_rate_low(con):
    load(
        con,
        fresh_ci()
        + [
            ci("a", "finished", 2),
            ci("b", "finished", 3),
            ci("c", "failed", 4),
            ci("d", "crashed", 5),
            ci("e", "failed", 6),
        ],
    )
    conditions = evaluate_rules(con, T, TH)
    assert [c.key for c in conditions] == ["push_to_main_success_rate_low:push_to_main"]
    assert conditions[0].message == (
        "Push-to-main success rate is 40.0% over the last 24 h (5 runs finished, failed or crashed; threshold 80%)."
    )
    load(con, fresh_ci() + [ci("a", "finished", 2), ci("c", "failed", 4), ci("d", "crashed", 5), ci("e", "failed", 6)])
    assert keys(con) == []  # 4 ended runs: below the 5-run minimum


def test_the_success_rate_rule_judges_the_snapshot_it_is_given_as_stored(con):
    """Issue 54: the rule reads the rate the snapshot at ``at`` stored (what Datadog was sent; per project too)
    instead of evaluating every gauge again. Five rated runs, 2 of 5 finished: 40 %, computed without a snapshot at T
    and stored by the snapshot at T; a stored 20 % (as if the runs had said so when the snapshot was taken) is what the
    alert says then, fleet-wide and by project."""
    from wandb_assets.lib.warehouse import record_snapshot

    runs = fresh_ci() + [ci("a", "finished", 2), ci("b", "finished", 3)]
    runs += [ci("c", "failed", 4), ci("d", "crashed", 5), ci("e", "failed", 6)]
    load(con, runs)
    (computed,) = evaluate_rules(con, T, TH)
    assert computed.details["success_rate_pct"] == 40.0
    record_snapshot(con, T)
    assert con.execute(
        "SELECT value FROM project_metrics WHERE snapshot_at = $t AND metric = 'wandb.push_to_main.success_rate_pct'",
        {"t": T},
    ).fetchall() == [(40.0,)]
    for table in ("fleet_metrics", "project_metrics"):
        con.execute(f"UPDATE {table} SET value = 20.0 WHERE metric = 'wandb.push_to_main.success_rate_pct'")
    for th in (TH, replace(TH, by_project=not TH.by_project)):
        (stored,) = evaluate_rules(con, T, th)
        assert stored.details["success_rate_pct"] == 20.0 and "is 20.0% over the last 24 h (5 runs" in stored.message


def test_success_rate_minimum_counts_only_the_runs_it_rates(con):
    # 5 killed + 1 failed: six runs ended, but the rate (0%) is over one run; below the 5-run minimum.
    load(con, fresh_ci() + [ci(f"k{i}", "killed", i + 1) for i in range(5)] + [ci("f", "failed", 7)])
    assert keys(con) == []


def main_runs(config: str, values: list[float], metric: str = "overview/sps", last_ended_hours_ago: float = 0.5):
    """Main-branch runs of one config in commit order, one every 10 minutes, the last ending before T."""
    rows = []
    for i, value in enumerate(values):
        ended = T - timedelta(hours=last_ended_hours_ago, minutes=10 * (len(values) - 1 - i))
        row = fleet_row(f"{config}-{i}", "finished", "push_to_main", ended - timedelta(minutes=5), ended)
        row.update(
            ci_branch="main",
            ci_config=config,
            ci_commit=f"{config[:3]}{i:04d}",
            ci_timestamp=ended - timedelta(minutes=5),
            url=f"http://wandb.local/runs/{config}-{i}",
            summary=json.dumps({metric: value}),
        )
        if metric in SPS_KEYS:  # as the load keeps the five SPS keys: their column too (``normalize``)
            row[SPS_KEYS[metric]] = value
        rows.append(row)
    return rows


def flat(level: float, n: int) -> list[float]:
    return [level] * n  # noise-free: the spread is the detector's floor, 0.5%


def test_sps_regression_names_commits_levels_and_how_many_runs_confirm_it(con):
    load(con, fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(85.0, 3)))
    (condition,) = evaluate_rules(con, T, TH)
    assert condition.key == "sps_regression:ppo:ppo0030"
    assert condition.message == (
        "SPS regression on main for ppo: overview/sps fell 15.0% from 100.0 to 85.0 (noise 0.5%). Last good commit "
        "ppo0029 (http://wandb.local/runs/ppo-29), first slow commit ppo0030 (http://wandb.local/runs/ppo-30); "
        "3 slow run(s) confirm it."
    )
    assert condition.details["run_id"] == "ppo-30"


def test_sps_regression_needs_more_than_two_slow_runs_and_ignores_a_straggler(con):
    values = flat(100.0, 30) + [60.0] + flat(100.0, 10) + [85.0, 85.0]
    load(con, fresh_ci() + main_runs("ppo", values))
    assert [c for c in evaluate_rules(con, T, TH) if c.rule == "sps_regression"] == []


def test_two_configs_never_mix(con):
    # ppo drops at its 30th run; dqn runs at a fifth of the speed, interleaved in time, and never changes
    load(con, fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(80.0, 4)) + main_runs("dqn", flat(20.0, 40)))
    assert keys(con) == ["sps_regression:ppo:ppo0030"]


def on_testbed(rows: list[dict], gpus: int, model: str) -> list[dict]:
    return [row | {"gpu_count": gpus, "gpu_model": model} for row in rows]


def test_a_main_series_that_changes_hardware_is_two_series_and_raises_no_alert(con):
    """Issue 45: ppo's 30 main runs on 8 H100s at 100 SPS, then its CI moves to 8 A100s at 70: two testbeds, each
    steady, no regression (a12c3e6 read it as a 30 % drop: sps_regression:ppo:ppo0030). A drop within the A100
    testbed (its last 3 runs at 56, -20 %) is one, said to be on it."""
    runs = main_runs("ppo", flat(100.0, 30) + flat(70.0, 30))
    moved = on_testbed(runs[:30], 8, "H100-80GB") + on_testbed(runs[30:], 8, "A100-80GB")
    load(con, fresh_ci() + moved)
    assert keys(con) == []
    runs = main_runs("ppo", flat(100.0, 30) + flat(70.0, 30) + flat(56.0, 3))
    load(con, fresh_ci() + on_testbed(runs[:30], 8, "H100-80GB") + on_testbed(runs[30:], 8, "A100-80GB"))
    (condition,) = [c for c in evaluate_rules(con, T, TH) if c.rule == "sps_regression"]
    assert condition.key == "sps_regression:ppo:ppo0060"
    assert condition.message.startswith(
        "SPS regression on main for ppo on 8xA100-80GB: overview/sps fell 20.0% from 70.0 to 56.0 (noise 0.5%)."
    )
    assert condition.details["testbed"] == "8xA100-80GB"


def test_two_testbeds_slowing_at_one_commit_are_two_alerts(con):
    """The same commit slows ppo by 15 % on 8 H100s and on 4 L4s (their runs interleaved): one alert each, the
    testbed in the key only because the commit is shared."""
    fast = on_testbed(main_runs("ppo", flat(100.0, 30) + flat(85.0, 3)), 8, "H100-80GB")
    slow = on_testbed(main_runs("ppo", flat(40.0, 30) + flat(34.0, 3)), 4, "L4")
    for row in slow:
        row["run_id"], row["url"] = row["run_id"] + "-l4", row["url"] + "-l4"
    load(con, fresh_ci() + fast + slow)
    assert keys(con) == ["sps_regression:ppo:ppo0030@4xL4", "sps_regression:ppo:ppo0030@8xH100-80GB"]


def test_the_sps_metric_is_configurable(con):
    load(con, fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(80.0, 4), metric="charts/SPS"))
    assert keys(con) == []  # nothing logged overview/sps
    assert keys(con, th=AlertThresholds(sps_metric="charts/SPS")) == ["sps_regression:ppo:ppo0030"]


def test_regress_then_fix_opens_and_resolves_one_alert(con):
    values = flat(100.0, 30) + flat(85.0, 22) + flat(100.0, 6)
    events = []
    for n in range(30, len(values) + 1):  # one tick per new main run
        load(con, fresh_ci() + main_runs("ppo", values[:n]))
        events += [(n, t.event, t.condition.key) for t in reconcile(con, evaluate_rules(con, T, TH), ALL_RULES, T, [])]
    assert events == [(33, "opened", "sps_regression:ppo:ppo0030"), (55, "resolved", "sps_regression:ppo:ppo0030")]


def test_an_unrecovered_regression_keeps_one_alert_over_400_ticks(con):
    """150 main runs at 1000 SPS, then 800 for good (3% noise; the review's series, seed 1): one tick per new run,
    400 in all. The alert opens once, keyed by its first slow commit, and never re-keys or resolves on its own
    (with a window of the last 200 runs it re-keyed at run 330 and resolved at run 340)."""
    import math
    import random

    rng = random.Random(1)
    values = [(1000 if i < 150 else 800) * math.exp(rng.gauss(0, 0.03)) for i in range(400)]
    rows = main_runs("ppo", values)
    load(con, fresh_ci() + rows)
    evaluate_rules(con, T, TH)  # creates the rules' views
    events = []
    for n, row in enumerate(rows, start=1):  # a tick just after each main run ended sees the first n runs
        at = row["ended_at"] + timedelta(minutes=1)
        events += [
            (n, t.event, t.condition.key)
            for t in reconcile(con, sps_regression(con, at, TH), {"sps_regression"}, at, [])
        ]
    assert events == [(153, "opened", "sps_regression:ppo:ppo0148")]  # the review's series: found at run 153


def test_the_change_points_recorded_are_what_the_detector_finds_and_are_read_back_while_the_series_holds(con):
    """Regress at commit 30 (100 -> 85), fixed at commit 52: one change point, recovered. Recorded, it is read back
    from ``sps_change_points`` (an edit made there shows); a new run, or a run fetched again with anything the series
    or a point reads changed, finds it anew; fetched again unchanged, the recorded one stands."""
    values = flat(100.0, 30) + flat(85.0, 22) + flat(100.0, 6)
    rows = main_runs("ppo", values)
    load(con, fresh_ci() + rows)
    assert record_change_points(con, T, "overview/sps") == 1
    (point,) = change_points(con, T, "overview/sps")
    assert point == find_change_points(con, T, "overview/sps")[0]
    assert {k: point[k] for k in ("ci_config", "last_good_commit", "first_slow_commit", "recovered_commit")} == {
        "ci_config": "ppo",
        "last_good_commit": "ppo0029",
        "first_slow_commit": "ppo0030",
        "recovered_commit": "ppo0052",  # the first of the six back at 100
    }
    assert (point["detected_commit"], round(point["before"], 9), round(point["after"], 9), point["recovered"]) == (
        "ppo0032",  # the third slow run: the alert opened when run 33 (index 32) ended
        100.0,
        85.0,
        True,
    )
    assert (point["first_slow_run_id"], point["first_slow_url"]) == ("ppo-30", "http://wandb.local/runs/ppo-30")
    con.execute("UPDATE sps_change_points SET before = 99.0")  # the same series: the table is what is read
    assert change_points(con, T, "overview/sps")[0]["before"] == 99.0
    assert change_points(con, T, "charts/SPS") == []  # another metric: found anew (nothing logged it)
    con.execute("UPDATE runs SET ingested_at = ingested_at + INTERVAL 1 MINUTE WHERE run_id = 'ppo-10'")
    assert change_points(con, T, "overview/sps")[0]["before"] == 99.0  # run 10 fetched again, unchanged: the same
    con.execute("UPDATE runs SET url = 'http://wandb.local/runs/ppo-10/moved' WHERE run_id = 'ppo-10'")
    assert round(change_points(con, T, "overview/sps")[0]["before"], 9) == 100.0  # what a point names changed: anew
    assert record_change_points(con, T, "overview/sps") == 1
    con.execute("UPDATE sps_change_points SET before = 99.0")
    con.execute("UPDATE runs SET sps_overview_sps = 100.5 WHERE run_id = 'ppo-10'")  # its SPS rewritten, nothing else
    assert round(change_points(con, T, "overview/sps")[0]["before"], 9) == 100.0  # found anew (the regime's median)
    assert record_change_points(con, T, "overview/sps") == 1
    con.execute("UPDATE sps_change_points SET before = 99.0")
    assert change_points(con, T + timedelta(hours=1), "overview/sps")[0]["before"] == 99.0  # later, the same runs
    extra = fleet_row("ppo-late", "finished", "push_to_main", T - timedelta(minutes=6), T - timedelta(minutes=1))
    extra.update(ci_branch="main", ci_config="ppo", ci_commit="ppo9999", url="u", summary='{"overview/sps": 100}')
    load(con, fresh_ci() + rows + [extra])
    assert round(change_points(con, T, "overview/sps")[0]["before"], 9) == 100.0  # one more run: found anew


def test_the_rules_right_after_recording_read_the_change_points_recorded_and_find_the_same(con):
    """A tick records the change points, then evaluates the rules on the same connection: the SPS rule reads the
    table as recorded (no second pass over main's runs to check the series), and finds what evaluating anew finds."""
    load(con, fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(85.0, 10)))  # slow from commit 30, not back
    assert record_change_points(con, T, "overview/sps") == 1
    anew = [c.key for c in evaluate_rules(con, T, TH)]
    assert [c.key for c in evaluate_rules(con, T, TH, change_points_recorded=True)] == anew
    assert anew == ["sps_regression:ppo:ppo0030"]
    # Recorded is taken as current (the series is not checked again): an edit of the table shows, though a run the
    # series reads changed since; evaluating anew finds the point again.
    con.execute("UPDATE sps_change_points SET first_slow_commit = 'ppo0031'")
    con.execute("UPDATE runs SET url = 'http://wandb.local/runs/ppo-1/moved' WHERE run_id = 'ppo-1'")
    assert [c.key for c in evaluate_rules(con, T, TH, change_points_recorded=True)] == ["sps_regression:ppo:ppo0031"]
    assert [c.key for c in evaluate_rules(con, T, TH)] == anew


def test_failure_spike(con):
    rows = [fleet_row(f"f{i}", "failed", "regular", ago(3), ago(2)) for i in range(6)]
    rows += [fleet_row(f"ok{i}", "finished", "regular", ago(3), ago(2)) for i in range(4)]
    load(con, fresh_ci() + rows)
    (condition,) = evaluate_rules(con, T, TH)
    assert condition.key == "failure_spike:fleet"
    assert condition.message.startswith("Failure spike: 6 of 10 runs that ended in the last 24 h failed or crashed")
    load(con, fresh_ci() + rows[1:])  # 9 ended: below the minimum of 10
    assert keys(con) == []


def test_stalled_by_heartbeat(con):
    stuck = fleet_row("stuck", "running", "regular", ago(5), ago(0.6))  # heartbeat 36 min ago
    fine = fleet_row("fine", "running", "regular", ago(5), ago(0.1))
    load(con, fresh_ci() + [stuck, fine])
    (condition,) = evaluate_rules(con, T, TH)
    assert condition.key == "stalled_run:stuck"
    assert "no heartbeat for 36 min" in condition.message


@pytest.mark.parametrize(
    ("threshold", "silent_s", "stalled"),
    [
        (30.5, 30 * 60 + 12, False),  # 30.2 min < 30.5: quiet (int(30.5) = 30 once made this an alert or a crash)
        (30.5, 30 * 60 + 36, True),  # 30.6 min
        (0.5, 20, False),
        (0.5, 40, True),
    ],
)
def test_fractional_stall_thresholds_without_a_step(con, threshold, silent_s, stalled):
    run = fleet_row("quiet", "running", "regular", ago(5), T - timedelta(seconds=silent_s))
    run["summary_step"] = None  # a third of real summaries have no _step
    load(con, fresh_ci() + [run])
    th = AlertThresholds(stall_heartbeat_minutes=threshold)
    conditions = evaluate_rules(con, T, th)
    assert [c.key for c in conditions] == (["stalled_run:quiet"] if stalled else [])
    if stalled:
        assert conditions[0].details["reason"] == f"no heartbeat for {silent_s // 60} min"


def test_a_stalled_offline_run_names_its_log_and_hostile_names_are_sent_as_text(con):
    """An offline run has no W&B page: the alert names its log, not "(None)". Its name is anyone's to choose:
    Slack gets it as literal text (``<!channel>`` pages nobody), and a preview table keeps its shape."""
    from wandb_assets.lib.markdown import markdown_table

    name = "<!channel> a|b\nc & <http://evil|click>"
    stuck = fleet_row("stuck", "running", "regular", ago(5), ago(0.6))
    stuck.update(name=name, url=None, source="offline", log_path="/logs/run-stuck.wandb")
    load(con, fresh_ci() + [stuck])
    (condition,) = evaluate_rules(con, T, TH)
    assert (
        condition.message == f"Run {name} looks stalled: no heartbeat for 36 min (offline log /logs/run-stuck.wandb)."
    )
    capture = CaptureServer()
    try:
        assert post_webhook(capture.url + "/hook", condition.message, timeout_s=2) is None
    finally:
        capture.stop()
    assert capture.requests[0]["body"]["text"] == (
        "Run &lt;!channel&gt; a|b\nc &amp; &lt;http://evil|click&gt; looks stalled: no heartbeat for 36 min "
        "(offline log /logs/run-stuck.wandb)."
    )
    assert markdown_table(["run", "n"], [(name, 1.5), (None, 2)]) == (
        "| run | n |\n|---|---|\n| &lt;!channel&gt; a\\|b c &amp; &lt;http://evil\\|click&gt; | 1.5 |\n|  | 2 |"
    )


def test_long_running(con):
    zombie = fleet_row("zombie", "running", "regular", ago(24 * 8), T)  # heartbeating, alive for 8 days
    queued = fleet_row("queued", "pending", "regular", ago(24 * 7 + 1), None)
    young = fleet_row("young", "running", "regular", ago(24 * 6), T)
    load(con, fresh_ci() + [zombie, queued, young])
    conditions = [c for c in evaluate_rules(con, T, TH) if c.rule == "long_running"]
    assert [c.key for c in conditions] == ["long_running:queued", "long_running:zombie"]
    assert conditions[1].message == (
        "Run zombie has been running since 2026-06-02 12:00 UTC (over 168 h): a zombie or a stuck job? (no link)."
    )


def test_stalled_by_step_needs_an_hour_of_ticks_without_progress(con):
    def at_step(step: float, heartbeat: datetime) -> list[dict]:
        run = fleet_row("slow", "running", "regular", ago(5), heartbeat)
        run["summary_step"] = step
        return fresh_ci() + [run]

    seen = []
    for minutes, step in [(0, 10), (15, 20), (30, 20), (45, 20), (60, 20), (75, 20), (90, 21)]:
        at = T + timedelta(minutes=minutes)
        load(con, at_step(step, at))  # heartbeats keep coming: only the step stalls
        seen.append((minutes, keys(con, at)))
    # step 20 first seen at +15 min: stalled once an hour has passed (+75), cleared by progress at +90.
    assert seen == [(0, []), (15, []), (30, []), (45, []), (60, []), (75, ["stalled_run:slow"]), (90, [])]


def test_ci_silent(con):
    old = fleet_row("ci-old", "finished", "push_to_main", ago(13), ago(12.5))
    load(con, [old])
    (condition,) = evaluate_rules(con, T, TH)
    assert condition.key == "ci_silent:push_to_main"
    assert condition.message == "No push-to-main run created in the last 12 h (none since 2026-06-09 23:00 UTC)."
    load(con, [fleet_row("ci-new", "finished", "push_to_main", ago(11), ago(10))])
    assert keys(con) == []


def test_thresholds_from_environment():
    th = alert_thresholds(
        {"WANDB_ASSETS_SPS_METRIC": "charts/SPS", "WANDB_ASSETS_ALERT_STALL_HEARTBEAT_MINUTES": "0.5"}
    )
    assert (th.sps_metric, th.stall_heartbeat_minutes, th.failure_spike_pct) == ("charts/SPS", 0.5, 50.0)


def test_pipeline_failure_resolves_only_for_its_own_job(con):
    opened = reconcile(
        con, [pipeline_failure("feed", "r1", "boom"), pipeline_failure("backfill", "r2", "x")], set(), T, []
    )
    assert len(opened) == 2
    # a full evaluation of the fleet rules never touches pipeline_failure
    assert reconcile(con, [], set(RULE_FUNCTIONS), T + timedelta(minutes=15), []) == []
    resolved = reconcile(con, [], {f"{PIPELINE_FAILURE}:feed"}, T + timedelta(minutes=30), [])
    assert [(t.event, t.condition.key) for t in resolved] == [("resolved", "pipeline_failure:feed")]
    still_open = con.execute("SELECT alert_key FROM alerts WHERE resolved_at IS NULL").fetchall()
    assert still_open == [("pipeline_failure:backfill",)]


def test_lifecycle_notifies_on_open_and_resolve_only(con):
    holding = [Condition("failure_spike", "fleet", "critical", "bad")]
    opened = reconcile(con, holding, ALL_RULES, T, ["slack"])
    assert [(t.event, t.condition.key) for t in opened] == [("opened", "failure_spike:fleet")]
    for minutes in range(15, 150, 15):  # the condition holds for nine more ticks: no new notification
        assert reconcile(con, holding, ALL_RULES, T + timedelta(minutes=minutes), ["slack"]) == []
    assert reconcile(con, [], {"sps_regression"}, T + timedelta(minutes=150), ["slack"]) == []  # rule not run
    resolved = reconcile(con, [], ALL_RULES, T + timedelta(minutes=165), ["slack"])
    assert [(t.event, t.condition.key) for t in resolved] == [("resolved", "failure_spike:fleet")]
    row = con.execute("SELECT opened_at, last_seen_at, resolved_at FROM alerts").fetchall()
    assert row == [(T, T + timedelta(minutes=135), T + timedelta(minutes=165))]
    events = con.execute("SELECT event, channel, status FROM alert_notifications ORDER BY id").fetchall()
    assert events == [("opened", "slack", "pending"), ("resolved", "slack", "pending")]
    # It can open again later, as a new alert.
    assert len(reconcile(con, holding, ALL_RULES, T + timedelta(hours=5), ["slack"])) == 1
    assert con.execute("SELECT count(*) FROM alerts").fetchone()[0] == 2


def test_webhook_outage_then_delivery_at_least_once(con):
    capture = CaptureServer()
    try:
        reconcile(con, [Condition("ci_silent", "push_to_main", "warning", "no CI for 13 h")], ALL_RULES, T, ["slack"])

        def deliver(channel, event, text):
            return post_webhook(capture.url + "/hook", text, timeout_s=2)

        capture.answer = 500
        assert drain_outbox(reusing(con), deliver, T) == (0, {"slack": "webhook answered HTTP 500"})
        reconcile(con, [], ALL_RULES, T + timedelta(minutes=15), ["slack"])  # resolves while the hook is down
        assert drain_outbox(reusing(con), deliver, T + timedelta(minutes=15))[0] == 0
        capture.answer = 200
        assert drain_outbox(reusing(con), deliver, T + timedelta(minutes=30)) == (2, {})
        assert drain_outbox(reusing(con), deliver, T + timedelta(minutes=45)) == (0, {})
        delivered = [r["body"]["text"] for r in capture.requests]
        assert delivered[-2:] == [
            ":rotating_light: [warning] ci_silent (push_to_main): no CI for 13 h",
            ":white_check_mark: Resolved ci_silent (push_to_main). Was: no CI for 13 h",
        ]
        assert len(capture.requests) == 2 + 2  # two refused tries (one per drain: the queue stops), two deliveries
        statuses = con.execute("SELECT event, status, attempts FROM alert_notifications ORDER BY id").fetchall()
        assert statuses == [("opened", "sent", 3), ("resolved", "sent", 1)]
    finally:
        capture.stop()


def _stalled(state: str) -> list[dict]:
    return fresh_ci() + [fleet_row("stuck", state, "regular", ago(5), ago(1))]


RULE_CASES = {
    "long_running": (
        fresh_ci() + [fleet_row("zombie", "running", "regular", ago(24 * 8), T + timedelta(hours=2))],
        fresh_ci() + [fleet_row("zombie", "finished", "regular", ago(24 * 8), ago(1))],
    ),
    # rule: (rows under which it holds, rows under which it no longer holds)
    "push_to_main_success_rate_low": (
        fresh_ci() + [ci(f"x{i}", "failed" if i < 3 else "finished", i + 1) for i in range(5)],
        fresh_ci() + [ci(f"x{i}", "finished", i + 1) for i in range(5)],
    ),
    "sps_regression": (
        fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(85.0, 22)),
        fresh_ci() + main_runs("ppo", flat(100.0, 30) + flat(85.0, 22) + flat(100.0, 6)),
    ),
    "failure_spike": (
        fresh_ci()
        + [fleet_row(f"f{i}", "failed" if i < 6 else "finished", "regular", ago(3), ago(2)) for i in range(10)],
        fresh_ci()
        + [fleet_row(f"f{i}", "failed" if i < 4 else "finished", "regular", ago(3), ago(2)) for i in range(10)],
    ),
    "stalled_run": (_stalled("running"), _stalled("crashed")),  # silent for an hour, then marked crashed
    "ci_silent": (
        [fleet_row("ci-old", "finished", "push_to_main", ago(13), ago(12.5))],
        [fleet_row("ci-old", "finished", "push_to_main", ago(13), ago(12.5))] + fresh_ci(),
    ),
}


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_each_rule_opens_stays_quiet_and_resolves(con, rule):
    holding, cleared = RULE_CASES[rule]
    events = []
    for minutes, rows in [(0, holding), (15, holding), (30, holding), (45, cleared), (60, cleared)]:
        at = T + timedelta(minutes=minutes)
        load(con, rows)
        transitions = reconcile(con, evaluate_rules(con, at, TH), ALL_RULES, at, ["slack"])
        events += [(minutes, t.event, t.condition.rule) for t in transitions]
    assert events == [(0, "opened", rule), (45, "resolved", rule)]
    assert con.execute("SELECT count(*) FROM alert_notifications").fetchone()[0] == 2


def test_alert_keys_are_the_same_with_one_project_or_several_and_an_upgrade_keeps_open_alerts_going(memory_con):
    """Finding 15 of code-review-2026-11c: turning WANDB_ASSETS_PROJECTS on (even naming the same project) resolved
    and reopened every open alert under a new key. Keys now carry the project either way; an open alert of a
    warehouse written before is re-keyed in place by the schema upgrade and goes on without a message."""
    from wandb_assets.lib.alerts import RULE_FUNCTIONS, evaluate_rules, reconcile
    from wandb_assets.lib.warehouse import ensure_schema
    from wandb_assets.settings import alert_thresholds

    ensure_schema(memory_con)
    at = datetime(2026, 11, 20, 12)
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, name, state, category, created_at, heartbeat_at, gpu_count, url, "
        "ingested_at, source) VALUES ('e', 'p', 'z1', 'zombie', 'running', 'regular', TIMESTAMP '2026-11-01', $hb, 1, "
        "'https://wandb.ai/e/p/runs/z1', $hb, 'wandb')",
        {"hb": at},
    )
    one = alert_thresholds({"WANDB_PROJECT": "p", "WANDB_ENTITY": "e"})
    several = alert_thresholds({"WANDB_ASSETS_PROJECTS": "e/p"})
    keys = [sorted(c.key for c in evaluate_rules(memory_con, at, th)) for th in (one, several)]
    assert keys[0] == keys[1] and "long_running:e/p:z1" in keys[0]
    # An open alert as a one-project warehouse keyed it before, with a message still waiting for Slack.
    memory_con.execute(
        "INSERT INTO alerts VALUES ('long_running:z1', 'long_running', 'z1', 'warning', 'm', '{}', $t, $t, NULL)",
        {"t": at - timedelta(hours=1)},
    )
    memory_con.execute(
        "INSERT INTO alert_notifications (id, alert_key, event, channel, text, status, attempts, created_at) "
        "VALUES (1, 'long_running:z1', 'opened', 'slack', 'x', 'pending', 0, $t)",
        {"t": at},
    )
    memory_con.execute("DELETE FROM warehouse_meta WHERE key = 'schema_version'")  # as an older version left it
    ensure_schema(memory_con)
    assert memory_con.execute("SELECT alert_key, subject FROM alerts").fetchall() == [("long_running:e/p:z1", "e/p:z1")]
    assert memory_con.execute("SELECT alert_key FROM alert_notifications").fetchall() == [("long_running:e/p:z1",)]
    transitions = reconcile(memory_con, evaluate_rules(memory_con, at, several), set(RULE_FUNCTIONS), at, ["slack"])
    assert [(t.event, t.condition.key) for t in transitions if t.condition.rule == "long_running"] == []


def test_alerts_of_one_run_rule_and_project_opened_together_go_as_one_message(con):
    """Issue 43: the second tick opened 16 stalled_run alerts at once, 16 pages. Three stalled runs of e/p, one of
    e/q and a long run of e/p open together: three messages, the three of e/p in one, each run with its line."""
    stalled = [
        Condition("stalled_run", f"e/p:r{i}", "warning", f"Run r{i} stalled: http://w/e/p/runs/r{i}") for i in range(3)
    ]
    others = [
        Condition("stalled_run", "e/q:s0", "warning", "Run s0 stalled: http://w/e/q/runs/s0"),
        Condition("long_running", "e/p:l0", "warning", "Run l0 runs 3 days: http://w/e/p/runs/l0"),
    ]
    reconcile(con, [*stalled, *others], ALL_RULES, T, ["slack"])
    sent: list[str] = []
    assert drain_outbox(reusing(con), lambda channel, event, text: sent.append(text), T) == (5, {})
    assert sent == [
        ":rotating_light: 3 stalled_run alerts opened in e/p:\n"
        "- [warning] stalled_run (e/p:r0): Run r0 stalled: http://w/e/p/runs/r0\n"
        "- [warning] stalled_run (e/p:r1): Run r1 stalled: http://w/e/p/runs/r1\n"
        "- [warning] stalled_run (e/p:r2): Run r2 stalled: http://w/e/p/runs/r2",
        ":rotating_light: [warning] stalled_run (e/q:s0): Run s0 stalled: http://w/e/q/runs/s0",
        ":rotating_light: [warning] long_running (e/p:l0): Run l0 runs 3 days: http://w/e/p/runs/l0",
    ]
    assert con.execute("SELECT count(*) FROM alert_notifications WHERE status = 'sent'").fetchone() == (5,)
    reconcile(con, others, ALL_RULES, T + timedelta(minutes=15), ["slack"])  # the three recover together
    sent.clear()
    assert drain_outbox(reusing(con), lambda channel, event, text: sent.append(text), T) == (3, {})
    assert sent == [
        ":white_check_mark: 3 stalled_run alerts resolved in e/p:\n"
        "- Resolved stalled_run (e/p:r0). Was: Run r0 stalled: http://w/e/p/runs/r0\n"
        "- Resolved stalled_run (e/p:r1). Was: Run r1 stalled: http://w/e/p/runs/r1\n"
        "- Resolved stalled_run (e/p:r2). Was: Run r2 stalled: http://w/e/p/runs/r2"
    ]


def test_an_alert_of_a_run_that_moves_to_another_mirrored_project_goes_on_under_its_key(memory_con, tmp_path):
    """z1 (running since 2026-11-01, over 168 h) has its long_running alert open in e/p; W&B moves it to e/q: the e/p
    copy is marked moved and the e/q copy holds the same condition. The problem neither went away nor started: no
    "resolved", no "opened" (it had paged both), the alert goes on as long_running:e/p:z1 saying e/q; it resolves
    once, under that key, when z1 ends in e/q."""
    import os

    from wandb_assets.lib.checks import broken
    from wandb_assets.lib.warehouse import WHOLE_KEY, load_runs_window, ndjson_lines, record_projects

    th = alert_thresholds({"WANDB_ASSETS_PROJECTS": "e/p,e/q"})
    start = datetime(2026, 11, 1)
    window = (start, start + timedelta(days=1))
    both = [{"entity": "e", "project": name, "error": None} for name in ("p", "q")]

    def fetched(n: int, project: str, state: str, at: datetime) -> list[tuple[str, str]]:
        row = fleet_row("z1", state, "regular", start + timedelta(hours=1), at, entity="e", project=project)
        path = tmp_path / f"{n}.ndjson"
        path.write_text(json.dumps({WHOLE_KEY: ["e/p", "e/q"]}) + "\n" + "".join(ndjson_lines([row], at)))
        stamp = (at - datetime(1970, 1, 1)).total_seconds()  # the fetch began at ``at`` (naive UTC)
        os.utime(path, (stamp, stamp))
        record_projects(memory_con, both, at)
        load_runs_window(memory_con, [str(path)], *window, projects=[("e", "p"), ("e", "q")])
        transitions = reconcile(memory_con, evaluate_rules(memory_con, at, th), ALL_RULES, at, ["slack"])
        return [(t.event, t.condition.key) for t in transitions if t.condition.rule == "long_running"]

    first = datetime(2026, 11, 20, 12)
    assert fetched(1, "p", "running", first) == [("opened", "long_running:e/p:z1")]
    assert fetched(2, "q", "running", first + timedelta(hours=1)) == []  # moved: neither resolved nor opened
    opened = memory_con.execute(
        "SELECT alert_key, details->>'project', message LIKE 'e/q:%', last_seen_at FROM alerts "
        "WHERE resolved_at IS NULL AND rule = 'long_running'"
    ).fetchall()
    assert opened == [("long_running:e/p:z1", "q", True, first + timedelta(hours=1))]
    assert broken(memory_con, first + timedelta(hours=1)) == []
    assert fetched(3, "q", "running", first + timedelta(hours=2)) == []  # and on, tick after tick
    assert fetched(4, "q", "finished", first + timedelta(hours=3)) == [("resolved", "long_running:e/p:z1")]
    events = memory_con.execute(
        "SELECT alert_key, event FROM alert_notifications WHERE alert_key LIKE 'long_running:%' ORDER BY id"
    ).fetchall()
    assert events == [("long_running:e/p:z1", "opened"), ("long_running:e/p:z1", "resolved")]


def test_a_tick_keeps_the_detectors_checkpoint_and_the_next_judges_from_it_as_from_the_start(con):
    """The tick that records the change points keeps, per series, where the detector last re-baselined (here the fix
    at commit 52, decided at 55); the next tick's series (10 more runs, a second drop at commit 77) is judged from
    there (what the checkpoint says of the runs before it is taken as it is: an edit made there shows), with the
    answer of the whole series; the second drop's re-baseline is kept only once its runs are ``SETTLED`` (a late run
    may still land among them); a checkpoint that cannot be read is never trusted: all anew."""
    from wandb_assets.lib.alerts import _DETECTOR_KEY, SETTLED

    def kept() -> dict:
        return json.loads(
            con.execute("SELECT value FROM warehouse_meta WHERE key = $k", {"k": _DETECTOR_KEY}).fetchone()[0]
        )

    def recorded() -> list[tuple]:
        return con.execute(
            "SELECT first_slow_commit, recovered, round(before, 9) FROM sps_change_points ORDER BY ordinal"
        ).fetchall()

    values = flat(100.0, 30) + flat(85.0, 22) + flat(100.0, 25)
    load(con, fresh_ci() + main_runs("ppo", values, last_ended_hours_ago=3))
    assert record_change_points(con, T, "overview/sps") == 1
    ((series, checkpoint),) = kept().items()
    assert series == json.dumps(["test-team", "test-project", "ppo", UNKNOWN_TESTBED])
    assert (checkpoint["regime_start"], checkpoint["prefix_length"], len(checkpoint["found"])) == (52, 55, 1)
    checkpoint["found"][0]["before"] = 99.0
    con.execute(
        "UPDATE warehouse_meta SET value = $v WHERE key = $k",
        {"k": _DETECTOR_KEY, "v": json.dumps(kept() | {series: checkpoint})},
    )
    load(con, fresh_ci() + main_runs("ppo", values + flat(80.0, 10)))
    assert record_change_points(con, T, "overview/sps") == 2
    assert recorded() == [("ppo0030", True, 99.0), ("ppo0077", False, 100.0)]  # resumed at 52: 0030 as kept
    assert kept()[series]["regime_start"] == 52  # 77 was decided on runs committed within SETTLED of T: not yet
    con.execute("DELETE FROM warehouse_meta WHERE key = 'sps_change_points'")  # (the series' mark: judge again)
    assert record_change_points(con, T + SETTLED + timedelta(hours=1), "overview/sps") == 2
    assert kept()[series]["regime_start"] == 77  # settled by then: kept
    con.execute("UPDATE warehouse_meta SET value = '{\"x\": 1}' WHERE key = $k", {"k": _DETECTOR_KEY})
    con.execute("DELETE FROM warehouse_meta WHERE key = 'sps_change_points'")  # (the series' mark: judge again)
    assert record_change_points(con, T, "overview/sps") == 2
    assert recorded() == [("ppo0030", True, 100.0), ("ppo0077", False, 100.0)]
    assert [(r["first_slow_commit"], round(r["before"], 9)) for r in find_change_points(con, T, "overview/sps")] == [
        ("ppo0030", 100.0),
        ("ppo0077", 100.0),
    ]


def test_a_summary_value_that_is_not_a_number_is_no_sps_whichever_key_is_judged(con):
    """A run's SPS is a number or none, as the load keeps the five SPS keys (text and booleans are none): a key of
    those is read from its column, any other (``charts/SPS``) from the summary by the same rule (it once cast the
    text "85" to 85.0)."""
    from wandb_assets.lib.alerts import sps_regression_summary

    rows = main_runs("ppo", [100.0, 85.0, 90.0, 70.0, 60.0, 50.0], metric="charts/SPS")
    for row, odd in zip(rows[1:5], ['"85"', "true", "null", '{"v": 70}'], strict=True):
        row["summary"] = '{"charts/SPS": ' + odd + "}"
    load(con, fresh_ci() + rows)
    assert "(2 runs with a value," in sps_regression_summary(con, T, replace(TH, sps_metric="charts/SPS"))
