"""The idle ladder's rules alone (issue 44): the policy file, its ladder's decisions, the episode a stream shows, the
exemptions and the teams file's Slack form. Every number worked out by hand in the docstrings."""

from datetime import datetime, timedelta

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from wandb_assets.lib.accounting.teams import parse_team_directory
from wandb_assets.lib.acting.idle_episodes import current_episodes
from wandb_assets.lib.acting.idle_policy import (
    DEFAULT_LADDER,
    Done,
    IdlePolicy,
    LadderStep,
    decide,
    exemption,
    parse_idle_policy,
)
from wandb_assets.lib.errors import ConfigError

T = datetime(2026, 11, 27, 12, 0)
POLICY = IdlePolicy(idle_gpu_pct=5.0)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_the_issue_s_policy_file_parses_to_its_defaults():
    document = yaml.safe_load(
        """
idle_gpu_pct: 5
gpu_fraction: 1.0
ladder:
  - {after_minutes: 60, tell: [owner]}
  - {after_minutes: 105, tell: [owner, team]}
  - {after_minutes: 120, stop: true}
stop_runs: false
grace_minutes: 15
exempt: {users: [], teams: [], projects: [], tags: [interactive], config_keys: []}
"""
    )
    assert parse_idle_policy(document, "policy", 7.0) == POLICY
    assert parse_idle_policy(None, "policy", 7.0) == IdlePolicy(idle_gpu_pct=7.0)  # an empty file: every default
    assert POLICY.ladder == DEFAULT_LADDER and not POLICY.stop_runs


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("[1, 2]", "policy must be a mapping"),
        ("stop_run: true", "unknown field 'stop_run'"),
        ("gpu_fraction: 0", "gpu_fraction must be a number above 0 and at most 1 (got 0)"),
        ("gpu_fraction: 1.5", "gpu_fraction must be a number above 0 and at most 1"),
        ("idle_gpu_pct: hot", "idle_gpu_pct must be a number at least 0 and at most 100 (got 'hot')"),
        ("stop_runs: yes please", "stop_runs must be true or false"),
        ("grace_minutes: -1", "grace_minutes must be a number at least 0"),
        ("ladder: []", "ladder must be a list of steps"),
        ("ladder: [{after_minutes: 60, tell: [boss]}]", "ladder step 1 may tell [owner], [team] or [owner, team]"),
        ("ladder: [{after_minutes: 60}]", "ladder step 1 neither tells anyone nor stops the run"),
        ("ladder: [{after: 60, tell: [owner]}]", "ladder step 1 must be such as"),
        ("ladder: [{after_minutes: 60, stop: true}]", "ladder step 1 stops a run nobody was told of"),
        (
            "ladder: [{after_minutes: 60, tell: [owner]}, {after_minutes: 60, stop: true}]",
            "ladder step 2 must come after step 1",
        ),
        ("exempt: {people: [ana]}", "exempt may hold users, teams, projects, tags, config_keys"),
        ("exempt: {tags: interactive}", "exempt.tags must be a list of names"),
    ],
)
def test_a_policy_mistake_is_one_sentence_naming_the_field(text, sentence):
    with pytest.raises(ConfigError) as raised:
        parse_idle_policy(yaml.safe_load(text), "policy", 5.0)
    assert sentence in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_run_idle_130_minutes_first_seen_now_is_told_not_stopped_and_stopped_after_the_grace():
    """Idle since 09:50, seen at 12:00 (130 min): steps 1 (60) and 2 (105) are due together: step 2 tells the owner
    and the team, step 1 is skipped (superseded), step 3 (the stop, due at 11:50) waits for the grace: 15 minutes after
    the owner was told at 12:00, so 12:15."""
    started = T - minutes(130)
    first = decide(POLICY, started, T, T, Done())
    assert (first.act, first.skip, first.next_step, first.next_at) == ((2,), (1,), 3, T + minutes(15))
    told = Done(frozenset({1, 2}), first_told_at=T)
    assert decide(POLICY, started, T + minutes(14), T + minutes(14), told).act == ()
    assert decide(POLICY, started, T + minutes(15), T + minutes(15), told).act == (3,)


