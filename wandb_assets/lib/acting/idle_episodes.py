"""A run's current idle episode, from its own sampled GPU stream (as read with ``lib/curves.gpu_rows``), in SQL on an
in-memory DuckDB: no warehouse, no Dagster.

A sample is idle when at least ``gpu_fraction`` of the run's GPUs were below ``idle_gpu_pct`` in it, its idle GPUs
counted by the ladder's rule ``lib/idle.ladder_idle_sql`` (a sample that sees more GPUs than the run holds is idle only
when every GPU it lists is), over the run's ``gpu_count``; the idle GPUs reported and their GPU-hours keep
``lib/idle.idle_of_run``'s scaled estimate. The episode is the unbroken stretch of idle samples that ends with the run's
latest sample: it starts at the first idle sample after the last sample that was not idle (or at the stream's first),
and lasts to the latest. A run whose latest sample is not idle has no episode. Its idle GPU-hours: each sample of the
episode holds its idle GPUs until the next sample (the latest holds nothing: it is where the episode stands).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb

from wandb_assets.lib.accounting.idle import idle_of_run, ladder_idle_sql


@dataclass(frozen=True)
class Episode:
    entity: str
    project: str
    run_id: str
    started_at: datetime
    latest_at: datetime
    #: idle GPUs of the run in its latest sample (``idle_of_run``), of ``gpu_count``
    idle_gpus: float
    gpu_count: int
    idle_gpu_hours: float
    #: the latest sample that was not idle, before the episode (None: idle since the stream's first sample)
    last_busy_at: datetime | None

    @property
    def idle_minutes(self) -> float:
        return (self.latest_at - self.started_at).total_seconds() / 60


EPISODES_SQL = f"""
WITH samples AS (
    SELECT entity, project, run_id, sampled_at::TIMESTAMP AS sampled_at,
           count(*) FILTER (WHERE util < $pct) AS idle, count(*) FILTER (WHERE util >= $pct) AS busy,
           count(*) AS gpus
    FROM stream WHERE util IS NOT NULL GROUP BY ALL
),
judged AS (
    SELECT s.*, r.gpu_count, {idle_of_run("s.idle", "s.gpus", "r.gpu_count")} AS idle_gpus,
           {ladder_idle_sql("s.idle", "s.gpus", "r.gpu_count")} >= $fraction * r.gpu_count AS is_idle,
           lead(sampled_at) OVER (PARTITION BY entity, project, run_id ORDER BY sampled_at) AS next_at
    FROM samples s JOIN runs r USING (entity, project, run_id)
    WHERE r.gpu_count > 0
),
bounds AS (
    SELECT entity, project, run_id, max(sampled_at) AS latest_at,
           max(sampled_at) FILTER (WHERE NOT is_idle) AS last_busy_at
    FROM judged GROUP BY ALL
)
SELECT j.entity, j.project, j.run_id, min(j.sampled_at) AS started_at, b.latest_at,
       arg_max(j.idle_gpus, j.sampled_at) AS idle_gpus, any_value(j.gpu_count) AS gpu_count,
       coalesce(sum(j.idle_gpus * (epoch(coalesce(j.next_at, j.sampled_at)) - epoch(j.sampled_at)) / 3600.0), 0)
           AS idle_gpu_hours, b.last_busy_at
FROM judged j JOIN bounds b USING (entity, project, run_id)
WHERE j.sampled_at > coalesce(b.last_busy_at, TIMESTAMP '0001-01-01') AND j.is_idle
GROUP BY j.entity, j.project, j.run_id, b.latest_at, b.last_busy_at
HAVING max(j.sampled_at) = b.latest_at
ORDER BY ALL
"""


def current_episodes(
    streams: dict[tuple[str, str, str], list[list]],
    gpu_counts: dict[tuple[str, str, str], int],
    idle_gpu_pct: float,
    gpu_fraction: float,
) -> list[Episode]:
    """The runs of ``gpu_counts`` (``{(entity, project, run_id): gpu_count}``) idle at their latest sample of their
    stream (``streams``: ``{(entity, project, run_id): lib.curves.gpu_rows(...)}``, rows ``[timestamp (ISO), gpu,
    util, ...]``), each with its episode."""
    import pandas

    keys: list[int] = []
    times: list[str] = []
    utils: list[float | None] = []
    order = list(streams)
    for k, key in enumerate(order):  # one pass, column by column: a frame built row by row costs seconds
        rows = streams[key]
        keys.extend([k] * len(rows))
        times.extend(row[0] for row in rows)
        utils.extend(row[2] for row in rows)
    stream_frame = pandas.DataFrame(
        {"run": pandas.Series(keys, dtype="int32"), "sampled_at": times, "util": pandas.Series(utils, dtype="float64")}
    )
    runs_frame = pandas.DataFrame(
        [[k, *key, gpu_counts[key]] for k, key in enumerate(order) if key in gpu_counts],
        columns=["run", "entity", "project", "run_id", "gpu_count"],
    )
    con = duckdb.connect()
    try:
        con.register("stream_rows", stream_frame)
        con.register("runs", runs_frame)
        con.execute(
            "CREATE TEMP VIEW stream AS SELECT r.entity, r.project, r.run_id, s.sampled_at, s.util "
            "FROM stream_rows s JOIN runs r USING (run)"
        )
        rows = con.execute(EPISODES_SQL, {"pct": idle_gpu_pct, "fraction": gpu_fraction}).fetchall()
    finally:
        con.close()
    return [Episode(*row) for row in rows]
