"""Times are UTC whatever the host's zone; configured times accept offsets; date ranges include their end day."""

import time
from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from tests.fleet import fleet_row, load
from wandb_assets import warehouse
from wandb_assets.lib.clock import configured_time
from wandb_assets.lib.derived import push_to_main_sps_rows, rebuild_gpu_hours, rebuild_gpu_usage, rebuild_success_rates
from wandb_assets.lib.errors import ConfigError
from wandb_assets.localwandb.server import iso_z


@pytest.fixture
def new_york(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_local_server_formats_times_in_utc_in_any_host_zone(new_york):
    assert time.strftime("%Z", time.localtime(0)) in ("EST", "EDT")  # the zone really is in force
    assert iso_z(datetime(2026, 6, 1, 10, tzinfo=UTC)) == "2026-06-01T10:00:00Z"
    assert iso_z(datetime(2026, 6, 1, 12, tzinfo=timezone(timedelta(hours=2)))) == "2026-06-01T10:00:00Z"
    assert iso_z(datetime(2026, 6, 1, 10)) == "2026-06-01T10:00:00Z"  # naive is UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-06-10T12:00:00Z", datetime(2026, 6, 10, 12)),
        ("2026-06-10T14:00:00+02:00", datetime(2026, 6, 10, 12)),
        ("2026-06-10T08:00:00-04:00", datetime(2026, 6, 10, 12)),
        ("2026-06-10T12:00:00", datetime(2026, 6, 10, 12)),
        ("", None),
    ],
)
def test_configured_times_accept_any_offset(new_york, text, expected):
    assert configured_time(text, "snapshot_at") == expected


def test_a_configured_time_that_is_not_one_is_a_sentence():
    with pytest.raises(
        ConfigError, match=r"^now must be an ISO-8601 time such as 2026-06-10T12:00:00Z \(got 'noon'\)\.$"
    ):
        configured_time("noon", "now")


def test_every_helper_includes_its_end_day(memory_con):
    """One rule for every table: ``end="2026-06-02"`` keeps all of June 2nd (TIMESTAMP and DATE columns alike)."""
    rows = [
        fleet_row("early", "finished", "push_to_main", datetime(2026, 6, 1, 0, 0), datetime(2026, 6, 1, 1)),
        fleet_row("late", "finished", "push_to_main", datetime(2026, 6, 2, 23, 30), datetime(2026, 6, 2, 23, 45)),
        fleet_row("after", "finished", "push_to_main", datetime(2026, 6, 3, 0, 0), datetime(2026, 6, 3, 1)),
        fleet_row("sweep1", "finished", "sweep", datetime(2026, 6, 2, 12), datetime(2026, 6, 2, 13)),
    ]
    rows[-1]["sweep_id"] = "sw1"
    load(memory_con, rows)
    push_to_main_sps_rows(memory_con)
    rebuild_success_rates(memory_con)
    rebuild_gpu_usage(memory_con, datetime(2026, 6, 4), {}, {})
    rebuild_gpu_hours(memory_con)
    memory_con.execute(
        "INSERT INTO fleet_metrics VALUES (TIMESTAMP '2026-06-02 23:59:59', 'm', 1), "
        "(TIMESTAMP '2026-06-03 00:00', 'm', 2)"
    )
    for end in ("2026-06-02", date(2026, 6, 2), datetime(2026, 6, 2, 9, 0)):
        assert warehouse.ci_runs(memory_con, "2026-06-01", end).run_id.tolist() == ["early", "late"]
        assert sorted(warehouse.daily_fleet(memory_con, "2026-06-01", end).day.dt.date.unique()) == [
            date(2026, 6, 1),
            date(2026, 6, 2),
        ]
        assert warehouse.gauges_over_time(memory_con, "2026-06-02", end).index.tolist() == [
            datetime(2026, 6, 2, 23, 59, 59)
        ]
        assert warehouse.sweeps(memory_con, "2026-06-02", end).sweep.tolist() == ["sw1"]
    assert warehouse.sweeps(memory_con, "2026-06-03", None).sweep.tolist() == []
