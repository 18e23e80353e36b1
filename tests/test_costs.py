"""What the GPUs cost, and what the dollars leave out: the fallback price, the priced share next to every cost, a
price key naming no model, the shipped price list, ``wandb-assets costs`` and gpu_usage's metadata (issue 33).

The small fleet, worked by hand (yesterday, UTC):
- ``h``: alice (team vision), 4 x "NVIDIA H100 80GB HBM3", 10:00-12:00: 8 GPU-hours at the file's ``H100-80G: 2.5``
  (read as H100-80GB) = $20.00.
- ``t``: bob (team applied), 1 x "Tesla T4", 10:00-11:00: 1 GPU-hour; T4 is not in the file.
- ``n``: carol (no team), 2 GPUs, no model recorded, 10:00-13:00: 6 GPU-hours.
Without a fallback price: $20.00 for 15 GPU-hours, 8 of them priced (53 %), 7 unpriced (6 with no model, 1 T4).
With ``WANDB_ASSETS_GPU_DEFAULT_PRICE=1.5``: t $1.50 and n $9.00, labelled fallback; $30.50 in all.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from wandb_assets.lib.accounting.costs import cost_summary, coverage_sentence, format_costs
from wandb_assets.lib.accounting.prices import prices_today
from wandb_assets.lib.errors import ConfigError
from wandb_assets.settings import SHIPPED_GPU_PRICES, pipeline_settings


def _fleet(day: datetime) -> list:
    from wandb_assets.localwandb import make_run_node

    def node(run_id, user, hours, config):
        return make_run_node(
            run_id,
            display_name=None,
            state="finished",
            created_at=day + timedelta(hours=10),
            heartbeat_at=day + timedelta(hours=10 + hours),
            config={"compute": config},
            username=user,
        )

    return [
        node("h", "alice", 2, {"gpu_count": 4, "gpu_type": "NVIDIA H100 80GB HBM3"}),
        node("t", "bob", 1, {"gpu_count": 1, "gpu_type": "Tesla T4"}),
        node("n", "carol", 3, {"gpu_count": 2}),
    ]


@pytest.fixture
def priced_fleet(wandb_server, warehouse_path, instance, monkeypatch, tmp_path):
    """The fleet above backfilled (no fallback price yet); returns (backfill, yesterday)."""
    from wandb_assets.ticks import execute_backfill

    day = datetime.now(UTC).replace(tzinfo=None, hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    wandb_server(_fleet(day))
    (tmp_path / "prices.yaml").write_text("H100-80G: 2.5\nHopper: 9.0\n")
    (tmp_path / "teams.yaml").write_text("vision: [alice]\napplied: [bob]\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_PRICES", str(tmp_path / "prices.yaml"))
    monkeypatch.setenv("WANDB_ASSETS_TEAMS", str(tmp_path / "teams.yaml"))

    def backfill():
        result = execute_backfill(instance, day.date(), day.date())
        assert result.success
        return result

    return backfill, day


def _rows(table) -> list[tuple]:
    return [tuple(r.data.values()) for r in table.records]


def _costs_cli(warehouse_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "costs", "--warehouse", str(warehouse_path), *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
    )


def test_costs_state_the_unpriced_share_and_a_fallback_price_prices_the_rest_labelled_as_such(
    priced_fleet, warehouse_path, monkeypatch, instance, tmp_path
):
    from wandb_assets.warehouse import query_read_only

    backfill, day = priced_fleet
    result = backfill()
    meta = result.asset_materializations_for_node("gpu_usage")[0].metadata
    assert meta["priced_gpu_hours_pct_30d"].value == 53.3  # 8 of 15
    assert [c.name for c in meta["cost_by_team_30d"].schema.columns] == ["team", "USD", "priced"]
    assert _rows(meta["cost_by_team_30d"]) == [
        ("vision", "$20.00", "100%"),
        ("unassigned", "-", "0%"),  # no price: by GPU-hours
        ("applied", "-", "0%"),
        ("total", "$20.00", "53%"),
    ]
    assert _rows(meta["cost_by_project_30d"])[0] == ("test-team/test-project", "$20.00", "53%")
    assert meta["cost_coverage"].value == (
        "7.0 GPU-hours (47%) have no price and are not in the dollars: no model recorded (6.0), T4 (1.0). "
        "Price them in WANDB_ASSETS_GPU_PRICES, or set WANDB_ASSETS_GPU_DEFAULT_PRICE."
    )
    # the key that names no GPU model is warned about by name; H100-80G reads as H100-80GB and prices it
    assert meta["unknown_price_keys"].value == "Hopper"
    logged = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert [m for m in logged if "Hopper" in m] == [
        "WANDB_ASSETS_GPU_PRICES prices 'Hopper', which names no GPU model this project knows: it applies only to "
        "runs recording exactly that name (see docs/gpu-accounting.md for the model names)."
    ]
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY run_id") == [
        ("h", 20.0),
        ("n", None),
        ("t", None),
    ]

    # a fallback price set later holds from the day it is first seen (yesterday's hours stay unpriced); one set on a
    # warehouse's first record holds since always: the same fleet into a new warehouse
    monkeypatch.setenv("WANDB_ASSETS_GPU_DEFAULT_PRICE", "1.5")
    backfill()
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY run_id")[1:] == [
        ("n", None),
        ("t", None),
    ]
    for leftover in (warehouse_path, warehouse_path.with_suffix(".duckdb.wal")):
        leftover.unlink(missing_ok=True)
    meta = backfill().asset_materializations_for_node("gpu_usage")[0].metadata
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY run_id") == [
        ("h", 20.0),
        ("n", 9.0),  # 2 GPUs x 3 h x $1.5
        ("t", 1.5),
    ]
    assert query_read_only(
        warehouse_path, "SELECT team, gpu_model, gpu_hours, cost_usd, price_basis FROM gpu_usage ORDER BY team"
    ) == [
        ("applied", "T4", 1.0, 1.5, "fallback"),
        ("unassigned", None, 6.0, 9.0, "fallback"),
        ("vision", "H100-80GB", 8.0, 20.0, "list"),
    ]
    assert _rows(meta["cost_by_team_30d"]) == [
        ("vision", "$20.00", "100%"),
        ("unassigned", "$9.00", "100%"),
        ("applied", "$1.50", "100%"),
        ("total", "$30.50", "100%"),
    ]
    assert meta["cost_coverage"].value == (
        "Every GPU-hour is priced, 7.0 of them at the fallback price (WANDB_ASSETS_GPU_DEFAULT_PRICE)."
    )

    # the CLI, as a user runs it: the same table, from the snapshot, with the warning about the key
    done = _costs_cli(warehouse_path, "--by", "model", "--days", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "warning: WANDB_ASSETS_GPU_PRICES prices 'Hopper', which names no GPU model this project knows."
    assert lines[1] == (
        f"GPU cost by model, {day.date()} to {day.date() + timedelta(days=1)} UTC (2 days, the last one so far):"
    )
    wide = _costs_cli(warehouse_path, "--by", "model", "--days", "30").stdout.splitlines()[1]
    assert wide == (  # a window reaching before the warehouse's first day says how much of it the warehouse holds
        f"GPU cost by model, {day.date() - timedelta(days=28)} to {day.date() + timedelta(days=1)} UTC (30 days, the "
        f"last one so far; the warehouse holds 2 of them, from {day.date()}: the dollars of the days before are not "
        "in it):"
    )
    assert [line.split() for line in lines[2:8]] == [
        ["model", "GPU-hours", "USD", "priced", "fallback", "GPU-h", "unpriced", "GPU-h", "idle", "GPU-h"],
        ["H100-80GB", "8.0", "$20.00", "100%", "0.0", "0.0", "0.0"],
        ["(no", "model)", "6.0", "$9.00", "100%", "6.0", "0.0", "0.0"],
        ["T4", "1.0", "$1.50", "100%", "1.0", "0.0", "0.0"],
        ["----------", "---------", "------", "------", "--------------", "--------------", "----------"],
        ["total", "15.0", "$30.50", "100%", "7.0", "0.0", "0.0"],
    ]
    assert "note:" not in done.stdout  # built with the settings in force

    # the teams file and the fallback price changed since the last build: the figures say they are the build's
    (tmp_path / "teams.yaml").write_text("vision: [alice, carol]\napplied: [bob]\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_DEFAULT_PRICE", "2.0")
    done = _costs_cli(warehouse_path, "--by", "team")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("note: these figures are as of the last refresh (")
    assert done.stdout.splitlines()[-1].endswith(
        " UTC), built with other teams and prices than the settings now: run `uv run wandb-assets refresh` to apply "
        "them."
    )


def test_costs_by_each_grouping_over_the_days_asked(priced_fleet, warehouse_path):
    from wandb_assets.warehouse import reading

    backfill, day = priced_fleet
    backfill()
    today = day.date() + timedelta(days=1)
    with reading(warehouse_path) as con:
        by_user = cost_summary(con, "user", today, 2)
        by_project = cost_summary(con, "project", today, 2)
        today_only = cost_summary(con, "team", today, 1)
    assert [(line.name, line.gpu_hours, line.cost_usd) for line in by_user.lines] == [
        ("alice", 8.0, 20.0),
        ("carol", 6.0, None),
        ("bob", 1.0, None),
    ]
    assert [(line.name, line.priced_pct) for line in by_project.lines] == [("test-team/test-project", 800 / 15)]
    assert today_only.lines == () and today_only.total.gpu_hours == 0
    assert format_costs(today_only).endswith("no GPU-hours in these days.")
    assert coverage_sentence(by_user).startswith("7.0 GPU-hours (47%) have no price")


def test_costs_without_a_snapshot_exit_2_with_one_sentence(tmp_path):
    done = _costs_cli(tmp_path / "none.duckdb")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: No warehouse snapshot at")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "two"])
def test_a_fallback_price_that_is_no_price_is_one_sentence(value):
    with pytest.raises(ConfigError) as caught:
        pipeline_settings({"WANDB_PROJECT": "p", "WANDB_ASSETS_GPU_DEFAULT_PRICE": value})
    assert "WANDB_ASSETS_GPU_DEFAULT_PRICE" in str(caught.value)
    assert str(caught.value).count(".") >= 1 and "\n" not in str(caught.value)


def test_the_shipped_price_list_covers_current_gpus_and_says_when_and_where_from():
    from wandb_assets.lib.accounting.gpus import canonical_gpu_model

    prices = pipeline_settings({"WANDB_PROJECT": "p"}).gpu_prices
    recorded = [  # names W&B records for current data-centre and workstation GPUs
        "NVIDIA H200",
        "NVIDIA B200",
        "NVIDIA GH200 480GB",
        "NVIDIA L40S",
        "NVIDIA L4",
        "NVIDIA RTX 6000 Ada Generation",
        "AMD Instinct MI300X",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "Tesla T4",
    ]
    assert [name for name in recorded if canonical_gpu_model(name)[0] not in prices_today(prices)] == []
    assert pipeline_settings({"WANDB_PROJECT": "p"}).unknown_price_keys == ()
    header = SHIPPED_GPU_PRICES.read_text().split("\n\n")[0]
    assert "As of 2026-11" in header and "Source:" in header


def test_metadata_files_that_fail_are_counted_by_cause_and_costs_says_the_model_could_not_be_read(
    wandb_server, warehouse_path, instance
):
    """Storage answers 404 for every wandb-metadata.json the pages list (issue 43: 426 of 436 failed and the warehouse
    then said "no model recorded" for every GPU-hour): the fetch counts the failures by cause at its end, each run
    keeps the cause (never the URL), costs says the models could not be read; a later fetch reads them."""
    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    day = datetime.now(UTC).replace(tzinfo=None, hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    h100 = {"gpu_count": 2, "gpu": "NVIDIA H100 80GB HBM3"}
    nodes = [
        make_run_node(f"r{i}", display_name=None, state="finished", created_at=day + timedelta(hours=10 + i),
                      heartbeat_at=day + timedelta(hours=11 + i), metadata=h100)
        for i in range(3)
    ]  # fmt: skip
    server = wandb_server(nodes)
    server.faults.file_status = 404
    result = execute_backfill(instance, day.date(), day.date())
    assert result.success
    meta = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert (meta["metadata_files"].value, meta["metadata_failures_by_cause"].value) == ({"error": 3}, {"HTTP 404": 3})
    warned = [e.user_message for e in instance.all_logs(result.run_id) if "could not be read" in e.user_message]
    assert warned == [
        "3 of 3 wandb-metadata.json files could not be read: HTTP 404 (3). Their runs' GPU model is unknown (GPU count "
        "from config or the system metrics) until a later fetch reads them; `wandb-assets costs` counts them."
    ]
    stored = "SELECT run_id, gpu_model, wandb_metadata FROM runs ORDER BY 1"
    assert [(r, m, json.loads(kept)["status"], json.loads(kept)["cause"], json.loads(kept)["attempts"])
            for r, m, kept in query_read_only(warehouse_path, stored)] == [
        (f"r{i}", None, "error", "HTTP 404", 1) for i in range(3)
    ]  # fmt: skip
    done = _costs_cli(warehouse_path, "--by", "model", "--days", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "3 run(s)' GPU model could not be read (their wandb-metadata.json: HTTP 404 (3)): their GPU-hours count as no "
        "model recorded until a later fetch reads them."
    )
    server.faults.file_status = None  # storage answers again: a fetch within the hour asks nothing (issue 53) ...
    server.file_downloads.clear()
    assert execute_backfill(instance, day.date(), day.date()).success
    assert server.file_downloads == []
    con = duckdb.connect(str(warehouse_path))  # ... the next one after it (the reads an hour older) reads them
    con.execute("UPDATE runs SET wandb_metadata = json_merge_patch(wandb_metadata, "
                "json_object('asked_at', (now()::TIMESTAMP - INTERVAL 2 HOUR)::VARCHAR))")  # fmt: skip
    con.close()
    assert execute_backfill(instance, day.date(), day.date()).success
    assert [row[:2] for row in query_read_only(warehouse_path, stored)] == [(f"r{i}", "H100-80GB") for i in range(3)]
    assert "could not be read" not in _costs_cli(warehouse_path, "--by", "model", "--days", "2").stdout
