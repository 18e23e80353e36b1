"""The analysts' dbt project (analytics/) built by the analytics job on a hand-made warehouse: every mart's values
worked out by hand, the chargeback file to the cent, a broken source failing its asset check and paging, the
docs page in Chromium, the export's memory on a million runs."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from datetime import date, datetime
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_assets.lib import exports
from wandb_assets.lib.accounting.budgets import record_budgets
from wandb_assets.lib.derived import rebuild_gpu_hours, rebuild_gpu_usage, rebuild_success_rates
from wandb_assets.lib.schema_docs import DBT_SOURCE_ASSETS
from wandb_assets.lib.warehouse import ensure_schema

NOW = datetime(2026, 11, 10, 12, 0)
PRICES = {"H100-80GB": 2.99, "A100-40GB": 1.29}
TEAMS = {"alice": "research", "bob": "research"}
RUNS = [
    # r1: 2 H100s for 4 h across the Oct/Nov midnight; r2: 1 A100 for 6 h, failed; r3: 4 GPUs of no model for 1 h
    dict(run_id="r1", user="alice", state="finished", created_at="2026-10-31 22:00", ended_at="2026-11-01 02:00",
         gpu_count=2, gpu_model="H100-80GB", cost_usd=23.92, sps_steady=1200.0),
    dict(run_id="r2", user="bob", state="failed", created_at="2026-11-02 00:00", ended_at="2026-11-02 06:00",
         gpu_count=1, gpu_model="A100-40GB", cost_usd=7.74, sps_steady=None),
    dict(run_id="r3", user="carol", state="finished", created_at="2026-11-03 00:00", ended_at="2026-11-03 01:00",
         gpu_count=4, gpu_model=None, cost_usd=None, sps_steady=None),
]  # fmt: skip


def build_hand_made_warehouse(path: Path, duplicate: str | None = None) -> None:
    """Three runs, r1's idle hours from its GPU stream, and the pipeline's own gpu_usage/success_rates/gpu_hours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    try:
        con.execute("SET TimeZone = 'UTC'")
        ensure_schema(con)
        for run in RUNS + [r for r in RUNS if r["run_id"] == duplicate]:
            con.execute(
                "INSERT INTO runs BY NAME SELECT 'e' AS entity, 'p' AS project, $run_id AS run_id, $user AS \"user\", "
                "$state AS state, 'regular' AS category, $created_at::TIMESTAMP AS created_at, "
                "$ended_at::TIMESTAMP AS ended_at, $ended_at::TIMESTAMP AS heartbeat_at, $gpu_count AS gpu_count, "
                "'config' AS gpu_count_source, $gpu_model AS gpu_model, $cost_usd AS cost_usd, "
                "$sps_steady AS sps_steady, 'wandb' AS source, $now AS ingested_at, "
                "(epoch($ended_at::TIMESTAMP) - epoch($created_at::TIMESTAMP)) / 3600 AS duration_hours",
                {**run, "now": NOW},
            )
        # r1's stream: both GPUs busy at 22:00 and 00:00, both idle at 23:45 (to the next sample, 00:00) and at 01:30
        # (to the run's end, 02:00): 2 x 0.25 = 0.5 idle GPU-hours on Oct 31, 2 x 0.5 = 1.0 on Nov 1
        con.execute(
            "INSERT INTO run_gpu_samples SELECT 'e', 'p', 'r1', t::TIMESTAMP, gpu, u, 50.0, 300.0 FROM (VALUES "
            "('2026-10-31 22:00', 90.0), ('2026-10-31 23:45', 0.0), ('2026-11-01 00:00', 90.0), "
            "('2026-11-01 01:30', 0.0)) s(t, u), (VALUES (0), (1)) g(gpu)"
        )
        con.execute(
            "INSERT INTO run_curve_idle VALUES ('e', 'p', 'r1', DATE '2026-10-31', 5.0, 0.5, 0.0), "
            "('e', 'p', 'r1', DATE '2026-11-01', 5.0, 1.0, 0.0)"
        )
        # the idle ladder told alice of r1's idle episode and would have stopped it (stopping off)
        con.execute(
            "INSERT INTO idle_actions (entity, project, run_id, episode_started_at, step, audience, outcome, "
            "idle_gpu_hours, idle_usd, details) SELECT 'e', 'p', 'r1', TIMESTAMP '2026-10-31 23:45', s, a, o, 0.5, "
            "1.495, '{\"user\": \"alice\"}' FROM (VALUES (1, 'owner', 'sent'), (1, 'datadog', 'sent'), "
            "(3, 'stop', 'would_stop')) v(s, a, o)"
        )
        rebuild_gpu_usage(con, NOW, PRICES, TEAMS)
        record_budgets(con, [("research", date(2026, 1, 1), 250000.0), ("research", date(2026, 11, 1), 300000.0)])
        rebuild_success_rates(con)
        rebuild_gpu_hours(con)
    finally:
        con.close()


