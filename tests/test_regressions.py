"""The SPS-regression detector on hand-built commit-ordered series (levels and noise chosen by hand)."""

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_assets.lib.regressions import find_regressions


def noisy(levels: list[float], noise: float = 0.03, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0, noise)) for level in levels]


def test_a_clean_ten_percent_step_is_found_at_the_right_commit():
    values = [1000.0 * (1 + 0.004 * (-1) ** i) for i in range(60)] + [
        900.0 * (1 + 0.004 * (-1) ** i) for i in range(20)
    ]
    (regression,) = find_regressions(values)
    assert (regression.last_good, regression.first_slow) == (59, 60)
    assert regression.change_pct == pytest.approx(-10.0, abs=0.5)
    assert regression.before == pytest.approx(1000.0, rel=0.005) and regression.after == pytest.approx(900.0, rel=0.005)
    assert regression.recovered_at is None


@pytest.mark.parametrize("seed", range(5))
def test_a_step_in_realistic_noise_is_found_within_a_few_runs_of_its_onset(seed):
    values = noisy([5000.0] * 80 + [4500.0] * 30, noise=0.03, seed=seed)
    found = find_regressions(values)
    assert len(found) == 1 and abs(found[0].first_slow - 80) <= 3


def test_one_slow_outlier_is_not_a_regression_nor_are_two_in_a_row():
    values = noisy([2000.0] * 100)
    values[50] *= 0.5
    values[70] *= 0.6
    values[71] *= 0.6
    assert find_regressions(values) == []


def test_a_thirty_percent_drop_is_reported_by_its_third_slow_run():
    values = noisy([3000.0] * 60 + [2100.0] * 10)
    for t in range(60, 70):  # what each tick sees
        found = find_regressions(values[: t + 1])
        if found:
            break
    assert (found[0].first_slow, found[0].detected_at) == (60, 62)
    assert found[0].change_pct == pytest.approx(-30, abs=3)


def test_an_improvement_is_not_a_regression():
    assert find_regressions(noisy([3000.0] * 60 + [3600.0] * 40)) == []


def test_regress_then_fix_is_one_regression_that_recovers():
    values = noisy([3000.0] * 50 + [2600.0] * 20 + [3000.0] * 30)
    (regression,) = find_regressions(values)
    assert abs(regression.first_slow - 50) <= 2
    assert regression.recovered_at is not None and 70 <= regression.recovered_at <= 72


def test_bimodal_hardware_alone_rarely_pages():
    """Two node types, the slow one 12% slower on 30% of runs: at most 0.15 false alerts per 100 main runs
    (the issue's budget), over 50 series of 200 runs (fixed seeds)."""
    alarms = 0
    for seed in range(50):
        rng = random.Random(seed)
        levels = [4000.0 * (0.88 if rng.random() < 0.3 else 1.0) for _ in range(200)]
        alarms += len(find_regressions(noisy(levels, noise=0.03, seed=seed + 1000)))
    assert 100 * alarms / (50 * 200) <= 0.15


@pytest.mark.parametrize("seed", range(8))
def test_a_prefix_reports_exactly_what_a_tick_would_have_seen(seed):
    rng = random.Random(seed)
    levels = [1000.0] * 40 + [1000.0 * rng.choice([0.95, 0.9, 0.85])] * 40 + [1000.0] * 40 + [700.0] * 30
    values = noisy(levels, noise=rng.uniform(0.02, 0.06), seed=seed)
    full = [(r.first_slow, r.detected_at, r.before, r.after) for r in find_regressions(values)]
    assert full
    for t in range(len(values)):
        seen = [(r.first_slow, r.detected_at, r.before, r.after) for r in find_regressions(values[: t + 1])]
        assert seen == [r for r in full if r[1] <= t]


def test_values_that_are_not_finite_and_positive_are_skipped_keeping_indexes():
    values = [1000.0 * (1 + 0.004 * (-1) ** i) for i in range(60)] + [
        900.0 * (1 + 0.004 * (-1) ** i) for i in range(20)
    ]
    values[30], values[40] = float("nan"), 0.0
    (regression,) = find_regressions(values)
    assert (regression.last_good, regression.first_slow) == (59, 60)


