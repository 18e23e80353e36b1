"""Alert rules over the warehouse, the alert lifecycle, and the notification outbox. No Dagster here.

A rule yields *conditions* (rule, subject, message, details) that hold at a snapshot. The lifecycle turns
them into ``alerts`` rows keyed by ``rule:subject``: an alert opens once, is only touched
(``last_seen_at``) while its condition keeps holding, and resolves when a later evaluation of its rule no
longer finds it. Opening and resolving each put one message per channel in ``alert_notifications``; the
outbox is drained in order and a channel that is down keeps its messages for a later tick.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import duckdb

from wandb_assets.lib.accounting.gpus import DEFAULT_IDLE_GPU_PCT, UNKNOWN_TESTBED, testbed_sql
from wandb_assets.lib.accounting.prices import PRICE_SCHEDULE_CTE, price_on_sql
from wandb_assets.lib.curves_warehouse import steady_metric
from wandb_assets.lib.gauges import snapshot_gauge, snapshot_project_gauge
from wandb_assets.lib.lake import retry_on_conflict
from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.regressions import Checkpoint, checkpoint_from_json, checkpoint_to_json, resume_regressions
from wandb_assets.lib.runs_lifecycle import moved_copy_sql
from wandb_assets.lib.sql import (
    ALIVE_SQL,
    ENDED_SQL,
    FAILED_SQL,
    MIRRORED_RUNS_SQL,
    RATED_SQL,
    SPS_SQL_STATES,
    Connect,
    dict_rows,
    meta_value,
    set_meta,
    transaction,
)

#: ``sps_change_points``: the detector's answer, one row per regression (``find_change_points``).
CHANGE_POINT_TYPES: dict[str, str] = {
    "ordinal": "INTEGER",
    "entity": "VARCHAR",
    "project": "VARCHAR",
    "ci_config": "VARCHAR",
    "testbed": "VARCHAR",
    "metric": "VARCHAR",
    "evaluated_at": "TIMESTAMP",
    "last_good_commit": "VARCHAR",
    "last_good_url": "VARCHAR",
    "first_slow_commit": "VARCHAR",
    "first_slow_run_id": "VARCHAR",
    "first_slow_created_at": "TIMESTAMP",
    "first_slow_url": "VARCHAR",
    "detected_commit": "VARCHAR",
    "before": "DOUBLE",
    "after": "DOUBLE",
    "change_pct": "DOUBLE",
    "noise_pct": "DOUBLE",
    "confirming_runs": "INTEGER",
    "recovered_commit": "VARCHAR",
    "recovered": "BOOLEAN",
}

ALERT_SQL = (
    """