def test_the_stop_waits_while_the_first_message_still_waits_in_the_outbox():
    """Slack down: steps 1 and 2 decided, nothing delivered (first_told_at None): the stop never comes."""
    pending = Done(frozenset({1, 2}), first_told_at=None)
    assert decide(POLICY, T - minutes(300), T, T, pending).act == ()


def test_the_ladder_climbs_one_step_per_threshold():
    """Idle from 10:00: at 11:00 step 1; at 11:45 step 2; told at 11:00, the stop at 12:00 (120 min) is past the grace
    (11:15)."""
    started = T - minutes(120)
    assert decide(POLICY, started, started + minutes(59), T, Done()).act == ()
    one = decide(POLICY, started, started + minutes(60), T, Done())
    assert (one.act, one.next_step, one.next_at) == ((1,), 2, started + minutes(105))
    two = decide(POLICY, started, started + minutes(105), T, Done(frozenset({1}), started + minutes(60)))
    assert two.act == (2,)
    three = decide(POLICY, started, T, T, Done(frozenset({1, 2}), started + minutes(60)))
    assert (three.act, three.next_step) == ((3,), None)


def test_idle_minutes_count_to_the_latest_sample_never_to_now():
    """The latest sample is 11:00, idle since 10:30 (30 min): nothing is due at 13:00 though two hours passed."""
    assert decide(POLICY, T - minutes(90), T - minutes(60), T + minutes(60), Done()).act == ()


def stream(run: str, samples: list[list[float]], start: datetime = T, every: int = 10) -> dict:
    """A run's stream as read (``lib.curves.gpu_rows``): ``samples[k][g]`` is GPU g's utilisation at
    ``start + k * every`` minutes."""
    return {
        ("e", "p", run): [
            [(start + minutes(every * k)).isoformat(), g, util, None, None]
            for k, sample in enumerate(samples)
            for g, util in enumerate(sample)
        ]
    }


def test_four_idle_gpus_of_eight_count_at_fraction_half_and_not_at_one():
    """8 GPUs, 4 at 0 % and 4 at 90 % on every sample (00, 10, 20, 30): at fraction 0.5 the run is idle since 12:00, 30
    minutes, 4 idle GPUs, 4 x 0.5 h = 2 idle GPU-hours; at 1.0 it has no episode."""
    rows = stream("r", [[0.0] * 4 + [90.0] * 4] * 4)
    (half,) = current_episodes(rows, {("e", "p", "r"): 8}, 5.0, 0.5)
    assert (half.started_at, half.latest_at, half.idle_gpus, half.idle_gpu_hours) == (T, T + minutes(30), 4.0, 2.0)
    assert half.idle_minutes == 30 and half.last_busy_at is None
    assert current_episodes(rows, {("e", "p", "r"): 8}, 5.0, 1.0) == []


def test_a_run_that_turns_busy_starts_its_next_episode_from_zero():
    """Idle at 00, 10; busy at 20; idle at 30, 40: the episode starts at 12:30 (10 minutes), the busy sample is its
    last_busy_at; a run busy at its latest sample has none."""
    (episode,) = current_episodes(stream("r", [[0.0], [1.0], [50.0], [0.0], [2.0]]), {("e", "p", "r"): 1}, 5.0, 1.0)
    assert (episode.started_at, episode.idle_minutes, episode.last_busy_at) == (T + minutes(30), 10, T + minutes(20))
    assert current_episodes(stream("r", [[0.0], [0.0], [50.0]]), {("e", "p", "r"): 1}, 5.0, 1.0) == []


def test_a_node_wide_sample_cannot_make_a_busy_run_idle_for_the_ladder():
    """Review E9: a 2-GPU run whose samples see the node's 8 GPUs, its own 2 at 95 % and the other 6 idle. The scaled
    estimate (lib/idle.idle_of_run) calls it 6 x 2/8 = 1.5 idle GPUs of 2, which at gpu_fraction 0.5 (1.5 >= 1) made
    an episode and a stop. The sample cannot say which GPUs are the run's, so for the ladder it is idle only when all
    8 are: no episode at any fraction. All 8 idle: an episode of 2 idle GPUs (8 x 2/8), 10 minutes, 2 x 1/6 h."""
    busy = stream("r", [[0.0] * 6 + [95.0] * 2] * 2)
    for fraction in (0.5, 0.75, 1.0):
        assert current_episodes(busy, {("e", "p", "r"): 2}, 5.0, fraction) == []
    (episode,) = current_episodes(stream("r", [[0.0] * 8] * 2), {("e", "p", "r"): 2}, 5.0, 1.0)
    assert (episode.idle_gpus, episode.idle_minutes) == (2.0, 10)
    assert episode.idle_gpu_hours == pytest.approx(2 / 6)


