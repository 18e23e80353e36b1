"""The idle ladder through real Dagster ticks (issue 44): the local W&B server serves running runs and their sampled
GPU streams, a loopback Slack Web API records every call (slack_sdk's base_url), the capture server stands for the
alert webhook and Datadog; stops go through the official client (wandb-core's StopRun mutation)."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta

import pytest

from tests.conftest import cli
from wandb_assets.localwandb import make_run_node
from wandb_assets.localwandb.slack import LocalSlack
from wandb_assets.ticks import execute_feed, run_tick
from wandb_assets.warehouse import query_read_only

TODAY = date(2026, 6, 2)
T = datetime(2026, 6, 2, 12, 0)
CREATED = datetime(2026, 6, 2, 8, 0)
EPOCH = datetime(1970, 1, 1)
TEAMS = """
research:
  channel: C0RESEARCH
  users:
    - {user: ana, slack: U0ANA}
    - bo
"""
POLICY = """
ladder:
  - {after_minutes: 60, tell: [owner]}
  - {after_minutes: 105, tell: [owner, team]}
  - {after_minutes: 120, stop: true}
stop_runs: %s
grace_minutes: 15
exempt: {tags: [interactive]}
"""
#: The W&B operations a tick reads with; anything else (StopRun) acts.
READS = {"Viewer", "GetDefaultEntity", "ServerFeaturesQuery", "Runs", "RunCurves", "RunFiles", "ProjectsActivity"}


def idle_run(
    run_id: str, user: str, idle_from: datetime, *, busy_gpus: int = 0, tags=None, email=None, metadata=None
) -> dict:
    """8 H100s sampled every 5 minutes from 08:00 to 12:00: 90 % before ``idle_from``, then 0 % (``busy_gpus`` of
    them stay at 90 %). ``metadata``: its wandb-metadata.json, and no GPU count in its config."""
    events = []
    moment = CREATED
    while moment <= T:
        idle = moment >= idle_from
        sample = {f"system.gpu.{g}.gpu": 0.0 if idle and g >= busy_gpus else 90.0 for g in range(8)}
        events.append({"_timestamp": (moment - EPOCH).total_seconds(), **sample})
        moment += timedelta(minutes=5)
    return make_run_node(
        run_id,
        display_name=f"train-{run_id}",
        state="running",
        created_at=CREATED,
        heartbeat_at=T,
        username=user,
        email=email,
        tags=tags,
        config={"compute": {"gpu_type": "NVIDIA H100 80GB HBM3"} | ({} if metadata else {"gpu_count": 8})},
        system_metrics={k: v for k, v in events[-1].items() if k != "_timestamp"},
        events=events,
        metadata=metadata,
    )


@pytest.fixture
def slack(monkeypatch):
    server = LocalSlack(users={"bo@example.com": "U0BO"})
    monkeypatch.setenv("WANDB_ASSETS_SLACK_BOT_TOKEN", server.token)
    monkeypatch.setenv("WANDB_ASSETS_SLACK_API_URL", server.url)
    yield server
    server.stop()


@pytest.fixture
def ladder(tmp_path, monkeypatch):
    def configure(stop_runs: bool) -> None:
        (tmp_path / "teams.yaml").write_text(TEAMS)
        (tmp_path / "policy.yaml").write_text(POLICY % ("true" if stop_runs else "false"))
        monkeypatch.setenv("WANDB_ASSETS_TEAMS", str(tmp_path / "teams.yaml"))
        monkeypatch.setenv("WANDB_ASSETS_IDLE_POLICY", str(tmp_path / "policy.yaml"))

    return configure


def ledger(path) -> list[tuple]:
    return query_read_only(
        str(path),
        "SELECT run_id, step, audience, outcome, channel, recipient, reason FROM idle_actions "
        "WHERE audience <> 'digest' ORDER BY run_id, step, audience",
    )


def hourglass(capture) -> list[str]:
    return [b["text"] for b in capture.bodies("/hook/") if ":hourglass:" in b["text"]]


def ladder_gauges(capture) -> dict[str, float]:
    """The ladder's gauges as Datadog last received them."""
    latest: dict[str, float] = {}
    for body in capture.bodies("/api/v2/series"):
        for series in body["series"]:
            if series["metric"].startswith("wandb.idle_ladder."):
                latest[series["metric"].removeprefix("wandb.idle_ladder.")] = series["points"][0]["value"]
    return latest


