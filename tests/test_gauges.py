"""Each gauge on hand-built fleets; every expected number was worked out by hand (see comments)."""

from datetime import datetime

import pytest

from tests.fleet import fleet_row, load
from wandb_assets.lib.datadog_feed import enqueue_snapshots
from wandb_assets.lib.gauges import GAUGE_NAMES, compute_gauges
from wandb_assets.lib.warehouse import record_snapshot, replay_snapshots

T = datetime(2026, 6, 10, 12, 0)  # snapshot; W = (06-09 12:00, 06-10 12:00]


def d(day: int, hour: float) -> datetime:
    return datetime(2026, 6, day, int(hour), int(hour % 1 * 60))


FLEET = [
    fleet_row("r1", "finished", "regular", d(10, 8), d(10, 10), gpus=2),  # 2 h, 4 GPU-h
    fleet_row("r2", "failed", "regular", d(9, 10), d(9, 13), gpus=1),  # 3 h, 1 GPU-h inside W
    fleet_row(
        "r3",
        "crashed",
        "push_to_main",
        d(10, 9),
        d(10, 11),
        gpus=8,  # 2 h, 16 GPU-h; latest CI SPS
        overview_sps=100.0,
        overview_steps_per_second=None,
        timing_cumulative_sps=7.0,
    ),
    fleet_row(
        "r4",
        "finished",
        "push_to_main",
        d(10, 6),
        d(10, 7),
        gpus=8,  # 1 h, 8 GPU-h
        overview_sps=90.0,
        overview_steps_per_second=80.0,
    ),
    fleet_row(
        "r5",
        "failed",
        "push_to_main",
        d(10, 10),
        d(10, 11.5),
        gpus=8,  # 1.5 h, 12 GPU-h; failed: no SPS
        overview_sps=50.0,
        timing_per_epoch_sps=5.0,
        overview_steps_per_second=1.0,
    ),
    fleet_row("r6", "running", "regular", d(7, 12), gpus=4),  # alive since 3 days: 24 h x 4 = 96 GPU-h
    fleet_row("r7", "pending", "sweep", d(10, 11), gpus=2),  # recent, 0 GPU-h
    fleet_row("r8", "finished", "regular", d(9, 11), d(9, 12)),  # ended exactly at the open edge: not in W
    fleet_row("r9", "finished", "sweep", d(10, 11), d(10, 12)),  # ended exactly at T: in W, 1 h, 1 GPU-h
    fleet_row("r10", "killed", "sweep", d(10, 1), d(10, 2)),  # ended in W, neither completed nor failed
    fleet_row("r11", "running", "sweep", d(10, 11.5), gpus=2),  # alive, 0.5 h x 2 = 1 GPU-h
    fleet_row("r12", "finished", "regular", d(10, 13), d(10, 14)),  # created after T: ignored
    fleet_row("r13", "crashed", "push_to_main", d(9, 8), d(9, 11), overview_sps=999.0),  # ended before W
]