def test_the_ladder_s_candidates_judge_a_node_wide_sample_as_the_episodes_do(memory_con):
    """The warehouse's candidates (the runs whose latest sample is idle, read each tick) follow the same rule: the
    2-GPU run beside 6 idle GPUs is not one at fraction 0.5; the same run with all 8 idle is."""
    from wandb_assets.lib.acting.idle_actions import candidates
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(memory_con)
    for run_id, utils in (("busy", [0.0] * 6 + [95.0] * 2), ("idle", [0.0] * 8)):
        memory_con.execute(
            "INSERT INTO runs (entity, project, run_id, state, created_at, gpu_count, gpu_model, latest_gpu_sample, "
            "source) VALUES ('e', 'p', $r, 'running', TIMESTAMP '2026-11-27 06:00', 2, 'H100-80GB', "
            "list_transform($u, (u, i) -> {'gpu_index': i, 'utilisation': u, 'memory': NULL::DOUBLE}), 'wandb')",
            {"r": run_id, "u": utils},
        )
    policy = IdlePolicy(5.0, gpu_fraction=0.5)
    assert [c.run_id for c in candidates(memory_con, policy, datetime(2026, 11, 27))] == ["idle"]


@given(st.lists(st.lists(st.sampled_from([0.0, 3.0, 50.0, 99.0]), min_size=1, max_size=4), min_size=1, max_size=12))
def test_the_episode_is_the_idle_run_of_samples_that_ends_at_the_latest(samples):
    """Against a plain loop: walk back from the latest sample while every GPU is below 5 %."""
    width = len(samples[0])
    samples = [(s * width)[:width] for s in samples]
    episodes = current_episodes(stream("r", samples), {("e", "p", "r"): width}, 5.0, 1.0)
    k = len(samples)
    while k > 0 and all(u < 5.0 for u in samples[k - 1]):
        k -= 1
    if k == len(samples):
        assert episodes == []
    else:
        (episode,) = episodes
        assert episode.started_at == T + minutes(10 * k)
        assert episode.idle_gpu_hours == pytest.approx(width * (len(samples) - 1 - k) / 6)


def test_exempt_users_teams_projects_tags_and_config_keys():
    policy = parse_idle_policy(
        yaml.safe_load(
            "exempt: {users: [ana], teams: [infra], projects: [e/notebooks, scratch], tags: [interactive, debug], "
            "config_keys: [idle.exempt]}"
        ),
        "policy",
        5.0,
    )

    def why(**run) -> str | None:
        args = {"entity": "e", "project": "p", "user": "bo", "team": "research", "tags": [], "config": {}} | run
        return exemption(policy, **args)

    assert why() is None
    assert why(user="ana") == "user ana is exempt"
    assert why(team="infra") == "team infra is exempt"
    assert why(project="notebooks") == "project e/notebooks is exempt"
    assert why(project="scratch", entity="other") == "project other/scratch is exempt"
    assert why(tags=["debug", "x"]) == "tagged debug"
    assert why(config='{"idle": {"exempt": true}}') == "config idle.exempt is set"
    assert why(config={"idle.exempt": 1}) == "config idle.exempt is set"
    assert why(config={"idle": {"exempt": False}}) is None


