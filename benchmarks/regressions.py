"""SPS-regression detectors on realistic commit-ordered CI throughput, scored the way a team lives with them.

    uv run python benchmarks/regressions.py                 # report seed (2), 300 series
    uv run python benchmarks/regressions.py --seed 1        # the tuning seed
    uv run python benchmarks/regressions.py --curves        # the detector on each run's last point vs steady SPS
    uv run python benchmarks/regressions.py --testbeds      # one series per config vs per config and testbed

The generator makes series of main-branch SPS with ground truth: multiplicative noise of 3-8%, slow
stragglers (one run 15-50% slower), bimodal hardware in a third of the series (two node types, the slow one
7-15% slower, 20-50% of runs), slow wander and occasional long drifts, and events: drops of 5, 10 or 30%,
improvements (+5..15%, never a regression), and regress-then-fix. Evaluation is streaming: at each new main
run a detector sees runs 0..t, as the 15-minute tick does; an alert counts once, when a detector first
reports a regression, and is a true positive when its first slow run is within 5 runs of a true drop onset
that no earlier alert matched. Every method gets the same series.

``--curves`` (issue 34): each run of a series becomes a training curve of ``--points`` SPS points at its level (the
generated value): a warm-up at half speed over the first tenth of its steps, multiplicative noise of
``--point-noise`` per point, and, with probability ``--end-hiccup``, a last point taken while the run checkpoints
or evaluates (60-90 % of its speed). The detector then sees either each run's last point (what a summary holds) or
its steady SPS (the median after the first 10 % of its step range, ``lib.curves_warehouse``'s rule), on the same
series and ground truth.

Methods: the old rule (latest run > 10% below the median of the previous 10), a Conbench-style lookback
z-score (mean and standard deviation of the previous 20 runs, z < -5, Conbench's default threshold), and
``wandb_assets.lib.regressions.find_regressions``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wandb_assets.lib.regressions import find_regressions  # noqa: E402

MATCH_RUNS = 5


@dataclass
class Series:
    values: list[float]
    onsets: list[int] = field(default_factory=list)  # first slow run of each true drop
    testbeds: list[str] = field(default_factory=list)  # each run's machine (``--testbeds``)


def generate(rng: random.Random, n: int) -> Series:
    level = math.log(rng.uniform(100, 50_000))
    noise = rng.uniform(0.03, 0.08)
    outlier_rate = rng.uniform(0.0, 0.05)
    bimodal = rng.random() < 1 / 3
    slow_share, slow_factor = rng.uniform(0.2, 0.5), math.log(rng.uniform(0.85, 0.93))
    drift_per_run = math.log(rng.uniform(0.95, 0.98)) / n if rng.random() < 0.15 else 0.0
    wander = 0.0
    shifts = [0.0] * n
    onsets: list[int] = []
    position = rng.randint(25, 45)
    while position < n - 15:
        kind = rng.choices(["drop", "improvement", "regress_then_fix", "none"], [0.45, 0.15, 0.2, 0.2])[0]
        if kind in ("drop", "regress_then_fix"):
            size = math.log(1 - rng.choice([0.05, 0.10, 0.30]))
            end = n if kind == "drop" else min(n, position + rng.randint(10, 30))
            for i in range(position, end):
                shifts[i] += size
            onsets.append(position)
        elif kind == "improvement":
            size = math.log(rng.uniform(1.05, 1.15))
            for i in range(position, n):
                shifts[i] += size
        position += rng.randint(30, 70)
    values, testbeds = [], []
    for i in range(n):
        wander += rng.gauss(0, 0.002)
        y = level + shifts[i] + wander + drift_per_run * i + rng.gauss(0, noise)
        on_slow = bimodal and rng.random() < slow_share
        if on_slow:
            y += slow_factor
        testbeds.append("slow" if on_slow else "fast")
        if rng.random() < outlier_rate:
            y += math.log(rng.uniform(0.5, 0.85))
        values.append(math.exp(y))
    return Series(values, onsets, testbeds)


def with_hardware_moves(series: list[Series], rng: random.Random, share: float = 0.5) -> tuple[list[Series], list]:
    """``share`` of the series move to other hardware for good at a random run (an older machine 20-40 % slower, or
    a newer one 25-60 % faster): not a regression. Returns the series and each one's move position (None: none)."""
    moved, at = [], []
    for s in series:
        if rng.random() >= share:
            moved.append(s)
            at.append(None)
            continue
        p = rng.randint(40, len(s.values) - 20)
        factor = rng.uniform(0.6, 0.8) if rng.random() < 0.5 else rng.uniform(1.25, 1.6)
        values = s.values[:p] + [v * factor for v in s.values[p:]]
        moved.append(Series(values, s.onsets, s.testbeds[:p] + [f"new-{t}" for t in s.testbeds[p:]]))
        at.append(p)
    return moved, at