EXPECTED = {
    "wandb.runs.active": 2,  # r6, r11
    "wandb.runs.completed_24h": 3,  # r1, r4, r9
    "wandb.runs.failed_24h": 3,  # r2, r3, r5
    "wandb.runs.total_recent": 10,  # all but r8, r12, r13
    "wandb.training.avg_duration_hours": 11.5 / 7,  # (2+3+2+1+1.5+1+1) / 7
    "wandb.training.total_gpu_hours_24h": 140,  # 4+1+16+8+12+96+1+1+1
    "wandb.push_to_main.runs_completed_24h": 1,  # r4
    "wandb.push_to_main.runs_failed_24h": 2,  # r3, r5
    "wandb.push_to_main.success_rate_pct": 100 / 3,
    "wandb.push_to_main.avg_duration_hours": 1.5,  # (2+1+1.5) / 3
    "wandb.push_to_main.overview.steps_per_second": 80.0,  # r3 has none, so r4's
    "wandb.push_to_main.overview.epoch_steps_per_second": None,  # nobody logged it
    "wandb.push_to_main.overview.sps": 100.0,  # r3 (crashed, ended 11:00) beats r4 (07:00); r5 failed
    "wandb.push_to_main.timing_cumulative.sps": 7.0,
    "wandb.push_to_main.timing_per_epoch.sps": None,  # only the failed r5 has it
    "wandb.sweep.runs_total_24h": 4,  # r7, r9, r10, r11
    "wandb.sweep.runs_completed_24h": 1,  # r9
    "wandb.sweep.runs_failed_24h": 0,
    "wandb.sweep.runs_active": 1,  # r11
    "wandb.sweep.success_rate_pct": 100.0,  # 1 / (1 + 0)
    # No prices given and no system samples: nothing idle, every GPU-hour unpriced (tests/test_gpus.py prices some).
    "wandb.gpu.idle_gpus": 0,
    "wandb.gpu.cost_usd_24h": None,  # 140 GPU-hours and none priced: NULL, never 0 (the warehouse's rule)
    "wandb.gpu.unpriced_gpu_hours_24h": 140,
    "wandb.gpu.idle_gpu_hours_24h": 0,
}


@pytest.fixture
def con(memory_con):
    return memory_con


def test_gauge_names_are_exactly_the_twenty_four():
    assert list(GAUGE_NAMES) == list(EXPECTED)


def test_hand_built_fleet(con):
    load(con, FLEET)
    assert compute_gauges(con, T) == pytest.approx(EXPECTED)


def test_empty_fleet_counts_zero_and_undefined_is_null(con):
    load(con, [])
    gauges = compute_gauges(con, T)
    undefined = {name for name, value in gauges.items() if value is None}
    assert undefined == {
        "wandb.training.avg_duration_hours",
        "wandb.push_to_main.success_rate_pct",
        "wandb.push_to_main.avg_duration_hours",
        "wandb.push_to_main.overview.steps_per_second",
        "wandb.push_to_main.overview.epoch_steps_per_second",
        "wandb.push_to_main.overview.sps",
        "wandb.push_to_main.timing_cumulative.sps",
        "wandb.push_to_main.timing_per_epoch.sps",
        "wandb.sweep.success_rate_pct",
    }
    assert all(value == 0 for name, value in gauges.items() if name not in undefined)


def test_multi_day_run_ended_in_window_counts_only_its_last_24_hours(con):
    # Created 3 days before T, ended 2 h before T on 4 GPUs: duration 70 h; inside W 22 h x 4 = 88 GPU-h.
    load(con, [fleet_row("long", "finished", "regular", d(7, 12), d(10, 10), gpus=4)])
    gauges = compute_gauges(con, T)
    assert gauges["wandb.training.avg_duration_hours"] == 70
    assert gauges["wandb.training.total_gpu_hours_24h"] == 88
    assert gauges["wandb.runs.total_recent"] == 1


def test_a_project_whose_runs_all_ended_before_the_window_keeps_its_row_of_zeros(con):
    """Issue 54: the gauges no longer classify the runs that ended before W (a million of them at every snapshot).
    Project `quiet`'s one run ended two days before T: it still has its per-project row, every gauge 0 or NULL as on an
    empty fleet, and the fleet's gauges are those of the hand-built fleet alone."""
    from wandb_assets.lib.gauges import compute_project_gauges

    old = fleet_row("old", "finished", "regular", d(7, 12), d(8, 10), gpus=4, project="quiet")
    load(con, [*FLEET, old])
    assert compute_gauges(con, T) == pytest.approx(EXPECTED)
    by_project = compute_project_gauges(con, T)
    assert sorted(by_project) == [("test-team", "quiet"), ("test-team", "test-project")]
    load(con, [])
    assert by_project[("test-team", "quiet")] == compute_gauges(con, T)  # zeros and NULLs, as an empty fleet's