#: November's month, status and the usage days its rows cover, as the chargeback file writes them.
NOV = ["2026-11", "open", "2026-11-01", "2026-11-03"]


def rows(con, sql: str) -> list[tuple]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in con.execute(sql).fetchall()]


def test_the_dbt_sources_are_our_assets_and_the_models_follow_them():
    from wandb_assets.definitions import defs
    from wandb_assets.defs.analytics.assets import analytics_models

    ours = {spec.key.to_user_string() for spec in defs.resolve_all_asset_specs() if spec.group_name != "analytics"}
    assert set(DBT_SOURCE_ASSETS.values()) <= ours
    deps = {key.to_user_string() for key in analytics_models.dependency_keys}
    assert {"runs", "gpu_usage", "success_rates", "run_curves"} <= deps
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get(analytics_models.keys_by_output_name["stg_runs"]).parent_keys} == {
        "runs"
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in analytics_models.check_keys}
    assert ("stg_runs", "unique_combination_stg_runs_entity__project__run_id") in checks
    assert not any(asset == "runs" for asset, _ in checks)  # materializing runs in the UI never runs dbt
    assert ("team_gpu_cost_monthly", "chargeback_matches_gpu_charges") in checks
    # the tick and the backfill never run dbt (its tests on our tables are checks of the analytics job)
    for job in ("refresh", "backfill", "offline", "curves"):
        assert "analytics_models" not in {n.name for n in defs.resolve_job_def(job).graph.node_defs}, job


@pytest.fixture
def built(warehouse_path, instance, monkeypatch):
    """The hand-made warehouse at WANDB_ASSETS_DUCKDB and one analytics run over it (docs too)."""
    from wandb_assets.ticks import execute_analytics

    build_hand_made_warehouse(warehouse_path)
    result = execute_analytics(instance)
    assert result.success
    return result


