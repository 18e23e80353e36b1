"""Derived tables and partition replacement on hand-built rows (expected values worked out by hand)."""

from datetime import date, datetime

import duckdb
import pytest

from tests.fleet import fleet_row
from wandb_assets.lib.derived import push_to_main_sps_rows, rebuild_gpu_hours, rebuild_gpu_usage, rebuild_success_rates
from wandb_assets.lib.warehouse import refresh_days, replace_runs_window, unfinished_run_ids

NOW = datetime(2026, 6, 4, 2, 0)
ROWS = [
    fleet_row("multi", "finished", "regular", datetime(2026, 6, 1, 18), datetime(2026, 6, 3, 6), gpus=2),
    fleet_row("alive", "running", "push_to_main", datetime(2026, 6, 3, 20), gpus=1),
    fleet_row("waiting", "pending", "sweep", datetime(2026, 6, 3, 21), gpus=8),
    fleet_row(
        "crash", "crashed", "push_to_main", datetime(2026, 6, 3, 1), datetime(2026, 6, 3, 2), gpus=4, overview_sps=10.0
    ),
    fleet_row("kill", "killed", "sweep", datetime(2026, 6, 3, 3), datetime(2026, 6, 3, 4), gpus=1),
]


@pytest.fixture
def con(memory_con):
    replace_runs_window(memory_con, ROWS, datetime(2026, 6, 1), datetime(2026, 6, 5))
    return memory_con


def test_gpu_hours_clip_each_run_to_each_day(con):
    rebuild_gpu_usage(con, NOW, {}, {})
    rebuild_gpu_hours(con)
    rows = con.execute("SELECT day, category, runs, gpu_hours FROM gpu_hours ORDER BY day, category").fetchall()
    assert rows == [
        (date(2026, 6, 1), "all", 1, 12.0),  # multi: 18:00-24:00 x 2
        (date(2026, 6, 1), "regular", 1, 12.0),
        (date(2026, 6, 2), "all", 1, 48.0),  # multi: 24 h x 2
        (date(2026, 6, 2), "regular", 1, 48.0),
        (date(2026, 6, 3), "all", 4, 12.0 + 4.0 + 4.0 + 1.0),  # multi 6 h x 2, alive 4 h, crash 1 h x 4, kill 1 h
        (date(2026, 6, 3), "push_to_main", 2, 8.0),
        (date(2026, 6, 3), "regular", 1, 12.0),
        (date(2026, 6, 3), "sweep", 1, 1.0),  # the pending run occupies nothing
        (date(2026, 6, 4), "all", 1, 2.0),  # alive until NOW = 02:00
        (date(2026, 6, 4), "push_to_main", 1, 2.0),
    ]


def test_success_rates_per_day_and_category(con):
    rebuild_success_rates(con)
    assert con.execute("SELECT DISTINCT entity, project FROM success_rates").fetchall() == [
        ("test-team", "test-project")
    ]
    rows = con.execute("SELECT * EXCLUDE (entity, project) FROM success_rates ORDER BY day, category").fetchall()
    assert rows == [
        (date(2026, 6, 3), "all", 1, 1, 1, 50.0),
        (date(2026, 6, 3), "push_to_main", 0, 1, 0, 0.0),
        (date(2026, 6, 3), "regular", 1, 0, 0, 100.0),
        (date(2026, 6, 3), "sweep", 0, 0, 1, None),  # killed only: rate undefined
    ]


def test_push_to_main_sps_has_one_row_per_ci_run(con):
    assert push_to_main_sps_rows(con) == 2
    rows = con.execute("SELECT run_id, state, sps_overview_sps FROM push_to_main_sps ORDER BY run_id").fetchall()
    assert rows == [("alive", "running", None), ("crash", "crashed", 10.0)]


def test_replacing_a_window_touches_only_that_window(con):
    replace_runs_window(
        con,
        [fleet_row("new", "finished", "regular", datetime(2026, 6, 3, 5), datetime(2026, 6, 3, 6))],
        datetime(2026, 6, 3),
        datetime(2026, 6, 4),
    )
    # The 06-03 runs W&B no longer returns stay, marked (alive ones last seen); the other window is untouched.
    assert con.execute("SELECT run_id, state, anomalies FROM runs ORDER BY run_id").fetchall() == [
        ("alive", "vanished", ["vanished"]),
        ("crash", "crashed", ["vanished"]),
        ("kill", "killed", ["vanished"]),
        ("multi", "finished", []),
        ("new", "finished", []),
        ("waiting", "vanished", ["vanished"]),
    ]


def test_failed_write_rolls_back_after_the_delete(con):
    # A row without a run id passes staging and the DELETE, then breaks the INSERT (run_id is NOT NULL):
    # only the transaction brings the deleted 06-03 window back.
    bad = fleet_row(None, "finished", "regular", datetime(2026, 6, 3, 5))
    with pytest.raises(duckdb.ConstraintException):
        replace_runs_window(con, [bad], datetime(2026, 6, 3), datetime(2026, 6, 4))
    assert [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()] == [
        "alive",
        "crash",
        "kill",
        "multi",
        "waiting",
    ]