def test_the_teams_file_takes_both_forms_with_slack_ids_and_channels():
    directory = parse_team_directory(
        yaml.safe_load(
            """
vision: [alice, bob]
research:
  channel: C0RESEARCH
  users:
    - {user: ana, slack: U0ANA}
    - bo
"""
        ),
        "WANDB_ASSETS_TEAMS",
    )
    assert directory.teams == {"alice": "vision", "bob": "vision", "ana": "research", "bo": "research"}
    assert directory.slack_users == {"ana": "U0ANA"}
    assert directory.channels == {"research": "C0RESEARCH"}
    for text, sentence in [
        ("research: {channel: C0, people: [ana]}", "unknown key 'people'"),
        ("research: {users: [{user: ana, email: a@b}]}", "gives team 'research' the member"),
        ("research: {channel: 5, users: [ana]}", "the channel 5: write a Slack channel id"),
        ("a: [ana]\nb: {users: [ana]}", "puts 'ana' in two teams (a, b)"),
    ]:
        with pytest.raises(ConfigError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
            parse_team_directory(yaml.safe_load(text), "WANDB_ASSETS_TEAMS")


def test_a_stop_step_that_also_tells_still_waits_for_an_earlier_message():
    """Ladder 30 tell owner, 40 stop: at 45 minutes first seen, step 1 tells and step 2 waits the grace (0 here: the
    next tick)."""
    policy = IdlePolicy(5.0, ladder=(LadderStep(30, ("owner",)), LadderStep(40, (), True)), grace_minutes=0)
    first = decide(policy, T - minutes(45), T, T, Done())
    assert (first.act, first.next_step, first.next_at) == ((1,), 2, T)
    assert decide(policy, T - minutes(45), T, T, Done(frozenset({1}), T)).act == (2,)


# --- the ledger: each step once per episode, the outbox, the claims (acting/idle_actions, acting/idle_delivery) ---


class Recorder:
    """``IdleChannels`` that records what went out; ``slack_down``: every Slack call is an outage."""

    def __init__(self) -> None:
        self.slack: list[tuple[str, str]] = []
        self.stops: list[str] = []
        self.slack_down = False

    def slack_missing(self):
        return None

    def post_slack(self, channel, text):
        from wandb_assets.lib.acting.idle_delivery import Outage

        if self.slack_down:
            raise Outage("Slack answered service_unavailable")
        self.slack.append((channel, text))

    def slack_user_by_email(self, email):
        return None

    def webhook_missing(self):
        return "no alert webhook"

    def post_webhook(self, text):
        raise AssertionError("not configured")

    def datadog_missing(self):
        return "DD_API_KEY not configured"

    def send_event(self, title, text):
        raise AssertionError("not configured")

    def stop_run(self, path, check):
        from wandb_assets.lib.acting.idle_delivery import StopAnswer

        self.stops.append(path)
        return StopAnswer("stopped")


def seen_run(started: datetime, latest: datetime, last_busy: datetime | None = None, project: str = "p"):
    from wandb_assets.lib.acting.idle_actions import Candidate, Seen
    from wandb_assets.lib.acting.idle_episodes import Episode

    run = Candidate("e", project, "r", "train", None, "ana", [], "{}", 8, "H100-80GB", 23.92)
    hours = 8 * (latest - started).total_seconds() / 3600
    episode = Episode("e", project, "r", started, latest, 8.0, 8, hours, last_busy)
    return Seen(run, episode, None, "research", "U0ANA", "C0RESEARCH")


def tick(con, seen, policy, now, channels, token="t"):
    from wandb_assets.lib.acting.idle_actions import claim_pending, record_decisions, record_outcomes, stop_outcomes
    from wandb_assets.lib.acting.idle_delivery import deliver
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(con)  # the ledger is read beside runs (a moved run's copies)
    written = record_decisions(con, [seen], policy, now, datadog=False)
    claimed = claim_pending(con, token, now)
    record_outcomes(con, token, deliver(claimed, channels, now, stop_outcomes(con, claimed)))
    return written


def outcomes(con) -> list[tuple]:
    return con.execute(
        "SELECT strftime(episode_started_at, '%H:%M'), step, audience, outcome FROM idle_actions ORDER BY ALL"
    ).fetchall()


def test_the_same_tick_twice_decides_and_sends_each_step_once(memory_con):
    """Idle 10:00-11:00: step 1 tells ana once, however often the tick runs (a retry, a restart, a second tick)."""
    channels = Recorder()
    seen = seen_run(T - minutes(120), T - minutes(60))
    assert len(tick(memory_con, seen, POLICY, T, channels)) == 1
    assert tick(memory_con, seen, POLICY, T, channels, token="second") == []
    assert len(channels.slack) == 1 and outcomes(memory_con) == [("10:00", 1, "owner", "sent")]


def test_a_run_that_turns_busy_between_steps_restarts_its_ladder(memory_con):
    """Told at step 1 (idle 10:00-11:00); busy at 11:10; idle again from 11:20: at 12:20 the new episode is told step 1
    again (the old episode's step 2 never comes); a stream re-sampled so that its start moves while it never turned
    busy is still the first episode (nothing new)."""
    channels = Recorder()
    tick(memory_con, seen_run(T - minutes(120), T - minutes(60)), POLICY, T - minutes(60), channels)
    tick(memory_con, seen_run(T - minutes(100), T - minutes(50)), POLICY, T - minutes(50), channels)
    assert len(channels.slack) == 1
    tick(
        memory_con,
        seen_run(T - minutes(40), T + minutes(20), last_busy=T - minutes(50)),
        POLICY,
        T + minutes(20),
        channels,
    )
    assert outcomes(memory_con) == [("10:00", 1, "owner", "sent"), ("11:20", 1, "owner", "sent")]
    assert len(channels.slack) == 2


def test_a_run_moved_mid_episode_goes_on_with_its_ladder_and_nobody_is_told_twice(memory_con):
    """Idle since 10:00, ana is told at 11:00 (step 1) while r is in e/p; W&B moves r to e/q (the e/p copy marked
    moved). At 11:00 in e/q nothing new (step 1 was done); at 11:45 (105 minutes idle) step 2 tells ana and the team
    once, in e/q; its episode is the one that began at 10:00."""
    channels = Recorder()
    tick(memory_con, seen_run(T - minutes(120), T - minutes(60)), POLICY, T - minutes(60), channels)
    created = T - timedelta(days=1)
    for project, state in (("p", "moved"), ("q", "running")):
        memory_con.execute(
            "INSERT INTO runs (entity, project, run_id, state, created_at, heartbeat_at, gpu_count, anomalies, "
            "ingested_at, source) VALUES ('e', $p, 'r', $s, $c, $h, 8, [], $h, 'wandb')",
            {"p": project, "s": state, "c": created, "h": T - minutes(60)},
        )
    assert (
        tick(memory_con, seen_run(T - minutes(120), T - minutes(60), project="q"), POLICY, T - minutes(60), channels)
        == []
    )
    later = seen_run(T - minutes(120), T - minutes(15), project="q")
    written = tick(memory_con, later, POLICY, T - minutes(15), channels)
    assert sorted((row["project"], row["step"], row["audience"]) for row in written) == [
        ("q", 2, "owner"),
        ("q", 2, "team"),
    ]
    assert outcomes(memory_con) == [
        ("10:00", 1, "owner", "sent"),
        ("10:00", 2, "owner", "sent"),
        ("10:00", 2, "team", "sent"),
    ]
    assert len(channels.slack) == 3


def test_a_slack_outage_delays_a_message_and_doubles_none_and_a_lost_claim_is_never_resent(memory_con):
    """Slack down: the message waits (pending, its error kept); back up: it goes once. A claim whose sender died (no
    outcome recorded 10 minutes later) is marked unknown and never sent again."""
    from wandb_assets.lib.acting.idle_actions import claim_pending

    channels = Recorder()
    channels.slack_down = True
    seen = seen_run(T - minutes(120), T - minutes(60))
    tick(memory_con, seen, POLICY, T, channels)
    assert channels.slack == [] and outcomes(memory_con) == [("10:00", 1, "owner", "pending")]
    assert memory_con.execute("SELECT last_error, attempts FROM idle_actions").fetchall() == [
        ("Slack answered service_unavailable", 1)
    ]
    channels.slack_down = False
    tick(memory_con, seen, POLICY, T + minutes(15), channels)
    tick(memory_con, seen, POLICY, T + minutes(30), channels)
    assert len(channels.slack) == 1 and outcomes(memory_con) == [("10:00", 1, "owner", "sent")]

    later = seen_run(T - minutes(120), T - minutes(15))  # step 2 falls due; its sender dies after claiming it
    from wandb_assets.lib.acting.idle_actions import record_decisions

    record_decisions(memory_con, [later], POLICY, T + minutes(31), datadog=False)
    assert len(claim_pending(memory_con, "died", T + minutes(31))) == 2
    assert claim_pending(memory_con, "other", T + minutes(35)) == []  # claimed: nobody else sends it
    assert claim_pending(memory_con, "after", T + minutes(42)) == []
    assert {row[3] for row in outcomes(memory_con) if row[1] == 2} == {"unknown"}
    assert len(channels.slack) == 1


def test_two_ticks_deciding_at_once_send_each_message_once(tmp_path, monkeypatch):
    """Two connections decide the same episode at the same moment (both have read the ledger before either writes:
    a barrier inside the decision holds them there): the second waits its turn and decides again from what the first
    wrote. One message, one ledger row."""
    import threading

    import duckdb

    import wandb_assets.lib.acting.idle_actions as idle_actions
    from wandb_assets.lib.warehouse import ensure_schema

    path = str(tmp_path / "w.duckdb")
    with duckdb.connect(path) as made:
        ensure_schema(made)
    barrier = threading.Barrier(2, timeout=2)
    real_decide = idle_actions.decide

    def decide_together(*args, **kwargs):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:  # the other one is waiting its turn
            pass
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(idle_actions, "decide", decide_together)
    channels = Recorder()
    seen = seen_run(T - minutes(120), T - minutes(60))
    database = duckdb.connect(path)
    errors = []

    def one_tick(token: str) -> None:
        con = database.cursor()
        try:
            tick(con, seen, POLICY, T, channels, token=token)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one_tick, args=(token,)) for token in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(channels.slack) == 1 and outcomes(database) == [("10:00", 1, "owner", "sent")]


