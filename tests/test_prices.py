"""Issue 52: dollars a finance team can close a month on. Dated prices (an edit of the price file never re-prices the
past; a dated period applies from its day; a run spanning a change is split at UTC midnight), per-cluster rules (the
first matching rule wins), closed months (a late run becomes an adjustment in the first open month; the closed month
never moves), and the upgrade of a warehouse priced before periods were kept. Every number worked out by hand."""

from __future__ import annotations

import json
import os
from datetime import date, datetime, timedelta

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.fleet import fleet_row
from wandb_assets.lib.accounting.closing import ClosingRefused, close_month
from wandb_assets.lib.accounting.prices import (
    PRICE_SCHEDULE_CTE,
    parse_prices,
    price_on_sql,
    priced_sql,
    record_prices,
    with_fallback,
)
from wandb_assets.lib.checks import broken
from wandb_assets.lib.derived import rebuild_gpu_usage
from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.sql import transaction
from wandb_assets.lib.warehouse import ensure_schema, load_runs_window, stage_rows


def _run(run_id: str, created: datetime, hours: float, gpus: int = 8, **extra) -> dict:
    ended = created + timedelta(hours=hours)
    return fleet_row(run_id, "finished", "regular", created, ended, gpus) | {
        "gpu_model": "H100-80GB",
        "user": "ana",
        **extra,
    }


def _load(con, rows: list[dict], at: datetime, prices) -> None:
    """Load ``rows`` (their creation days' window) as a refresh at ``at`` reading ``prices``."""
    path, _ = stage_rows(rows)
    try:
        start = min(r["created_at"] for r in rows).replace(hour=0, minute=0)
        end = max(r["created_at"] for r in rows).replace(hour=0, minute=0) + timedelta(days=1)
        load_runs_window(con, path, start, end, prices=prices, priced_at=at)
    finally:
        os.unlink(path)


def _prices(text: str):
    return parse_prices(yaml.safe_load(text), "prices")


def _costs(con) -> dict[str, float | None]:
    return dict(con.execute("SELECT run_id, round(cost_usd, 6) FROM runs ORDER BY run_id").fetchall())


def _usage(con, month: str) -> float:
    return con.execute(
        "SELECT round(sum(cost_usd), 6) FROM gpu_usage WHERE strftime(day, '%Y-%m') = $m", {"m": month}
    ).fetchone()[0]


def test_an_undated_price_edit_takes_effect_from_the_day_first_seen_and_never_reprices_the_past(memory_con):
    """May 10: 8 H100s for 10 h at $2 = $160. On June 15 the file says $3 (undated): May stays $160 in runs and in
    gpu_usage, and a run of June 15 (8 x 1 h) costs $24; `check` holds. (Before: May became $240, check passing.)"""
    ensure_schema(memory_con)
    _load(memory_con, [_run("may", datetime(2026, 5, 10), 10)], datetime(2026, 5, 11), {"H100-80GB": 2.0})
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 1), {"H100-80GB": 2.0}, {})
    assert (_costs(memory_con), _usage(memory_con, "2026-05")) == ({"may": 160.0}, 160.0)

    june = datetime(2026, 6, 15, 9)
    _load(memory_con, [_run("june", datetime(2026, 6, 15, 1), 1)], june, {"H100-80GB": 3.0})
    rebuild_gpu_usage(memory_con, june, {"H100-80GB": 3.0}, {})
    assert _costs(memory_con) == {"june": 24.0, "may": 160.0}
    assert (_usage(memory_con, "2026-05"), _usage(memory_con, "2026-06")) == (160.0, 24.0)
    periods = memory_con.execute(
        "SELECT valid_from, usd, dated, source FROM gpu_price_periods WHERE model = 'H100-80GB' ORDER BY seq"
    ).fetchall()
    assert periods == [
        (None, 2.0, False, "file, since always (the warehouse's first record)"),
        (date(2026, 6, 15), 3.0, False, "file, from the day first seen"),
    ]
    assert broken(memory_con, june) == []