def ladder_events(capture) -> list[dict]:
    return [e for e in capture.bodies("/api/v1/events") if "source:idle_ladder" in e.get("tags", [])]


def test_owners_are_told_once_and_with_stopping_off_nothing_reaches_w_and_b(
    wandb_server, capture, slack, ladder, warehouse_path, instance, capsys
):
    """At 12:00: run a (ana, idle since 09:50: 130 min) is due steps 1 and 2 together: step 2 tells ana (U0ANA, from
    the teams file) and research's channel, step 1 is skipped; b (bo, idle 60 min) tells bo, found by e-mail; c is
    tagged interactive (exempt); d (carol: no team, no e-mail) goes to the alert webhook with the reason; e is busy;
    f has 4 of 8 GPUs idle (fraction 1.0: not idle). At 12:16 a's stop is due (told 12:00:30 + 15 min): stopping is
    off, so it is recorded as would_stop and no mutation reaches W&B. A second feed at the same time adds nothing."""
    ladder(stop_runs=False)
    server = wandb_server(
        [
            idle_run("a", "ana", datetime(2026, 6, 2, 9, 50)),
            idle_run("b", "bo", datetime(2026, 6, 2, 11, 0), email="bo@example.com"),
            idle_run("c", "ana", CREATED, tags=["interactive"]),
            idle_run("d", "carol", datetime(2026, 6, 2, 10, 55)),
            idle_run("e", "ana", T + timedelta(hours=1)),
            idle_run("f", "ana", CREATED, busy_gpus=4),
        ]
    )
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    messages = slack.messages()
    link = f"{server.url}/test-team/test-project/runs/"
    assert [(m["channel"], m["text"].split(" has had")[0]) for m in messages] == [
        (
            "U0ANA",
            f":hourglass: Your run <{link}a|train-a> (test-team/test-project, id a)",
        ),
        (
            "C0RESEARCH",
            f":hourglass: Run of ana: <{link}a|train-a> (test-team/test-project, id a)",
        ),
        (
            "U0BO",
            f":hourglass: Your run <{link}b|train-b> (test-team/test-project, id b)",
        ),
    ]
    assert messages[0]["text"].split(" has had ")[1] == (
        "8 of 8 H100-80GB GPUs idle for 130 minutes (since 2026-06-02 09:50 UTC): $51.83 idle so far, $23.92 an hour "
        "for its 8 GPUs. Next, if it stays idle: stop the run (stopping is off: it would only be recorded) at "
        "12:15 UTC. To exempt such a run, tag it `interactive`."
    )
    assert [c["method"] for c in slack.calls].count("users.lookupByEmail") == 1
    (to_carol,) = hourglass(capture)
    assert to_carol.startswith(
        "(for the owner; no Slack user for carol: not in the teams file, and W&amp;B gave no e-mail) "
        ":hourglass: Your run"
    )
    assert ledger(warehouse_path) == [
        ("a", 1, "owner", "skipped", None, None, "due together with a later step"),
        ("a", 2, "datadog", "sent", "datadog_event", None, None),
        ("a", 2, "owner", "sent", "slack", "U0ANA", None),
        ("a", 2, "team", "sent", "slack", "C0RESEARCH", None),
        ("b", 1, "datadog", "sent", "datadog_event", None, None),
        ("b", 1, "owner", "sent", "slack", "U0BO", None),
        ("d", 1, "datadog", "sent", "datadog_event", None, None),
        (
            "d",
            1,
            "owner",
            "sent",
            "webhook",
            "alert webhook",
            "no Slack user for carol: not in the teams file, and W&B gave no e-mail",
        ),
    ]
    assert len(ladder_events(capture)) == 3

    for _ in range(2):  # the stop falls due; the same feed again adds nothing
        feed = execute_feed(instance, now="2026-06-02T12:16:00")
        assert feed.success
    shown = feed.asset_materializations_for_node("fleet_alerts")[0].metadata["idle_ladder_open_episodes"]
    assert [r.data["idle episode"] for r in shown.value.records][0] == (  # the UI's fleet_alerts page
        "test-team/test-project/a, idle since 2026-06-02 09:50 UTC: 1 owner: skipped, 2 owner: sent, 2 team: sent, "
        "3 stop: would_stop"
    )
    assert ledger(warehouse_path)[1:3] == [
        ("a", 2, "datadog", "sent", "datadog_event", None, None),
        ("a", 2, "owner", "sent", "slack", "U0ANA", None),
    ]
    stop_rows = [row for row in ledger(warehouse_path) if row[2] == "stop"]
    assert stop_rows == [
        (
            "a",
            3,
            "stop",
            "would_stop",
            "none",
            "test-team/test-project/a",
            "stop_runs is off in the policy: the run would have been stopped now",
        )
    ]
    assert len(slack.messages()) == 3 and len(hourglass(capture)) == 1 and len(ladder_events(capture)) == 4
    assert ladder_gauges(capture) == {
        "owners_told_24h": 3.0,  # a, b and d (through the webhook)
        "runs_stopped_24h": 0.0,
        "runs_would_stop_24h": 1.0,
        "idle_usd_avoided_24h": 0.0,
    }
    assert {operation for operation, _ in server.requests} <= READS  # no StopRun, not even a Run lookup
    assert server.stops == []

    code, out, _ = cli(capsys, "idle", "--now", "2026-06-02T12:16:00")
    assert code == 0
    assert out.splitlines()[0] == (
        "Idle policy: GPUs below 5%, 1 of a run's GPUs; 60 min: tell the owner; 105 min: tell the owner and the team; "
        "120 min: stop the run. Stopping is off (the stop step is only recorded)."
    )
    assert out.splitlines()[1:] == [
        "Open idle episodes: 3",
        "  test-team/test-project/a of ana: idle since 2026-06-02 09:50 UTC (8 of 8 GPUs, 17.33 idle GPU-hours, "
        "$51.83); done: 1 owner: skipped, 2 owner: sent, 2 team: sent, 3 stop: would_stop; no step left",
        "  test-team/test-project/d of carol: idle since 2026-06-02 10:55 UTC (8 of 8 GPUs, 8.67 idle GPU-hours, "
        "$25.91); done: 1 owner: sent; next: tell the owner and the team at 2026-06-02 12:40 UTC (if still idle)",
        "  test-team/test-project/b of bo: idle since 2026-06-02 11:00 UTC (8 of 8 GPUs, 8.00 idle GPU-hours, "
        "$23.92); done: 1 owner: sent; next: tell the owner and the team at 2026-06-02 12:45 UTC (if still idle)",
        "Idle at their latest sample, not on the ladder: 1",
        "  test-team/test-project/c of ana: tagged interactive",
    ]
    code, out, _ = cli(capsys, "idle", "--now", "2026-06-02T13:00:00")  # no sample since 12:00: nothing can climb
    assert out.splitlines()[3].split("done: ")[1] == (
        "1 owner: sent; next: tell the owner and the team, due since 2026-06-02 12:40 UTC: waiting for a newer GPU "
        "sample (latest 12:00 UTC)"
    )


