"""``wandb-assets check``: each invariant of the warehouse holds on a good one and is named when broken (each
broken on purpose here, one at a time). Every other test's warehouse is checked at its end (``conftest``)."""

import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta

import duckdb
import pytest

from tests.fleet import fleet_row, load
from wandb_assets.lib.accounting.closing import close_month
from wandb_assets.lib.checks import INVARIANTS, broken, check_warehouse
from wandb_assets.lib.derived import rebuild_gpu_usage
from wandb_assets.lib.sql import transaction
from wandb_assets.lib.warehouse import GPU_SAMPLES_SQL, ensure_schema, load_runs_window, record_projects, stage_rows

NOW = datetime.now(UTC).replace(tzinfo=None)
T = datetime(2026, 6, 1)


def _good(con) -> None:
    """Two projects: a finished H100 run priced at 3 USD, a running run with an idle sample, a project record."""
    ensure_schema(con)
    rows = [
        fleet_row("done", "finished", "regular", T, T + timedelta(hours=2), gpus=2, entity="e", project="p")
        | {"gpu_model": "H100-80GB"},
        fleet_row("live", "running", "regular", T, None, gpus=1, entity="e", project="q")
        | {"latest_gpu_sample": [{"gpu_index": 0, "utilisation": 0.0, "memory": 1.0}]},
    ]
    path, _ = stage_rows(rows)
    try:
        load_runs_window(con, path, T, T + timedelta(days=1), prices=[("H100-80GB", 3.0)])
    finally:
        os.unlink(path)
    con.execute(GPU_SAMPLES_SQL, {"snapshot_at": T + timedelta(hours=1)})
    record_projects(con, [{"entity": "e", "project": p, "error": None} for p in ("p", "q")], T)
    rebuild_gpu_usage(con, T + timedelta(hours=3), {"H100-80GB": 3.0}, {"alice": "vision"})
    with transaction(con):  # May is closed (it holds no usage), June open
        close_month(con, date(2026, 5, 1), T)


