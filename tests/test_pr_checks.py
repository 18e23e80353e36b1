"""Pull requests' throughput against main on the same testbed (issue 45, the verdicts): hand-worked values."""

import os
import subprocess
import sys
from datetime import timedelta
from unittest.mock import patch

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fleet import MAIN_SPS, T, ci_run, load, pr_fleet
from wandb_assets.lib.acting.pr_checks import (
    NO_BASELINE,
    NO_CHANGE,
    REGRESSION,
    format_pr_table,
    judge,
    judge_prs,
    t_quantile,
)


@pytest.mark.parametrize(("df", "expected"), [(1, 31.820516), (4, 3.746947), (9, 2.821438), (29, 2.462021)])
def test_the_t_quantile_matches_the_tables(df, expected):
    assert t_quantile(0.99, df) == pytest.approx(expected, abs=1e-5)


def test_the_boundary_by_hand():
    """Boundary = 1,000 - t(0.99, 9) x 6.549 x sqrt(1 + 1/10) = 1,000 - 2.821438 x 6.5490 x 1.048809 = 980.62 with no
    minimum change; with the default 2 % the width is max(19.38, 20) = 20: 980.0. A PR at 850 (-15 %) regresses, one at
    995 (-0.5 %, in the noise) does not; three main runs are no baseline."""
    regressed = judge([850.0], MAIN_SPS, min_change_pct=0)
    assert (regressed.verdict, round(regressed.boundary, 2), regressed.change_pct) == (REGRESSION, 980.62, -15.0)
    assert round(judge([850.0], MAIN_SPS).boundary, 2) == 980.0
    assert judge([995.0], MAIN_SPS).verdict == NO_CHANGE
    assert judge([990.0, 1000.0], MAIN_SPS).pr_value == 995.0  # two runs of one commit and config: one sample
    assert judge([700.0], MAIN_SPS[:3]).verdict == NO_BASELINE
    assert judge([940.0], MAIN_SPS, percent=5.0).boundary == 950.0  # the percentage threshold: median less 5 %


@pytest.fixture
def fleet(tmp_path):
    """``pr_fleet``: ten main runs on 8 H100s (``MAIN_SPS``), twelve on 8 A100s, three on 4 L4s; PRs 7, 8 and 9."""
    path = tmp_path / "w.snapshot.duckdb"
    con = duckdb.connect(str(path))
    load(con, pr_fleet())
    yield con, path
    con.close()


def test_a_pr_is_judged_against_main_on_its_own_testbed_only(fleet):
    """PR 7 on H100s against the ten H100 main runs only (the A100 runs, 40 % slower, are another testbed):
    regression; PR 8's two runs of one commit are one sample (995): no change; PR 9 on 4 L4s has 3 main runs: no
    baseline."""
    con, _ = fleet
    rows = {(r["pr"], r["metric"]): r for r in judge_prs(con, T, "overview/sps")}
    assert set(rows) == {(7, "overview/sps"), (8, "overview/sps"), (9, "overview/sps")}
    seven, eight, nine = rows[(7, "overview/sps")], rows[(8, "overview/sps")], rows[(9, "overview/sps")]
    assert (seven["testbed"], seven["verdict"], seven["baseline_n"], round(seven["boundary"], 2)) == (
        "8xH100-80GB",
        REGRESSION,
        10,
        980.0,  # 2 % of 1,000 (the minimum change) is wider than the t rule's 19.38
    )
    assert seven["baseline_runs"] == [f"m{i}" for i in range(10)]
    assert (eight["pr_value"], eight["pr_n"], eight["verdict"]) == (995.0, 2, NO_CHANGE)
    assert (nine["testbed"], nine["baseline_n"], nine["verdict"], nine["boundary"]) == ("4xL4", 3, NO_BASELINE, None)


