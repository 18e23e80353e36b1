"""The pull requests' verdicts on GitHub (issue 45) through real Dagster runs (the feed judges and queues,
``github_checks`` delivers) and PyGithub against a loopback GitHub API that checks the App's JWT and records every
call (tests/github_api.py). The fleet is issue 45's hand-worked one (tests/fleet.py ``pr_fleet``): PR 7 regressed
(850 against ten H100 main runs, boundary 980.0: 2 % of main's mean), PR 8 within the noise (995 from two runs), PR 9
on 4 L4s with three main runs (no baseline)."""

import json
from datetime import timedelta

import duckdb
import pytest

from tests.conftest import put_secret
from tests.fleet import T, ci_run, load, pr_fleet
from tests.github_api import LocalGitHub, app_private_key
from wandb_assets.lib.acting.pr_checks import NO_BASELINE
from wandb_assets.lib.acting.pr_outbox import CHECK_NAME, MARKER, STALE_CLAIM, claim, deliver
from wandb_assets.ticks import execute_feed, execute_github_checks
from wandb_assets.warehouse import query_read_only

#: The PR commits' full SHAs: the run names carry the first 8 hex digits.
FULL = {
    "deadbeef": "deadbeef" + "7" * 32,
    "cafe0001": "cafe0001" + "8" * 32,
    "cafe0002": "cafe0002" + "8" * 32,
    "f00d0001": "f00d0001" + "9" * 32,
}
PR7_ROW = "| ppo | 8xH100-80GB | overview/sps | 850.0 [1] | 1,000.0 [10] | -15.0% | 980.0 | regression |"


@pytest.fixture
def github(monkeypatch):
    """The loopback GitHub with the three PRs' head commits, reached as a GitHub App (id 77)."""
    key = app_private_key()
    server = LocalGitHub(app_id=77, private_key=key)
    for pr, commit in ((7, "deadbeef"), (8, "cafe0001"), (9, "f00d0001")):
        server.add_commit(FULL[commit], pr=pr)
    server.add_commit("cafe0002" + "8" * 32)  # PR 8's next commit, pushed later
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # credentials from the environment: no secret is read
    monkeypatch.setenv("WANDB_ENTITY", "test-team")
    monkeypatch.setenv("WANDB_PROJECT", "test-project")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_REPO", "acme/trainer")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_APP_ID", "77")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY", key)
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_API_URL", server.base)
    server.key = key
    yield server
    server.stop()