@pytest.mark.parametrize("fleet", ["two projects", "empty"])
def test_a_snapshot_stores_the_fleet_and_each_project_from_one_pass(con, fleet):
    """Issue 54: the snapshot evaluates the gauges once, grouped by project and for the whole fleet together (two
    passes over the runs were 0.55 s of a tick at a million runs). What it stores is what each evaluation alone gives:
    the fleet's row not changed by a project whose runs all ended before W (its row of NULL flags), nor missing
    when no run exists."""
    from wandb_assets.lib.gauges import compute_project_gauges

    rows = [*FLEET, fleet_row("old", "finished", "regular", d(7, 12), d(8, 10), gpus=4, project="quiet")]
    load(con, rows if fleet == "two projects" else [])
    record_snapshot(con, T)
    stored = dict(con.execute("SELECT metric, value FROM fleet_metrics WHERE snapshot_at = $t", {"t": T}).fetchall())
    assert stored == compute_gauges(con, T)
    if fleet == "two projects":
        assert stored == pytest.approx(EXPECTED)
    by_project: dict = {}
    for entity, project, metric, value in con.execute(
        "SELECT entity, project, metric, value FROM project_metrics"
    ).fetchall():
        by_project.setdefault((entity, project), {})[metric] = value
    assert by_project == compute_project_gauges(con, T)
    projects = [("test-team", "quiet"), ("test-team", "test-project")] if fleet == "two projects" else []
    assert sorted(by_project) == projects


def test_snapshot_later_moves_the_window(con):
    load(con, FLEET)
    later = compute_gauges(con, datetime(2026, 6, 11, 9, 0))  # W = (06-10 09:00, 06-11 09:00]
    # Ended in W: r3 (11:00), r5 (11:30), r9 (12:00); r1 ended 10:00 too; r12 (14:00, now existing).
    assert later["wandb.runs.completed_24h"] == 3  # r1, r9, r12
    assert later["wandb.push_to_main.overview.sps"] == 100.0
    assert later["wandb.push_to_main.overview.steps_per_second"] is None  # r4 ended 07:00, outside W