@pytest.mark.slow  # a dbt build with docs, read in Chromium (80 s of a worker beside two busy loops)
def test_the_marts_hold_the_hand_worked_values_and_the_docs_show_them(
    built, warehouse_path, tmp_path, capsys, chromium
):
    from tests.conftest import cli

    evaluations = [e.event_specific_data for e in built.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert len(evaluations) == 39 and all(e.passed for e in evaluations)
    con = duckdb.connect(str(warehouse_path), read_only=True)
    try:
        billed = "first_day, last_day, price_from, usd_per_gpu_hour, charge_category, adjustment_of"
        cost = rows(con, f"SELECT * EXCLUDE ({billed}) FROM analytics.team_gpu_cost_monthly ORDER BY ALL NULLS LAST")
        # nothing closed: every row is its month's usage, at each model's one (since always) price
        assert rows(con, f"SELECT DISTINCT {billed} FROM analytics.team_gpu_cost_monthly ORDER BY ALL NULLS LAST")[
            :2
        ] == [
            (date(2026, 10, 31), date(2026, 10, 31), None, 2.99, "usage", None),
            (date(2026, 11, 1), date(2026, 11, 1), None, 2.99, "usage", None),
        ]
        # month, team, entity, project, model, price basis, users, GPU-h, $, unpriced GPU-h, idle GPU-h, idle $,
        # failed GPU-h, $
        assert cost == [
            (date(2026, 10, 1), "research", "e", "p", "H100-80GB", "list", 1, 4.0, 11.96, 0.0, 0.5, 1.495, 0.0, 0.0),
            (date(2026, 11, 1), "research", "e", "p", "A100-40GB", "list", 1, 6.0, 7.74, 0.0, 0.0, 0.0, 6.0, 7.74),
            (date(2026, 11, 1), "research", "e", "p", "H100-80GB", "list", 1, 4.0, 11.96, 0.0, 1.0, 2.99, 0.0, 0.0),
            (date(2026, 11, 1), "unassigned", "e", "p", None, "unpriced", 1, 4.0, None, 4.0, 0.0, None, 0.0, None),
        ]
        # weeks from Monday: r1 (2 GPUs x 4 h, Oct 31 - Nov 1: 8 GPU-hours) and its 1.5 idle GPU-hours ($4.485) in
        # the week of Oct 26, with the ladder's one told episode and one recorded stop; bob's and carol's runs in the
        # week of Nov 2
        assert rows(con, "SELECT * FROM analytics.idle_by_user_weekly ORDER BY ALL") == [
            (date(2026, 10, 26), "alice", "research", 8.0, 1.5, 4.485, 1, 0, 1, 0, "e/p/r1", 0.5),
            (date(2026, 11, 2), "bob", "research", 6.0, 0.0, 0.0, 0, 0, 0, 0, None, None),
            (date(2026, 11, 2), "carol", "unassigned", 4.0, 0.0, None, 0, 0, 0, 0, None, None),
        ]
        # the budget in force: research's 2026-11 row from November, its 2026-01 row before; none for unassigned
        assert rows(
            con,
            "SELECT month, team, spend_usd, budget_usd, over_budget FROM analytics.team_budget_vs_spend ORDER BY ALL",
        ) == [
            (date(2026, 10, 1), "research", 11.96, 250000.0, False),
            (date(2026, 11, 1), "research", 19.7, 300000.0, False),
            (date(2026, 11, 1), "unassigned", None, None, None),
        ]
        assert rows(
            con,
            "SELECT run_id, team, gpu_hours, idle_gpu_hours, idle_share, cost_usd, steps_per_gpu_hour "
            "FROM analytics.run_efficiency ORDER BY run_id",
        ) == [
            ("r1", "research", 8.0, 1.5, 0.1875, 23.92, 2160000.0),
            ("r2", "research", 6.0, None, None, 7.74, None),
            ("r3", "unassigned", 4.0, None, None, None, None),
        ]
        assert rows(con, "SELECT * FROM analytics.fleet_health_daily ORDER BY day") == [
            (date(2026, 10, 31), 1, 0, 0, 0, None, 4.0, 11.96, 0.5, 12.5, 0.0),
            (date(2026, 11, 1), 0, 1, 0, 0, 100.0, 4.0, 11.96, 1.0, 25.0, 0.0),
            (date(2026, 11, 2), 1, 0, 1, 0, 0.0, 6.0, 7.74, 0.0, 0.0, 100.0),
            (date(2026, 11, 3), 1, 1, 0, 0, 100.0, 4.0, None, 0.0, 0.0, 0.0),
        ]
    finally:
        con.close()
    check_compares_the_money_marts_and_the_chargeback_with_gpu_usage(warehouse_path, tmp_path)
    # the chargeback file: cents, NULL as empty, the month's total equal to gpu_usage's to the cent
    code, out, err = cli(capsys, "export", "chargeback", "--month", "2026-11", "--out", str(tmp_path))
    assert (code, err) == (0, ""), err
    assert "3 rows, 14.0 GPU-hours, $19.70" in out
    with open(tmp_path / "chargeback-2026-11.csv", newline="") as f:
        written = list(csv.reader(f))
    assert written == [
        list(exports.CHARGEBACK_COLUMNS),
        [*NOV, "research", "e", "p", "A100-40GB", "list", "", "1.29", "usage", "", "1", "6.0", "7.74", "0.0", "0.0"]
        + ["0.00", "6.0", "7.74"],
        [*NOV, "research", "e", "p", "H100-80GB", "list", "", "2.99", "usage", "", "1", "4.0", "11.96", "0.0", "1.0"]
        + ["2.99", "0.0", "0.00"],
        [
            *NOV,
            "unassigned",
            "e",
            "p",
            "",
            "unpriced",
            "",
            "",
            "usage",
            "",
            "1",
            "4.0",
            "",
            "4.0",
            "0.0",
            "",
            "0.0",
            "",
        ],
    ]
    # a month the warehouse holds nothing of: the (empty) file, and what the warehouse covers
    code, out, err = cli(capsys, "export", "chargeback", "--month", "2026-09", "--out", str(tmp_path))
    assert (code, err) == (0, ""), err
    assert out.splitlines()[-1] == (
        "note: the warehouse holds no GPU usage in 2026-09: its data runs from 2026-10-31 to 2026-11-03 (UTC days); "
        "backfill the month to charge it (uv run wandb-assets backfill --start YYYY-MM-DD)."
    )
    code, out, _ = cli(capsys, "export", "runs", "--since", "2026-11-01", "--out", str(tmp_path), "--format", "csv")
    assert code == 0 and "Wrote 2 runs created since 2026-11-01" in out
    code, _, err = cli(capsys, "export", "chargeback", "--month", "2026-11-01", "--out", str(tmp_path))
    assert (code, err.strip()) == (2, "error: --month must be a month as YYYY-MM, e.g. 2026-10 (got '2026-11-01').")
    # dbt itself from the CLI: a model built there is in the docs page at once (issue 43), not after the next run
    from wandb_assets.defs.analytics.project import DOCS_SITE

    before = DOCS_SITE.stat().st_mtime_ns
    code, out, err = cli(capsys, "dbt", "--", "run", "-s", "marts_build")
    assert code == 0, out + err
    assert out.splitlines()[-1] == f"The docs page shows them: {DOCS_SITE} (uv run wandb-assets docs)"
    assert DOCS_SITE.stat().st_mtime_ns > before and "marts_build" in DOCS_SITE.read_text()
    check_docs_page(chromium, tmp_path)


def check_docs_page(page, tmp_path: Path) -> None:
    """`wandb-assets docs` serves the page the analytics run wrote; Chromium shows our tables and the analysts'
    models with their columns and lineage, and asks nothing of any host but loopback."""
    from tests.conftest import free_port, stop_process_group

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "wandb_assets.cli", "docs", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    elsewhere: list[str] = []
    try:
        assert f"http://127.0.0.1:{port}/" in server.stdout.readline()
        page.route("**/*", lambda route, _request: _routed(route, elsewhere, port))
        page.goto(f"http://127.0.0.1:{port}/#!/model/model.wandb_analytics.team_gpu_cost_monthly")
        page.wait_for_selector("text=unpriced_gpu_hours", timeout=30_000)
        body = page.inner_text("body")
        assert "team_gpu_cost_monthly" in body and "stg_gpu_charges" in body  # the model, what it depends on
        assert "of gpu_hours, those without any price" in body  # a column's description
        page.goto(f"http://127.0.0.1:{port}/#!/source/source.wandb_analytics.warehouse.runs")
        page.wait_for_selector("text=curves_status", timeout=30_000)
        assert "W&B run id (the `name` of the GraphQL node)" in page.inner_text("body")  # schema_docs' text
        page.screenshot(path=str(tmp_path / "dbt-docs.png"), full_page=True)
        artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "dbt-docs.png"))
    finally:
        stop_process_group(server)
    assert elsewhere == []