def test_a_policy_mistake_exits_2_with_one_sentence_before_any_run(
    wandb_server, tmp_path, monkeypatch, capsys, instance
):
    (tmp_path / "policy.yaml").write_text("ladder:\n  - {after_minutes: 60, tell: [boss]}\n")
    monkeypatch.setenv("WANDB_ASSETS_IDLE_POLICY", str(tmp_path / "policy.yaml"))
    wandb_server([])
    code, _, err = cli(capsys, "refresh")
    assert code == 2
    assert err == (
        f"error: WANDB_ASSETS_IDLE_POLICY ({tmp_path / 'policy.yaml'}): ladder step 1 may tell [owner], [team] or "
        "[owner, team] (got ['boss']).\n"
    )


@pytest.mark.slow  # the ledger's outage and refusal paths are in tests/test_idle_policy.py's everyday tier too
def test_slack_down_delays_once_then_the_stop_after_the_grace_a_refusal_told_once_and_an_ended_run_left(
    wandb_server, capture, slack, ladder, warehouse_path, instance
):
    """stop_runs on. 12:00:30, Slack down: a, r and g are due step 2; nothing is sent (one call tried). 12:05 Slack is
    back: six messages go, once. g ends. 12:21 (told 12:05 + 15 min): a is stopped through W&B; r's stop is refused
    and told once to bo and the team; g, ended, is never stopped. 12:36: nothing more, no second StopRun."""
    ladder(stop_runs=True)
    nine_fifty = datetime(2026, 6, 2, 9, 50)
    server = wandb_server(
        [
            idle_run("a", "ana", nine_fifty),
            idle_run("g", "ana", nine_fifty),
            idle_run("r", "bo", nine_fifty, email="bo@example.com"),
        ]
    )
    server.faults.refuse_stop = frozenset({"r"})
    slack.down = True
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    assert slack.messages() == [] and len(slack.calls) == 1
    assert {row[3] for row in ledger(warehouse_path) if row[2] in ("owner", "team") and row[1] == 2} == {"pending"}

    slack.down = False
    assert execute_feed(instance, now="2026-06-02T12:05:00").success
    assert sorted(m["channel"] for m in slack.messages()) == ["C0RESEARCH"] * 3 + ["U0ANA", "U0ANA", "U0BO"]

    ended = server._records["g"]["node"]
    server.upsert_runs([{**ended, "state": "finished", "heartbeatAt": "2026-06-02T12:10:00Z"}])
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:21:00", now="2026-06-02T12:21:00")
    )
    assert server.stops == ["test-team/test-project/a"]
    after_stop = slack.messages()[6:]
    link = f"{server.url}/test-team/test-project/runs/"
    assert [(m["channel"], m["text"].split(" (test-team")[0]) for m in after_stop] == [
        ("U0ANA", f":octagonal_sign: Your run <{link}a|train-a>"),
        ("C0RESEARCH", f":octagonal_sign: Run of ana: <{link}a|train-a>"),
        ("U0BO", f":warning: Your run <{link}r|train-r>"),
        ("C0RESEARCH", f":warning: Run of bo: <{link}r|train-r>"),
    ]
    assert "W&amp;B refused: input: stopRun permission denied" in after_stop[2]["text"]
    # a's stop avoided as long again as it had idled (130 min on its stream, 8 H100s at $2.99): 8 x 130/60 x 2.99
    assert ladder_gauges(capture) == {
        "owners_told_24h": 3.0,
        "runs_stopped_24h": 1.0,
        "runs_would_stop_24h": 0.0,
        "idle_usd_avoided_24h": pytest.approx(51.826667, abs=1e-5),
    }
    stops = {row[0]: row[3:] for row in ledger(warehouse_path) if row[2] == "stop"}
    assert stops["a"] == ("stopped", "wandb", "test-team/test-project/a", None)
    assert stops["r"][0] == "refused" and "permission denied" in stops["r"][3]
    assert "g" not in stops

    assert execute_feed(instance, now="2026-06-02T12:36:00").success
    assert server.count("StopRun") == 2 and len(slack.messages()) == 10
    details = query_read_only(str(warehouse_path), "SELECT details FROM idle_actions WHERE run_id = 'a' LIMIT 1")
    assert json.loads(details[0][0])["email"] is None
    assert slack.token not in str(query_read_only(str(warehouse_path), "SELECT * FROM idle_actions"))