CREATE TABLE IF NOT EXISTS alerts (
    alert_key VARCHAR, rule VARCHAR, subject VARCHAR, severity VARCHAR, message VARCHAR, details JSON,
    opened_at TIMESTAMP, last_seen_at TIMESTAMP, resolved_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS alert_notifications (
    id BIGINT, alert_key VARCHAR, event VARCHAR, channel VARCHAR,
    text VARCHAR, status VARCHAR, attempts INTEGER, last_error VARCHAR, created_at TIMESTAMP, sent_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS run_progress (
    run_id VARCHAR, observed_at TIMESTAMP, step DOUBLE, entity VARCHAR, project VARCHAR
);
CREATE TABLE IF NOT EXISTS sps_change_points (
"""
    + ",\n".join(f"    {column} {kind}" for column, kind in CHANGE_POINT_TYPES.items())
    + """
);
"""
)


@dataclass(frozen=True)
class AlertThresholds:
    """Every rule's knobs, with their defaults (``settings.Settings`` reads the ``WANDB_ASSETS_ALERT_*``
    variables into one of these)."""

    success_rate_min_pct: float = 80.0
    success_rate_min_runs: int = 5
    failure_spike_pct: float = 50.0
    failure_spike_min_ended: int = 10
    stall_heartbeat_minutes: float = 30.0
    stall_step_minutes: float = 60.0
    ci_silent_hours: float = 12.0
    long_running_hours: float = 168.0
    #: The summary key sps_regression watches (``WANDB_ASSETS_SPS_METRIC``).
    sps_metric: str = "overview/sps"
    #: Several projects mirrored (``WANDB_ASSETS_PROJECTS``): every rule runs per project, and alert subjects and
    #: messages carry ``entity/project``. The settings always turn it on (one project or several: the same keys);
    #: off, every rule runs over the whole fleet with unscoped keys (what warehouses before issue 32 recorded).
    by_project: bool = False
    #: idle_gpus: a GPU below this utilisation (percent) is idle (``WANDB_ASSETS_IDLE_GPU_PCT``) ...
    idle_gpu_pct: float = DEFAULT_IDLE_GPU_PCT
    #: ... and a running run whose GPUs were all idle on every sample for this long is alerted.
    idle_gpu_minutes: float = 30.0


def scoped(th: AlertThresholds, row: dict, subject: str | None, message: str) -> tuple[str, str]:
    """``(subject, message)`` of a condition found for ``row``'s project: with ``by_project`` the subject is
    ``entity/project[:subject]`` and the message starts with ``entity/project: ``; else both as given."""
    if not th.by_project:
        return subject or "", message
    where = f"{row['entity']}/{row['project']}"
    return (f"{where}:{subject}" if subject else where), f"{where}: {message}"


@dataclass(frozen=True)
class Condition:
    """A rule that holds for one subject at one evaluation."""

    rule: str
    subject: str
    severity: str
    message: str
    details: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.rule}:{self.subject}"


#: Rated push-to-main runs (finished, failed, crashed) per project in the 24 h before ``$t``.
_RATED_SQL = f"""
SELECT entity, project, count(*) AS rated FROM {MIRRORED_RUNS_SQL} runs
WHERE category = 'push_to_main' AND state IN ({RATED_SQL})
AND ended_at > $t - INTERVAL 24 HOUR AND ended_at <= $t AND created_at <= $t GROUP BY ALL
"""


def _push_to_main_rates(con, at: datetime, th: AlertThresholds) -> list[dict]:
    """``[{entity, project, rate, rated}]``: the push-to-main success rate at ``at`` (the gauge's own definition)
    and how many rated runs it covers, per project with ``by_project``, else one row for the whole fleet."""
    rated = {(r["entity"], r["project"]): r["rated"] for r in dict_rows(con, _RATED_SQL, {"t": at})}
    name = "wandb.push_to_main.success_rate_pct"
    if not th.by_project:
        rate = snapshot_gauge(con, at, name, th.idle_gpu_pct)
        return [{"entity": None, "project": None, "rate": rate, "rated": sum(rated.values())}]
    return [
        {"entity": e, "project": p, "rate": rate, "rated": rated.get((e, p), 0)}
        for (e, p), rate in snapshot_project_gauge(con, at, name, th.idle_gpu_pct).items()
    ]


def success_rate_summary(con, at: datetime, th: AlertThresholds) -> str:
    """What the success-rate check found when it did not fire, as one sentence (per project: the lowest rate)."""
    rates = [r for r in _push_to_main_rates(con, at, th) if r["rate"] is not None]
    if not rates:
        return f"No push-to-main run finished, failed or crashed in the 24 h before {at:%Y-%m-%d %H:%M} UTC."
    row = min(rates, key=lambda r: (r["rate"], -r["rated"]))
    rate, rated = row["rate"], row["rated"]
    if rate is None:
        return f"No push-to-main run finished, failed or crashed in the 24 h before {at:%Y-%m-%d %H:%M} UTC."
    verdict = (
        f"too few to judge (minimum {th.success_rate_min_runs})"
        if rated < th.success_rate_min_runs
        else f"at or above the {th.success_rate_min_pct:g}% threshold"
    )
    return scoped(
        th,
        row,
        None,
        f"Push-to-main success rate {rate:.1f}% over the 24 h before {at:%Y-%m-%d %H:%M} UTC "
        f"({rated} runs finished, failed or crashed): {verdict}."
        + (f" (The lowest of {len(rates)} projects.)" if len(rates) > 1 else ""),
    )[1]


def sps_regression_summary(con, at: datetime, th: AlertThresholds) -> str:
    """What the SPS-regression check found when it did not fire, as one sentence."""
    configs, runs = con.execute(  # counted in SQL: the series themselves are not needed for a sentence
        f"SELECT count(DISTINCT (entity, project, ci_config)), count(*) FROM ({_series_runs_sql(th.sps_metric)})",
        series_params(con, at, th.sps_metric),
    ).fetchone()
    return (
        f"No unrecovered {th.sps_metric} regression in {configs} CI config(s) on main "
        f"({runs} runs with a value, up to {at:%Y-%m-%d %H:%M} UTC)."
    )


def success_rate_low(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """Push-to-main success rate below the threshold, over at least ``success_rate_min_runs`` *rated* runs.

    The minimum counts the runs the rate is computed from (finished + failed + crashed), so killed or
    preempted runs cannot make one failure look like a rate over many runs.
    """
    conditions = []
    for row in _push_to_main_rates(con, at, th):
        rate, rated = row["rate"], row["rated"]
        if rate is None or rated < th.success_rate_min_runs or rate >= th.success_rate_min_pct:
            continue
        subject, message = scoped(
            th,
            row,
            "push_to_main",
            f"Push-to-main success rate is {rate:.1f}% over the last 24 h ({rated} runs finished, failed or "
            f"crashed; threshold {th.success_rate_min_pct:g}%).",
        )
        conditions.append(
            Condition(
                "push_to_main_success_rate_low",
                subject,
                "warning",
                message,
                {"success_rate_pct": rate, "rated_runs": rated} | _project_details(th, row),
            )
        )
    return conditions


def _project_details(th: AlertThresholds, row: dict) -> dict:
    return {"entity": row["entity"], "project": row["project"]} if th.by_project else {}


#: Main-branch runs of one CI config in commit order (the CI timestamp in the name, then created_at), with the
#: throughput metric read from the summary (``$key``: a JSON path to one summary key). The whole history: the
#: detector is causal and O(n log w), so every tick sees the regimes, baselines and alert keys earlier ticks saw.
#: (A window of the last N runs would lose a regression's baseline as it slides, re-key the alert, and
#: eventually resolve it although the throughput never recovered.)
#: A run's SPS for the detector: its steady SPS (``runs.sps_steady``, the median of its curve after warm-up) when its
#: curves were read and ``$steady`` (they are of the metric judged), else its summary value of ``$key``. Measured on
#: ``benchmarks/regressions.py --curves``: F1 0.725 on steady SPS against 0.527 on each run's last point when a
#: quarter of runs end on a checkpoint; equal without that; a series switching mid-way adds no false alert.
#: A summary value is a number or none (text and booleans are none), as ``runs`` keeps the five SPS keys
#: (``normalize.finite_float``): one of those is read from its column (pr_checks reads the same), another key from
#: the summary (at a million runs, parsing 337,709 summaries took 0.3 s of each tick's SPS check).
def _sps_of_run_sql(metric: str) -> str:
    column = SPS_KEYS.get(metric)
    summary = column or (
        "CASE WHEN json_type(summary, $key) IN ('DOUBLE', 'BIGINT', 'UBIGINT') "
        "THEN json_extract(summary, $key)::DOUBLE END"
    )
    return f"coalesce(CASE WHEN $steady THEN sps_steady END, {summary})"


#: Main's ended CI runs up to ``$t``: what the series are made of (``_series_runs_sql``) and what their mark digests
#: (``_series_mark_sql``), one condition for both.
_MAIN_CI_RUNS = f"""category = 'push_to_main' AND ci_branch = 'main' AND ci_config IS NOT NULL
  AND state IN ({SPS_SQL_STATES}) AND ended_at <= $t AND created_at <= $t"""


def _series_runs_sql(metric: str) -> str:
    """Main's CI runs up to ``$t`` with an SPS of ``metric`` (``_sps_of_run_sql``), with what names them."""
    sps = _sps_of_run_sql(metric)
    return f"""
SELECT entity, project, ci_config, {testbed_sql("runs")} AS testbed, run_id, ci_commit, url, created_at,
       {sps} AS sps, coalesce(ci_timestamp, created_at) AS commit_time
FROM {MIRRORED_RUNS_SQL} runs
WHERE {_MAIN_CI_RUNS} AND isfinite({sps}) AND {sps} > 0
"""


#: Commit order within a series: the CI timestamp in the name, then created_at; the run id breaks ties.
_COMMIT_ORDER = "commit_time, created_at, run_id"
#: A main series: one CI config on one testbed (GPU count and model, ``lib.gpus.testbed_sql``): a change of hardware
#: is two series, never a regression (issue 45).
_SERIES = "entity, project, ci_config, testbed"
#: Each main series' runs up to ``$t`` with their position in it (0 = oldest, commit order), read once an evaluation
#: into a temporary table (each read parses a third of a million summaries at a million runs): the detector's lists of
#: values and the few runs a regression names both come from it.
_SERIES_TABLE = "sps_series_runs"
_SERIES_TABLE_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_SERIES_TABLE} AS
SELECT *, row_number() OVER (PARTITION BY {_SERIES} ORDER BY {_COMMIT_ORDER}) - 1 AS position
FROM ({{runs}})
"""
#: Each series as one list of values in commit order: what the detector reads, without a Python row per run; and how
#: many of its first runs were committed before ``$settled_before`` (``SETTLED``).
_SERIES_VALUES_SQL = f"""
SELECT {_SERIES}, list(sps ORDER BY position) AS sps, count(*) FILTER (WHERE commit_time < $settled_before) AS settled
FROM {_SERIES_TABLE} GROUP BY ALL ORDER BY ALL
"""
#: How long after its commit a main run may still end and join its series: the detector keeps its checkpoint before
#: the runs committed this recently (``regressions.resume_regressions``' ``settled``). A run ending later than this
#: after its commit changes the series' settled runs, and the next tick judges the series from its first run.
SETTLED = timedelta(hours=6)
#: The runs at given positions of given series (``$wanted``: JSON ``[{entity, project, ci_config, testbed,
#: position}]``): the few a regression names.
_SERIES_RUNS_AT_SQL = f"""
WITH wanted AS (
    SELECT unnest(from_json($wanted::JSON, '[{{"entity": "VARCHAR", "project": "VARCHAR", "ci_config": "VARCHAR",
                                              "testbed": "VARCHAR", "position": "BIGINT"}}]'), recursive := true)
)
SELECT s.* FROM {_SERIES_TABLE} s JOIN wanted USING ({_SERIES}, position)
"""


def series_params(con, at: datetime, metric: str) -> dict:
    """The parameters of the series queries: ``$t``, the summary ``$key`` of ``metric`` (unless it has its column),
    and ``$steady``: whether the runs' steady SPS is of ``metric`` (``curves_warehouse.steady_metric``)."""
    key = {} if metric in SPS_KEYS else {"key": summary_key_path(metric)}
    return {"t": at, **key, "steady": steady_metric(con) == metric}


