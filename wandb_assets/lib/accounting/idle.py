"""The one rule of idle GPU time, as SQL, whatever the samples' source: the tick's snapshots (``gpu_samples``), a run's
sampled GPU stream read with its curves (``run_gpu_samples``), or an offline log's stats records (loaded into
``run_gpu_samples`` like an online run's). No Dagster here.

A sample holds from when it was taken until the run's next sample, the run's end (``busy_until_sql``) or ``now``,
whichever comes first, but never longer than the longer of ``MIN_HOLD`` (a tick missed now and then) and
``HOLD_GAPS`` times the stream's sampling interval: the ticks' stream is sampled every 15 minutes (a sample holds an
hour at most: a longer gap is missed ticks, not known idleness); a run's sampled stream read with its curves is
sampled at its median gap between samples (W&B samples a long run's stream down to a few hundred points: a 30-day
run's samples are 87 minutes apart, and each holds until the next). A hold that
crosses UTC midnight counts on both days, each its part. A run that occupies no GPU (pending, moved) holds nothing.
"""

from __future__ import annotations

from wandb_assets.lib.sql import busy_until_sql

#: The runs whose idle GPU-hours come from their own sampled stream (``run_curve_idle``), not from tick samples: one
#: source per run, in gpu_usage and in the gauges alike.
CURVE_IDLE_RUNS_SQL = "(SELECT DISTINCT entity, project, run_id FROM run_curve_idle)"
#: The shortest a sample may hold for: a stream sampled every 15 minutes that misses a tick still counts.
MIN_HOLD = "INTERVAL 1 HOUR"
#: A sample holds at most this many of its stream's median gaps (a gap longer than that is missing data).
HOLD_GAPS = 2


def idle_of_run(idle: str, sampled: str, gpu_count: str) -> str:
    """The one rule of a run's idle GPUs in a sample, as SQL: the idle GPUs counted, scaled to the run's
    ``gpu_count`` when the sample sees more GPUs than the run holds (NVML lists the whole node: 6 idle of 8 seen, on a
    run of 2, is 1.5), so idle GPU-hours never exceed GPU-hours."""
    return f"({idle}) * least(1.0, coalesce(({gpu_count}) / nullif({sampled}, 0), 1.0))"


def ladder_idle_sql(idle: str, sampled: str, gpu_count: str) -> str:
    """The idle GPUs of a run in a sample as the idle ladder judges them, as SQL: the trigger of an action that cannot
    be undone. A sample that sees no more GPUs than the run holds counts its idle GPUs; one that sees more (NVML lists
    the whole node) cannot say which GPUs are the run's, so the run counts idle (all its ``gpu_count``) only when every
    GPU the sample lists is idle, else none (a 2-GPU run at 95 % beside 6 idle GPUs is busy). Idle GPU-hours keep
    ``idle_of_run``'s scaled estimate."""
    return (
        f"(CASE WHEN ({sampled}) > ({gpu_count}) "
        f"THEN (CASE WHEN ({idle}) >= ({sampled}) THEN ({gpu_count}) ELSE 0 END) ELSE ({idle}) END)"
    )


#: The sampling interval of a stream read with a run's curves: its median gap between samples.
MEDIAN_GAP = "median(next_at - sampled_at) OVER (PARTITION BY entity, project, run_id)"
#: The sampling interval of the ticks' stream (``gpu_samples``): the schedule's 15 minutes.
TICK_INTERVAL = "INTERVAL 15 MINUTE"


def held_sql(sampled: str, runs: str, now: str, interval: str = MEDIAN_GAP, prefix: str = "") -> str:
    """CTEs ``gaps`` and ``held`` (named with ``prefix`` first, where one query holds two streams). ``sampled`` is a
    CTE of one row per run and sample: ``entity, project, run_id, sampled_at, idle`` (GPUs below the threshold),
    ``busy`` (GPUs at or above it) and ``gpus`` (GPUs seen). ``held``: per sample of a run of ``runs`` (a relation with
    the ``runs`` columns) taken within its GPU time, its ``idle`` GPUs (``idle_of_run``), ``partly`` (its idle GPUs
    while another GPU of the run was busy) and ``until``, when the sample stops holding (the module's rule;
    ``interval``: the stream's sampling interval)."""
    end = busy_until_sql(now)
    return f"""
{prefix}gaps AS (
    SELECT s.*, r.gpu_count, {end} AS busy_until,
           lead(s.sampled_at) OVER (PARTITION BY s.entity, s.project, s.run_id ORDER BY s.sampled_at) AS next_at
    FROM {sampled} s JOIN {runs} r USING (entity, project, run_id)
    WHERE s.sampled_at >= r.created_at AND s.sampled_at <= {now} AND {end} IS NOT NULL
),
{prefix}held AS (
    SELECT entity, project, run_id, sampled_at,
           {idle_of_run("idle", "gpus", "gpu_count")} AS idle,
           CASE WHEN busy > 0 THEN {idle_of_run("idle", "gpus", "gpu_count")} ELSE 0 END AS partly,
           least(coalesce(next_at, busy_until), busy_until, {now},
                 sampled_at + greatest({MIN_HOLD}, {HOLD_GAPS} * {interval})) AS until
    FROM {prefix}gaps
)"""


def held_daily_sql(held: str = "held") -> str:
    """CTE ``held_daily``: each hold of ``held`` cut at UTC midnights, one row per run, sample and day with
    ``day_start`` and ``hours``, the part of the hold on that day."""
    return f"""
held_daily AS (
    SELECT *, (epoch(least(until, day_start + INTERVAL 1 DAY)) - epoch(greatest(sampled_at, day_start))) / 3600.0
              AS hours
    FROM (SELECT *, unnest(range(date_trunc('day', sampled_at), until, INTERVAL 1 DAY)) AS day_start
          FROM {held} WHERE until > sampled_at)
)"""