def _routed(route, elsewhere: list[str], port: int):
    url = route.request.url
    if url.startswith((f"http://127.0.0.1:{port}/", "data:", "blob:")):
        return route.continue_()
    elsewhere.append(url)
    return route.abort()


def check_compares_the_money_marts_and_the_chargeback_with_gpu_usage(warehouse_path: Path, tmp_path: Path) -> None:
    """On the hand-worked test's build (a dbt build is ~40 s): marts_reconcile holds on the built warehouse (Nov:
    $19.70 in gpu_usage, the mart and the file); a cent added to one mart row, or to a team's spend, is named with its
    month; a gpu_usage built again since the marts is not compared with them (they are made again after it)."""
    import shutil

    from wandb_assets.lib.checks import broken, check_warehouse

    def marts(path: Path, change: str | None = None) -> list[tuple]:
        copy = tmp_path / f"copy-{len(list(tmp_path.glob('copy-*')))}.duckdb"
        shutil.copy(path, copy)
        con = duckdb.connect(str(copy))
        try:
            if change:
                con.execute(change)
            found = {i.name: (n, rows) for i, n, rows in check_warehouse(con, NOW, 5.0)}
            assert [line for line in broken(con, NOW, 5.0) if not line.startswith("marts_reconcile")] == []
            return found["marts_reconcile"][1]
        finally:
            con.close()

    con = duckdb.connect(str(warehouse_path), read_only=True)
    try:
        build = con.execute("SELECT value FROM warehouse_meta WHERE key = 'gpu_usage_build'").fetchone()[0]
        assert con.execute("SELECT gpu_usage_build FROM analytics.marts_build").fetchall() == [(build,)]
        assert con.execute(
            f"SELECT month, sum(cost_usd)::DOUBLE FROM ({exports.chargeback_sql('true')}) GROUP BY 1 ORDER BY 1"
        ).fetchall() == [("2026-10", 11.96), ("2026-11", 19.70)]
    finally:
        con.close()
    assert marts(warehouse_path) == []
    one_row = "UPDATE analytics.team_gpu_cost_monthly SET cost_usd = cost_usd + 0.01 WHERE gpu_model = 'A100-40GB'"
    assert sorted(marts(warehouse_path, one_row), key=str) == [  # the file is made from the mart: a cent off too
        ("chargeback file", date(2026, 11, 1), 19.7, 19.71, 0.0, None),
        ("team_gpu_cost_monthly", date(2026, 11, 1), 19.7, 19.71, 14.0, 14.0),
    ]
    spend = "UPDATE analytics.team_budget_vs_spend SET spend_usd = spend_usd + 0.01 WHERE month = DATE '2026-10-01'"
    assert marts(warehouse_path, spend) == [("team_budget_vs_spend", date(2026, 10, 1), 11.96, 11.97, None, None)]
    hours = "UPDATE analytics.team_gpu_cost_monthly SET idle_gpu_hours = 0 WHERE month = DATE '2026-10-01'"
    assert [r[:2] for r in marts(warehouse_path, hours)] == [("team_gpu_cost_monthly", date(2026, 10, 1))]
    # gpu_usage built again after the marts: they wait for the next analytics run, nothing to compare
    rebuilt = 'UPDATE analytics.marts_build SET gpu_usage_build = \'{"now": "an earlier build"}\''
    assert marts(warehouse_path, f"{rebuilt}; {one_row}") == []