def summary_key_path(metric: str) -> str:
    """The JSON path of one summary key, slashes and dots included (``overview/sps`` -> ``$."overview/sps"``)."""
    return '$."' + metric.replace('"', '\\"') + '"'


def find_change_points(con, at: datetime, metric: str) -> list[dict]:
    """Every regression the detector finds in each CI config's main series up to ``at``, recovered ones too, oldest
    first per config: one ``sps_change_points`` row each. Each series comes as one list of values; only the runs a
    regression names are read as rows (at a million runs, 313,606 Python rows cost 0.7 s an evaluation)."""
    return _change_points_and_checkpoints(con, at, metric)[0]


def _change_points_and_checkpoints(con, at: datetime, metric: str) -> tuple[list[dict], dict[str, Checkpoint]]:
    """``find_change_points``, each series resumed from the checkpoint a tick kept (``_DETECTOR_KEY``) where it still
    holds, and the checkpoints to keep now."""
    params = series_params(con, at, metric)
    con.execute(_SERIES_TABLE_SQL.format(runs=_series_runs_sql(metric)), params)
    try:
        return _change_points_of_series(con, at, metric, _stored_checkpoints(con))
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_SERIES_TABLE}")


#: ``warehouse_meta`` key: the detector's checkpoint of each series (``regressions.Checkpoint``), kept by the tick that
#: recorded the change points, so the next one judges only the runs after each series' last re-baseline.
_DETECTOR_KEY = "sps_detector_checkpoints"


def _stored_checkpoints(con) -> dict[str, Checkpoint]:
    """The checkpoints kept, by series (``json.dumps([entity, project, ci_config, testbed])``); none if unreadable."""
    try:
        kept = meta_value(con, _DETECTOR_KEY)
        return {series: checkpoint_from_json(data) for series, data in json.loads(kept).items()} if kept else {}
    except (duckdb.CatalogException, ValueError, KeyError, TypeError):  # none kept, or by another version: start over
        return {}


def _change_points_of_series(
    con, at: datetime, metric: str, checkpoints: dict[str, Checkpoint]
) -> tuple[list[dict], dict[str, Checkpoint]]:
    found, kept = [], {}
    rows = con.execute(_SERIES_VALUES_SQL, {"settled_before": at - SETTLED}).fetchall()
    for entity, project, config, testbed, values, settled in rows:
        series = json.dumps([entity, project, config, testbed])
        regressions, checkpoint = resume_regressions(values, checkpoints.get(series), settled)
        found += [((entity, project, config, testbed), regression) for regression in regressions]
        if checkpoint is not None:
            kept[series] = checkpoint
    if not found:
        return [], kept
    wanted = {
        (*series, position)
        for series, r in found
        for position in (r.last_good, r.first_slow, r.detected_at, r.recovered_at)
        if position is not None
    }
    keys = ("entity", "project", "ci_config", "testbed", "position")
    named = {
        tuple(row[key] for key in keys): row
        for row in dict_rows(
            con, _SERIES_RUNS_AT_SQL, {"wanted": json.dumps([dict(zip(keys, w, strict=True)) for w in wanted])}
        )
    }
    rows = []
    for series, regression in found:
        good, slow = named[(*series, regression.last_good)], named[(*series, regression.first_slow)]
        recovered = named[(*series, regression.recovered_at)] if regression.recovered_at is not None else None
        rows.append(
            {
                "ordinal": len(rows),
                "entity": series[0],
                "project": series[1],
                "ci_config": series[2],
                "testbed": series[3],
                "metric": metric,
                "evaluated_at": at,
                "last_good_commit": good["ci_commit"],
                "last_good_url": good["url"],
                "first_slow_commit": slow["ci_commit"],
                "first_slow_run_id": slow["run_id"],
                "first_slow_created_at": slow["created_at"],
                "first_slow_url": slow["url"],
                "detected_commit": named[(*series, regression.detected_at)]["ci_commit"],
                "before": regression.before,
                "after": regression.after,
                "change_pct": regression.change_pct,
                "noise_pct": regression.noise_pct,
                "confirming_runs": regression.confirming_runs,
                "recovered_commit": recovered["ci_commit"] if recovered else None,
                "recovered": recovered is not None,
            }
        )
    return rows, kept