def test_the_documented_example_policy_is_the_default():
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "docs" / "examples" / "idle_policy.yaml"
    assert parse_idle_policy(yaml.safe_load(example.read_text()), "example", 5.0) == POLICY


def test_the_weekly_digest_tells_each_owner_and_team_once(memory_con):
    """Week of Mon 2026-11-16: ana 3 idle GPU-hours ($8.97) over two days, bo 1.5 (unpriced), carol none; ana's
    episodes of that week: r1 (2.0 idle GPU-h) and r2 (0.5). On Tuesday 11-24 each gets one digest: ana by her Slack
    id, bo has none in the teams file (recorded, not sent), research's channel its total; a second tick sends none."""
    from wandb_assets.lib.accounting.teams import parse_team_directory
    from wandb_assets.lib.acting.idle_digest import record_digest
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(memory_con)
    memory_con.execute(
        "INSERT INTO gpu_usage BY NAME SELECT * FROM (VALUES "
        "(DATE '2026-11-16', 'ana', 2.0, 5.98), (DATE '2026-11-17', 'ana', 1.0, 2.99), "
        "(DATE '2026-11-18', 'bo', 1.5, NULL), (DATE '2026-11-18', 'carol', 0.0, 0.0), "
        "(DATE '2026-11-23', 'ana', 9.0, 26.91)) "  # the Monday after: next week's
        "v(day, username, idle_gpu_hours, idle_cost_usd), (SELECT 'research' AS team, 'e' AS entity, 'p' AS project)"
    )
    memory_con.execute(
        "INSERT INTO idle_actions (entity, project, run_id, episode_started_at, step, audience, outcome, "
        "idle_gpu_hours, details) VALUES "
        "('e', 'p', 'r1', '2026-11-17 10:00', 1, 'owner', 'sent', 2.0, '{\"user\": \"ana\"}'), "
        "('e', 'p', 'r2', '2026-11-18 10:00', 1, 'owner', 'sent', 0.5, '{\"user\": \"ana\"}')"
    )
    directory = parse_team_directory(
        {"research": {"channel": "C0RESEARCH", "users": [{"user": "ana", "slack": "U0ANA"}, "bo", "carol"]}}, "teams"
    )
    channels = Recorder()
    tuesday = datetime(2026, 11, 24, 9, 0)
    memory_con.execute(  # the warehouse holds the week whole: its first run was created the Sunday before
        "INSERT INTO runs (entity, project, run_id, state, created_at, source) VALUES "
        "('e', 'p', 'r0', 'finished', '2026-11-15 23:00', 'wandb')"
    )
    memory_con.execute("UPDATE idle_actions SET decided_at = '2026-11-17 10:00'")  # the ladder on since then
    assert record_digest(memory_con, tuesday, directory) == 3
    assert record_digest(memory_con, tuesday + minutes(15), directory) == 0
    from wandb_assets.lib.acting.idle_actions import claim_pending, record_outcomes
    from wandb_assets.lib.acting.idle_delivery import deliver

    for token in ("one", "two"):
        claimed = claim_pending(memory_con, token, tuesday)
        record_outcomes(memory_con, token, deliver(claimed, channels, tuesday))
    assert channels.slack == [
        (
            "C0RESEARCH",
            ":bar_chart: Team research, idle GPUs, week of 2026-11-16 to 2026-11-22 (UTC): 4.5 GPU-hours, $8.97: "
            "ana 3.0 GPU-h ($8.97), bo 1.5 GPU-h (unpriced).",
        ),
        (
            "U0ANA",
            ":bar_chart: Your idle GPUs, week of 2026-11-16 to 2026-11-22 (UTC): 3.0 idle GPU-hours, $8.97. "
            "Worst: e/p/r1 (2.0 idle GPU-h); e/p/r2 (0.5 idle GPU-h).",
        ),
    ]
    assert memory_con.execute(
        "SELECT run_id, outcome, reason FROM idle_actions WHERE audience = 'digest' ORDER BY run_id"
    ).fetchall() == [
        ("team:research", "sent", None),
        ("user:ana", "sent", None),
        ("user:bo", "undeliverable", "the teams file gives user bo no Slack user"),
    ]