@pytest.mark.parametrize(("pr", "code"), [(7, 1), (8, 0), (9, 0)])
def test_pr_check_fails_on_the_regressed_pr_only(fleet, pr, code):
    con, path = fleet
    con.close()
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "pr-check", "--pr", str(pr), "--fail-on-regression"]
        + ["--warehouse", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (code, "")
    lines = done.stdout.splitlines()
    assert lines[1] == "| config | testbed | metric | PR | baseline median [n] | change | boundary | verdict | W&B |"
    if pr == 7:
        assert lines[3] == (
            "| ppo | 8xH100-80GB | overview/sps | 850.0 [1] | 1,000.0 [10] | -15.0% | 980.0 | regression | "
            "[p7](https://wandb.example/test-team/test-project/runs/p7) |"
        )
        assert lines[-1] == (
            "1 metric(s) regressed against main on the same testbed; overview/sps gates (regressed), the others are "
            "reported."
        )


def snapshot(path, rows) -> None:
    """Publish ``rows`` as the snapshot at ``path`` the way a feed does: written aside, then moved into place."""
    aside = path.with_suffix(".next")
    con = duckdb.connect(str(aside))
    load(con, rows)
    con.close()
    os.replace(aside, path)


def test_pr_check_waits_until_the_prs_runs_have_ended_in_the_snapshot(tmp_path):
    """``--wait``: no snapshot yet, then one of PR 7's two runs ended and one still running, then both ended: the
    table of the two (855 from 850 and 860) and exit 1 (regressed)."""
    path = tmp_path / "w.snapshot.duckdb"
    waiting = subprocess.Popen(
        [sys.executable, "-m", "wandb_assets.cli", "pr-check", "--pr", "7", "--fail-on-regression", "--wait", "2"]
        + ["--poll-seconds", "0.3", "--warehouse", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stderr.readline().startswith("Waiting for PR 7: 0 run(s) ended, 0 running in the snapshot")
        second = ci_run("p7b", "pr7", "deadbeef", 860.0, 0.2)  # a second run of the commit, still running
        snapshot(path, [*pr_fleet(), second | {"state": "running"}])
        while not (line := waiting.stderr.readline()).startswith("Waiting for PR 7: 1 run(s) ended, 1 running"):
            assert line, "pr-check ended while a run of the PR was still running"
        snapshot(path, [*pr_fleet(), second])
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1
    assert out.splitlines()[0] == "PR 7 at deadbeef:"
    assert out.splitlines()[3].startswith("| ppo | 8xH100-80GB | overview/sps | 855.0 [2] | 1,000.0 [10] |")
    assert out.splitlines()[-1] == (
        "1 metric(s) regressed against main on the same testbed; overview/sps gates (regressed), the others are "
        "reported."
    )


def test_pr_check_without_a_verdict_in_time_fails_the_gate(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "pr-check", "--pr", "7", "--fail-on-regression", "--wait", "0.01"]
        + ["--poll-seconds", "0.2", "--warehouse", str(tmp_path / "none.duckdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == "No ended run of PR 7 in the warehouse snapshot after waiting 0.01 minute(s).\n"
    assert done.stderr.splitlines()[-1] == "No verdict: the gate cannot pass without one (--allow-missing lets it)."


def test_pr_check_gating_a_pr_with_no_ended_run_fails_unless_allowed(fleet):
    """Issue 51: `--fail-on-regression` on a PR with no ended run in the snapshot (PR 10 has none) exits 1, without
    --wait too (it exited 0 on 5d25e50: a gate that passes on nothing); `--allow-missing` lets it pass."""
    con, path = fleet
    con.close()
    base = [sys.executable, "-m", "wandb_assets.cli", "pr-check", "--pr", "10", "--fail-on-regression"]
    base += ["--warehouse", str(path)]
    for extra, code in (([], 1), (["--allow-missing"], 0)):
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (code, "No ended run of PR 10 in the warehouse snapshot.\n")


def test_the_baseline_is_main_as_it_stood_when_the_pr_run_ended(memory_con):
    """Five main runs at 500 SPS that end after PR 7's run (it ended 30 minutes before T) are not its baseline:
    judged at T + 1 day, PR 7 is still judged against m0..m9 (a verdict judged again is the same verdict)."""
    later = [ci_run(f"n{i}", "main", f"n{i:02d}", 500.0, -1 - i) for i in range(5)]
    load(memory_con, pr_fleet() + later)
    rows = {r["pr"]: r for r in judge_prs(memory_con, T + timedelta(days=1), "overview/sps")}
    assert rows[7]["baseline_runs"] == [f"m{i}" for i in range(10)]
    assert (rows[7]["verdict"], round(rows[7]["boundary"], 2)) == (REGRESSION, 980.0)


def test_a_config_name_cannot_break_the_table_or_notify_anyone():
    """Run names are anyone's to choose: a config ``ppo|@acme/core`` stays one cell and mentions nobody on GitHub."""
    row = {
        "config": "ppo|@acme/core",
        "testbed": "8xH100-80GB",
        "metric": "overview/sps",
        "pr_value": 850.0,
        "pr_n": 1,
        "baseline_median": None,
        "baseline_n": 0,
        "change_pct": None,
        "boundary": None,
        "verdict": NO_BASELINE,
        "pr_runs": ["p7"],
    }
    line = format_pr_table([row], links=True).splitlines()[2]
    assert (
        line == "| ppo\\|@\u200bacme/core | 8xH100-80GB | overview/sps | 850.0 [1] | - [0] | - | - | no baseline | p7 |"
    )
    assert row["config"] in format_pr_table([row]).replace("\\|", "|").replace("\u200b", "")


def test_pr_check_dry_run_prints_the_check_and_the_comment_it_would_post(fleet):
    """Issue 51: see before switching it on. `pr-check --pr 7 --dry-run` prints, after the table, the check run on
    deadbeef (failure: PR 7 regressed on the gating metric) and the comment with its marker; nothing is sent."""
    con, path = fleet
    con.close()
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "pr-check", "--pr", "7", "--dry-run", "--warehouse", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        "Dry run: what the GitHub delivery would post to (WANDB_ASSETS_GITHUB_REPO not set) (nothing is sent):" in lines
    )
    assert (
        "check run 'wandb-assets / throughput' on deadbeef: failure: 1 of 1 metric(s) regressed against main on the "
        "same testbed" in lines
    )
    assert "<!-- wandb-assets:throughput -->" in lines


@given(
    main=st.lists(
        st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 40))), min_size=0, max_size=40
    ),  # (CI time, end time or still running) in hours
    cutoffs=st.lists(st.integers(-1, 45), min_size=1, max_size=8),
    k=st.integers(1, 6),
)
def test_each_baseline_is_the_last_k_main_runs_ended_by_its_cutoff(main, cutoffs, k):
    """The one-sweep baselines (issue 54) equal the rule as written: for each PR group, main's runs of its key that had
    ended by its cutoff, sorted by CI time then run id, the last ``k``."""
    from wandb_assets.lib.acting.pr_checks import _baselines

    hour = lambda h: T + timedelta(hours=h)  # noqa: E731
    runs = [(hour(ci), f"m{i:02d}", float(i), None if end is None else hour(end)) for i, (ci, end) in enumerate(main)]
    wanted = [(("ppo", "8xH100-80GB", "overview/sps"), hour(c)) for c in cutoffs]
    expected = [
        sorted((r for r in runs if r[3] is not None and r[3] <= cutoff), key=lambda r: (r[0], r[1]))[-k:]
        for _, cutoff in wanted
    ]
    assert _baselines({wanted[0][0]: runs}, wanted, k) == expected


def test_a_tick_judges_only_the_groups_whose_runs_changed(memory_con):
    """Issue 54: on a million runs every tick judged all 112,305 PR groups of the history against main (the feed ran
    past ten minutes). With the verdicts of pr_fleet stored, nothing is judged again; a third run of PR 8's commit
    judges PR 8's group alone, the same row that judging everything and keeping what differs from the stored verdicts
    gives."""
    from wandb_assets.lib.acting.pr_checks import record_pr_checks

    load(memory_con, pr_fleet())
    first = judge_prs(memory_con, T, "overview/sps", changed_only=True)
    assert sorted(r["pr"] for r in first) == [7, 8, 9]
    record_pr_checks(memory_con, first)
    assert judge_prs(memory_con, T, "overview/sps", changed_only=True) == []
    load(memory_con, [*pr_fleet(), ci_run("p8c", "pr8", "CAFE0001", 1010.0, 0.25)])  # the commit as a name may write it
    (changed,) = judge_prs(memory_con, T, "overview/sps", changed_only=True)
    assert (changed["pr"], changed["commit"], changed["pr_runs"], changed["pr_value"]) == (
        8,
        "cafe0001",
        ["p8a", "p8b", "p8c"],
        1000.0,
    )
    stored = {
        (r[0], r[1], r[2]): r[3]
        for r in memory_con.execute("SELECT pr, commit, metric, pr_runs FROM pr_checks").fetchall()
    }
    every = judge_prs(memory_con, T, "overview/sps")  # judging everything, then keeping what changed: the same row
    assert [r for r in every if stored.get((r["pr"], r["commit"], r["metric"])) != r["pr_runs"]] == [changed]


def test_a_verdict_without_a_config_stands_like_any_other(memory_con):
    """A PR run whose name gave no config (``ci_config`` NULL) is judged once (no main run of no config: no
    baseline), and once its verdict is stored the next tick judges nothing: a NULL config equals the stored NULL."""
    from wandb_assets.lib.acting.pr_checks import record_pr_checks

    load(memory_con, [*pr_fleet(), ci_run("p5", "pr5", "abcdef01", 900.0, 1) | {"ci_config": None}])
    record_pr_checks(memory_con, judge_prs(memory_con, T, "overview/sps", changed_only=True))
    assert memory_con.execute("SELECT pr, config, verdict FROM pr_checks WHERE pr = 5").fetchall() == [
        (5, None, "no baseline")
    ]
    assert judge_prs(memory_con, T, "overview/sps", changed_only=True) == []


def test_the_verdicts_come_one_config_testbed_and_metric_at_a_time(memory_con):
    """Issue 54: the first tick after a million-run backfill held all 521,940 verdicts and their values at once
    (3.2 GiB). ``iter_judged`` yields one key's verdicts at a time, keys in order (4 L4s before 8 H100s): PR 9's, then
    PRs 7 and 8's; the same rows ``judge_prs`` returns, and its working table is gone once the last is yielded."""
    from wandb_assets.lib.acting.pr_checks import iter_judged

    load(memory_con, pr_fleet())
    chunks = list(iter_judged(memory_con, T, "overview/sps"))
    assert [[(r["testbed"], r["pr"]) for r in chunk] for chunk in chunks] == [
        [("4xL4", 9)],
        [("8xH100-80GB", 7), ("8xH100-80GB", 8)],
    ]
    assert [r for chunk in chunks for r in chunk] == sorted(
        judge_prs(memory_con, T, "overview/sps"), key=lambda r: (r["testbed"], r["pr"])
    )
    assert memory_con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'pr_judged_values'"
    ).fetchone() == (0,)


