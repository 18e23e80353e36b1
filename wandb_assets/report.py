"""The fleet report run: one long-lived W&B run (stable id, resumed each time) that shows the fleet where
W&B users already look. Each publish logs every fleet snapshot not published yet, oldest first, against the
custom x-axis ``fleet/snapshot_unix``; then the alerts and push-to-main SPS tables, SPS line plots per CI
config, a self-contained HTML dashboard, and the warehouse snapshot as a versioned artifact.

``report_publications`` in the warehouse remembers what went out (the run's summary carries
``fleet/last_snapshot_unix`` too), so no snapshot is logged twice and none is skipped: a publish after an
outage catches up in order. Its rows are written before the run is finished, so a crash in between cannot
publish a snapshot twice (at most, the last publication is incomplete in W&B).

The warehouse is never held while W&B is talked to: everything to publish is read through one short
connection, the run is logged with the warehouse closed, and a second short connection records it.
The warehouse artifact goes out at most once a UTC day (``publish`` forces one), with a TTL, and without
the raw ``config``/``summary`` JSON of the runs unless asked for. Works online and with
``WANDB_MODE=offline``. No Dagster here.
"""

from __future__ import annotations

import html
import os
import tempfile
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

from wandb_assets.lib.clock import utc_now
from wandb_assets.lib.downsample import downsample
from wandb_assets.lib.gauges import GAUGE_NAMES
from wandb_assets.lib.lake import Lake, is_lake
from wandb_assets.lib.lake import attach as attach_lake
from wandb_assets.lib.sql import SPS_SQL_STATES, Connect, sql_string
from wandb_assets.lib.warehouse import ensure_schema, row_counts

REPORT_RUN_ID = "fleet-report"
PLOT_POINTS = 250
TABLE_ROWS = 250
X_AXIS = "fleet/snapshot_unix"


@dataclass
class PublishResult:
    published: list[datetime] = field(default_factory=list)
    run_path: str = ""
    #: ``name:alias`` of the warehouse artifact logged this time, or "" when none was due.
    artifact: str = ""


@dataclass(frozen=True)
class ArtifactPolicy:
    """How the warehouse artifact is published."""

    ttl: timedelta = timedelta(days=30)
    raw: bool = False  # keep the runs' raw config/summary JSON in the copy
    force: bool = False  # publish one now even if one went out today (``wandb-assets publish``)


def _unix(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1)).total_seconds())


def unpublished_snapshots(con, project: str, run_id: str) -> list[datetime]:
    """Snapshots not yet published to this report run (a back-dated one too), oldest first."""
    return [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT m.snapshot_at FROM fleet_metrics m WHERE NOT EXISTS (SELECT 1 FROM report_publications p "
            "WHERE p.project = $project AND p.run_id = $run AND p.snapshot_at = m.snapshot_at) ORDER BY m.snapshot_at",
            {"project": project, "run": run_id},
        ).fetchall()
    ]


def warehouse_artifact_due(con, project: str, run_id: str, today: date) -> bool:
    """At most one warehouse artifact per UTC day and report run."""
    last = con.execute(
        "SELECT max(published_at) FROM report_publications WHERE project = $project AND run_id = $run "
        "AND artifact IS NOT NULL",
        {"project": project, "run": run_id},
    ).fetchone()[0]
    return last is None or last.date() < today


def reduced_copy(snapshot_file: str | os.PathLike | Lake, target: str | os.PathLike, raw: bool) -> dict[str, int]:
    """A fresh DuckDB file with every table of the snapshot (same schema, comments and views), without the
    runs' ``config``/``summary`` JSON unless ``raw``. Built anew rather than by deleting, so no freed page
    of the file still holds the dropped data. Returns the row counts. ``snapshot_file`` may be a DuckLake
    (attached read-only: its latest committed snapshot)."""
    import duckdb

    con = duckdb.connect(str(target))
    try:
        con.execute("SET TimeZone = 'UTC'")
        ensure_schema(con)
        if isinstance(snapshot_file, Lake):
            attach_lake(con, snapshot_file, "source", read_only=True)
        else:
            con.execute(f"ATTACH {sql_string(str(snapshot_file))} AS source (READ_ONLY)")
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'source' AND table_name IN "
                "(SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()) "
                "AND table_name <> 'warehouse_meta'"
            ).fetchall()
        ]
        for table in tables:
            dropped = " EXCLUDE (config, summary)" if table == "runs" and not raw else ""
            con.execute(f"INSERT INTO main.{table} BY NAME SELECT *{dropped} FROM source.{table}")
        con.execute("DETACH source")
        counts = row_counts(con)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return counts