def test_a_stop_refused_by_w_and_b_is_told_once_and_never_tried_again(memory_con):
    """stop_runs on; told at 12:00 (step 2); at 12:16 the stop is refused: the owner and the team hear it once, and at
    12:31 nothing is tried or sent again."""
    from wandb_assets.lib.acting.idle_delivery import StopAnswer

    class Refusing(Recorder):
        def stop_run(self, path, check):
            self.stops.append(path)
            return StopAnswer("refused", "permission denied")

    channels = Refusing()
    policy = IdlePolicy(5.0, stop_runs=True)
    for at in (T, T + minutes(16), T + minutes(31)):
        tick(memory_con, seen_run(T - minutes(130), at), policy, at, channels)
    assert channels.stops == ["e/p/r"]
    assert [channel for channel, _ in channels.slack] == ["U0ANA", "C0RESEARCH", "U0ANA", "C0RESEARCH"]
    assert "should have been stopped, but W&amp;B refused: permission denied." in channels.slack[2][1]
    assert ("09:50", 3, "stop", "refused") in outcomes(memory_con)


def test_the_first_weekly_digest_waits_for_a_tick_after_the_ladder_is_on_and_a_whole_week(memory_con):
    """The ladder switched on at Tue 11-24 09:00 (its first tick): no digest then, nothing recorded. At 09:15 the
    week of Mon 11-16 goes out (the warehouse holds runs from Sun 11-15). A warehouse first filled on Wed 11-18 holds
    part of that week: one skipped row says so and nobody is told a part of a week as a whole."""
    from wandb_assets.lib.accounting.teams import parse_team_directory
    from wandb_assets.lib.acting.idle_digest import record_digest
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(memory_con)
    directory = parse_team_directory({"research": {"users": [{"user": "ana", "slack": "U0ANA"}]}}, "teams")
    memory_con.execute(
        "INSERT INTO gpu_usage BY NAME SELECT * FROM (VALUES (DATE '2026-11-18', 'ana', 2.0, 5.98)) "
        "v(day, username, idle_gpu_hours, idle_cost_usd), (SELECT 'research' AS team, 'e' AS entity, 'p' AS project)"
    )
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, state, created_at, source) VALUES "
        "('e', 'p', 'r1', 'finished', '2026-11-18 08:00', 'wandb')"
    )
    tuesday = datetime(2026, 11, 24, 9, 0)

    def digests():
        return memory_con.execute(
            "SELECT run_id, outcome, reason FROM idle_actions WHERE audience = 'digest' ORDER BY run_id"
        ).fetchall()

    assert record_digest(memory_con, tuesday, directory) == 0 and digests() == []
    assert record_digest(memory_con, tuesday + minutes(15), directory) == 1
    assert digests() == [
        (
            "none",
            "skipped",
            "the warehouse holds from 2026-11-18, not the whole week of 2026-11-16: no digest of a part of a week",
        )
    ]
    memory_con.execute("DELETE FROM idle_actions")
    memory_con.execute("UPDATE runs SET created_at = '2026-11-15 23:00'")
    assert record_digest(memory_con, tuesday + minutes(30), directory) == 2
    assert [(r, o) for r, o, _ in digests()] == [("team:research", "pending"), ("user:ana", "pending")]