def test_judging_pauses_the_garbage_collector_and_leaves_it_as_it_found_it():
    """The judging of one key runs with the cyclic collector off (millions of small acyclic objects: 7 s of 25 s at a
    million runs); it is on again after, also when judging fails, and stays off for a caller that had turned it off."""
    import gc

    from wandb_assets.lib.acting.pr_checks import _collector_paused

    assert gc.isenabled()
    with pytest.raises(ValueError), _collector_paused():
        assert not gc.isenabled()
        raise ValueError("a failing judgement")
    assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_judging_holds_no_connection_to_the_warehouse(tmp_path, monkeypatch):
    """Issue 54: the first tick after a backfill judges the whole history (16 s at a million runs, 265 s at ten
    million) and held the warehouse's writer all along, past every other writer's lock wait. Now the values are
    copied out under one connection and judged with none open: while each group is judged another process opens the
    file for writing. The verdicts, recorded after, are those judging everything in place gives; a second judging
    finds nothing changed."""
    from contextlib import contextmanager

    from wandb_assets.lib.acting import pr_checks

    path = tmp_path / "w.duckdb"
    with duckdb.connect(str(path)) as con:
        load(con, pr_fleet())
    reference = duckdb.connect()  # judged in place, as a snapshot's pr-check does, and recorded
    load(reference, pr_fleet())
    pr_checks.record_pr_checks(reference, judge_prs(reference, T, "overview/sps"))

    @contextmanager
    def open_warehouse():
        con = duckdb.connect(str(path))
        try:
            yield con
        finally:
            con.close()

    opened_elsewhere, limits = [], []
    judged_key = pr_checks._judged_key  # noqa: SLF001 - observed, not replaced: another process opens the file

    def observed(*args):
        probe = f"import duckdb; duckdb.connect({str(path)!r}).execute('CREATE OR REPLACE TABLE probe AS SELECT 1')"
        opened_elsewhere.append(subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode)
        limits.append(args[0].execute("SELECT current_setting('memory_limit')").fetchone()[0])
        return judged_key(*args)

    monkeypatch.setattr(pr_checks, "_judged_key", observed)
    monkeypatch.setattr(pr_checks, "_VERDICTS_PER_FILE", 1)  # written out after each key: two files
    stored = "SELECT * FROM pr_checks ORDER BY pr, commit, config, testbed, metric"
    config = {
        "memory_limit": "1GB"
    }  # the warehouse connections' limit (WANDB_ASSETS_DUCKDB_MEMORY_LIMIT) holds there too
    with pr_checks.judge_changed(open_warehouse, T, "overview/sps", config=config) as judged:
        assert opened_elsewhere == [0, 0]  # a key a testbed with PR runs (4 L4s, 8 H100s), judged with the file free
        with duckdb.connect(config=config) as limited:
            assert limits == [limited.execute("SELECT current_setting('memory_limit')").fetchone()[0]] * 2
        assert sorted(judged.prs) == [7, 8, 9]
        assert judged.by_verdict == {"regression": 1, "no change": 1, "no baseline": 1}
        assert len(judged.verdicts) == 2
        with open_warehouse() as con:
            pr_checks.record_judged(con, judged)
            assert con.execute(stored).fetchall() == reference.execute(stored).fetchall()
    assert judged.verdicts and not any(path.exists() for path in judged.verdicts)  # gone with the context
    with pr_checks.judge_changed(open_warehouse, T, "overview/sps") as again:
        assert (again.verdicts, again.by_verdict, again.prs) == ((), {}, frozenset())