def sps_series(con) -> dict[str, list[tuple]]:
    """Per CI config on main: (ended_unix, sps, commit, alerted) rows, downsampled to PLOT_POINTS."""
    rows = con.execute(
        "SELECT s.ci_config, epoch(s.ended_at)::BIGINT, s.sps_overview_sps, s.ci_commit, "
        "EXISTS (SELECT 1 FROM alerts a WHERE a.rule = 'sps_regression' AND (a.details->>'ci_config') = s.ci_config "
        "        AND (a.details->>'run_id') = s.run_id) "
        "FROM push_to_main_sps s WHERE s.ci_branch = 'main' AND s.sps_overview_sps IS NOT NULL "
        f"AND s.ended_at IS NOT NULL AND s.state IN ({SPS_SQL_STATES}) ORDER BY s.ci_config, s.ended_at"
    ).fetchall()
    by_config: dict[str, list[tuple]] = {}
    for config, *point in rows:
        by_config.setdefault(config, []).append(tuple(point))
    return {
        config: downsample(points, PLOT_POINTS, {i for i, p in enumerate(points) if p[3]})
        for config, points in by_config.items()
    }


def _svg_line(points: list[tuple], width: int = 520, height: int = 120) -> str:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if not points:
        return ""
    x0, x1, y0, y1 = min(xs), max(xs) or 1, min(ys), max(ys)

    def sx(x):
        return 5 + (width - 10) * ((x - x0) / ((x1 - x0) or 1))

    def sy(y):
        return height - 5 - (height - 10) * ((y - y0) / ((y1 - y0) or 1))

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, *_ in points)
    marks = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="#d62728"/>' for x, y, _, a in points if a)
    return (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{line}"/>{marks}</svg>'
    )