def test_a_dated_period_applies_from_its_day_and_a_run_spanning_it_is_split_at_midnight(memory_con):
    """$2 until June 10, $3 from June 10 (dated). ``before``: June 9 02:00-04:00 (8 x 2 h x $2 = $32); ``after``: June
    10 02:00-04:00 ($48); ``across``: June 9 12:00 to June 10 12:00: 8 x 12 h at $2 + 8 x 12 h at $3 = $192 + $288 =
    $480, in gpu_usage as two days each with its period."""
    ensure_schema(memory_con)
    prices = _prices("H100-80GB:\n  - {usd: 2.0}\n  - {from: 2026-06-10, usd: 3.0}\n")
    rows = [
        _run("before", datetime(2026, 6, 9, 2), 2),
        _run("after", datetime(2026, 6, 10, 2), 2),
        _run("across", datetime(2026, 6, 9, 12), 24),
    ]
    _load(memory_con, rows, datetime(2026, 6, 11), prices)
    assert _costs(memory_con) == {"across": 480.0, "after": 48.0, "before": 32.0}
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 11), prices, {})
    assert memory_con.execute(
        "SELECT day, price_basis, price_from, usd_per_gpu_hour, gpu_hours, cost_usd FROM gpu_usage ORDER BY day"
    ).fetchall() == [
        (date(2026, 6, 9), "list", None, 2.0, 16.0 + 96.0, 224.0),
        (date(2026, 6, 10), "list", date(2026, 6, 10), 3.0, 16.0 + 96.0, 336.0),
    ]
    assert broken(memory_con, datetime(2026, 6, 11)) == []


def test_a_hostname_rule_prices_its_runs_first_match_wins_else_the_models_price(memory_con):
    """H100s: hosts cw-* $1.50 (first rule), hosts cw-old-* $9 (never reached for cw-old-1: cw-* comes first),
    projects e/reserved $1.00, else $3.00. 8 GPUs x 1 h each: cw-1 $12, cw-old-1 $12, gpu-7 in e/reserved $8, gpu-7
    elsewhere $24, no hostname $24."""
    ensure_schema(memory_con)
    prices = _prices(
        "H100-80GB:\n  - {usd: 1.5, hosts: 'cw-*'}\n  - {usd: 9, hosts: [cw-old-*]}\n"
        "  - {usd: 1.0, projects: e/reserved}\n  - {usd: 3.0}\n"
    )
    t = datetime(2026, 6, 1, 1)
    rows = [
        _run("a", t, 1, hostname="cw-1"),
        _run("b", t, 1, hostname="cw-old-1"),
        _run("c", t, 1, hostname="gpu-7") | {"entity": "e", "project": "reserved"},
        _run("d", t, 1, hostname="gpu-7"),
        _run("e", t, 1),
    ]
    _load(memory_con, rows, datetime(2026, 6, 2), prices)
    assert _costs(memory_con) == {"a": 12.0, "b": 12.0, "c": 8.0, "d": 24.0, "e": 24.0}
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 2), prices, {})
    assert memory_con.execute("SELECT price_basis, sum(cost_usd) FROM gpu_usage GROUP BY 1 ORDER BY 1").fetchall() == [
        ("hosts cw-*", 24.0),
        ("list", 48.0),
        ("projects e/reserved", 8.0),
    ]
    assert broken(memory_con, datetime(2026, 6, 2)) == []