@pytest.mark.parametrize("per_insert, per_file", [(1, 1), (2, 3), (5_000, 100_000)])
def test_the_verdicts_written_out_are_the_same_however_they_are_batched(tmp_path, monkeypatch, per_insert, per_file):
    """The verdicts gathered into the judging database a few thousand at a time (one insert per key cost 20 ms each)
    and written out a hundred thousand a file: however they are cut, every verdict is written once, as judging in
    place gives it."""
    from contextlib import contextmanager

    from wandb_assets.lib.acting import pr_checks

    path = tmp_path / "w.duckdb"
    with duckdb.connect(str(path)) as con:
        load(con, pr_fleet())
    reference = duckdb.connect()
    load(reference, pr_fleet())
    pr_checks.record_pr_checks(reference, judge_prs(reference, T, "overview/sps"))

    @contextmanager
    def open_warehouse():
        with duckdb.connect(str(path)) as con:
            yield con

    monkeypatch.setattr(pr_checks, "_VERDICTS_PER_INSERT", per_insert)
    monkeypatch.setattr(pr_checks, "_VERDICTS_PER_FILE", per_file)
    stored = "SELECT * EXCLUDE (judged_at) FROM pr_checks ORDER BY pr, commit, config, testbed, metric"
    with pr_checks.judge_changed(open_warehouse, T, "overview/sps") as judged, open_warehouse() as con:
        pr_checks.record_judged(con, judged)
        assert con.execute(stored).fetchall() == reference.execute(stored).fetchall()
        assert judged.by_verdict.total() == len(reference.execute(stored).fetchall()) == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    main=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 600)), max_size=30),
    prs=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 300), st.integers(1, 600)), min_size=1, max_size=8),
    k=st.integers(1, 6),
    windows=st.sampled_from(
        [None, (timedelta(hours=2), timedelta(hours=40)), (timedelta(0),), (timedelta(hours=30),), ()]
    ),
)
def test_the_main_runs_staged_are_those_a_baseline_can_take(main, prs, k, windows):
    """Issue 54: a tick staged every main run of a touched config, testbed and metric (millions at ten million runs)
    for a few PR groups. Only the main runs a baseline can take are staged now: those ended after the earliest cutoff
    of the key's groups, and of those ended by it the last k. Each verdict's baseline is still the last k main runs
    (by CI time, then run id) ended by its group's cutoff, worked out here from every run; and no more main runs are
    staged than that bound. Main's runs are looked for in windows before the earliest cutoff first (``windows``: the
    default ones, or others, none), then in all of main: whichever pass finds a key's baseline, it is the same."""
    from wandb_assets.lib.acting import pr_checks

    with patch.object(pr_checks, "BASELINE_WINDOWS", pr_checks.BASELINE_WINDOWS if windows is None else windows):
        _check_the_staged_main_runs(main, prs, k)


