"""The Datadog feed: one v2 series payload per fleet snapshot, and a delivery ledger in DuckDB.

Each snapshot is delivered **at least once**: sending and marking it ``delivered`` are two steps, so a
crash (or a timeout that Datadog did accept) between them sends it again on the next tick. That is
harmless: a re-sent point has the same metric, tags, timestamp and value, and Datadog keeps one value per
timestamp. A snapshot whose send fails for a passing reason (5xx, 429, a timeout, a refused connection, a
403) stays ``pending`` and later ticks send pending snapshots oldest first; Datadog's v2 intake refuses
points older than one hour, so a snapshot still pending after that is ``expired`` with the reason. Without
an API key configured anywhere the feed runs dry: snapshots are recorded as ``dry_run`` with the payload
they would have sent.

The warehouse is never held over the network: ``deliver_pending`` reads what to send through one short
connection, closes it, sends, then opens another to mark the results. No Dagster and no Datadog client
here: sending is a callable, and so is opening a connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from wandb_assets.lib.lake import retry_on_conflict
from wandb_assets.lib.sql import Connect, transaction

MAX_POINT_AGE = timedelta(hours=1)
GAUGE_TYPE = 3  # MetricIntakeType.GAUGE in Datadog's v2 API

LEDGER_SQL = """
CREATE TABLE IF NOT EXISTS datadog_deliveries (
    snapshot_at TIMESTAMP, status VARCHAR, attempts INTEGER, last_error VARCHAR,
    delivered_at TIMESTAMP, enqueued_at TIMESTAMP
);
"""


@dataclass(frozen=True)
class SendResult:
    """What one submission got: ``status`` is the HTTP status, or None for a timeout/connection error."""

    status: int | None
    error: str = ""

    @property
    def accepted(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def permanent(self) -> bool:
        """A rejection that retrying cannot fix (a malformed payload). 403 is not: the key can be fixed."""
        return self.status is not None and 400 <= self.status < 500 and self.status not in (403, 408, 429)


Sender = Callable[[dict], SendResult]


@dataclass
class DeliveryReport:
    """What one pass over the ledger did."""

    delivered: list[datetime] = field(default_factory=list)
    expired: list[datetime] = field(default_factory=list)
    rejected: list[datetime] = field(default_factory=list)
    dry_run: list[datetime] = field(default_factory=list)
    still_pending: list[datetime] = field(default_factory=list)
    #: One sentence for the tick's log when delivery stopped on an error (never contains the key).
    problem: str | None = None


def feed_tags(entity: str | None, project: str | None, env: str | None) -> list[str]:
    """Low-cardinality tags shared by every point: never one per run. One project mirrored: its entity and
    project. Several (``entity`` None): ``scope:fleet``, the fleet-wide series (see ``project_tags``)."""
    tags = ["source:wandb-assets", *([f"entity:{entity}", f"project:{project}"] if entity else ["scope:fleet"])]
    return tags + [f"env:{env}"] if env else tags


def project_tags(fleet_tags: list[str], entity: str, project: str) -> list[str]:
    """The tags of one project's own series: the fleet series' ``source`` and ``env`` with ``scope:project``."""
    common = [t for t in fleet_tags if t.startswith(("source:", "env:"))]
    return [*common[:1], "scope:project", f"entity:{entity}", f"project:{project}", *common[1:]]


#: The gauges of the ``$n`` projects with the most GPU-hours in the last 24 h (then most active runs, then by
#: name) at one snapshot: the projects that get their own series, so the number of tag sets stays bounded.
_PROJECT_SERIES_SQL = """
WITH ranked AS (
    SELECT entity, project FROM project_metrics WHERE snapshot_at = $t GROUP BY ALL
    ORDER BY max(value) FILTER (WHERE metric = 'wandb.training.total_gpu_hours_24h') DESC NULLS LAST,
             max(value) FILTER (WHERE metric = 'wandb.runs.active') DESC NULLS LAST, entity, project
    LIMIT $n
)
SELECT entity, project, metric, value FROM project_metrics JOIN ranked USING (entity, project)
WHERE snapshot_at = $t AND value IS NOT NULL ORDER BY entity, project, metric
"""


def snapshot_payload(con, snapshot_at: datetime, tags: list[str], project_series: int = 0) -> dict:
    """The v2 series payload of one snapshot: one gauge series per non-NULL metric, one point each; then, for
    the ``project_series`` projects with the most GPU-hours, one series per metric and project."""
    rows = [
        (metric, value, tags)
        for metric, value in con.execute(
            "SELECT metric, value FROM fleet_metrics WHERE snapshot_at = $t AND value IS NOT NULL ORDER BY metric",
            {"t": snapshot_at},
        ).fetchall()
    ]
    if project_series:
        rows += [
            (metric, value, project_tags(tags, entity, project))
            for entity, project, metric, value in con.execute(
                _PROJECT_SERIES_SQL, {"t": snapshot_at, "n": project_series}
            ).fetchall()
        ]
    timestamp = int((snapshot_at - datetime(1970, 1, 1)).total_seconds())
    return {
        "series": [
            {
                "metric": metric,
                "type": GAUGE_TYPE,
                "points": [{"timestamp": timestamp, "value": value}],
                "tags": list(series_tags),
            }
            for metric, value, series_tags in rows
        ]
    }


def enqueue_snapshots(con, now: datetime, dry_run: bool) -> list[datetime]:
    """Add every fleet snapshot not yet in the ledger, as ``pending`` (or ``dry_run``). Returns them.

    In dry run (no key configured anywhere) snapshots still ``pending`` from a tick whose key could not be
    read can never be sent either: they become ``dry_run`` too and are returned with the new ones.
    """
    con.execute(LEDGER_SQL)
    return _enqueue(con, now, dry_run)


@retry_on_conflict
def _enqueue(con, now: datetime, dry_run: bool) -> list[datetime]:
    stranded = []
    with transaction(con):
        if dry_run:  # (no UPDATE ... RETURNING: DuckLake does not support it)
            stranded = [
                r[0]
                for r in con.execute(
                    "SELECT snapshot_at FROM datadog_deliveries WHERE status = 'pending' ORDER BY snapshot_at"
                ).fetchall()
            ]
            con.execute("UPDATE datadog_deliveries SET status = 'dry_run' WHERE status = 'pending'")
        new = [
            r[0]
            for r in con.execute(
                "SELECT DISTINCT m.snapshot_at FROM fleet_metrics m WHERE NOT EXISTS "
                "(SELECT 1 FROM datadog_deliveries d WHERE d.snapshot_at = m.snapshot_at) ORDER BY m.snapshot_at"
            ).fetchall()
        ]
        if new:  # DuckDB refuses executemany with no parameter sets
            con.executemany(
                "INSERT INTO datadog_deliveries VALUES (?, ?, 0, NULL, NULL, ?)",
                [(t, "dry_run" if dry_run else "pending", now) for t in new],
            )
    return stranded + new


def _mark(con, snapshot_at: datetime, status: str, error: str | None, now: datetime, attempted: bool) -> None:
    con.execute(
        "UPDATE datadog_deliveries SET status = $status, last_error = coalesce($error, last_error), "
        "attempts = attempts + $inc, delivered_at = CASE WHEN $status = 'delivered' THEN $now END "
        "WHERE snapshot_at = $t",
        {"status": status, "error": error, "inc": 1 if attempted else 0, "now": now, "t": snapshot_at},
    )


def _expiry_note(age: timedelta) -> str:
    return f"expired: still undelivered {age} after the snapshot; Datadog's intake refuses points older than one hour"


def deliver_pending(
    connect: Connect, send: Sender, now: datetime, tags: list[str], project_series: int = 0
) -> DeliveryReport:
    """Send pending snapshots oldest first; stop at the first passing failure so order is kept.

    Three steps, the warehouse closed during the middle one: (1) expire what is too old and build the
    payloads of the rest, (2) send, (3) record each answer.
    """
    report = DeliveryReport()
    with connect() as con:
        con.execute(LEDGER_SQL)
        pending = [
            r[0]
            for r in con.execute(
                "SELECT snapshot_at FROM datadog_deliveries WHERE status = 'pending' ORDER BY snapshot_at"
            ).fetchall()
        ]
        for snapshot_at in pending:
            if now - snapshot_at > MAX_POINT_AGE:
                _mark(con, snapshot_at, "expired", _expiry_note(now - snapshot_at), now, attempted=False)
                report.expired.append(snapshot_at)
        sendable = [t for t in pending if t not in report.expired]
        payloads = [(t, snapshot_payload(con, t, tags, project_series)) for t in sendable]
    answers: list[tuple[datetime, SendResult]] = []
    for snapshot_at, payload in payloads:
        result = send(payload)
        answers.append((snapshot_at, result))
        if not (result.accepted or result.permanent):
            break
    if not answers:
        return report
    with connect() as con:
        for snapshot_at, result in answers:
            if result.accepted:
                _mark(con, snapshot_at, "delivered", None, now, attempted=True)
                report.delivered.append(snapshot_at)
            elif result.permanent:
                _mark(con, snapshot_at, "rejected", f"HTTP {result.status}: {result.error}"[:500], now, attempted=True)
                report.rejected.append(snapshot_at)
            else:
                error = f"HTTP {result.status}: {result.error}" if result.status else result.error
                _mark(con, snapshot_at, "pending", error[:500], now, attempted=True)
                report.still_pending = sendable[len(answers) - 1 :]
                report.problem = _problem(result, error, len(report.still_pending))  # always the last answer
    return report


def _problem(result: SendResult, error: str, waiting: int) -> str:
    if result.status == 403:
        return (
            "Datadog refused DD_API_KEY (403 Forbidden): set a valid API key for DD_SITE; "
            f"{waiting} snapshot(s) wait and expire after one hour."
        )
    return f"Datadog intake unavailable ({error[:200]}); {waiting} snapshot(s) stay pending for the next tick."


def record_dry_run(
    con, snapshots: list[datetime], tags: list[str], log: Callable[[str], None], project_series: int = 0
) -> DeliveryReport:
    """Log what would have been sent for snapshots recorded as ``dry_run`` (one short line each)."""
    tag_text = ",".join(tags)
    for snapshot_at in snapshots:
        payload = snapshot_payload(con, snapshot_at, tags, project_series)
        fleet = sum(series["tags"] == tags for series in payload["series"])
        per_project = len(payload["series"]) - fleet
        log(
            f"Datadog dry run (no DD_API_KEY configured): would send {fleet} gauges for "
            f"{snapshot_at.isoformat()}Z with tags {tag_text}"
            + (f", and {per_project} per-project series (scope:project)" if per_project else "")
        )
    return DeliveryReport(dry_run=list(snapshots))