@pytest.mark.breaks_invariants
def test_a_late_run_into_a_closed_month_is_an_adjustment_in_the_first_open_month_and_the_month_never_moves(
    memory_con,
):
    """May holds one run (8 x 10 h x $2 = $160) and is closed on June 2. On June 20 an offline-style late May run
    arrives (8 x 5 h = $80) and the teams file moves ana to 'vision': May's billed rows stay as closed ($160,
    team unassigned); June bills an adjustment of May: -$160 unassigned, +$240 vision; `check` holds, and fails
    once May's record is altered."""
    ensure_schema(memory_con)
    prices = {"H100-80GB": 2.0}
    _load(memory_con, [_run("may1", datetime(2026, 5, 10), 10)], datetime(2026, 5, 11), prices)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 2), prices, {})
    with transaction(memory_con):
        record = close_month(memory_con, date(2026, 5, 1), datetime(2026, 6, 2))
    assert (record["gpu_hours"], record["cost_usd"], record["first_day"]) == (80.0, 160.0, date(2026, 5, 10))
    closed = memory_con.execute("SELECT * FROM gpu_charges WHERE month = '2026-05-01' ORDER BY ALL").fetchall()

    _load(memory_con, [_run("may2", datetime(2026, 5, 20), 5)], datetime(2026, 6, 20), prices)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 20), prices, {"ana": "vision"})
    assert memory_con.execute("SELECT * FROM gpu_charges WHERE month = '2026-05-01' ORDER BY ALL").fetchall() == closed
    assert memory_con.execute(
        "SELECT month, charge_category, adjustment_of, team, gpu_hours, cost_usd FROM gpu_charges "
        "ORDER BY month, cost_usd"
    ).fetchall() == [
        (date(2026, 5, 1), "usage", None, "unassigned", 80.0, 160.0),
        (date(2026, 6, 1), "adjustment", date(2026, 5, 1), "unassigned", -80.0, -160.0),
        (date(2026, 6, 1), "adjustment", date(2026, 5, 1), "vision", 120.0, 240.0),
    ]
    assert broken(memory_con, datetime(2026, 6, 20)) == []
    with pytest.raises(
        ClosingRefused, match="2026-05 was closed at 2026-06-02 00:00 UTC: a closed month never changes"
    ):
        close_month(memory_con, date(2026, 5, 1), datetime(2026, 6, 20))
    with pytest.raises(ClosingRefused, match="2026-06 is not over"):
        close_month(memory_con, date(2026, 6, 1), datetime(2026, 6, 20))
    memory_con.execute("UPDATE closed_month_charges SET cost_usd = 150 WHERE month = '2026-05-01'")
    memory_con.execute("UPDATE gpu_charges SET cost_usd = 150 WHERE month = '2026-05-01'")
    assert [line.split(":")[0] for line in broken(memory_con, datetime(2026, 6, 20))] == [
        "closed_months_never_move",
        "charges_reconcile_with_usage",  # May is billed $10 short
    ]


def test_costs_name_the_periods_and_rules_that_priced_them_and_the_closed_months_they_reach(memory_con):
    """May (8 x 10 h on a dc host at $2 = $160) is closed on June 2. By June 20 a late May run (8 x 5 h, $80), a June
    run on the cw cluster (8 x 2 h at its $1.50) and one after the period dated June 15 (1 x 4 h at $3) arrive.
    `costs` over 45 days names each period and rule with its GPU-hours, and says May bills $160 as closed and its
    +40 GPU-hours, +$80 are billed as adjustments."""
    from wandb_assets.lib.accounting.costs import cost_summary, format_costs

    ensure_schema(memory_con)
    prices = _prices('H100-80GB:\n  - {usd: 2.0}\n  - {hosts: "cw-*", usd: 1.5}\n  - {from: 2026-06-15, usd: 3.0}\n')
    _load(memory_con, [_run("may1", datetime(2026, 5, 10), 10, hostname="dc-1")], datetime(2026, 5, 11), prices)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 2), prices, {})
    with transaction(memory_con):
        close_month(memory_con, date(2026, 5, 1), datetime(2026, 6, 2))
    _load(memory_con, [_run("may2", datetime(2026, 5, 20), 5, hostname="dc-1")], datetime(2026, 6, 20), prices)
    june = [
        _run("june1", datetime(2026, 6, 16), 2, hostname="cw-1"),
        _run("june2", datetime(2026, 6, 16, 5), 4, gpus=1, hostname="dc-2"),
    ]
    _load(memory_con, june, datetime(2026, 6, 20), prices)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 20), prices, {})
    text = format_costs(cost_summary(memory_con, "model", date(2026, 6, 20), 45))
    assert "  H100-80GB      140.0  $276.00    100%" in text  # 120 x 2 + 16 x 1.5 + 4 x 3
    assert text.splitlines()[-5:] == [
        "Priced at:",
        "  H100-80GB: $2.00 an hour (since always), 120.0 GPU-hours",
        "  H100-80GB: $3.00 an hour (from 2026-06-15), 4.0 GPU-hours",
        "  H100-80GB: $1.50 an hour (since always, hosts cw-*), 16.0 GPU-hours",
        "2026-05 is closed (at 2026-06-02 00:00 UTC, by wandb-assets close): its chargeback bills $160.00 as recorded "
        "then; the figures above are its usage as computed now, and what changed in it since (+40.0 GPU-hours, "
        "+$80.00) is billed as adjustments in later months.",
    ]