def test_a_low_run_just_before_the_step_does_not_move_the_onset():
    values = noisy([1000.0] * 60 + [850.0] * 10, seed=5)
    values[59] = 960.0  # a low last good run (-4% in 3% noise): the CUSUM starts counting there
    (regression,) = find_regressions(values)
    assert (regression.last_good, regression.first_slow) == (59, 60)


def test_a_small_shift_is_not_worth_a_page_however_significant():
    values = [1000.0 * (1 + 0.001 * (-1) ** i) for i in range(60)] + [975.0] * 40  # 2.5% in 0.1% noise
    assert find_regressions(values) == []


@pytest.mark.parametrize("seed", range(3))
def test_slow_drift_is_absorbed_not_paged(seed):
    """Infrastructure wander: 8% down over 200 runs (0.04% a run) in 3% noise is no regression."""
    values = noisy([2000.0 * (1 - 0.0004 * i) for i in range(200)], noise=0.03, seed=100 + seed)
    assert find_regressions(values) == []


def test_a_series_seen_before_is_answered_from_memory_with_the_same_regressions():
    """The asset check and fleet_alerts of one tick ask about the same series: the second answer is remembered
    (and is a fresh list: a caller changing it cannot change the next answer)."""
    from wandb_assets.lib.regressions import _remembered, find_regressions

    series = [1000.0 + (i % 5) for i in range(40)] + [800.0 + (i % 5) for i in range(10)]
    first = find_regressions(series)
    hits = _remembered.cache_info().hits
    first.clear()
    again = find_regressions(list(series))
    assert _remembered.cache_info().hits == hits + 1
    # found at the third slow run: 801 (median of 800, 801, 802) against 1002 (median of 1000..1004): -20.06 %
    assert [(r.last_good, r.first_slow, round(r.change_pct, 2)) for r in again] == [(39, 40, -20.06)]


def test_the_sliding_baseline_gives_what_sorting_each_window_afresh_gives():
    """Windows that stay, slide by one, slide by several, shrink from the left or jump elsewhere: each (level,
    spread) equals the definition computed from scratch (median, 1.4826 x MAD, 10-90 % range / 2.563)."""
    from statistics import median

    from wandb_assets.lib.regressions import MIN_SPREAD, _quantile, _SlidingBaseline

    def from_scratch(window: list[float]) -> tuple[float, float]:
        ordered = sorted(window)
        level = median(ordered)
        mad = 1.4826 * median([abs(x - level) for x in ordered])
        return level, max(mad, (_quantile(ordered, 0.9) - _quantile(ordered, 0.1)) / 2.563, MIN_SPREAD)

    rng = random.Random(11)
    logs = [math.log(1000 * (1 + rng.gauss(0, 0.05)) * (0.8 if rng.random() < 0.3 else 1)) for _ in range(600)]
    sliding = _SlidingBaseline(logs)
    lo, hi, checked = 0, 25, 0
    for _ in range(2000):
        move = rng.random()
        if move < 0.5:
            lo, hi = lo + 1, hi + 1  # slide by one
        elif move < 0.6:
            lo, hi = lo + 3, hi + 2  # slide by several, shrinking
        elif move < 0.7:
            lo = rng.randrange(0, 560)
            hi = lo + rng.randint(20, 30)  # jump elsewhere
        if hi > len(logs):
            lo, hi = 0, 25
        if hi - lo < 20:
            lo = hi - 20
        assert sliding.of(lo, hi) == from_scratch(logs[lo:hi]), (lo, hi)
        checked += 1
    assert checked == 2000


# A series of CI runs in commit order: regimes of a level, each run a noise factor, some values W&B can send that
# the detector skips (NaN, infinite, zero, negative, null).
_LEVEL_RUNS = st.tuples(st.sampled_from([1000.0, 950.0, 880.0, 700.0, 1200.0]), st.integers(1, 45))
_SKIPPED = st.sampled_from([math.nan, math.inf, 0.0, -5.0, None])