@pytest.mark.slow
@pytest.mark.breaks_invariants  # a duplicate run is the point
def test_a_duplicate_run_fails_the_source_test_as_a_failed_asset_check_and_pages(warehouse_path, instance):
    from wandb_assets.ticks import execute_analytics, settle_pipeline_alert

    build_hand_made_warehouse(warehouse_path, duplicate="r2")
    result = execute_analytics(instance, docs=False)
    assert not result.success
    failed = {
        (e.event_specific_data.asset_key.to_user_string(), e.event_specific_data.check_name)
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed
    }
    assert failed == {("stg_runs", "unique_combination_stg_runs_entity__project__run_id")}
    # and the source test on runs itself failed in the same build: the run failed naming it
    assert "source_unique_combination_warehouse_runs_entity__project__run_id" in str(
        [e.event_specific_data for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    ) or any(
        "source_unique_combination_warehouse_runs" in str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    )
    # the UI's view: the check's latest execution on the runs asset failed
    from dagster import AssetCheckKey, AssetKey

    key = AssetCheckKey(AssetKey("stg_runs"), "unique_combination_stg_runs_entity__project__run_id")
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert record.evaluation.passed is False
    # the marts built from runs were not built from the broken table (dbt skips what depends on a failed test)
    con = duckdb.connect(str(warehouse_path), read_only=True)
    try:
        assert con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'analytics' AND table_name = 'run_efficiency'"
        ).fetchone() == (0,)
    finally:
        con.close()
    # and pipeline_failure opens the analytics job's alert, as the run-failure sensor does
    settle_pipeline_alert(instance, result)
    con = duckdb.connect(str(warehouse_path), read_only=True)
    try:
        assert con.execute("SELECT alert_key, resolved_at FROM alerts WHERE rule = 'pipeline_failure'").fetchall() == [
            ("pipeline_failure:analytics", None)
        ]
    finally:
        con.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 10_000, allow_nan=False)), min_size=1, max_size=30))
