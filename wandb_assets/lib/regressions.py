"""Throughput regressions in one commit-ordered series: a robust one-sided CUSUM on log SPS. No Dagster here.

Why this shape (see ``benchmarks/regressions.py`` for the measurements):

- **log SPS**: a 10% drop is the same size on a 500 and a 50,000 SPS config.
- **A robust baseline**: the level is the median and the noise a robust spread of the runs *before* the
  excursion under test (never of the runs being judged), so the slow runs cannot hide themselves. The spread
  is the larger of 1.4826 x MAD and the 10-90% quantile range / 2.563: both equal the standard deviation on
  normal noise, and the second also widens for bimodal hardware (two node types of different speed), where
  MAD only sees the majority mode.
- **Clipped residuals**: each run adds at most ``CLIP - SLACK`` (2.2) to the statistic, so a single
  straggler, or two in a row, can never reach the threshold (6.5); three clearly slow runs can, so a large
  drop is reported at its third run.
- **Re-baselined after every change**: after a drop (reported) or a rise (a fix or an improvement, never
  reported) the new regime gets its own baseline, so a regress-then-fix is one regression, and slow drift is
  absorbed by the moving baseline instead of firing.
- **Causal**: each run is judged only with the runs before it, so the result on a prefix is what a tick at
  that point would have seen.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from array import array
from dataclasses import asdict, dataclass, replace
from statistics import median

#: Runs a regime needs before it is judged (its baseline), and at most this many recent ones make it.
MIN_BASELINE = 20
BASELINE_WINDOW = 30
#: CUSUM in units of the baseline spread: slack per run, clip per run, alarm threshold.
SLACK = 1.1
CLIP = 3.3
THRESHOLD = 6.5
#: Changes smaller than this (relative) are not worth a page, however significant.
MIN_CHANGE = 0.04
#: The spread is never taken below this (relative): CI numbers are rounded, some series are too smooth.
MIN_SPREAD = 0.005
#: How far before the CUSUM's first low run the onset of a drop is looked for.
ONSET_LOOKBACK = 10
#: A regression is recovered when a later regime is back within this many spreads of the old level.
RECOVERY_SPREADS = 2.0


@dataclass(frozen=True)
class Regression:
    """One drop: runs ``first_slow..`` are slower than runs ``..last_good``.

    ``before``/``after`` are robust levels (medians, in SPS) of the two regimes as seen when it was found;
    ``detected_at`` is the run at which it was found (the tick that would have paged); ``recovered_at`` the
    first run of a later regime back within the noise of ``before`` (None while it is still slow).
    """

    first_slow: int
    last_good: int
    before: float
    after: float
    change_pct: float
    detected_at: int
    confirming_runs: int
    noise_pct: float
    recovered_at: int | None = None


@dataclass(frozen=True)
class Checkpoint:
    """Where the detector may resume a series it has seen: at its last re-baseline. What it finds after that point
    depends only on the runs from ``regime_start`` on and on ``found``/``open_drops``, and the re-baseline itself
    only on the first ``prefix_length`` values, which ``prefix_digest`` names: while a series keeps them, the runs
    added after them can be judged from here (the answer is the whole series' answer; a changed prefix starts over)."""

    prefix_length: int
    prefix_digest: str
    #: Index (in the values) of the first run of the regime under way.
    regime_start: int
    found: tuple[Regression, ...] = ()
    #: Positions in ``found`` of the regressions not recovered yet.
    open_drops: tuple[int, ...] = ()


#: The detector's rules as a checkpoint was taken under (its constants, and a version to bump when its logic changes):
#: a checkpoint taken under other rules names other values, so it is never resumed from.
_RULES = repr(
    (1, MIN_BASELINE, BASELINE_WINDOW, SLACK, CLIP, THRESHOLD, MIN_CHANGE, MIN_SPREAD, ONSET_LOOKBACK, RECOVERY_SPREADS)
).encode()


def _digest(values) -> str:
    """A digest of values as the detector reads them (anything not a number reads as NaN: it is skipped either way),
    and of the rules it reads them by."""
    numbers = array("d", (v if isinstance(v, (int, float)) else math.nan for v in values))
    return hashlib.blake2b(_RULES + numbers.tobytes(), digest_size=16).hexdigest()


def checkpoint_to_json(checkpoint: Checkpoint) -> dict:
    """A checkpoint as JSON (to keep between ticks)."""
    found = [asdict(r) for r in checkpoint.found]
    return {**asdict(checkpoint), "found": found, "open_drops": list(checkpoint.open_drops)}


def checkpoint_from_json(data: dict) -> Checkpoint:
    """``checkpoint_to_json`` read back."""
    return Checkpoint(
        int(data["prefix_length"]),
        str(data["prefix_digest"]),
        int(data["regime_start"]),
        tuple(Regression(**r) for r in data["found"]),
        tuple(int(k) for k in data["open_drops"]),
    )


def resume_regressions(
    values: list[float], checkpoint: Checkpoint | None, settled: int | None = None
) -> tuple[list[Regression], Checkpoint | None]:
    """``find_regressions(values)``, resumed from ``checkpoint`` (of an earlier call on this series) when the series
    still starts with the values it was taken on; and the checkpoint to resume from next time (None: none yet): the
    last re-baseline decided on the first ``settled`` values alone (None: on any), the runs no late run should land
    among. A tick at a million runs judges four series of ~78,000 runs: 0.22 s each from the start, 0.02-0.05 s from
    a checkpoint. A run ends after runs committed later than it have ended, so each tick's new runs land among the
    last hour or two of a series: a checkpoint taken there (the last re-baseline often is) did not hold, and the
    detector started over (the SPS check 1.0-1.2 s a tick with new runs arriving, 0.7-0.8 s from a settled one)."""
    if checkpoint is not None and (
        len(values) < checkpoint.prefix_length
        or _digest(values[: checkpoint.prefix_length]) != checkpoint.prefix_digest
    ):
        checkpoint = None
    return _find(tuple(values), checkpoint, settled)


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def find_regressions(values: list[float]) -> list[Regression]:
    """Every drop in a commit-ordered series of SPS values (oldest first), oldest first.

    Values that are not finite and positive are ignored (they keep their index). Deterministic, O(n log w), so
    the answer for a series seen before in this process is remembered (``_remembered``): a tick's asset check
    and its ``fleet_alerts`` ask about the same series, which at a million runs is 2 s of detection each.
    """
    return list(_remembered(tuple(values)))


@functools.lru_cache(maxsize=64)
def _remembered(values: tuple) -> tuple[Regression, ...]:
    return tuple(_find(values)[0])


class _SlidingBaseline:
    """The baseline of ``logs[lo:hi]`` (``_baseline_of_sorted``), the window kept sorted as it moves: the same
    window again costs nothing, one moved on by a run an insertion and a removal instead of a sort (the same
    numbers either way: median, MAD and quantiles are read off the same sorted values)."""

    def __init__(self, logs: list[float]) -> None:
        self.logs = logs
        self.lo = self.hi = 0
        self.ordered: list[float] = []
        self.result = (0.0, 0.0)

    def of(self, lo: int, hi: int) -> tuple[float, float]:
        if (lo, hi) == (self.lo, self.hi) and self.ordered:
            return self.result
        if self.lo <= lo <= self.hi <= hi and hi - self.hi <= BASELINE_WINDOW:
            for y in self.logs[self.lo : lo]:
                del self.ordered[bisect.bisect_left(self.ordered, y)]
            for y in self.logs[self.hi : hi]:
                bisect.insort(self.ordered, y)
        else:
            self.ordered = sorted(self.logs[lo:hi])
        self.lo, self.hi = lo, hi
        self.result = _baseline_of_sorted(self.ordered)
        return self.result


def _median_of_sorted(ordered: list[float]) -> float:
    """``statistics.median`` of values already sorted (the same arithmetic, without sorting them again)."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _baseline_of_sorted(ordered: list[float]) -> tuple[float, float]:
    """(level, spread) of a regime's runs, already sorted: robust to outliers and aware of two modes."""
    level = _median_of_sorted(ordered)
    mad = 1.4826 * _median_of_sorted(sorted([abs(x - level) for x in ordered]))
    spread_q = (_quantile(ordered, 0.9) - _quantile(ordered, 0.1)) / 2.563
    return level, max(mad, spread_q, MIN_SPREAD)


def _find(
    values: tuple, checkpoint: Checkpoint | None = None, settled: int | None = None
) -> tuple[list[Regression], Checkpoint | None]:
    """Every drop (``find_regressions``), judged from ``checkpoint`` (a valid one: ``resume_regressions``) or from the
    first run, and the checkpoint at the last re-baseline decided on the first ``settled`` values (any: None;
    ``checkpoint`` if there was none since)."""
    first = checkpoint.regime_start if checkpoint else 0  # nothing before a checkpoint's regime is read again
    points = [
        (i, math.log(v))
        for i, v in enumerate(values[first:], first)
        if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)
    ]
    found: list[Regression] = list(checkpoint.found) if checkpoint else []
    regime_start = 0  # position in ``points`` of the current regime's first run
    low = high = 0.0  # downward / upward CUSUM statistics
    low_start = high_start = None  # where each excursion began
    level = spread = 0.0
    open_drops: list[int] = list(checkpoint.open_drops) if checkpoint else []  # indexes in ``found`` not recovered
    baseline = _SlidingBaseline([y for _, y in points])
    position = regime_start
    last_rebaseline = None
    while position < len(points):
        index, y = points[position]
        if position - regime_start < MIN_BASELINE:
            position += 1
            continue
        # Baseline: the runs of this regime before any excursion under way (never the runs being judged).
        excursion = position  # the first run of an excursion under way, if any
        if low_start is not None and low_start < excursion:
            excursion = low_start
        if high_start is not None and high_start < excursion:
            excursion = high_start
        window_start = max(regime_start, excursion - BASELINE_WINDOW)
        if excursion - window_start >= MIN_BASELINE:
            level, spread = baseline.of(window_start, excursion)
        z = max(-CLIP, min(CLIP, (y - level) / spread))
        low = max(0.0, low - z - SLACK)
        high = max(0.0, high + z - SLACK)
        low_start = (low_start if low_start is not None else position) if low > 0 else None
        high_start = (high_start if high_start is not None else position) if high > 0 else None
        changed_at = None
        if low > THRESHOLD:
            low_start = _split(points, max(regime_start, low_start - ONSET_LOOKBACK), position, level, spread)
            changed_at = low_start
            after = median([p[1] for p in points[low_start : position + 1]])
            change = math.exp(after - level) - 1
            if change <= -MIN_CHANGE:
                found.append(
                    Regression(
                        first_slow=points[low_start][0],
                        last_good=points[low_start - 1][0],
                        before=math.exp(level),
                        after=math.exp(after),
                        change_pct=100 * change,
                        detected_at=index,
                        confirming_runs=position - low_start + 1,
                        noise_pct=100 * (math.exp(spread) - 1),
                    )
                )
                open_drops.append(len(found) - 1)
        elif high > THRESHOLD:
            changed_at = high_start
            after = median([p[1] for p in points[high_start : position + 1]])
            for k in list(open_drops):  # a rise back to an old level recovers that regression
                old = found[k]
                if after >= math.log(old.before) - RECOVERY_SPREADS * math.log(1 + old.noise_pct / 100):
                    found[k] = replace(old, recovered_at=points[high_start][0])
                    open_drops.remove(k)
        if changed_at is not None:  # re-baseline: the new regime starts where the excursion began
            regime_start, position = changed_at, changed_at
            low = high = 0.0
            low_start = high_start = None
            # decided on the values up to this run (its digest is taken once, for the last re-baseline kept)
            if settled is None or index + 1 <= settled:
                last_rebaseline = (index + 1, points[regime_start][0], tuple(found), tuple(open_drops))
            continue
        position += 1
    if last_rebaseline is None:
        return found, checkpoint
    judged, start, found_then, open_then = last_rebaseline
    return found, Checkpoint(judged, _digest(values[:judged]), start, found_then, open_then)


def _split(points: list[tuple[int, float]], start: int, end: int, level: float, spread: float) -> int:
    """The onset of a drop between ``start`` and ``end``: where the runs before and after differ most.

    CUSUM starts counting at the first low run, which may be noise just before the change; the split that
    maximises the two-sample statistic on the clipped residuals is a better estimate of the first slow run.
    """
    residuals = [max(-CLIP, min(CLIP, (y - level) / spread)) for _, y in points[start : end + 1]]
    total, n = sum(residuals), len(residuals)
    best, best_score, prefix = end, -1.0, 0.0
    for k in range(1, n):  # onset = start + k: runs start..start+k-1 before, the rest after
        prefix += residuals[k - 1]
        before, after = prefix / k, (total - prefix) / (n - k)
        score = k * (n - k) / n * (before - after) ** 2 if before > after else 0.0
        if score > best_score:
            best, best_score = start + k, score
    return best