def test_the_preview_says_who_would_be_told_what_and_which_run_stopped_and_sends_nothing(
    wandb_server, capture, slack, ladder, warehouse_path, instance, capsys, monkeypatch, tmp_path
):
    """Before switching the ladder on: the warehouse holds the 12:00 fleet of the test above, no policy set.
    ``idle --preview --policy`` at 12:00:30 prints each message as it would go out (a: step 2 to ana and research's
    channel, step 1 skipped; b to bo, found by e-mail, a read of Slack; d to the webhook with the reason) and sends
    nothing, records nothing. Then, the ladder on since 12:00:30 with stopping on, the preview at 12:16 says a would
    be stopped now (W&B read as at send time, no StopRun) and what its owner would hear."""
    ladder(stop_runs=True)
    policy_file = str(tmp_path / "policy.yaml")
    monkeypatch.delenv("WANDB_ASSETS_IDLE_POLICY")
    server = wandb_server(
        [
            idle_run("a", "ana", datetime(2026, 6, 2, 9, 50)),
            idle_run("b", "bo", datetime(2026, 6, 2, 11, 0), email="bo@example.com"),
            idle_run("c", "ana", CREATED, tags=["interactive"]),
            idle_run("d", "carol", datetime(2026, 6, 2, 10, 55)),
        ]
    )
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    code, out, err = cli(capsys, "idle", "--preview", "--policy", policy_file, "--now", "2026-06-02T12:00:30")
    assert (code, err) == (0, "")
    link = f"{server.url}/test-team/test-project/runs/"
    lines = out.splitlines()
    assert lines[:2] == [
        f"Preview of the idle ladder (policy {policy_file}) at 2026-06-02 12:00 UTC: nothing is sent, stopped or "
        "recorded.",
        "Runs idle at their latest sample: 4; actions due now: 8",
    ]
    assert [line.split(" has had ")[0] for line in lines[2:]] == [
        "  test-team/test-project/a step 1 (owner): skipped: due together with a later step",
        f"  test-team/test-project/a step 2 (owner): to Slack U0ANA: :hourglass: Your run <{link}a|train-a> "
        "(test-team/test-project, id a)",
        f"  test-team/test-project/a step 2 (team): to Slack C0RESEARCH: :hourglass: Run of ana: <{link}a|train-a> "
        "(test-team/test-project, id a)",
        f"  test-team/test-project/b step 1 (owner): to Slack U0BO: :hourglass: Your run <{link}b|train-b> "
        "(test-team/test-project, id b)",
        f"  test-team/test-project/d step 1 (owner): to the alert webhook: (for the owner; no Slack user for carol: "
        f"not in the teams file, and W&amp;B gave no e-mail) :hourglass: Your run <{link}d|train-d> "
        "(test-team/test-project, id d)",
        "  test-team/test-project/a step 2 (datadog): as a Datadog event: Idle GPUs, step 2: "
        "test-team/test-project/a: Step 2 (tell the owner and the team) for run train-a of ana: 8 of 8 GPUs idle for "
        f"130 minutes; 17.33 idle GPU-hours, $51.83. {link}a",
        "  test-team/test-project/b step 1 (datadog): as a Datadog event: Idle GPUs, step 1: "
        "test-team/test-project/b: Step 1 (tell the owner) for run train-b of bo: 8 of 8 GPUs idle for 60 minutes; "
        f"8.00 idle GPU-hours, $23.92. {link}b",
        "  test-team/test-project/d step 1 (datadog): as a Datadog event: Idle GPUs, step 1: "
        "test-team/test-project/d: Step 1 (tell the owner) for run train-d of carol: 8 of 8 GPUs idle for 65 "
        f"minutes; 8.67 idle GPU-hours, $25.91. {link}d",
    ]
    assert slack.messages() == [] and hourglass(capture) == [] and ladder_events(capture) == []
    assert [c["method"] for c in slack.calls] == ["users.lookupByEmail"]
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM idle_actions") == [(0,)]

    monkeypatch.setenv("WANDB_ASSETS_IDLE_POLICY", policy_file)
    assert execute_feed(instance, now="2026-06-02T12:00:30").success
    told = len(slack.messages())
    code, out, _ = cli(capsys, "idle", "--preview", "--now", "2026-06-02T12:16:00")
    assert code == 0
    assert [line for line in out.splitlines() if "test-team/test-project/a step 3 (" in line][:3] == [
        "  test-team/test-project/a step 3 (stop): would be stopped now (W&B read now: running, the same run, not "
        "exempt)",
        f"  test-team/test-project/a step 3 (owner): to Slack U0ANA: :octagonal_sign: Your run <{link}a|train-a> "
        "(test-team/test-project, id a) was stopped after 130 minutes idle (since 2026-06-02 09:50 UTC). To exempt "
        "such a run, tag it `interactive`.",
        f"  test-team/test-project/a step 3 (team): to Slack C0RESEARCH: :octagonal_sign: Run of ana: "
        f"<{link}a|train-a> (test-team/test-project, id a) was stopped after 130 minutes idle (since 2026-06-02 09:50 "
        "UTC). To exempt such a run, tag it `interactive`.",
    ]
    assert server.stops == [] and len(slack.messages()) == told
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM idle_actions WHERE step = 3") == [(0,)]