def test_the_chargeback_cents_add_up_to_the_months_total_to_the_cent(costs):
    """Each row within a cent of its own dollars, and the rows' cents summing to the month's total rounded."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("CREATE SCHEMA analytics")
        con.execute(
            "CREATE TABLE analytics.team_gpu_cost_monthly (month DATE, team VARCHAR, entity VARCHAR, project VARCHAR, "
            "gpu_model VARCHAR, price_basis VARCHAR, price_from DATE, usd_per_gpu_hour DOUBLE, "
            "charge_category VARCHAR DEFAULT 'usage', adjustment_of DATE, users BIGINT, gpu_hours DOUBLE, "
            "cost_usd DOUBLE, unpriced_gpu_hours DOUBLE, idle_gpu_hours DOUBLE, idle_cost_usd DOUBLE, "
            "failed_gpu_hours DOUBLE, failed_cost_usd DOUBLE, first_day DATE, last_day DATE)"
        )
        con.execute("CREATE TABLE closed_months (month DATE)")
        con.executemany(
            "INSERT INTO analytics.team_gpu_cost_monthly (month, team, entity, project, cost_usd) "
            "VALUES ('2026-10-01', ?, 'e', 'p', ?)",
            [(f"t{i:02d}", cost) for i, cost in enumerate(costs)],
        )
        written = dict(
            con.execute(
                f"SELECT team, cost_usd FROM ({exports.CHARGEBACK_SQL})", {"month": date(2026, 10, 1)}
            ).fetchall()
        )
    finally:
        con.close()
    priced = [c for c in costs if c is not None]
    assert [written[f"t{i:02d}"] is None for i in range(len(costs))] == [c is None for c in costs]
    for i, cost in enumerate(costs):
        if cost is not None:
            assert abs(float(written[f"t{i:02d}"]) - cost) < 0.01 + 1e-9
    total = sum(v for v in written.values() if v is not None)
    assert (
        total == (round(sum(priced) * 100) / 100 if priced else 0) or abs(float(total) - round(sum(priced), 2)) < 1e-9
    )


def test_analytics_runs_after_each_feed_or_backfill_unless_off_or_in_flight(instance, monkeypatch):
    from dagster import (
        DagsterEvent,
        DagsterEventType,
        DagsterRun,
        DagsterRunStatus,
        RunRequest,
        SkipReason,
        build_run_status_sensor_context,
    )

    from wandb_assets.defs.analytics.jobs import analytics_after_feed

    feed_run = DagsterRun(
        job_name="feed", run_id="f" * 8 + "-0000-0000-0000-" + "0" * 12, status=DagsterRunStatus.SUCCESS
    )
    instance.add_run(feed_run)

    def evaluate():
        context = build_run_status_sensor_context(
            sensor_name="analytics_after_feed",
            dagster_event=DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name="feed"),
            dagster_instance=instance,
            dagster_run=feed_run,
        )
        return analytics_after_feed(context)

    monkeypatch.setenv("WANDB_ASSETS_ANALYTICS", "true")
    request = evaluate()
    assert isinstance(request, RunRequest) and request.run_key == f"after:{feed_run.run_id}"
    monkeypatch.setenv("WANDB_ASSETS_ANALYTICS", "false")
    assert isinstance(evaluate(), SkipReason)
    monkeypatch.setenv("WANDB_ASSETS_ANALYTICS", "true")
    instance.add_run(
        DagsterRun(
            job_name="analytics", run_id="a" * 8 + "-0000-0000-0000-" + "0" * 12, status=DagsterRunStatus.STARTED
        )
    )
    skipped = evaluate()
    assert isinstance(skipped, SkipReason) and "1 analytics run(s) still in flight" in skipped.skip_message


def _million_run_snapshot(path: Path) -> None:
    """A warehouse snapshot of 1,000,000 runs with real-sized config and summary JSON (~1.3 KB a run)."""
    con = duckdb.connect(str(path))
    try:
        ensure_schema(con)
        con.execute(
            """
            INSERT INTO runs BY NAME
            SELECT 'team' AS entity, 'fleet' AS project, 'run' || lpad(i::VARCHAR, 7, '0') AS run_id,
                   'finished' AS state, 'regular' AS category, 'u' || (i % 50) AS "user",
                   TIMESTAMP '2026-10-01' + to_seconds(i * 2) AS created_at,
                   TIMESTAMP '2026-10-01' + to_seconds(i * 2 + 3600) AS ended_at, 8 AS gpu_count,
                   'H100-80GB' AS gpu_model, 23.92 AS cost_usd, 'wandb' AS source,
                   to_json({lr: i / 1e6, batch: 256, model: repeat('m', 400), seed: i, notes: repeat('x', 400)})
                       AS config,
                   to_json({_step: i, loss: 1.0 / (i + 1), "overview/sps": 1000 + i % 97, text: repeat('s', 300)})
                       AS summary,
                   ['ci', 'nightly'] AS tags
            FROM range(1000000) t(i)
            """
        )
    finally:
        con.close()


@pytest.mark.slow
def test_exporting_a_million_runs_streams_under_a_gib(tmp_path):
    snapshot = tmp_path / "big.snapshot.duckdb"
    _million_run_snapshot(snapshot)
    # Parquet only: its peak is the higher (721 vs 349 MiB measured), and CSV goes through the same streaming COPY;
    # benchmarks/bench_ingest.py measures both formats on the million-run pipeline warehouse.
    for fmt in ("parquet",):
        child = subprocess.Popen(
            [sys.executable, "-m", "wandb_assets.cli", "export", "runs", "--since", "2026-10-01", "--format", fmt,
             "--warehouse", str(snapshot), "--out", str(tmp_path / "out")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        peak_kib = 0
        while child.poll() is None:  # VmHWM: this process's own peak (ru_maxrss would carry pytest's over the fork)
            try:
                status = Path(f"/proc/{child.pid}/status").read_text()
            except OSError:
                break
            peak_kib = max(
                [peak_kib, *(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))]
            )
            time.sleep(0.01)
        out = child.communicate()[0]
        assert child.returncode == 0, out
        assert "Wrote 1,000,000 runs" in out
        assert 100 < peak_kib / 1024 < 1024, f"{fmt}: {peak_kib / 1024:.0f} MiB"
        print(f"export runs --format {fmt}: peak {peak_kib / 1024:.0f} MiB")
    exported = duckdb.sql(f"SELECT count(*), count(DISTINCT run_id) FROM '{tmp_path / 'out'}/*.parquet'").fetchone()
    assert exported == (1_000_000, 1_000_000)


def test_the_chargeback_columns_are_documented_as_the_code_defines_them():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "analytics.md").read_text()
    for column, meaning in exports.CHARGEBACK_COLUMNS.items():
        assert f"| `{column}` | {meaning} |" in guide, column


def test_the_dbt_console_log_is_appended_by_every_run_and_moved_aside_when_large(tmp_path, monkeypatch):
    """The slow tier failed by chance (issue 53): a command's analytics run truncated dbt's console log while another
    run (the daemon's, another test's) was writing it, and that run's lines were gone. Each run appends; a log past
    its size is moved aside whole, and a run still writing the old file keeps its lines there."""
    import wandb_assets.defs.analytics.project as project

    log = tmp_path / "target" / "cli-dbt.log"
    monkeypatch.setattr(project, "DBT_CONSOLE_LOG", log)
    monkeypatch.setattr(project, "DBT_CONSOLE_LOG_MAX_BYTES", 40)
    with project.open_dbt_console_log() as daemons:
        daemons.write("daemon: 1 of 2 PASS\n")
        daemons.flush()
        with project.open_dbt_console_log() as commands:  # a command's run starts meanwhile
            commands.write("command: 1 of 1 PASS\n")
        daemons.write("daemon: 2 of 2 PASS\n")
    assert log.read_text() == "daemon: 1 of 2 PASS\ncommand: 1 of 1 PASS\ndaemon: 2 of 2 PASS\n"
    with project.open_dbt_console_log() as later:  # 60 bytes > 40: the old lines are moved aside first
        later.write("later: 1 of 1 PASS\n")
    assert log.read_text() == "later: 1 of 1 PASS\n"
    assert (tmp_path / "target" / "cli-dbt.log.1").read_text().count("PASS") == 3


def test_the_docs_page_is_made_again_when_missing_stale_or_an_hour_old(tmp_path):
    from wandb_assets.defs.analytics.assets import DOCS_MAX_AGE_S, docs_due

    site, manifest = tmp_path / "index.html", tmp_path / "manifest.json"
    manifest.write_text("{}")
    os.utime(manifest, (1_000_000, 1_000_000))
    assert docs_due(site, manifest, now=1_000_100)  # missing
    site.write_text("<html>")
    os.utime(site, (1_000_050, 1_000_050))
    assert not docs_due(site, manifest, now=1_000_100)
    assert docs_due(site, manifest, now=1_000_050 + DOCS_MAX_AGE_S + 1)  # an hour old
    os.utime(manifest, (1_000_060, 1_000_060))
    assert docs_due(site, manifest, now=1_000_100)  # the project changed after the page was made


@pytest.mark.slow
def test_refresh_says_what_it_does_and_keeps_the_dbt_builds_warnings_out_of_the_terminal(
    wandb_server, dagster_home, warehouse_path, capsys, monkeypatch
):
    """A refresh that builds the analysts' models says so before the minute it takes, and dagster-dbt's notes on
    the sources' tests (six WARNING blocks every build) stay in the run's log unless --verbose."""
    from tests.conftest import cli
    from tests.test_pipeline_e2e import dataset

    wandb_server(dataset())
    monkeypatch.setenv("WANDB_ASSETS_ANALYTICS", "true")
    code, _, err = cli(capsys, "refresh", "--quiet")
    assert code == 0, err
    said = [line for line in err.splitlines() if line.endswith(" ...")]
    assert said == [
        "Refreshing: reading the recent days from W&B, rebuilding the tables, snapshotting the gauges ...",
        "Feeding Datadog and judging the alerts ...",
        "Building the analysts' dbt models, their tests and docs (WANDB_ASSETS_ANALYTICS; a minute or two) ...",
    ]
    assert "AssetObservation" not in err and " - WARNING - analytics - " not in err, err[-3000:]


@pytest.mark.slow  # two dbt builds and exports (90 s under a busy loop); the ledger rule is tested in the everyday tier
def test_a_closed_month_re_exports_byte_for_byte_and_a_later_change_is_an_adjustment_of_it(
    built, warehouse_path, instance, tmp_path, capsys
):
    """October (alice's r1, 4 GPU-hours of H100 at $2.99 = $11.96, team research) is closed on Nov 10; then the
    teams file moves alice to 'vision'. October's file, written again after the marts are rebuilt, is byte for byte
    the one written at closing (status closed); November bills the change as a Correction of October: -$11.96
    research, +$11.96 vision (also in the FOCUS file)."""
    from tests.conftest import cli
    from wandb_assets.lib.accounting.closing import close_month
    from wandb_assets.lib.sql import transaction
    from wandb_assets.ticks import execute_analytics

    con = duckdb.connect(str(warehouse_path))
    with transaction(con):
        close_month(con, date(2026, 10, 1), NOW)
    con.close()
    assert execute_analytics(instance).success
    out = tmp_path / "files"
    assert cli(capsys, "export", "chargeback", "--month", "2026-10", "--out", str(out))[0] == 0
    at_closing = (out / "chargeback-2026-10.csv").read_bytes()
    assert at_closing.splitlines()[1].startswith(b"2026-10,closed,2026-10-31,2026-10-31,research,e,p,H100-80GB,")

    con = duckdb.connect(str(warehouse_path))
    rebuild_gpu_usage(con, NOW, PRICES, TEAMS | {"alice": "vision"})
    con.close()
    assert execute_analytics(instance).success
    code, _, err = cli(capsys, "export", "chargeback", "--month", "2026-10", "--out", str(out), "--force")
    assert (code, err) == (0, "")
    assert (out / "chargeback-2026-10.csv").read_bytes() == at_closing
    code, _, err = cli(capsys, "export", "chargeback", "--month", "2026-11", "--out", str(out), "--format", "focus")
    assert (code, err) == (0, "")
    with open(out / "chargeback-2026-11.focus.csv", newline="") as f:
        focus = list(csv.DictReader(f))
    corrections = [
        (
            r["ChargeCategory"],
            r["ChargeClass"],
            r["ChargePeriodStart"],
            r["ChargePeriodEnd"],
            r["x_Team"],
            r["BilledCost"],
        )
        for r in focus
        if r["ChargeClass"]
    ]
    assert sorted(corrections) == [
        ("Adjustment", "Correction", "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z", "research", "-11.96"),
        ("Adjustment", "Correction", "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z", "vision", "11.96"),
    ]
    assert {r["BillingPeriodStart"] for r in focus} == {"2026-11-01T00:00:00Z"}