def test_the_upgrade_of_a_warehouse_priced_before_periods_keeps_its_dollars(memory_con):
    """A warehouse that priced its runs at $2 (warehouse_meta gpu_prices, before periods were kept) upgraded while the
    file says $3: the $2 is recorded since always and the $3 from the day of the upgrade; May's $160 stays."""
    ensure_schema(memory_con)  # the upgrade made gpu_price_periods, empty
    memory_con.execute(
        "INSERT INTO warehouse_meta VALUES ('gpu_prices', $v)", {"v": json.dumps([{"model": "H100-80GB", "usd": 2.0}])}
    )
    _load(memory_con, [_run("may", datetime(2026, 5, 10), 10)], datetime(2026, 6, 20), {"H100-80GB": 3.0})
    assert _costs(memory_con) == {"may": 160.0}
    assert memory_con.execute("SELECT valid_from, usd, source FROM gpu_price_periods ORDER BY seq").fetchall() == [
        (None, 2.0, "the prices the warehouse had priced with before periods were kept"),
        (date(2026, 6, 20), 3.0, "file, from the day first seen"),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("H100-80GB:\n  - {usd: 2}\n  - {usd: 3}\n", "two periods of one rule without `from`"),
        ("H100-80GB:\n  - {from: 2026-06-01, usd: 2}\n  - {from: 2026-06-01, usd: 3}\n", "from 2026-06-01"),
        ("H100-80GB:\n  - {from: june, usd: 2}\n", "`from` is a UTC day as YYYY-MM-DD"),
        ("H100-80GB:\n  - {usd: 2, hosts: a, projects: b}\n", "at most one of hosts, projects or entities"),
        ("H100-80GB:\n  - {usd: 2, racks: a}\n", "at most one of hosts, projects or entities"),
        ("H100-80GB:\n  - {hosts: a}\n", "a period is {usd: 2.49}"),
        ("H100-80GB: []\n", "an empty list"),
        ("H100-80GB:\n  - {usd: 2, hosts: []}\n", "a match is a glob pattern or a list of them"),
    ],
)
def test_a_malformed_period_is_one_sentence(text, says):
    with pytest.raises(ConfigError, match=says.replace("{", r"\{").replace("}", r"\}")):
        _prices(text)


def test_recording_the_same_file_twice_adds_nothing(memory_con):
    ensure_schema(memory_con)
    prices = _prices("H100-80GB:\n  - {usd: 2.0}\n  - {from: 2026-06-10, usd: 3.0, hosts: cw-*}\nA100-80GB: 1.4\n")
    assert record_prices(memory_con, prices, date(2026, 6, 1), datetime(2026, 6, 1)) == 2
    assert record_prices(memory_con, prices, date(2026, 6, 2), datetime(2026, 6, 2)) == 0
    assert memory_con.execute("SELECT count(*) FROM gpu_price_periods").fetchone() == (3,)


def test_the_close_command_closes_a_past_month_once_and_says_what_it_holds(tmp_path, monkeypatch):
    """May: 8 H100s x 10 h at $2 (the price file): $160. `close --month
    2026-05` on June 2: exit 0 naming 80 GPU-hours, $160.00 and the usage days; again: exit 1, closed already; June
    (not over): exit 1; a missing warehouse: exit 2."""
    import subprocess
    import sys

    import duckdb

    (tmp_path / "prices.yaml").write_text("H100-80GB: 2.0\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_PRICES", str(tmp_path / "prices.yaml"))
    path = tmp_path / "w.duckdb"
    con = duckdb.connect(str(path))
    ensure_schema(con)
    _load(con, [_run("may", datetime(2026, 5, 10), 10)], datetime(2026, 5, 11), {"H100-80GB": 2.0})
    con.close()

    def close(month: str, where=path) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "wandb_assets.cli", "close", "--month", month, "--warehouse", str(where)]
        return subprocess.run([*command, "--now", "2026-06-02T08:00:00Z"], capture_output=True, text=True, timeout=120)

    done = close("2026-05")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(
        "Closed 2026-05 at 2026-06-02 08:00 UTC: 80.0 GPU-hours, $160.00, usage days 2026-05-10 to 2026-05-10."
    )
    again = close("2026-05")
    assert (again.returncode, again.stderr) == (
        1,
        "error: 2026-05 was closed at 2026-06-02 08:00 UTC: a closed month never changes.\n",
    )
    assert close("2026-06").stderr.startswith("error: 2026-06 is not over (it ends 2026-07-01 00:00 UTC)")
    assert close("2026-05", tmp_path / "none.duckdb").returncode == 2
    assert not (tmp_path / "none.duckdb").exists()
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT month, closed_by, gpu_hours, cost_usd FROM closed_months").fetchall() == [
        (date(2026, 5, 1), "wandb-assets close", 80.0, 160.0)
    ]
    con.close()