def _series_mark_sql(metric: str) -> str:
    """What the main series up to ``$t`` are made of, cheaply (no summary is parsed): how many runs, the latest time
    among them, and a digest of every column the series and their change points are read from (the metric's column,
    else the summary's text). The same as when ``sps_change_points`` was recorded: the same rows, so the detector
    would find the same. A run read again unchanged leaves it as it was (its ``ingested_at`` was in it: each tick's
    re-read of yesterday and today ran the detector again, 0.7 s at a million runs, for the same answer)."""
    source = SPS_KEYS.get(metric) or "summary"
    return f"""
SELECT count(*), greatest(max(ended_at), max(created_at)),
       sum(hash(entity, project, run_id, created_at, ended_at, state, ci_timestamp, ci_config, ci_commit, url,
                gpu_count, gpu_model, sps_steady, {source}))::VARCHAR
FROM {MIRRORED_RUNS_SQL} runs
WHERE {_MAIN_CI_RUNS}
"""


_CHANGE_POINTS_KEY = "sps_change_points"


def _series_mark(con, at: datetime, metric: str) -> str:
    count, last, content = con.execute(_series_mark_sql(metric), {"t": at}).fetchone()
    steady = steady_metric(con) == metric
    return json.dumps(
        {
            "metric": metric,
            "series": "per testbed",  # what the series were split by: a warehouse recorded before is found again
            "steady": steady,
            "runs": count,
            "last": last.isoformat() if last else None,
            "content": content,
        }
    )


def record_change_points(con, at: datetime, metric: str) -> int:
    """Rebuild ``sps_change_points`` as of ``at`` (a writer connection; the detector runs only when the series
    changed since the last rebuild). Returns the rows."""
    con.execute(ALERT_SQL)
    mark = _series_mark(con, at, metric)
    if _recorded_mark(con) == mark:
        return con.execute("SELECT count(*) FROM sps_change_points").fetchone()[0]
    rows, checkpoints = _change_points_and_checkpoints(con, at, metric)
    with transaction(con):
        set_meta(con, _DETECTOR_KEY, json.dumps({k: checkpoint_to_json(c) for k, c in checkpoints.items()}))
        con.execute("DELETE FROM sps_change_points")
        if rows:
            con.execute(
                "INSERT INTO sps_change_points BY NAME "
                "SELECT unnest(from_json($rows::JSON, $shape), recursive := true)",
                {"rows": json.dumps(rows, default=str), "shape": json.dumps([CHANGE_POINT_TYPES])},
            )
        set_meta(con, _CHANGE_POINTS_KEY, mark)
    return len(rows)


def _recorded_mark(con) -> str | None:
    try:
        return meta_value(con, _CHANGE_POINTS_KEY)
    except duckdb.CatalogException:  # a warehouse (or a snapshot) from before the table: nothing recorded
        return None


def change_points(con, at: datetime, metric: str) -> list[dict]:
    """``find_change_points`` as of ``at``, read from ``sps_change_points`` when it was recorded for the same series
    (the same metric, runs and latest time: a tick and every reader after it until the next load), else found
    now. At a million runs the detector takes over a second; reading the table, milliseconds."""
    if _recorded_mark(con) == _series_mark(con, at, metric):
        return recorded_change_points(con)
    return find_change_points(con, at, metric)


def recorded_change_points(con) -> list[dict]:
    """``sps_change_points`` as ``record_change_points`` last recorded it."""
    return dict_rows(con, "SELECT * FROM sps_change_points ORDER BY ordinal", {})


def sps_regression(con, at: datetime, th: AlertThresholds, recorded: bool = False) -> list[Condition]:
    """One condition per regression of a CI config on main that has not recovered (``lib.regressions``).
    ``recorded``: ``record_change_points`` has just run on ``con`` at ``at``, so its table is read without checking
    the series again (the check costs a pass over main's runs, 0.1 s at a million runs).

    The alert is keyed by the first slow commit, so two regressions of one config are two alerts; it resolves
    when a later regime is back within the noise of the old level. Configs never mix: each is its own series.
    """
    metric = th.sps_metric
    conditions = []
    found = recorded_change_points(con) if recorded else change_points(con, at, metric)
    points = [point for point in found if not point["recovered"]]
    shared = Counter((p["entity"], p["project"], p["ci_config"], p["first_slow_commit"]) for p in points)
    for point in points:
        config, slow, testbed = point["ci_config"], point["first_slow_commit"], point.get("testbed") or UNKNOWN_TESTBED
        # the key is the config and first slow commit, as before testbeds; the testbed joins it only when two
        # testbeds of the config slowed at the same commit (the alerts open before the upgrade keep their keys)
        shared_commit = shared[(point["entity"], point["project"], config, slow)] > 1
        on = f" on {testbed}" if testbed != UNKNOWN_TESTBED else ""
        subject, message = scoped(
            th,
            point,
            f"{config}:{slow}" + (f"@{testbed}" if shared_commit else ""),
            f"SPS regression on main for {config}{on}: {metric} fell {-point['change_pct']:.1f}% from "
            f"{point['before']:,.1f} to {point['after']:,.1f} (noise {point['noise_pct']:.1f}%). "
            f"Last good commit {point['last_good_commit']} ({point['last_good_url']}), first slow commit {slow} "
            f"({point['first_slow_url']}); {point['confirming_runs']} slow run(s) confirm it.",
        )
        conditions.append(
            Condition(
                "sps_regression",
                subject,
                "warning",
                message,
                _project_details(th, point)
                | {
                    "ci_config": config,
                    "testbed": testbed,
                    "metric": metric,
                    "last_good_commit": point["last_good_commit"],
                    "last_good_url": point["last_good_url"],
                    "first_slow_commit": slow,
                    "first_slow_url": point["first_slow_url"],
                    "run_id": point["first_slow_run_id"],
                    "before": point["before"],
                    "after": point["after"],
                    "change_pct": point["change_pct"],
                    "confirming_runs": point["confirming_runs"],
                },
            )
        )
    return conditions