def test_a_policy_that_tells_without_a_slack_token_slack_takes_exits_2_before_any_run(
    wandb_server, ladder, monkeypatch, capsys, instance, warehouse_path
):
    """Telling steps need Slack: with no bot token, or one Slack refuses (``auth.test`` answers invalid_auth), refresh
    exits 2 with one sentence before any run (nothing recorded undeliverable); the loopback Slack's own token passes."""
    ladder(stop_runs=False)
    wandb_server([idle_run("a", "ana", datetime(2026, 6, 2, 9, 50))])
    monkeypatch.delenv("WANDB_ASSETS_SLACK_BOT_TOKEN", raising=False)
    code, _, err = cli(capsys, "refresh")
    assert (code, err) == (
        2,
        "error: WANDB_ASSETS_IDLE_POLICY tells owners or teams (step 1), but no Slack bot token is configured: set "
        "WANDB_ASSETS_SLACK_BOT_TOKEN (a bot token with chat:write and users:read.email), or take the telling steps "
        "out of the policy.\n",
    )
    slack = LocalSlack()
    try:
        monkeypatch.setenv("WANDB_ASSETS_SLACK_API_URL", slack.url)
        monkeypatch.setenv("WANDB_ASSETS_SLACK_BOT_TOKEN", "xoxb-revoked")
        code, _, err = cli(capsys, "refresh")
        assert (code, err) == (
            2,
            "error: WANDB_ASSETS_IDLE_POLICY tells owners or teams (step 1), but Slack refused the bot token "
            "(invalid_auth): check WANDB_ASSETS_SLACK_BOT_TOKEN\n",
        )
        assert [c["method"] for c in slack.calls] == ["auth.test"]
        assert not warehouse_path.exists() and instance.get_runs() == []
    finally:
        slack.stop()