def per_testbed(series: list[Series]) -> list[Series]:
    """Each series split by testbed (the runs of one machine, in commit order), a true drop's onset placed at the
    first run of that machine at or after it: what the detector sees once series are kept per testbed."""
    split = []
    for s in series:
        for testbed in dict.fromkeys(s.testbeds):
            where = [i for i, t in enumerate(s.testbeds) if t == testbed]
            onsets = sorted({next(k for k, i in enumerate(where) if i >= o) for o in s.onsets if o <= where[-1]})
            split.append(Series([s.values[i] for i in where], onsets, [testbed] * len(where)))
    return split


def testbed_report(series: list[Series], rng: random.Random) -> None:
    """``--testbeds`` (issue 45): one series per config (machines mixed) against one per config and testbed, on the
    generator's series (a third bimodal) and with half of them moved to other hardware for good."""
    moved, at = with_hardware_moves(series, rng)
    print(f"hardware moves: {sum(p is not None for p in at)} of {len(series)} series (0.6-0.8x or 1.25-1.6x for good)")
    print(f"{'series':52} {'precision':>9} {'recall':>7} {'F1':>5} {'false/100':>9} {'at moves':>8}")
    for name, chosen in (("as generated", series), ("with hardware moves", moved)):
        mixed = [stream_ours(s.values) for s in chosen]
        at_moves = sum(
            1
            for alerts, p in zip(mixed, at, strict=True)
            if p is not None and chosen is moved
            for _, first in alerts
            if abs(first - p) <= MATCH_RUNS
        )
        split = per_testbed(chosen)
        for label, alerts, scored, moves in (
            (f"{name}: per config (machines mixed)", mixed, chosen, at_moves),
            (f"{name}: per config and testbed", [stream_ours(s.values) for s in split], split, 0),
        ):
            r = score(alerts, scored)
            print(
                f"{label:52} {r['precision']:9.3f} {r['recall']:7.3f} {r['f1']:5.3f} {r['false_per_100']:9.3f} "
                f"{moves:8d}"
            )


def as_curves(
    series: list[Series], rng: random.Random, points: int, point_noise: float, end_hiccup: float
) -> tuple[list[Series], list[Series]]:
    """``(last point, steady SPS)`` of each run of each series, as ``--curves`` describes: the same onsets."""
    last, steady = [], []
    for s in series:
        finals, steadies = [], []
        for level in s.values:
            curve = [
                level * (0.5 if k < points / 10 else 1.0) * math.exp(rng.gauss(0, point_noise)) for k in range(points)
            ]
            if rng.random() < end_hiccup:
                curve[-1] = level * rng.uniform(0.6, 0.9) * math.exp(rng.gauss(0, point_noise))
            finals.append(curve[-1])
            steadies.append(statistics.median(curve[math.ceil(0.1 * (points - 1)) :]))
        last.append(Series(finals, s.onsets))
        steady.append(Series(steadies, s.onsets))
    return last, steady


def old_rule(values: list[float]) -> list[int]:
    """Runs at which the old rule's alert opens (it names the latest run as the offender)."""
    opened, holding = [], False
    for t in range(len(values)):
        previous = values[max(0, t - 10) : t]
        now = len(previous) >= 5 and values[t] < 0.9 * statistics.median(previous)
        if now and not holding:
            opened.append(t)
        holding = now
    return opened


def conbench_z(values: list[float], lookback: int = 20, threshold: float = 5.0) -> list[int]:
    """Conbench's lookback z-score: the run is a regression when z < -threshold against the previous runs."""
    opened, holding = [], False
    for t in range(len(values)):
        previous = values[max(0, t - lookback) : t]
        now = False
        if len(previous) >= 5:
            sd = statistics.pstdev(previous)
            now = sd > 0 and (values[t] - statistics.fmean(previous)) / sd < -threshold
        if now and not holding:
            opened.append(t)
        holding = now
    return opened


def stream_ours(values: list[float]) -> list[tuple[int, int]]:
    """(alert run, first slow run) as a tick would see them: the detector called on each prefix."""
    seen: set[int] = set()
    alerts = []
    for t in range(len(values)):
        for regression in find_regressions(values[: t + 1]):
            if regression.first_slow not in seen:
                seen.add(regression.first_slow)
                alerts.append((t, regression.first_slow))
    return alerts