def _check_the_staged_main_runs(main, prs, k):
    from wandb_assets.lib.acting.pr_checks import _JUDGED_VALUES, _stage_judged_values

    def run(run_id: str, branch: str, commit: str, hours_ago: int, minutes: int) -> dict:
        row = ci_run(run_id, branch, commit, 1000.0 + hours_ago % 7, hours_ago)
        return row | {"ended_at": row["created_at"] + timedelta(minutes=minutes)}

    rows = [run(f"m{i:02d}", "main", f"c{i:02d}", hours, minutes) for i, (hours, minutes) in enumerate(main)]
    rows += [run(f"p{j:02d}", f"pr{n}", f"{n:08x}", hours, minutes) for j, (n, hours, minutes) in enumerate(prs)]
    con = duckdb.connect()
    load(con, rows)
    ended = {r["run_id"]: r["ended_at"] for r in rows}
    cutoffs = {}
    for r in rows[len(main) :]:
        cutoffs[r["ci_branch"]] = max(cutoffs.get(r["ci_branch"], r["ended_at"]), r["ended_at"])
    cutoffs = {branch: min(T, at) for branch, at in cutoffs.items()}
    for verdict in judge_prs(con, T, "overview/sps", k=k):
        taken = sorted(
            (r["ci_timestamp"], r["run_id"])
            for r in rows[: len(main)]
            if ended[r["run_id"]] <= cutoffs[f"pr{verdict['pr']}"]
        )
        assert verdict["baseline_runs"] == [run_id for _, run_id in taken[-k:]]
    _stage_judged_values(con, "overview/sps", None, False, T, k)
    staged = con.execute(f"SELECT count(*) FROM {_JUDGED_VALUES} WHERE ci_branch = 'main'").fetchone()[0]
    first = min(cutoffs.values())
    assert staged <= sum(1 for r in rows[: len(main)] if r["ended_at"] > first) + k