def warehouse(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    try:
        load(con, rows)
    finally:
        con.close()


def tick(instance, at):
    """The feed (judges, queues) then the delivery, as the sensor runs it after each feed; the feed's result."""
    now = at.isoformat() + "Z"
    feed = execute_feed(instance, now=now)
    assert feed.success
    assert sensor_after(instance, feed) == f"feed:{feed.run_id}"  # the deployment's sensor asks for this delivery
    assert execute_github_checks(instance, now=now).success
    return feed


def sensor_after(instance, feed) -> str:
    """What ``after_feed_to_github`` answers to this successful feed run: its run key, or why it skips."""
    from dagster import RunRequest, build_run_status_sensor_context

    from wandb_assets.defs.feed.github import after_feed_to_github

    context = build_run_status_sensor_context(
        sensor_name="after_feed_to_github",
        dagster_event=feed.get_run_success_event(),
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(feed.run_id),
    )
    answer = after_feed_to_github(context)
    return answer.run_key if isinstance(answer, RunRequest) else answer.skip_message


def checks_by_commit(server) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for run in server.check_runs.values():
        found.setdefault(run["head_sha"][:8], []).append(run)
    return found


def test_each_commit_gets_one_check_each_pr_one_comment_and_a_second_run_edits_them(
    github, warehouse_path, instance, monkeypatch
):
    warehouse(warehouse_path, pr_fleet())
    feed = tick(instance, T)
    (judged,) = feed.asset_materializations_for_node("pr_checks")  # what the UI shows of the asset
    assert (judged.metadata["judged"].value, judged.metadata["queued_for_github"].value) == (3, 6)
    assert PR7_ROW in judged.metadata["latest_verdicts"].value
    checks = checks_by_commit(github)
    assert {commit: [(r["name"], r["conclusion"]) for r in runs] for commit, runs in checks.items()} == {
        "deadbeef": [(CHECK_NAME, "failure")],
        "cafe0001": [(CHECK_NAME, "success")],
        "f00d0001": [(CHECK_NAME, "neutral")],
    }
    seven = checks["deadbeef"][0]
    assert seven["head_sha"] == FULL["deadbeef"]  # the short SHA of the run name, resolved through the API
    assert seven["output"]["title"] == "1 of 1 metric(s) regressed against main on the same testbed"
    assert PR7_ROW in seven["output"]["summary"]
    assert f"{PR7_ROW} [p7](https://wandb.example/test-team/test-project/runs/p7) |" in seven["output"]["summary"]
    assert checks["f00d0001"][0]["output"]["title"].startswith("1 of 1 metric(s) have no baseline")
    comments = {c["issue"]: c for c in github.comments.values()}
    assert sorted(comments) == [7, 8, 9]
    assert comments[7]["body"].startswith(MARKER) and PR7_ROW in comments[7]["body"]
    # the App: one JWT call for the installation, one token exchange, one for its slug (its comments' author);
    # every repository call with that token
    assert [c["path"] for c in github.calls if c["who"] == "app"] == [
        "/repos/acme/trainer/installation",
        "/app/installations/4242/access_tokens",
        "/app",
    ]
    assert {
        c["who"] for c in github.calls if c["path"].startswith("/repos/acme/trainer/") and "install" not in c["path"]
    } == {"installation"}

    # nothing new: the next tick asks GitHub nothing; without a repository the sensor launches nothing
    monkeypatch.delenv("WANDB_ASSETS_GITHUB_REPO")
    feed = execute_feed(instance, now=(T + timedelta(minutes=5)).isoformat() + "Z")
    assert sensor_after(instance, feed) == "WANDB_ASSETS_GITHUB_REPO is not set: the verdicts stay in pr_checks."
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_REPO", "acme/trainer")
    calls = len(github.calls)
    tick(instance, T + timedelta(minutes=15))
    assert len(github.calls) == calls

    # a second run of PR 7's commit (860: the sample is now 855 from two runs) and PR 8's head moves to cafe0002
    rows = pr_fleet() + [
        ci_run("p7b", "pr7", "deadbeef", 860.0, -0.5),
        ci_run("p8c", "pr8", "cafe0002", 1001.0, -0.5),
    ]
    github.pulls[8] = FULL["cafe0002"]
    warehouse(warehouse_path, rows)
    tick(instance, T + timedelta(hours=1))
    checks = checks_by_commit(github)
    assert {commit: len(runs) for commit, runs in checks.items()} == {
        "deadbeef": 1,
        "cafe0001": 1,
        "cafe0002": 1,
        "f00d0001": 1,
    }
    assert "| 855.0 [2] |" in checks["deadbeef"][0]["output"]["summary"]
    assert checks["cafe0002"][0]["conclusion"] == "success"
    assert len(github.calls_to("PATCH", r"/repos/acme/trainer/check-runs/\d+")) == 1  # PR 7's, edited
    assert len(github.comments) == 3  # edited in place, none added
    comments = {c["issue"]: c for c in github.comments.values()}
    assert "| 855.0 [2] |" in comments[7]["body"]
    assert "at `cafe0002`" in comments[8]["body"]  # the PR's comment shows its newest commit
    # the verdicts of PR 9 (no new run) stand: not judged again, not sent again
    assert len(github.calls_to("PATCH", r"/repos/acme/trainer/issues/comments/\d+")) == 2


def test_a_backfill_s_old_pull_requests_are_judged_and_kept_never_sent_to_github(github, warehouse_path, instance):
    """Issue 54: the first tick after a backfill judges the history's PRs (112,305 groups at a million runs) and
    queued every one for GitHub: a check run on each old commit and a comment on each closed PR, for hours. PR 6's one
    run ended 30 days before T (WANDB_ASSETS_GITHUB_MAX_AGE_DAYS 7): its verdict (no baseline: main's runs ended
    later) is kept in pr_checks and counted, GitHub hears nothing of it; PRs 7-9 (runs ended an hour before T) get
    their checks and comments as before."""
    warehouse(warehouse_path, [*pr_fleet(), ci_run("p6", "pr6", "abcdef01", 990.0, 30 * 24)])
    feed = tick(instance, T)
    (judged,) = feed.asset_materializations_for_node("pr_checks")
    assert (judged.metadata["judged"].value, judged.metadata["queued_for_github"].value) == (4, 6)
    assert judged.metadata["prs_too_old_for_github"].value == 1
    assert query_read_only(str(warehouse_path), "SELECT pr, verdict FROM pr_checks WHERE pr = 6") == [(6, NO_BASELINE)]
    assert sorted(checks_by_commit(github)) == ["cafe0001", "deadbeef", "f00d0001"]
    assert sorted(c["issue"] for c in github.comments.values()) == [7, 8, 9]
    assert not any("abcdef01" in c["path"] or "/pulls/6/" in c["path"] for c in github.calls)


@pytest.mark.slow
def test_a_github_outage_delays_the_verdicts_and_a_sender_that_died_mid_send_doubles_nothing(
    github, warehouse_path, instance
):
    warehouse(warehouse_path, pr_fleet())
    github.outage = 1000
    tick(instance, T)
    assert github.check_runs == {} and github.comments == {}
    con = duckdb.connect(str(warehouse_path))
    try:
        held = con.execute(
            "SELECT item, state, attempts, last_error FROM github_deliveries ORDER BY pr, item"
        ).fetchall()
    finally:
        con.close()
    assert [(item, state) for item, state, _, _ in held] == [
        ("check:deadbeef", "pending"),
        ("comment", "pending"),
        ("check:cafe0001", "pending"),
        ("comment", "pending"),
        ("check:f00d0001", "pending"),
        ("comment", "pending"),
    ]
    tried = [error for _, _, attempts, error in held if attempts == 1]
    assert len(tried) == 6 and tried[0].startswith("GitHub answered 502")  # the rest: "not tried: ..."
    # GitHub is back; a sender claims everything, delivers, and dies before recording
    github.outage = 0
    from wandb_assets.defs.feed.github import GitHubResource
    from wandb_assets.defs.wandb_runs.resources import wandb_resource
    from wandb_assets.settings import github_target

    con = duckdb.connect(str(warehouse_path))
    try:
        claimed = claim(con, "acme/trainer", "dead-sender", T)
    finally:
        con.close()
    outcomes = deliver(claimed, GitHubResource(wandb=wandb_resource()).channel(github_target()), T)
    assert {o["state"] for o in outcomes} == {"delivered"}
    assert (len(github.check_runs), len(github.comments)) == (3, 3)
    # within ten minutes its claim holds; after, the next run sends the items again and finds what it sent
    tick(instance, T + STALE_CLAIM / 2)
    assert (len(github.check_runs), len(github.comments)) == (3, 3)
    tick(instance, T + STALE_CLAIM + timedelta(seconds=1))
    assert (len(github.check_runs), len(github.comments)) == (3, 3)
    con = duckdb.connect(str(warehouse_path))
    try:
        assert con.execute("SELECT DISTINCT state FROM github_deliveries").fetchall() == [("delivered",)]
    finally:
        con.close()


@pytest.mark.slow
def test_a_personal_token_gets_commit_statuses_and_no_secret_is_kept_anywhere(
    github, warehouse_path, instance, monkeypatch, capsys, caplog
):
    """A personal token cannot make check runs (GitHub answers 403): the verdicts become commit statuses with the
    same context. Neither the token nor the App's private key nor an installation token appears in the logs, the
    run's events and metadata, the warehouse or an error's text."""
    token = "ghp_" + "T0k3n" * 8
    github.token = token
    warehouse(warehouse_path, pr_fleet())
    monkeypatch.delenv("WANDB_ASSETS_GITHUB_APP_ID")
    monkeypatch.delenv("WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_TOKEN", token)
    github.outage = 1  # the first request fails: an error text is logged and kept
    tick(instance, T)
    assert github.statuses == []
    tick(instance, T + timedelta(minutes=15))
    assert github.check_runs == {}
    assert sorted((s["sha"][:8], s["state"], s["context"]) for s in github.statuses) == [
        ("cafe0001", "success", CHECK_NAME),
        ("deadbeef", "failure", CHECK_NAME),
        ("f00d0001", "success", CHECK_NAME),
    ]
    # the App once more, with GitHub refusing its credentials for a while: error texts too
    monkeypatch.delenv("WANDB_ASSETS_GITHUB_TOKEN")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_APP_ID", "77")
    monkeypatch.setenv("WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY", github.key)
    warehouse(warehouse_path, pr_fleet() + [ci_run("p7b", "pr7", "deadbeef", 860.0, -0.5)])
    github.outage = 1
    tick(instance, T + timedelta(hours=1))
    tick(instance, T + timedelta(hours=2))
    assert github.issued, "the App's token exchange happened"
    secrets = [token, *github.issued, *[line for line in github.key.splitlines() if "PRIVATE KEY" not in line][1:4]]
    con = duckdb.connect(str(warehouse_path))
    try:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        stored = json.dumps([con.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables], default=str)
    finally:
        con.close()
    events = json.dumps([str(e) for r in instance.get_runs() for e in instance.all_logs(r.run_id)], default=str)
    seen = stored + events + capsys.readouterr().out + capsys.readouterr().err + caplog.text
    assert "GitHub answered 502" in stored and "GitHub answered 502" in caplog.text + events
    assert [s for s in secrets if s in seen] == []


@pytest.mark.slow
def test_the_apps_private_key_comes_from_the_secret(
    github, warehouse_path, instance, monkeypatch, moto_endpoint, wandb_server
):
    """Without WANDB_API_KEY the W&B secret in Secrets Manager (moto's server) is in use: it holds the App's private
    key beside the W&B credentials, and the checks go out as with the key in the environment."""
    wandb_server([])  # the local W&B server the secret's key is checked against
    put_secret(
        moto_endpoint,
        "dev/datadog/collectors/wandb",
        json.dumps(
            {
                "WANDB_API_KEY": "s" * 40,
                "WANDB_ENTITY": "test-team",
                "WANDB_PROJECT": "test-project",
                "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY": github.key,
            }
        ),
    )
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY"):
        monkeypatch.delenv(name)
    warehouse(warehouse_path, pr_fleet())
    tick(instance, T)
    assert sorted((r["head_sha"][:8], r["conclusion"]) for r in github.check_runs.values()) == [
        ("cafe0001", "success"),
        ("deadbeef", "failure"),
        ("f00d0001", "neutral"),
    ]


@pytest.mark.slow
def test_from_the_w_and_b_server_to_the_check_in_one_refresh(github, wandb_server, dagster_home, capsys):
    """The whole path, as `wandb-assets refresh` runs it: the local W&B server serves ten main runs of ppo on 8 H100s
    (1,000 SPS) and PR 7's run of deadbeef at 850; the refresh reads them (GPU model from each run's metadata), the
    feed judges PR 7 and the delivery puts a failing check on deadbeef's full SHA."""
    from datetime import UTC, datetime

    from tests.conftest import cli
    from wandb_assets.localwandb import make_run_node

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)

    def ci_node(run_id: str, branch: str, commit: str, sps: float, hours_ago: float) -> dict:
        created = now - timedelta(hours=hours_ago)
        return make_run_node(
            run_id,
            display_name=f"github.sky.{branch}.{commit}.ppo.{int(created.replace(tzinfo=UTC).timestamp())}",
            state="finished",
            created_at=created,
            heartbeat_at=created + timedelta(minutes=20),
            config={"compute.gpu_count": 8},
            summary={"overview/sps": sps, "_step": 1000},
            metadata={"gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3"},
            job_type="benchmark",
        )

    sps = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1008.0, 992.0, 1000.0]
    nodes = [ci_node(f"m{i}", "main", f"c{i:07x}", value, 20 - i) for i, value in enumerate(sps)]
    wandb_server([*nodes, ci_node("p7", "pr7", "deadbeef", 850.0, 2)])
    code, _, err = cli(capsys, "refresh", "--quiet")
    assert code == 0, err
    assert "Sending the pull requests' throughput verdicts to GitHub ..." in err
    (check,) = github.check_runs.values()
    assert (check["head_sha"], check["conclusion"]) == (FULL["deadbeef"], "failure")
    assert (
        "| ppo | 8xH100-80GB | overview/sps | 850.0 [1] | 1,000.0 [10] | -15.0% | 980.0 | regression |"
        in (check["output"]["summary"])
    )
    assert [c["issue"] for c in github.comments.values()] == [7]