def failure_spike(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """More than ``failure_spike_pct`` of the runs that ended in the last 24 h failed or crashed (per project
    with ``by_project``, else over the whole fleet)."""
    by = "entity, project" if th.by_project else "NULL AS entity, NULL AS project"
    counts = dict_rows(
        con,
        f"SELECT {by}, count(*) AS ended, count(*) FILTER (WHERE state IN ({FAILED_SQL})) AS failed "
        f"FROM {MIRRORED_RUNS_SQL} runs "
        f"WHERE state IN ({ENDED_SQL}) AND ended_at > $t - INTERVAL 24 HOUR AND ended_at <= $t AND created_at <= $t "
        "GROUP BY ALL ORDER BY ALL",
        {"t": at},
    )
    conditions = []
    for row in counts:
        ended, failed = row["ended"], row["failed"]
        if ended < th.failure_spike_min_ended or 100 * failed / ended <= th.failure_spike_pct:
            continue
        subject, message = scoped(
            th,
            row,
            None,
            f"Failure spike: {failed} of {ended} runs that ended in the last 24 h failed or crashed "
            f"({100 * failed / ended:.0f}% > {th.failure_spike_pct:g}%).",
        )
        details = {"ended": ended, "failed_or_crashed": failed} | _project_details(th, row)
        conditions.append(Condition("failure_spike", subject or "fleet", "critical", message, details))
    return conditions


def record_progress(con, at: datetime) -> None:
    """Remember each running run's summary ``_step`` at this evaluation (for the stalled-step rule)."""
    con.execute("DELETE FROM run_progress WHERE observed_at = $t", {"t": at})
    con.execute(
        "INSERT INTO run_progress BY NAME SELECT entity, project, run_id, $t AS observed_at, summary_step AS step "
        f"FROM {MIRRORED_RUNS_SQL} runs WHERE state = 'running' AND created_at <= $t",
        {"t": at},
    )
    con.execute("DELETE FROM run_progress WHERE observed_at < $t - INTERVAL 2 DAY", {"t": at})


STALLED_SQL = f"""
WITH current_step AS (
    SELECT entity, project, run_id, step FROM run_progress WHERE observed_at = $t
),
unchanged_since AS (
    SELECT p.entity, p.project, p.run_id, min(p.observed_at) AS since
    FROM run_progress p JOIN current_step c
      ON p.entity = c.entity AND p.project = c.project AND p.run_id = c.run_id AND p.step = c.step
    GROUP BY ALL
),
judged AS (
    SELECT r.entity, r.project, r.run_id, r.name, r.url, r.log_path, r.heartbeat_at, c.step, u.since,
           r.heartbeat_at < $heartbeat_cutoff AS heartbeat_stale,
           c.step IS NOT NULL AND u.since <= $step_cutoff AS step_stuck
    FROM {MIRRORED_RUNS_SQL} r LEFT JOIN current_step c USING (entity, project, run_id)
    LEFT JOIN unchanged_since u USING (entity, project, run_id)
    WHERE r.state = 'running' AND r.created_at <= $t
)
SELECT entity, project, run_id, name, url, log_path,
       CASE WHEN heartbeat_stale
            THEN 'no heartbeat for ' || floor((epoch($t) - epoch(heartbeat_at)) / 60)::BIGINT || ' min'
            ELSE '_step stuck at ' || format('{{:g}}', step) || ' since ' || strftime(since, '%Y-%m-%d %H:%M') || ' UTC'
       END AS reason
FROM judged WHERE heartbeat_stale OR step_stuck
ORDER BY entity, project, run_id
"""


def stalled_run(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """Running runs whose heartbeat is older than the threshold, or whose ``_step`` has not moved.

    The thresholds are any float number of minutes; each is one SQL comparison against a cutoff time,
    and the reason is worked out in the same query (no second opinion in Python).
    """
    record_progress(con, at)
    found = dict_rows(
        con,
        STALLED_SQL,
        {
            "t": at,
            "heartbeat_cutoff": at - timedelta(minutes=th.stall_heartbeat_minutes),
            "step_cutoff": at - timedelta(minutes=th.stall_step_minutes),
        },
    )
    conditions = []
    for r in found:
        subject, message = scoped(
            th, r, r["run_id"], f"Run {r['name'] or r['run_id']} looks stalled: {r['reason']} ({_link(r)})."
        )
        details = {"run_id": r["run_id"], "url": r["url"], "reason": r["reason"]} | _project_details(th, r)
        conditions.append(Condition("stalled_run", subject, "warning", message, details))
    return conditions


def _link(run: dict) -> str:
    """Where to look at a run: its W&B page, or for a run read from an offline log (no page yet) that log."""
    if run["url"]:
        return run["url"]
    return f"offline log {run['log_path']}" if run.get("log_path") else "no link"


def ci_silent(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """No push-to-main run created for ``ci_silent_hours``. With ``by_project``, per project that has ever had
    one (a research project without CI is not silent CI); when none has, once, as for one project."""
    by = "entity, project" if th.by_project else "NULL AS entity, NULL AS project"
    latest = dict_rows(
        con,
        f"SELECT {by}, max(created_at) AS latest FROM {MIRRORED_RUNS_SQL} runs "
        "WHERE category = 'push_to_main' AND created_at <= $t "
        "GROUP BY ALL ORDER BY ALL",
        {"t": at},
    ) or [{"entity": None, "project": None, "latest": None}]
    conditions = []
    for row in latest:
        last = row["latest"]
        if last is not None and last > at - timedelta(hours=th.ci_silent_hours):
            continue
        since = f"since {last:%Y-%m-%d %H:%M} UTC" if last else "in the warehouse at all"
        message = f"No push-to-main run created in the last {th.ci_silent_hours:g} h (none {since})."
        subject, message = scoped(th, row, "push_to_main", message) if row["entity"] else ("push_to_main", message)
        details = {"last_created_at": last.isoformat() if last else None}
        conditions.append(Condition("ci_silent", subject, "warning", message, details | _project_details(th, row)))
    return conditions


def long_running(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """Runs alive (running, pending, preempting) for longer than ``long_running_hours``: a zombie on the
    server, or a job stuck in a queue. The tick refreshes them by id instead of re-reading their days."""
    found = dict_rows(
        con,
        f"SELECT entity, project, run_id, name, url, log_path, state, created_at FROM {MIRRORED_RUNS_SQL} runs "
        f"WHERE state IN ({ALIVE_SQL}) AND created_at <= $cutoff ORDER BY entity, project, run_id",
        {"cutoff": at - timedelta(hours=th.long_running_hours)},
    )
    conditions = []
    for r in found:
        subject, message = scoped(
            th,
            r,
            r["run_id"],
            f"Run {r['name'] or r['run_id']} has been {r['state']} since {r['created_at']:%Y-%m-%d %H:%M} UTC "
            f"(over {th.long_running_hours:g} h): a zombie or a stuck job? ({_link(r)}).",
        )
        details = {
            "run_id": r["run_id"],
            "url": r["url"],
            "state": r["state"],
            "created_at": r["created_at"].isoformat(),
        }
        details |= _project_details(th, r)
        conditions.append(Condition("long_running", subject, "warning", message, details))
    return conditions


IDLE_GPUS_SQL = f"""
WITH samples AS (  -- per run and snapshot: its busiest GPU
    SELECT entity, project, run_id, snapshot_at, max(utilisation) AS busiest
    FROM gpu_samples WHERE snapshot_at <= $t GROUP BY ALL
),
last_busy AS (
    SELECT entity, project, run_id, max(snapshot_at) FILTER (WHERE busiest >= $idle_pct) AS at
    FROM samples GROUP BY ALL
),
idle AS (  -- the first sample after the last busy one: idle on every sample since
    SELECT s.entity, s.project, s.run_id, min(s.snapshot_at) AS since, max(s.snapshot_at) AS latest
    FROM samples s JOIN last_busy b USING (entity, project, run_id)
    WHERE b.at IS NULL OR s.snapshot_at > b.at GROUP BY ALL
),
{PRICE_SCHEDULE_CTE}
SELECT r.entity, r.project, r.run_id, r.name, r.url, r.log_path, r."user", r.gpu_count, r.gpu_model, i.since,
       r.gpu_count * {price_on_sql("r", "$t::DATE")} AS usd_per_hour
FROM idle i JOIN {MIRRORED_RUNS_SQL} r USING (entity, project, run_id)
WHERE r.state = 'running' AND i.latest = $t AND i.since <= $since
ORDER BY r.entity, r.project, r.run_id
"""


def idle_gpus(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """A running run whose GPUs were all below ``idle_gpu_pct`` on every sample (``gpu_samples``, one per
    snapshot) for at least ``idle_gpu_minutes``, sampled at this snapshot too. A run without system metrics has
    no samples and is never called idle; one busy GPU of eight keeps a run busy."""
    found = dict_rows(
        con,
        IDLE_GPUS_SQL,
        {
            "t": at,
            "idle_pct": th.idle_gpu_pct,
            "since": at - timedelta(minutes=th.idle_gpu_minutes),
        },
    )
    conditions = []
    for r in found:
        minutes = (at - r["since"]).total_seconds() / 60
        burn = f"${r['usd_per_hour']:,.2f}/h" if r["usd_per_hour"] is not None else "price unknown"
        subject, message = scoped(
            th,
            r,
            r["run_id"],
            f"Run {r['name'] or r['run_id']} of {r['user'] or 'unknown user'} holds {r['gpu_count']} "
            f"{r['gpu_model'] + ' ' if r['gpu_model'] else ''}GPU{'' if r['gpu_count'] == 1 else 's'} idle "
            f"(all below {th.idle_gpu_pct:g}%) on every sample since "
            f"{r['since']:%Y-%m-%d %H:%M} UTC ({minutes:.0f} min), burning {burn} ({_link(r)}).",
        )
        details = {
            "run_id": r["run_id"],
            "url": r["url"],
            "user": r["user"],
            "gpu_count": r["gpu_count"],
            "gpu_model": r["gpu_model"],
            "idle_since": r["since"].isoformat(),
            "usd_per_hour": r["usd_per_hour"],
        } | _project_details(th, r)
        conditions.append(Condition("idle_gpus", subject, "warning", message, details))
    return conditions


def project_unreachable(con, at: datetime, th: AlertThresholds) -> list[Condition]:
    """A mirrored project the last fetch could not read (404, 403, repeated 5xx, a malformed page; ``entity/*``:
    its listing): one alert per project, whatever the mode, resolved when it reads again or is no longer
    mirrored. Its rows in the warehouse stay as they were (``wandb_projects``)."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'wandb_projects' "
        "AND database_name = current_database()"
    ).fetchone()[0]
    if not exists:
        return []
    found = dict_rows(
        con,
        "SELECT entity, project, failing_since, last_fetched_at, last_error FROM wandb_projects "
        "WHERE mirrored AND last_error IS NOT NULL ORDER BY entity, project",
        {},
    )
    conditions = []
    for r in found:
        where = f"{r['entity']}/{r['project']}"
        last = f"last read whole {r['last_fetched_at']:%Y-%m-%d %H:%M} UTC" if r["last_fetched_at"] else "never read"
        message = (
            f"W&B project {where} could not be read since {r['failing_since']:%Y-%m-%d %H:%M} UTC ({last}; its "
            f"rows are kept as they were): {r['last_error'][:300]}"
        )
        details = {"entity": r["entity"], "project": r["project"], "failing_since": r["failing_since"].isoformat()}
        conditions.append(Condition("project_unreachable", where, "warning", message, details))
    return conditions


RULE_FUNCTIONS: dict[str, Callable[[Any, datetime, AlertThresholds], list[Condition]]] = {
    "push_to_main_success_rate_low": success_rate_low,
    "sps_regression": sps_regression,
    "failure_spike": failure_spike,
    "stalled_run": stalled_run,
    "ci_silent": ci_silent,
    "long_running": long_running,
    "idle_gpus": idle_gpus,
    "project_unreachable": project_unreachable,
}
#: Every rule: those evaluated over the warehouse, and the one the pipeline-failure job opens and resolves.
PIPELINE_FAILURE = "pipeline_failure"


def pipeline_failure(job_name: str, run_id: str, error: str) -> Condition:
    """The condition "job ``job_name`` failed": one alert per job, whatever the run."""
    return Condition(
        PIPELINE_FAILURE,
        job_name,
        "critical",
        f"Dagster run {run_id} of job {job_name} failed: {error[:300]}",
        {"run_id": run_id, "job": job_name},
    )


RULES: tuple[str, ...] = (*RULE_FUNCTIONS, PIPELINE_FAILURE)


def evaluate_rules(con, at: datetime, th: AlertThresholds, change_points_recorded: bool = False) -> list[Condition]:
    """Every warehouse rule at snapshot time ``at``. ``change_points_recorded``: ``record_change_points`` has just run
    on ``con`` at ``at`` (``sps_regression`` reads its table as recorded)."""
    con.execute(ALERT_SQL)
    recorded = {"sps_regression": {"recorded": True}} if change_points_recorded else {}
    return [
        condition for name, rule in RULE_FUNCTIONS.items() for condition in rule(con, at, th, **recorded.get(name, {}))
    ]


@dataclass(frozen=True)
class Transition:
    """An alert that opened or resolved at this evaluation."""

    event: str  # "opened" | "resolved"
    condition: Condition


def _unwatched_projects(con) -> set[tuple[str, str]]:
    """``(entity, project)`` of the projects recorded but not mirrored now (``wandb_projects``): nobody watches them."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'wandb_projects' "
        "AND database_name = current_database()"
    ).fetchone()[0]
    if not exists:
        return set()
    return {(e, p) for e, p in con.execute("SELECT entity, project FROM wandb_projects WHERE NOT mirrored").fetchall()}


@retry_on_conflict
def reconcile(
    con, conditions: list[Condition], evaluated: set[str], now: datetime, channels: list[str]
) -> list[Transition]:
    """Open, touch and resolve alerts; queue one message per channel per transition. One transaction.

    ``evaluated`` says what this evaluation covered: rule names (every subject of the rule) or single
    alert keys (``pipeline_failure:feed``). Only an open alert it covered and that no longer holds resolves; an alert of
    a project outside the mirror set now is unwatched, not healthy: it stays open (``details.unwatched``) and goes on
    under the same key when the project returns.
    """
    con.execute(ALERT_SQL)
    transitions: list[Transition] = []
    with transaction(con):
        open_alerts = {
            r["alert_key"]: r
            for r in dict_rows(
                con,
                "SELECT alert_key, rule, subject, severity, message, details FROM alerts WHERE resolved_at IS NULL",
                {},
            )
        }
        holding = {c.key: c for c in conditions}
        continued = _continued_after_moves(con, open_alerts, holding)
        unwatched = _unwatched_projects(con)
        touched: list[tuple[str, str, str, str]] = []  # (key, message, details, severity) of those still holding
        for found, condition in holding.items():
            key = continued.get(found, found)  # a moved run's alert goes on under the key it opened with
            params = {
                "key": key,
                "now": now,
                "message": condition.message,
                "details": json.dumps(condition.details, default=str),
                "severity": condition.severity,
            }
            if key in open_alerts:  # still holding: touched below, all in one statement
                touched.append((key, params["message"], params["details"], condition.severity))
            else:
                con.execute(
                    "INSERT INTO alerts VALUES ($key, $rule, $subject, $severity, $message, $details::JSON, $now, "
                    "$now, NULL)",
                    params | {"rule": condition.rule, "subject": condition.subject},
                )
                transitions.append(Transition("opened", condition))
        if touched:  # one UPDATE, not one per alert (2,500 open alerts at a million runs: 1.5 s a tick)
            keys, messages, details, severities = map(list, zip(*touched, strict=True))
            con.execute(
                "UPDATE alerts SET last_seen_at = $now, message = t.message, details = t.details::JSON, "
                "severity = t.severity FROM (SELECT unnest($keys) AS alert_key, unnest($messages) AS message, "
                "unnest($details) AS details, unnest($severities) AS severity) t "
                "WHERE alerts.alert_key = t.alert_key AND alerts.resolved_at IS NULL",
                {"now": now, "keys": keys, "messages": messages, "details": details, "severities": severities},
            )
        going_on = set(continued.values())
        for key, row in open_alerts.items():
            if key not in holding and key not in going_on and (row["rule"] in evaluated or key in evaluated):
                details = _details_of(row)
                if (
                    row["rule"] != "project_unreachable"  # (a project no longer mirrored needs no reading)
                    and details.get("entity") is not None
                    and (details["entity"], details.get("project")) in unwatched
                ):  # out of the mirror set: unwatched, not healthy; it goes on under its key when the project returns
                    if not details.get("unwatched"):
                        con.execute(
                            "UPDATE alerts SET details = $details::JSON WHERE alert_key = $key AND resolved_at IS NULL",
                            {"key": key, "details": json.dumps({**details, "unwatched": True}, default=str)},
                        )
                    continue
                con.execute(
                    "UPDATE alerts SET resolved_at = $now WHERE alert_key = $key AND resolved_at IS NULL",
                    {"key": key, "now": now},
                )
                transitions.append(
                    Transition(
                        "resolved",
                        Condition(row["rule"], row["subject"], row["severity"], row["message"], details),
                    )
                )
        for transition in transitions:
            for channel in channels:
                con.execute(
                    "INSERT INTO alert_notifications "
                    "(id, alert_key, event, channel, text, status, attempts, created_at) "
                    "SELECT coalesce(max(id), 0) + 1, $key, $event, $channel, $text, 'pending', 0, $now "
                    "FROM alert_notifications",
                    {
                        "key": transition.condition.key,
                        "event": transition.event,
                        "channel": channel,
                        "text": notification_text(transition),
                        "now": now,
                    },
                )
    return transitions


def _details_of(row: dict) -> dict:
    """An alert row's ``details`` as a dict (DuckDB hands JSON back as text; {} when NULL)."""
    return (json.loads(row["details"]) if isinstance(row["details"], str) else row["details"]) or {}


def _continued_after_moves(con, open_alerts: dict[str, dict], holding: dict[str, Condition]) -> dict[str, str]:
    """``{found key: open key}``: a run alert (``RUN_ALERT_RULES``) open on a copy the run lifecycle marked ``moved``
    (``runs_lifecycle.mark_moved``), or already gone on to the project it names, whose rule now holds for the same run
    (``runs_lifecycle.same_run_sql``: entity, run id and creation time) in the project it moved to.
    The problem did not go away and did not start: the alert goes on under the key it opened with (its message and
    details the new project's), so a move pages neither "resolved" nor "opened"."""
    stranded = {}
    for key, row in open_alerts.items():
        if row["rule"] not in RUN_ALERT_RULES or key in holding:
            continue
        details = _details_of(row)
        if details.get("entity") is not None and details.get("run_id") is not None:
            stranded[key] = (row["rule"], details["entity"], details.get("project"), details["run_id"])
    if not stranded:
        return {}
    by_run = {
        (c.rule, c.details.get("entity"), c.details.get("run_id")): found
        for found, c in holding.items()
        if c.rule in RUN_ALERT_RULES and found not in open_alerts
    }
    pairs = {
        key: (entity, project, run_id, holding[found].details.get("project"), found)
        for key, (rule, entity, project, run_id) in stranded.items()
        if (found := by_run.get((rule, entity, run_id))) is not None
    }
    if not pairs:
        return {}
    moved = set(
        con.execute(
            "SELECT entity, project, run_id, into_project FROM (SELECT unnest($e::VARCHAR[]) AS entity, "
            "unnest($p::VARCHAR[]) AS project, unnest($r::VARCHAR[]) AS run_id, unnest($i::VARCHAR[]) AS into_project) "
            f"c WHERE {moved_copy_sql('c', 'c.into_project')}",
            {
                "e": [s[0] for s in pairs.values()],
                "p": [s[1] for s in pairs.values()],
                "r": [s[2] for s in pairs.values()],
                "i": [s[3] for s in pairs.values()],
            },
        ).fetchall()
    )
    continued = {}
    for key, (entity, project, run_id, into_project, found) in pairs.items():
        # the same run (entity, id, created_at) moved on; or an alert that went on already (its details name the
        # project it was last seen in: the new one)
        if (entity, project, run_id, into_project) in moved or into_project == project:
            continued[found] = key
    return continued


def scope_unscoped_alerts(con) -> int:
    """Give the open alerts of a warehouse written when one project's alerts carried no project in their keys
    (``long_running:z1``) the keys every alert now has (``long_running:e/p:z1``), in place: the alert goes on, it
    neither resolves nor opens again. Only when the warehouse mirrors one project (which one is then certain), and
    only keys whose subject names no project (idempotent). Returns the alerts re-keyed."""
    projects = con.execute(
        "SELECT DISTINCT entity, project FROM runs WHERE coalesce(source, 'wandb') = 'wandb' AND entity IS NOT NULL"
    ).fetchall()
    if len(projects) != 1:
        return 0
    where = f"{projects[0][0]}/{projects[0][1]}"
    subject = "CASE WHEN subject = 'fleet' THEN $where ELSE $where || ':' || subject END"
    unscoped = (
        "resolved_at IS NULL AND rule NOT IN (SELECT unnest($kept::VARCHAR[])) "
        "AND NOT contains(split_part(subject, ':', 1), '/')"
    )
    params = {"where": where, "kept": [PIPELINE_FAILURE, "project_unreachable"]}
    rekeyed = con.execute(f"SELECT alert_key, rule || ':' || {subject} FROM alerts WHERE {unscoped}", params).fetchall()
    for old, new in rekeyed:
        con.execute("UPDATE alert_notifications SET alert_key = $new WHERE alert_key = $old", {"old": old, "new": new})
    con.execute(f"UPDATE alerts SET subject = {subject}, alert_key = rule || ':' || {subject} WHERE {unscoped}", params)
    return len(rekeyed)


def notification_text(transition: Transition) -> str:
    """A readable one-message summary with the rule, the subject and the links in the message."""
    condition = transition.condition
    if transition.event == "opened":
        return f":rotating_light: [{condition.severity}] {condition.rule} ({condition.subject}): {condition.message}"
    return f":white_check_mark: Resolved {condition.rule} ({condition.subject}). Was: {condition.message}"


Deliver = Callable[[str, str, str], str | None]
"""``deliver(channel, event, text)`` returns None on success, else an error sentence."""


def drain_outbox(connect: Connect, deliver: Deliver, now: datetime) -> tuple[int, dict[str, str]]:
    """Send pending notifications oldest first per channel; a failing channel stops and keeps its queue. The
    notifications of one evaluation, channel and event whose alerts are of one run rule in one project (16
    ``stalled_run`` alerts opened at once) go as one message (``group_text``), as Alertmanager groups.

    Delivery is **at least once**: the warehouse is closed while messages go out and the outcomes are
    recorded afterwards, so a crash in between sends those messages again on the next tick.
    Returns ``(sent, {channel: error})``, ``sent`` counting notifications (a group's each).
    """
    with connect() as con:
        con.execute(ALERT_SQL)
        pending = con.execute(
            "SELECT id, channel, event, text, alert_key, created_at FROM alert_notifications "
            "WHERE status = 'pending' ORDER BY id"
        ).fetchall()
    if not pending:
        return 0, {}
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for notification_id, channel, event, text, key, created_at in pending:
        rule, scope, subject = (str(key).split(":", 2) + ["", ""])[:3]
        grouped = rule in RUN_ALERT_RULES and subject
        group = (channel, event, rule, scope, created_at if grouped else notification_id)
        groups.setdefault(group, []).append((notification_id, text))
    outcomes: list[tuple[int, str | None]] = []
    failed: dict[str, str] = {}
    for (channel, event, rule, scope, _), members in groups.items():  # in the order of each group's first one
        if channel in failed:
            continue
        texts = [text for _, text in members]
        error = deliver(channel, event, texts[0] if len(texts) == 1 else group_text(event, rule, scope, texts))
        outcomes.extend((notification_id, error) for notification_id, _ in members)
        if error is not None:
            failed[channel] = error
    with connect() as con:
        _record_outcomes(con, outcomes, now)
    return sum(error is None for _, error in outcomes), failed


#: Rules with one alert per run (keys ``rule:entity/project:run_id``, the run's id in ``details.run_id``): their
#: notifications of one evaluation and project go as one message.
RUN_ALERT_RULES = ("stalled_run", "long_running", "idle_gpus")


def group_text(event: str, rule: str, scope: str, texts: list[str]) -> str:
    """One message for several alerts of ``rule`` in project ``scope`` that opened (or resolved) together: a header,
    then each alert's own line (its run, its link)."""
    what = "opened" if event == "opened" else "resolved"
    mark = ":rotating_light:" if event == "opened" else ":white_check_mark:"
    lines = [text.split(" ", 1)[1] if text.startswith(":") else text for text in texts]
    return f"{mark} {len(texts)} {rule} alerts {what} in {scope}:\n" + "\n".join(f"- {line}" for line in lines)


@retry_on_conflict
def _record_outcomes(con, outcomes: list[tuple[int, str | None]], now: datetime) -> None:
    with transaction(con):
        for notification_id, error in outcomes:
            con.execute(
                "UPDATE alert_notifications SET attempts = attempts + 1, last_error = coalesce($error, last_error), "
                "status = CASE WHEN $error IS NULL THEN 'sent' ELSE status END, "
                "sent_at = CASE WHEN $error IS NULL THEN $now END WHERE id = $id",
                {"now": now, "id": notification_id, "error": None if error is None else error[:500]},
            )
