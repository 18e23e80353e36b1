"""The idle ladder's weekly digest: each owner's and team's idle GPU-hours and dollars of the past ISO week and
their worst runs, written once a week into the ledger (``acting/idle_actions``) and sent from it like every step."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta

from wandb_assets.lib.acting.channels import slack_text
from wandb_assets.lib.acting.idle_actions import (
    DIGEST,
    IDLE_ACTIONS_COLUMNS,
    PENDING,
    SKIPPED,
    ladder_since,
    prepare_ledger,
    take_turn,
)
from wandb_assets.lib.lake import retry_on_conflict
from wandb_assets.lib.sql import transaction

#: Per user (and team) of the week ``[$week, $week + 7 days)``: gpu_usage's idle GPU-hours and dollars, and the user's
#: three episodes with the most idle GPU-hours that began that week.
DIGEST_SQL = f"""
WITH usage AS (
    SELECT username, team, sum(idle_gpu_hours) AS idle_gpu_hours, sum(idle_cost_usd) AS idle_usd
    FROM gpu_usage WHERE day >= $week AND day < $week + INTERVAL 7 DAY AND username IS NOT NULL
    GROUP BY ALL HAVING sum(idle_gpu_hours) > 0
),
episodes AS (
    SELECT details->>'user' AS username, entity || '/' || project || '/' || run_id AS run,
           max(idle_gpu_hours) AS idle_gpu_hours
    FROM idle_actions
    WHERE audience <> '{DIGEST}' AND episode_started_at >= $week AND episode_started_at < $week + INTERVAL 7 DAY
    GROUP BY ALL
)
SELECT u.username, u.team, u.idle_gpu_hours, u.idle_usd,
       (SELECT list((e.run, e.idle_gpu_hours) ORDER BY e.idle_gpu_hours DESC)[:3]
        FROM episodes e WHERE e.username = u.username) AS worst
FROM usage u ORDER BY u.team, u.idle_gpu_hours DESC, u.username
"""


def _usd(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:,.2f}"


def digest_rows(con, week: date, now: datetime, directory) -> list[dict]:
    """The digest rows of the week beginning Monday ``week``: one per user with idle GPU-hours (to their Slack user in
    the teams file) and one per team (to its channel)."""
    found = con.execute(DIGEST_SQL, {"week": week}).fetchall()
    rows: list[dict] = []
    by_team: dict[str, list[tuple]] = {}
    span = f"{week:%Y-%m-%d} to {week + timedelta(days=6):%Y-%m-%d}"
    for user, team, hours, usd, worst in found:
        by_team.setdefault(team, []).append((user, hours, usd))
        text = slack_text(
            ":bar_chart: Your idle GPUs, week of {span} (UTC): {hours} idle GPU-hours, {usd}.",
            span=span,
            hours=f"{hours:,.1f}",
            usd=_usd(usd),
        )
        if worst:  # run paths are anyone's to choose (wandb.init(id=...)): escaped, never live mrkdwn
            runs = [slack_text("{run} ({hours} idle GPU-h)", run=run, hours=round(h, 1)) for run, h in worst]
            text += f" Worst: {'; '.join(runs)}."
        rows.append(_digest_row(f"user:{user}", week, now, text, directory.slack_users.get(user), user, hours, usd))
    for team, members in by_team.items():
        hours = sum(h for _, h, _ in members)
        priced = [u for _, _, u in members if u is not None]
        usd = sum(priced) if priced else None
        lines = ", ".join(
            slack_text("{user} {hours} GPU-h ({usd})", user=user, hours=f"{h:,.1f}", usd=_usd(u))
            for user, h, u in members[:10]
        )
        text = (
            slack_text(
                ":bar_chart: Team {team}, idle GPUs, week of {span} (UTC): {hours} GPU-hours, {usd}: ",
                team=team,
                span=span,
                hours=f"{hours:,.1f}",
                usd=_usd(usd),
            )
            + f"{lines}."
        )
        rows.append(_digest_row(f"team:{team}", week, now, text, directory.channels.get(team), None, hours, usd))
    return rows


def _digest_row(key, week, now, text, recipient, user, hours, usd) -> dict:
    return {
        "entity": "",
        "project": "",
        "run_id": key,
        "episode_started_at": datetime.combine(week, datetime.min.time()),
        "step": 0,
        "audience": DIGEST,
        "decided_at": now,
        "recipient": recipient,
        "outcome": PENDING,
        "idle_gpu_hours": round(hours, 6),
        "idle_usd": None if usd is None else round(usd, 6),
        "details": json.dumps({"text": text, "user": user}),
        "attempts": 0,
    }


def last_week(now: datetime) -> date:
    """The Monday of the last whole ISO week before ``now``."""
    today = now.date()
    return today - timedelta(days=today.weekday() + 7)


def uncovered(con, week: date) -> str | None:
    """Why the warehouse does not hold the whole week beginning Monday ``week`` (None: it does): it holds the week
    when it holds runs created before the week began (a warehouse first filled mid-week would report part of a
    week as the whole: a run created on Sunday and idle on Monday is not in it)."""
    first = con.execute("SELECT min(created_at) FROM runs").fetchone()[0]
    if first is not None and first.date() < week:
        return None
    held = f"from {first:%Y-%m-%d}" if first is not None else "no run"
    return f"the warehouse holds {held}, not the whole week of {week:%Y-%m-%d}: no digest of a part of a week"


@retry_on_conflict
def record_digest(con, now: datetime, directory) -> int:
    """The last whole week's digest rows, written once (the deciders' turn row first, as ``record_decisions``).
    Never on the tick that switched the ladder on (``ladder_since``), and only of a week the warehouse holds whole
    (``uncovered``: else one skipped row says why)."""
    import pandas

    week = last_week(now)
    prepare_ledger(con, now)
    with transaction(con):
        take_turn(con, now)
        since = ladder_since(con)
        if since is None or since >= now:  # the ladder's first tick: a digest then would come out of the blue
            return 0
        done = con.execute(
            f"SELECT count(*) FROM idle_actions WHERE audience = '{DIGEST}' AND episode_started_at = $week",
            {"week": datetime.combine(week, datetime.min.time())},
        ).fetchone()[0]
        if done:
            return 0
        partial = uncovered(con, week)
        rows = [] if partial else digest_rows(con, week, now, directory)
        if not rows:  # nothing idle, or not the whole week: one row says the week was looked at
            rows = [
                _digest_row("none", week, now, "", None, None, 0.0, None)
                | {"outcome": SKIPPED, "acted_at": now, "reason": partial or "nobody had idle GPU-hours"}
            ]
        frame = pandas.DataFrame(rows, columns=list(IDLE_ACTIONS_COLUMNS)).astype(
            {"episode_started_at": "datetime64[us]", "decided_at": "datetime64[us]", "acted_at": "datetime64[us]"}
        )
        con.register("idle_digest", frame)
        try:
            con.execute("INSERT INTO idle_actions BY NAME SELECT * REPLACE (details::JSON AS details) FROM idle_digest")
        finally:
            con.unregister("idle_digest")
    return len(rows)