@pytest.mark.parametrize(
    ("oldest", "today", "first_partition", "max_days", "expected"),
    [
        (None, date(2026, 6, 10), date(2026, 1, 1), 7, (date(2026, 6, 9), date(2026, 6, 10))),
        (date(2026, 6, 10), date(2026, 6, 10), date(2026, 1, 1), 7, (date(2026, 6, 9), date(2026, 6, 10))),
        (date(2026, 6, 4), date(2026, 6, 10), date(2026, 1, 1), 7, (date(2026, 6, 4), date(2026, 6, 10))),
        # a zombie from June 2nd: the window is capped at 7 days back; it is refreshed by id instead
        (date(2026, 6, 2), date(2026, 6, 10), date(2026, 1, 1), 7, (date(2026, 6, 3), date(2026, 6, 10))),
        (date(2026, 6, 2), date(2026, 6, 10), date(2026, 1, 1), 3, (date(2026, 6, 7), date(2026, 6, 10))),
        (date(2025, 12, 1), date(2026, 1, 3), date(2026, 1, 1), 7, (date(2026, 1, 1), date(2026, 1, 3))),
    ],
)
def test_refresh_days(oldest, today, first_partition, max_days, expected):
    assert refresh_days(oldest, today, first_partition, max_days) == expected


@pytest.mark.parametrize(
    ("last_tick", "oldest", "max_days", "expected_first"),
    [
        (date(2026, 6, 10), None, 1, date(2026, 6, 9)),  # ticking: yesterday and today
        (date(2026, 6, 9), None, 1, date(2026, 6, 9)),  # the last tick yesterday: the same
        (date(2026, 6, 6), None, 1, date(2026, 6, 6)),  # down since the 6th: the days it missed too
        (date(2026, 6, 6), date(2026, 6, 3), 7, date(2026, 6, 3)),  # an unfinished run reaching further wins
        (date(2026, 6, 6), date(2026, 6, 8), 7, date(2026, 6, 6)),  # ... and a nearer one does not shorten it
        (date(2026, 3, 1), None, 1, date(2026, 5, 10)),  # at most 31 days: older gaps are a backfill's
    ],
)
def test_a_tick_after_an_outage_reads_the_days_it_missed(last_tick, oldest, max_days, expected_first):
    assert refresh_days(oldest, date(2026, 6, 10), date(2026, 1, 1), max_days, last_tick) == (
        expected_first,
        date(2026, 6, 10),
    )


def test_unfinished_runs_before_a_window_are_named_for_a_refresh_by_id(con):
    assert unfinished_run_ids(con, datetime(2026, 6, 3, 20, 30)) == ["alive"]  # running; "waiting" is 21:00
    assert unfinished_run_ids(con, datetime(2026, 6, 4)) == ["alive", "waiting"]  # pending counts too


def test_a_run_ending_exactly_at_midnight_adds_no_empty_day(memory_con):
    row = fleet_row("m", "finished", "regular", datetime(2026, 6, 1, 22), datetime(2026, 6, 2, 0, 0), gpus=2)
    replace_runs_window(memory_con, [row], datetime(2026, 6, 1), datetime(2026, 6, 3))
    rebuild_gpu_usage(memory_con, NOW, {}, {})
    rebuild_gpu_hours(memory_con)
    rows = memory_con.execute("SELECT day, category, runs, gpu_hours FROM gpu_hours ORDER BY day, category").fetchall()
    assert rows == [(date(2026, 6, 1), "all", 1, 4.0), (date(2026, 6, 1), "regular", 1, 4.0)]


def test_a_null_category_is_its_own_group_not_a_second_all(memory_con):
    rows = [
        fleet_row("a", "finished", "regular", datetime(2026, 6, 1, 1), datetime(2026, 6, 1, 2)),
        fleet_row("b", "failed", None, datetime(2026, 6, 1, 3), datetime(2026, 6, 1, 4)),
    ]
    replace_runs_window(memory_con, rows, datetime(2026, 6, 1), datetime(2026, 6, 2))
    rebuild_success_rates(memory_con)
    got = memory_con.execute("SELECT category, completed, failed FROM success_rates ORDER BY category").fetchall()
    assert got == [("all", 1, 1), ("regular", 1, 0), (None, 0, 1)]
    rebuild_gpu_usage(memory_con, NOW, {}, {})
    rebuild_gpu_hours(memory_con)
    got = memory_con.execute("SELECT category, runs FROM gpu_hours ORDER BY category").fetchall()
    assert got == [("all", 2), ("regular", 1), (None, 1)]


def test_a_run_id_is_stored_once_even_without_a_parseable_creation_time(con):
    undated = fleet_row("undated", "finished", "regular", None)
    for _ in range(2):
        replace_runs_window(con, [undated], datetime(2026, 6, 3), datetime(2026, 6, 4))
    assert con.execute("SELECT count(*) FROM runs WHERE run_id = 'undated'").fetchone()[0] == 1
    # The 06-03 window's runs (alive, waiting, crash, kill) are no longer returned: kept, marked vanished.
    assert con.execute(
        "SELECT run_id FROM runs WHERE NOT list_contains(anomalies, 'vanished') ORDER BY 1"
    ).fetchall() == [
        ("multi",),
        ("undated",),
    ]