def test_record_snapshot_appends_a_time_series_and_replaces_same_instant(con):
    load(con, FLEET)
    record_snapshot(con, T)
    record_snapshot(con, T)
    record_snapshot(con, datetime(2026, 6, 10, 12, 15))
    rows = con.execute("SELECT snapshot_at, count(*) FROM fleet_metrics GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [(T, 24), (datetime(2026, 6, 10, 12, 15), 24)]
    nulls = con.execute("SELECT count(*) FROM fleet_metrics WHERE value IS NULL AND snapshot_at = $t", {"t": T})
    assert nulls.fetchone()[0] == 3  # epoch_steps_per_second, timing_per_epoch.sps, cost_usd_24h (nothing priced)


def test_gauges_are_shown_rounded_with_their_unit():
    from wandb_assets.lib.gauges import GAUGE_NAMES, format_gauge, gauge_unit, rounded_gauge

    units = {name: gauge_unit(name) for name in GAUGE_NAMES}
    assert units["wandb.runs.active"] == units["wandb.sweep.runs_total_24h"] == "runs"
    assert units["wandb.push_to_main.success_rate_pct"] == "%"
    assert units["wandb.training.avg_duration_hours"] == "hours"
    assert units["wandb.training.total_gpu_hours_24h"] == "GPU-hours"
    assert (
        units["wandb.push_to_main.overview.steps_per_second"] == units["wandb.push_to_main.overview.sps"] == "steps/s"
    )
    assert units["wandb.gpu.idle_gpus"] == "GPUs" and units["wandb.gpu.cost_usd_24h"] == "USD"
    assert units["wandb.gpu.unpriced_gpu_hours_24h"] == units["wandb.gpu.idle_gpu_hours_24h"] == "GPU-hours"
    assert sorted(set(units.values())) == ["%", "GPU-hours", "GPUs", "USD", "hours", "runs", "steps/s"]
    assert rounded_gauge("wandb.gpu.idle_gpus", 8.0) == 8 and isinstance(rounded_gauge("wandb.gpu.idle_gpus", 8.0), int)
    assert format_gauge("wandb.gpu.cost_usd_24h", 1234.567) == "1,234.57"
    assert rounded_gauge("wandb.runs.active", 24.0) == 24 and isinstance(rounded_gauge("wandb.runs.active", 24.0), int)
    assert rounded_gauge("wandb.push_to_main.success_rate_pct", 74.683544303) == 74.68
    assert rounded_gauge("wandb.push_to_main.success_rate_pct", None) is None
    assert format_gauge("wandb.runs.active", 24.0) == "24"
    assert format_gauge("wandb.training.total_gpu_hours_24h", 2166.3944) == "2,166.39"
    assert format_gauge("wandb.push_to_main.overview.sps", None) == "NULL"


def test_a_replayed_snapshot_sees_the_runs_as_they_were_then(con):
    # At M = 06-10 09:00 (W = (06-09 09:00, 06-10 09:00]):
    # a: created 06-10 02:00, finished 06-10 11:00 -> still running at M: active 1, 7 h x 2 GPUs = 14 GPU-h.
    # b: created 06-10 03:00, failed 06-10 05:00 -> failed in W, 2 h x 1 GPU = 2 GPU-h; avg duration 2 h.
    # c: created 06-10 10:00 -> did not exist at M.
    load(
        con,
        [
            fleet_row("a", "finished", "regular", d(10, 2), d(10, 11), gpus=2),
            fleet_row("b", "failed", "regular", d(10, 3), d(10, 5)),
            fleet_row("c", "finished", "regular", d(10, 10), d(10, 11)),
        ],
    )
    moment = d(10, 9)
    replayed = compute_gauges(con, moment, as_of=True)
    assert (
        replayed["wandb.runs.active"],
        replayed["wandb.runs.completed_24h"],
        replayed["wandb.runs.failed_24h"],
        replayed["wandb.runs.total_recent"],
        replayed["wandb.training.total_gpu_hours_24h"],
        replayed["wandb.training.avg_duration_hours"],
    ) == (1, 0, 1, 2, 16, 2)
    # Today's rows read plainly at M: a is finished (ended after M, so neither active nor in W).
    assert compute_gauges(con, moment)["wandb.runs.active"] == 0
    # replay_snapshots stores them and marks them in the Datadog ledger so the feed never sends them.
    now = d(10, 12)
    assert replay_snapshots(con, [moment, d(10, 10)], now) == 2
    assert replay_snapshots(con, [moment, d(10, 10)], now) == 2  # again: replaced, not doubled
    assert con.execute("SELECT snapshot_at, count(*) FROM fleet_metrics GROUP BY 1 ORDER BY 1").fetchall() == [
        (moment, 24),
        (d(10, 10), 24),
    ]
    assert con.execute("SELECT snapshot_at, status FROM datadog_deliveries ORDER BY 1").fetchall() == [
        (moment, "replayed"),
        (d(10, 10), "replayed"),
    ]
    assert enqueue_snapshots(con, now, dry_run=True) == []


def test_per_project_gauges_older_than_their_retention_are_deleted_at_each_snapshot(memory_con):
    """code-review-2026-11c: project_metrics (24 gauges x projects x 96 snapshots a day) was never pruned. With a
    retention of 2 days, a snapshot deletes the per-project rows older than that; the fleet-wide rows stay."""
    from datetime import datetime, timedelta

    from tests.fleet import fleet_row, load
    from wandb_assets.lib.warehouse import record_snapshot

    load(memory_con, [fleet_row("a", "finished", "regular", datetime(2026, 6, 1), datetime(2026, 6, 1, 1))])
    first = datetime(2026, 6, 1, 12)
    for day in range(4):
        record_snapshot(memory_con, first + timedelta(days=day), project_metrics_days=2)
    kept = memory_con.execute("SELECT DISTINCT snapshot_at FROM project_metrics ORDER BY 1").fetchall()
    assert kept == [(first + timedelta(days=d),) for d in (1, 2, 3)]  # 06-02 12:00 is exactly 2 days old: kept
    assert memory_con.execute("SELECT count(DISTINCT snapshot_at) FROM fleet_metrics").fetchone() == (4,)