@pytest.mark.breaks_invariants  # a hand-made gpu_usage and runs of two tables only: no whole warehouse to check
def test_costs_read_a_snapshot_written_before_price_periods(memory_con):
    """A snapshot written by the version before dated prices has `price_basis` but no `price_from` until the next
    refresh upgrades the warehouse: `costs` reads it (its dollars as they were), without the periods' lines."""
    from wandb_assets.lib.accounting.costs import cost_summary

    memory_con.execute(
        "CREATE TABLE gpu_usage AS SELECT DATE '2026-06-01' AS day, 'e' AS entity, 'p' AS project, 'ana' AS username, "
        "'vision' AS team, 'H100-80GB' AS gpu_model, 10.0 AS gpu_hours, 20.0 AS cost_usd, 'list' AS price_basis, "
        "0.0 AS idle_gpu_hours"
    )
    memory_con.execute(
        "CREATE TABLE runs (gpu_model VARCHAR, wandb_metadata JSON, ended_at TIMESTAMP, heartbeat_at TIMESTAMP, "
        "created_at TIMESTAMP)"
    )
    summary = cost_summary(memory_con, "team", date(2026, 6, 2), 2)
    assert (summary.total.gpu_hours, summary.total.cost_usd, summary.prices, summary.closed) == (10.0, 20.0, (), ())


_HOSTS = st.sampled_from([None, "cw-1", "cw-old-2", "gpu-7"])
_PLACES = st.sampled_from([("e", "p"), ("e", "reserved"), ("f", "p")])
_MODELS = st.sampled_from([None, "H100-80GB", "A100-80GB", "L4"])
_RULE = st.fixed_dictionaries(
    {"usd": st.sampled_from([1.0, 2.0, 3.5])},
    optional={
        "from": st.sampled_from([date(2026, 6, 2), date(2026, 6, 4)]),
        "hosts": st.sampled_from(["cw-*", ["cw-old-*", "gpu-*"]]),
    },
)
_FILE = st.dictionaries(
    st.sampled_from(["H100-80GB", "A100-80GB"]), st.lists(_RULE, min_size=1, max_size=3), max_size=2
)


@given(
    files=st.lists(st.tuples(_FILE, st.sampled_from([None, 0.5])), min_size=1, max_size=3),
    rows=st.lists(st.tuples(_MODELS, _HOSTS, _PLACES, st.integers(0, 5)), min_size=1, max_size=25),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_each_row_is_priced_once_by_the_same_rule_as_one_row_alone(memory_con, files, rows):
    """``priced_sql`` prices each distinct model, host, project and day once and joins the price back: every source row
    (duplicates too) comes back once, at the price ``price_on_sql`` gives that row alone, whatever the file's rules
    (hosts, dated periods, edits recorded on later days, the fallback price)."""
    ensure_schema(memory_con)  # the fixture's connection serves every example: each starts with no periods
    memory_con.execute("DELETE FROM gpu_price_periods")
    memory_con.execute("DROP TABLE IF EXISTS src")
    for day, (document, fallback) in enumerate(files, start=1):
        try:
            prices = with_fallback(parse_prices(document, "prices") if document else (), fallback)
        except ConfigError:  # two periods of one rule on the same day: a file the settings refuse
            assume(False)
        with transaction(memory_con):
            record_prices(memory_con, prices, date(2026, 6, day), datetime(2026, 6, day))
    memory_con.execute(
        "CREATE TABLE src (n INTEGER, gpu_model VARCHAR, hostname VARCHAR, entity VARCHAR, project VARCHAR, day DATE)"
    )
    memory_con.executemany(
        "INSERT INTO src VALUES (?, ?, ?, ?, ?, ?)",
        [(n, m, h, e, p, date(2026, 6, 1) + timedelta(days=d)) for n, (m, h, (e, p), d) in enumerate(rows)],
    )
    priced = memory_con.execute(
        f"WITH {PRICE_SCHEDULE_CTE}, src_rows AS (FROM src) "
        f"SELECT n, usd_per_gpu_hour FROM ({priced_sql('src_rows', 'd.day')}) ORDER BY n"
    ).fetchall()
    alone = memory_con.execute(
        f"WITH {PRICE_SCHEDULE_CTE} SELECT n, {price_on_sql('r', 'r.day')} FROM src r ORDER BY n"
    ).fetchall()
    assert priced == alone