def dashboard_html(
    gauges: dict[str, float | None], snapshot_at: datetime, alerts: list[tuple], series: dict[str, list[tuple]]
) -> str:
    """A self-contained page (inline CSS and SVG, nothing fetched): gauges, open alerts, SPS per config."""
    gauge_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{'' if gauges.get(name) is None else f'{gauges[name]:,.2f}'}</td></tr>"
        for name in GAUGE_NAMES
    )
    alert_rows = (
        "".join(
            f"<tr><td>{html.escape(str(r[0]))}</td><td>{html.escape(str(r[1]))}</td><td>{html.escape(str(r[2]))}</td>"
            f"<td>{html.escape(str(r[3]))}</td></tr>"
            for r in alerts
            if r[4] is None
        )
        or '<tr><td colspan="4">none</td></tr>'
    )
    charts = "".join(
        f"<h3>{html.escape(config)}: overview/sps on main ({len(points)} points, red = SPS regression alert)</h3>"
        f"{_svg_line(points)}"
        for config, points in sorted(series.items())
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Fleet dashboard</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}}</style></head><body>
<h1>Fleet dashboard</h1><p>Snapshot {snapshot_at:%Y-%m-%d %H:%M:%S} UTC (window: the 24 hours before).</p>
<h2>Gauges</h2><table><tr><th>metric</th><th>value</th></tr>{gauge_rows}</table>
<h2>Open alerts</h2><table><tr><th>rule</th><th>subject</th><th>opened (UTC)</th><th>message</th></tr>
{alert_rows}</table>
<h2>Main-branch throughput</h2>{charts}</body></html>"""


@dataclass
class _Contents:
    """Everything one publication logs, read from the warehouse before W&B is contacted."""

    pending: list[datetime]
    by_snapshot: dict[datetime, dict[str, float | None]]
    alerts: list[tuple]
    sps: list[tuple]
    series: dict[str, list[tuple]]
    published_before: bool


ALERT_COLUMNS = ["rule", "subject", "opened_at", "message", "resolved_at", "severity"]
SPS_COLUMNS = ["ci_config", "ci_branch", "ci_commit", "state", "ended_at", "overview_sps", "url"]


def _read_contents(con, project: str, run_id: str) -> _Contents:
    pending = unpublished_snapshots(con, project, run_id)
    rows = (
        con.execute(
            "SELECT snapshot_at, metric, value FROM fleet_metrics WHERE snapshot_at IN "
            "(SELECT unnest($t::TIMESTAMP[])) ORDER BY snapshot_at",
            {"t": pending},
        ).fetchall()
        if pending
        else []
    )
    by_snapshot: dict[datetime, dict[str, float | None]] = {}
    for snapshot_at, metric, value in rows:
        by_snapshot.setdefault(snapshot_at, {})[metric] = value
    alerts = con.execute(
        f"SELECT rule, subject, strftime(opened_at, '%Y-%m-%d %H:%M'), message, "
        f"strftime(resolved_at, '%Y-%m-%d %H:%M'), severity FROM alerts ORDER BY opened_at DESC LIMIT {TABLE_ROWS}"
    ).fetchall()
    sps = con.execute(
        f"SELECT ci_config, ci_branch, ci_commit, state, strftime(ended_at, '%Y-%m-%d %H:%M'), sps_overview_sps, url "
        f"FROM push_to_main_sps WHERE sps_overview_sps IS NOT NULL ORDER BY ended_at DESC NULLS LAST LIMIT {TABLE_ROWS}"
    ).fetchall()
    published_before = con.execute(
        "SELECT count(*) > 0 FROM report_publications WHERE project = $project AND run_id = $run",
        {"project": project, "run": run_id},
    ).fetchone()[0]
    return _Contents(pending, by_snapshot, alerts, sps, sps_series(con), published_before)


def publish_report(
    connect: Connect,
    snapshot_file: str | os.PathLike | None,
    project: str,
    entity: str | None = None,
    run_id: str = REPORT_RUN_ID,
    now: datetime | None = None,
    mode: str | None = None,
    api_key: str | None = None,
    artifact_policy: ArtifactPolicy | None = None,
) -> PublishResult:
    """Publish every unpublished snapshot to the report run; a no-op when there is none."""
    import wandb

    now = now or utc_now()
    policy = artifact_policy or ArtifactPolicy()
    with connect() as con:
        contents = _read_contents(con, project, run_id)
        artifact_due = policy.force or warehouse_artifact_due(con, project, run_id, now.date())
    if not contents.pending:
        return PublishResult()
    run = wandb.init(
        project=project,
        entity=entity,
        id=run_id,
        resume="allow",
        job_type="fleet-report",
        name="wandb-assets fleet report",
        mode=mode,
        dir=os.environ.get("WANDB_DIR") or None,  # read now: wandb's process-wide settings may be older
        settings=wandb.Settings(silent=True, console="off", **({"api_key": api_key} if api_key else {})),
    )
    try:
        pending = contents.pending
        already = run.summary.get("fleet/last_snapshot_unix")
        if not contents.published_before and already is not None:
            # a new or rebuilt warehouse, an old report run: the run's own memory says what went out
            pending = [t for t in pending if _unix(t) > already]
        run.define_metric(X_AXIS)
        run.define_metric("fleet/*", step_metric=X_AXIS)
        for snapshot_at in pending:
            values = contents.by_snapshot.get(snapshot_at, {})
            run.log({X_AXIS: _unix(snapshot_at), **{f"fleet/{m}": v for m, v in values.items() if v is not None}})
        artifact = ""
        if pending:
            latest = pending[-1]
            if latest >= max(contents.pending):
                run.summary.update(
                    {
                        "fleet/last_snapshot_unix": _unix(latest),
                        "fleet/last_snapshot_at": latest.isoformat() + "Z",
                        **{f"fleet/{m}": v for m, v in contents.by_snapshot[latest].items()},
                    }
                )
            _log_tables_and_dashboard(run, contents, contents.by_snapshot[latest], latest)
            if artifact_due:
                artifact = _log_warehouse(run, snapshot_file, latest, policy)
        run_path = f"{run.entity}/{run.project}/{run.id}" if run.entity else f"{run.project}/{run.id}"
        # Recorded before finish(): a crash after this line cannot publish these snapshots a second time.
        if pending:
            with connect() as con:
                con.executemany(
                    "INSERT INTO report_publications VALUES (?, ?, ?, ?, ?)",
                    [(t, now, project, run_id, (artifact or None) if t == pending[-1] else None) for t in pending],
                )
    finally:
        run.finish()
    return PublishResult(published=pending, run_path=run_path, artifact=artifact)


def _log_tables_and_dashboard(run, contents: _Contents, gauges: dict, snapshot_at: datetime) -> None:
    import wandb

    logged = {
        "tables/alerts": wandb.Table(columns=ALERT_COLUMNS, data=[list(r) for r in contents.alerts]),
        "tables/push_to_main_sps": wandb.Table(columns=SPS_COLUMNS, data=[list(r) for r in contents.sps]),
    }
    for config, points in contents.series.items():
        table = wandb.Table(
            columns=["ended_unix", "overview_sps", "ci_commit", "alert"], data=[list(p) for p in points]
        )
        logged[f"sps/{config}"] = wandb.plot.line(
            table, "ended_unix", "overview_sps", title=f"{config}: overview/sps on main"
        )
    page = dashboard_html(gauges, snapshot_at, contents.alerts, contents.series)
    logged["dashboard"] = wandb.Html(page, inject=False)
    run.log(logged)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dashboard.html"
        path.write_text(page)
        artifact = wandb.Artifact(
            "fleet-dashboard", type="dashboard", metadata={"snapshot_at": snapshot_at.isoformat() + "Z"}
        )
        artifact.add_file(str(path))
        run.log_artifact(artifact)


def _log_warehouse(run, snapshot_file, snapshot_at: datetime, policy: ArtifactPolicy) -> str:
    """Log a reduced copy of the warehouse snapshot as ``fleet-warehouse`` with a TTL; returns name:alias."""
    import wandb

    if not snapshot_file or not (is_lake(snapshot_file) or Path(snapshot_file).exists()):
        return ""
    alias = f"snapshot-{_unix(snapshot_at)}"
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "warehouse.duckdb"
        counts = reduced_copy(snapshot_file, copy, policy.raw)
        artifact = wandb.Artifact(
            "fleet-warehouse",
            type="warehouse",
            description="Read-only DuckDB snapshot of the wandb-assets warehouse"
            + ("" if policy.raw else " (runs without their raw config/summary JSON)"),
            metadata={"snapshot_at": snapshot_at.isoformat() + "Z", "row_counts": counts, "raw": policy.raw},
        )
        artifact.ttl = policy.ttl
        artifact.add_file(str(copy), name="warehouse.duckdb")
        run.log_artifact(artifact, aliases=["latest", alias])  # the default "mutable" policy stages a copy now
    return f"fleet-warehouse:{alias}"