STALE = "; UPDATE warehouse_meta SET value = 'changed since' WHERE key = 'inputs_version'"
BREAKS = {
    # (a change to runs or the samples without a rebuild of gpu_usage: gpu_usage_reconciles waits for the rebuild)
    "one_row_per_run": "INSERT INTO runs SELECT * FROM runs WHERE run_id = 'done'" + STALE,
    "idle_within_gpu_hours": "UPDATE gpu_usage SET idle_gpu_hours = gpu_hours + 1 WHERE project = 'p'" + STALE,
    "curve_idle_reconciles": "INSERT INTO run_curve_idle VALUES ('e', 'p', 'done', DATE '2026-06-01', 5, 0.5, 0)"
    + STALE,
    "cost_is_hours_times_price": "UPDATE runs SET cost_usd = cost_usd + 0.01 WHERE run_id = 'done'",
    "no_busy_unmirrored_run": "UPDATE wandb_projects SET mirrored = false WHERE project = 'q'",
    "no_alert_on_a_run_not_alive": (
        "INSERT INTO alerts VALUES ('stalled_run:e/p:done', 'stalled_run', 'e/p:done', 'warning', 'm', "
        '\'{"run_id": "done", "entity": "e", "project": "p"}\', now(), TIMESTAMP \'2100-01-01\', NULL)'
    ),
    "gpu_usage_reconciles": "UPDATE gpu_usage SET failed_gpu_hours = failed_gpu_hours + 0.01 WHERE project = 'p'",
    # June 1 priced at a period that takes effect on June 2 (the period is recorded: only the day's pricing is wrong)
    "gpu_usage_priced_at_its_day": "INSERT INTO gpu_price_periods VALUES ('H100-80GB', 'list', NULL, [], 1000000, "
    "DATE '2026-06-02', 2.5, true, 'file, dated', now(), 99); UPDATE gpu_usage SET price_from = DATE '2026-06-02', "
    "usd_per_gpu_hour = 2.5, cost_usd = gpu_hours * 2.5 WHERE project = 'p'",
    # the closed May altered: a row added to its record and to what is billed, its totals kept
    "closed_months_never_move": "INSERT INTO closed_month_charges (month, charge_category, gpu_hours, cost_usd) "
    "VALUES (DATE '2026-05-01', 'usage', 0, 0); INSERT INTO gpu_charges (month, charge_category, gpu_hours, cost_usd) "
    "VALUES (DATE '2026-05-01', 'usage', 0, 0)",
    # a June row billed twice
    "charges_reconcile_with_usage": "INSERT INTO gpu_charges SELECT * FROM gpu_charges WHERE project = 'p'",
    "one_project_per_run": "INSERT INTO runs SELECT * REPLACE ('p2' AS project, ['vanished'] AS anomalies) "
    "FROM runs WHERE run_id = 'done'" + STALE,
    "no_run_left_unmirrored": "UPDATE runs SET state = 'vanished', anomalies = ['unmirrored'], "
    "ingested_at = TIMESTAMP '2026-05-01' WHERE run_id = 'live'" + STALE,
    # the money marts as dbt builds them from gpu_usage (the model's SQL), with an idle GPU-hour too many in June
    "marts_reconcile": "CREATE SCHEMA analytics; CREATE TABLE analytics.team_gpu_cost_monthly AS "
    "SELECT date_trunc('month', day)::DATE AS month, team, entity, project, gpu_model, "
    "coalesce(price_basis, 'unpriced') AS price_basis, sum(gpu_hours) AS gpu_hours, "
    "sum(cost_usd) AS cost_usd, 0.0 AS unpriced_gpu_hours, sum(idle_gpu_hours) + 1 AS idle_gpu_hours, "
    "sum(idle_cost_usd) AS idle_cost_usd, sum(failed_gpu_hours) AS failed_gpu_hours, "
    "sum(failed_cost_usd) AS failed_cost_usd, 1 AS users, NULL::DATE AS price_from, NULL::DOUBLE AS usd_per_gpu_hour, "
    "'usage' AS charge_category, NULL::DATE AS adjustment_of, min(day) AS first_day, max(day) AS last_day "
    "FROM gpu_usage GROUP BY ALL; "
    "CREATE TABLE analytics.team_budget_vs_spend AS SELECT month, team, sum(cost_usd) AS spend_usd "
    "FROM analytics.team_gpu_cost_monthly GROUP BY ALL; CREATE TABLE analytics.marts_build AS "
    "SELECT value AS gpu_usage_build FROM warehouse_meta WHERE key = 'gpu_usage_build'",
    "curves_once": "INSERT INTO run_history VALUES ('e', 'p', 'done', 'overview/sps', 1, NULL, 1.0), "
    "('e', 'p', 'done', 'overview/sps', 1, NULL, 1.0), ('e', 'p', 'done', 'overview/sps', 2, NULL, 1.0)",
}


def test_every_invariant_holds_on_a_good_warehouse(memory_con):
    _good(memory_con)
    assert memory_con.execute("SELECT run_id, cost_usd FROM runs ORDER BY 1").fetchall() == [
        ("done", 12.0),  # 2 GPUs x 2 h x 3 USD
        ("live", None),
    ]
    assert [(i.name, count) for i, count, _ in check_warehouse(memory_con, NOW)] == [(i.name, 0) for i in INVARIANTS]


@pytest.mark.breaks_invariants
@pytest.mark.parametrize("name", list(BREAKS))
def test_each_invariant_broken_on_purpose_is_named_and_only_it(memory_con, name):
    _good(memory_con)
    memory_con.execute(BREAKS[name])
    failing = [(i.name, count) for i, count, _ in check_warehouse(memory_con, NOW) if count]
    assert failing == [(name, 1)]
    (sentence,) = broken(memory_con, NOW)
    assert sentence.startswith(f"{name}: 1 row(s) break '")