@st.composite
def _series(draw):
    values = []
    for level, runs in draw(st.lists(_LEVEL_RUNS, min_size=1, max_size=6)):
        for _ in range(runs):
            skipped = draw(st.one_of(st.none(), _SKIPPED)) if draw(st.integers(0, 30)) == 0 else False
            values.append(skipped if skipped is not False else level * draw(st.floats(0.94, 1.06)))
    return values


@settings(max_examples=150, deadline=None)
@given(_series(), st.data())
def test_a_series_resumed_from_its_checkpoint_is_judged_as_from_the_start(values, data):
    """What a tick judges from the checkpoint the last tick kept equals the whole series judged from its first run,
    whatever runs came since; and a series whose judged runs changed (a run of an older commit ended late) is judged
    from the start, not from a checkpoint that no longer holds."""
    from wandb_assets.lib.regressions import checkpoint_from_json, checkpoint_to_json, resume_regressions

    cut = data.draw(st.integers(0, len(values)))
    _, checkpoint = resume_regressions(values[:cut], None)
    if checkpoint is not None:  # kept between ticks as JSON
        checkpoint = checkpoint_from_json(json.loads(json.dumps(checkpoint_to_json(checkpoint))))
    whole = find_regressions(values)
    resumed, _ = resume_regressions(values, checkpoint)
    assert resumed == whole
    if checkpoint is not None and checkpoint.prefix_length > 0:  # an earlier run's value changed: start over
        at = data.draw(st.integers(0, checkpoint.prefix_length - 1))
        changed = [*values[:at], 1.5 * (values[at] if isinstance(values[at], float) else 1000.0), *values[at + 1 :]]
        assert resume_regressions(changed, checkpoint)[0] == find_regressions(changed)


@settings(max_examples=150, deadline=None)
@given(_series(), st.data())
def test_a_checkpoint_kept_before_the_unsettled_runs_holds_when_a_late_run_lands_among_them(values, data):
    """A run ends after runs committed later than it have ended: it lands among a series' last runs. The checkpoint
    kept with ``settled`` was decided on the first ``settled`` values alone, so a run inserted after them leaves it
    valid: resumed from it, the series with the late run is judged as from its first run."""
    from wandb_assets.lib.regressions import resume_regressions

    settled = data.draw(st.integers(0, len(values)))
    _, checkpoint = resume_regressions(values, None, settled)
    assert checkpoint is None or checkpoint.prefix_length <= settled
    at = data.draw(st.integers(settled, len(values)))
    late = [*values[:at], data.draw(st.floats(1.0, 20_000.0)), *values[at:]]
    if checkpoint is not None:  # it still holds: the values it was decided on are unchanged
        assert resume_regressions(late, checkpoint, settled)[1] is not None
    assert resume_regressions(late, checkpoint, settled)[0] == find_regressions(late)


def test_a_checkpoint_lets_a_tick_judge_only_the_runs_after_the_last_re_baseline():
    """A drop at run 60 re-baselines there (decided at run 62): the checkpoint names run 60 as the regime's start and
    the 63 values it was decided on; resumed, a 20% drop at run 100 is found as from the start."""
    from wandb_assets.lib.regressions import resume_regressions

    wiggle = [1 + 0.004 * (-1) ** i for i in range(60)]
    values = [1000.0 * w for w in wiggle] + [850.0 * w for w in wiggle[:30]]
    (first,), checkpoint = resume_regressions(values, None)
    assert (first.first_slow, first.detected_at) == (60, 62)
    assert (checkpoint.regime_start, checkpoint.prefix_length, checkpoint.found) == (60, 63, (first,))
    later = values + [680.0 * w for w in wiggle[:30]]
    resumed, after = resume_regressions(later, checkpoint)
    assert resumed == find_regressions(later) and [r.first_slow for r in resumed] == [60, 90]
    assert after.regime_start == 90