def score(all_alerts: list[list[tuple[int, int]]], series: list[Series]) -> dict[str, float]:
    tp = fp = 0
    delays: list[int] = []
    onsets_total = sum(len(s.onsets) for s in series)
    matched_total = 0
    for alerts, s in zip(all_alerts, series, strict=True):
        matched: set[int] = set()
        for at, first_slow in alerts:
            candidates = [o for o in s.onsets if o not in matched and abs(first_slow - o) <= MATCH_RUNS and at >= o]
            if candidates:
                onset = min(candidates, key=lambda o: abs(first_slow - o))
                matched.add(onset)
                tp += 1
                delays.append(at - onset)
            else:
                fp += 1
        matched_total += len(matched)
    runs = sum(len(s.values) for s in series)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = matched_total / onsets_total if onsets_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "false_per_100": 100 * fp / runs,
        "median_delay": statistics.median(delays) if delays else float("nan"),
        "alerts": tp + fp,
    }


def time_per_call(method, series: list[Series], points: int = 200) -> float:
    samples = [s.values[:points] for s in series[:50]]
    started = time.perf_counter()
    for values in samples:
        method(values)
    return 1000 * (time.perf_counter() - started) / len(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2, help="2 reports; 1 is the seed the constants were tuned on")
    parser.add_argument("--series", type=int, default=300)
    parser.add_argument("--curves", action="store_true", help="last point of each run's curve vs its steady SPS")
    parser.add_argument("--points", type=int, default=50, help="with --curves: SPS points per run")
    parser.add_argument("--point-noise", type=float, default=0.04, help="with --curves: noise of one point")
    parser.add_argument("--end-hiccup", type=float, default=0.25, help="with --curves: share of runs ending slow")
    parser.add_argument("--testbeds", action="store_true", help="one series per config vs per config and testbed")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    series = [generate(rng, rng.randint(150, 250)) for _ in range(args.series)]
    runs = sum(len(s.values) for s in series)
    print(
        f"seed {args.seed}: {len(series)} series, {runs:,} main runs, {sum(len(s.onsets) for s in series)} true drops"
    )
    if args.testbeds:
        testbed_report(series, random.Random(args.seed + 45))
        return
    if args.curves:
        last, steady = as_curves(series, rng, args.points, args.point_noise, args.end_hiccup)
        print(
            f"curves: {args.points} points a run, {args.point_noise:.0%} noise a point, last point a checkpoint or "
            f"evaluation in {args.end_hiccup:.0%} of runs"
        )
        print(f"{'ours, on':42} {'precision':>9} {'recall':>7} {'F1':>5} {'false/100':>9} {'delay':>6}")
        switched = []  # curves turned on mid-series: the last point before a random run, steady SPS from it on
        for old, new in zip(last, steady, strict=True):
            at = rng.randint(0, len(old.values))
            switched.append(Series(old.values[:at] + new.values[at:], old.onsets))
        variants = (
            ("each run's last point (summary)", last),
            ("steady SPS (median after warm-up)", steady),
            ("last point, then steady SPS (switch)", switched),
        )
        for name, values in variants:
            result = score([stream_ours(s.values) for s in values], values)
            print(
                f"{name:42} {result['precision']:9.3f} {result['recall']:7.3f} {result['f1']:5.3f} "
                f"{result['false_per_100']:9.3f} {result['median_delay']:6.1f}"
            )
        return
    methods = {
        "old rule (latest < 0.9 x median of 10)": (lambda v: [(t, t) for t in old_rule(v)], old_rule),
        "Conbench lookback z-score (20, z < -5)": (lambda v: [(t, t) for t in conbench_z(v)], conbench_z),
        "ours: robust CUSUM on log SPS": (stream_ours, find_regressions),
    }
    print(f"{'method':42} {'precision':>9} {'recall':>7} {'F1':>5} {'false/100':>9} {'delay':>6} {'ms/call':>8}")
    for name, (stream, single) in methods.items():
        result = score([stream(s.values) for s in series], series)
        ms = time_per_call(single, series)
        print(
            f"{name:42} {result['precision']:9.3f} {result['recall']:7.3f} {result['f1']:5.3f} "
            f"{result['false_per_100']:9.3f} {result['median_delay']:6.1f} {ms:8.3f}"
        )


if __name__ == "__main__":
    main()