def test_without_a_slack_token_the_ladder_messages_wait_and_go_out_once_it_is_set(
    wandb_server, capture, slack, ladder, warehouse_path, instance, monkeypatch
):
    """A run started by the UI's daemon has no preflight: with the token unset, b's message waits in the ledger
    (pending, not undeliverable, nothing to the webhook); the token set, the next tick sends it to bo, once."""
    ladder(stop_runs=False)
    wandb_server([idle_run("b", "bo", datetime(2026, 6, 2, 11, 0), email="bo@example.com")])
    monkeypatch.delenv("WANDB_ASSETS_SLACK_BOT_TOKEN")
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    assert ledger(warehouse_path)[1:] == [("b", 1, "owner", "pending", None, None, None)]
    assert hourglass(capture) == [] and slack.messages() == []
    monkeypatch.setenv("WANDB_ASSETS_SLACK_BOT_TOKEN", slack.token)
    for _ in range(2):
        assert execute_feed(instance, now="2026-06-02T12:05:00").success
    assert ledger(warehouse_path)[1:] == [("b", 1, "owner", "sent", "slack", "U0BO", None)]
    assert [m["channel"] for m in slack.messages()] == ["U0BO"]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [(400, ("undeliverable", "none")), (403, ("pending", "datadog_event")), (503, ("pending", "datadog_event"))],
)
def test_a_datadog_event_follows_the_notifier_s_classes(
    wandb_server, capture, slack, ladder, warehouse_path, instance, answer, outcome
):
    """Datadog answering the ladder's event 400 (it will never take it as it is): undeliverable with the reason, said
    once, nothing paused (bo is told in Slack all the same); 403 (the key) or 503: the event waits for the next tick."""
    ladder(stop_runs=False)
    wandb_server([idle_run("b", "bo", datetime(2026, 6, 2, 11, 0), email="bo@example.com")])
    capture.answer = str(answer)
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    (event, owner) = ledger(warehouse_path)
    assert (event[3], event[4]) == outcome and owner[3:5] == ("sent", "slack")
    if answer == 400:
        assert event[6].startswith("Datadog answered 400") and "(an idle-ladder event)" in event[6]


def test_a_running_run_on_a_shared_node_is_judged_by_its_own_gpu_count_from_its_metadata(
    wandb_server, capture, slack, ladder, warehouse_path, instance
):
    """Run g holds 2 GPUs of an 8-GPU node (its wandb-metadata.json says gpu_count 2; its config none); the node's
    samples list 8 GPUs, all idle from 11:00. Its owner hears of 2 GPUs at $5.98 an hour (2 x $2.99), not 8 at
    $23.92; the file is read once this tick, for g alone (h's count comes from its config)."""
    ladder(stop_runs=False)
    server = wandb_server(
        [
            idle_run(
                "g", "ana", datetime(2026, 6, 2, 11, 0), metadata={"gpu_count": 2, "gpu": "NVIDIA H100 80GB HBM3"}
            ),
            idle_run("h", "ana", datetime(2026, 6, 2, 11, 0)),
        ]
    )
    assert all(
        r.success for r in run_tick(instance, TODAY, snapshot_at="2026-06-02T12:00:00", now="2026-06-02T12:00:30")
    )
    texts = {m["text"].split("|")[1].split(">")[0]: m["text"].split(" has had ")[1] for m in slack.messages()}
    assert texts["train-g"].startswith(
        "2 of 2 H100-80GB GPUs idle for 60 minutes (since 2026-06-02 11:00 UTC): $5.98 idle so far, $5.98 an hour for "
        "its 2 GPUs."
    )
    assert texts["train-h"].startswith("8 of 8 H100-80GB GPUs idle for 60 minutes")
    assert server.file_downloads == ["test-team/test-project/g"]