@pytest.mark.breaks_invariants
@pytest.mark.parametrize(
    "copy",
    [
        "('p2' AS project)",  # alive in two mirrored projects at once: 5d25e50 passed it
        "('p2' AS project, 'finished' AS state, TIMESTAMP '2026-06-01 13:00' AS ended_at)",
    ],
)
def test_a_run_counted_in_two_projects_is_named_whatever_the_states_of_its_copies(memory_con, copy):
    """Issue 53: one_project_per_run looked only at copies left behind (vanished, unmirrored); a run (entity, id,
    creation time) alive in two projects at once counts its GPU-hours twice and is named too."""
    _good(memory_con)
    memory_con.execute(f"INSERT INTO runs SELECT * REPLACE {copy} FROM runs WHERE run_id = 'live'" + STALE)
    failing = [(i.name, count) for i, count, _ in check_warehouse(memory_con, NOW) if count]
    assert ("one_project_per_run", 1) in failing
    (line,) = [line for line in broken(memory_con, NOW) if line.startswith("one_project_per_run")]
    assert "e.g. [('e', 'live', datetime.datetime(2026, 6, 1, " in line and "'p2 (" in line


@pytest.mark.breaks_invariants
def test_an_alert_on_a_run_of_a_project_that_just_left_the_mirror_set_is_unwatched_not_broken(memory_con):
    """Found by the reconciliation soak (issue 42): a running run with an open alert whose project leaves the mirror set
    is marked (vanished, unmirrored) by the fetch that records the set; until the next alert evaluation marks the
    alert unwatched, the alert is an unwatched project's, not an alert on a dead run. Its project mirrored, the same
    alert on the same vanished run is named."""
    _good(memory_con)
    memory_con.execute(
        "INSERT INTO alerts VALUES ('stalled_run:e/q:live', 'stalled_run', 'e/q:live', 'warning', 'm', "
        '\'{"run_id": "live", "entity": "e", "project": "q"}\', now(), TIMESTAMP \'2100-01-01\', NULL)'
    )
    memory_con.execute("UPDATE runs SET state = 'vanished', anomalies = ['unmirrored'] WHERE run_id = 'live'")
    memory_con.execute("UPDATE wandb_projects SET mirrored = false WHERE project = 'q'")
    assert not [line for line in broken(memory_con, NOW) if line.startswith("no_alert_on_a_run_not_alive")]
    memory_con.execute("UPDATE wandb_projects SET mirrored = true WHERE project = 'q'")
    assert [line for line in broken(memory_con, NOW) if line.startswith("no_alert_on_a_run_not_alive")]


def test_the_command_exits_0_when_all_hold_1_naming_what_breaks_and_2_without_a_warehouse(tmp_path):
    path = tmp_path / "w.duckdb"
    con = duckdb.connect(str(path))
    _good(con)
    con.close()

    def check() -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "wandb_assets.cli", "check", "--warehouse", str(path)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    ok = check()
    assert ok.returncode == 0, ok.stderr
    assert (
        ok.stdout.splitlines()[-1] == f"{len(INVARIANTS)} of {len(INVARIANTS)} invariants hold over 2 runs of {path}."
    )
    con = duckdb.connect(str(path))
    con.execute(BREAKS["cost_is_hours_times_price"])
    con.close()
    bad = check()
    assert bad.returncode == 1
    assert "FAILED cost_is_hours_times_price: 1 row(s) break" in bad.stdout
    assert bad.stdout.splitlines()[-1].startswith(f"{len(INVARIANTS) - 1} of {len(INVARIANTS)} invariants hold")
    path.unlink()
    gone = check()
    assert (gone.returncode, gone.stdout) == (2, "")
    assert gone.stderr.startswith(f"error: no warehouse at {path}")


def test_a_fleet_loaded_whole_holds_every_invariant(memory_con):
    load(memory_con, [fleet_row("a", "finished", "regular", T, T + timedelta(hours=1))])
    assert broken(memory_con, NOW) == []
