"""What the idle ladder shows of itself: ``wandb-assets idle``'s text (the policy, each open episode, what comes
next) and the ladder's Datadog gauges. Reads the ledger (``acting/idle_actions``); writes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from wandb_assets.lib.acting.idle_actions import (
    LEDGER_KEY,
    PENDING,
    SENDING,
    SENT,
    SKIPPED,
    STOPPED,
    WITHDRAWN,
    WOULD_STOP,
    Candidate,
    Seen,
    claim_pending,
    ledger_rows,
    prepare_ledger,
    record_decisions,
    stop_outcomes,
)
from wandb_assets.lib.acting.idle_policy import DATADOG, OWNER, STOP, TEAM, IdlePolicy
from wandb_assets.lib.datadog_feed import GAUGE_TYPE

#: Each running run's latest episode in the ledger: what was done (step, audience, outcome), and what its latest
#: decision said comes next.
OPEN_EPISODES_SQL = f"""
WITH latest AS (
    SELECT entity, project, run_id, max(episode_started_at) AS episode_started_at FROM idle_actions GROUP BY ALL
)
SELECT a.entity, a.project, a.run_id, a.episode_started_at,
       string_agg(a.step || ' ' || a.audience || ': ' || a.outcome, ', ' ORDER BY a.step, a.audience) AS done,
       arg_max(a.details::VARCHAR, a.decided_at) AS details, max(a.idle_gpu_hours) AS idle_gpu_hours,
       max(a.idle_usd) AS idle_usd,
       bool_or(a.audience IN ('{OWNER}', '{TEAM}') AND a.outcome = '{SENT}' AND a.channel = 'slack') AS told_in_slack,
       bool_or(a.audience IN ('{OWNER}', '{TEAM}') AND a.outcome NOT IN ('{PENDING}', '{SENDING}', '{SKIPPED}',
               '{WITHDRAWN}')) AS tried
FROM idle_actions a JOIN latest USING (entity, project, run_id, episode_started_at)
JOIN runs r USING (entity, project, run_id)
WHERE r.state = 'running' AND a.audience <> '{DATADOG}'
GROUP BY ALL ORDER BY a.episode_started_at, a.entity, a.project, a.run_id
"""


def format_idle(
    policy: IdlePolicy,
    configured: bool,
    episodes: list[tuple],
    idle_now: list[tuple[Candidate, str]],
    now: datetime,
) -> str:
    """What ``wandb-assets idle`` prints at ``now``: the policy, the open episodes (done, next and when: a step is
    judged on the run's GPU samples, so one due by the clock but not taken waits for a newer sample, said with the
    latest), and the runs idle at their latest sample the ladder has not judged (``idle_now``: each with its exemption
    or why not yet)."""
    ladder = "; ".join(f"{step.after_minutes:g} min: {step.describe()}" for step in policy.ladder)
    if configured:
        head = f"Idle policy: GPUs below {policy.idle_gpu_pct:g}%, {policy.gpu_fraction:g} of a run's GPUs; {ladder}."
        head += " Stopping is " + ("ON." if policy.stop_runs else "off (the stop step is only recorded).")
    else:
        head = (
            "The idle ladder is off (WANDB_ASSETS_IDLE_POLICY is not set): nothing is sent or stopped. The default "
            f"policy would: {ladder} (stopping off)."
        )
    lines = [head, f"Open idle episodes: {len(episodes)}"]
    for entity, project, run_id, started, done, details_text, hours, usd, told_in_slack, tried in episodes:
        d = json.loads(details_text or "{}")
        cost = f", ${usd:,.2f}" if usd is not None else ""
        if not d.get("next_step"):
            following = "no step left"
        elif datetime.fromisoformat(d["next_at"]) <= now and d.get("latest_sample_at"):
            following = (
                f"next: {d['next_step_does']}, due since {datetime.fromisoformat(d['next_at']):%Y-%m-%d %H:%M} UTC: "
                f"waiting for a newer GPU sample (latest {datetime.fromisoformat(d['latest_sample_at']):%H:%M} UTC)"
            )
        else:
            following = (
                f"next: {d['next_step_does']} at {datetime.fromisoformat(d['next_at']):%Y-%m-%d %H:%M} UTC "
                "(if still idle)"
            )
        if tried and not told_in_slack and policy.stop_runs and any(step.stop for step in policy.ladder):
            following += "; nobody reachable in Slack (owner or team channel): will not stop"
        lines.append(
            f"  {entity}/{project}/{run_id} of {d.get('user') or 'unknown user'}: idle since {started:%Y-%m-%d %H:%M} "
            f"UTC ({d.get('idle_gpus', 0):g} of {d.get('gpu_count')} GPUs, {hours or 0:.2f} idle GPU-hours{cost}); "
            f"done: {done}; {following}"
        )
    if idle_now:
        lines.append(f"Idle at their latest sample, not on the ladder: {len(idle_now)}")
        for run, why in idle_now:
            lines.append(f"  {run.entity}/{run.project}/{run.run_id} of {run.user or 'unknown user'}: {why}")
    return "\n".join(lines)


#: A stopped run's idle dollars avoided are estimated as the dollars of as long again as it had idled when stopped, at
#: most this long: nobody knows when its owner would have noticed; this says how the estimate is made.
AVOIDED_HOURS_MAX = 24.0

#: The ladder's Datadog gauges over the 24 hours before ``$now``: runs whose owner was told, runs stopped, runs that
#: would have been stopped (stop_runs off), and the idle dollars the stops avoided (``AVOIDED_HOURS_MAX``).
LADDER_GAUGES_SQL = f"""
SELECT
    count(DISTINCT (entity, project, run_id)) FILTER (WHERE audience = '{OWNER}' AND outcome = '{SENT}')
        AS owners_told_24h,
    count(DISTINCT (entity, project, run_id)) FILTER (WHERE audience = '{STOP}' AND outcome = '{STOPPED}')
        AS runs_stopped_24h,
    count(DISTINCT (entity, project, run_id)) FILTER (WHERE audience = '{STOP}' AND outcome = '{WOULD_STOP}')
        AS runs_would_stop_24h,
    coalesce(sum(least(idle_usd, (details->>'usd_per_hour')::DOUBLE * {AVOIDED_HOURS_MAX}))
        FILTER (WHERE audience = '{STOP}' AND outcome = '{STOPPED}'), 0) AS idle_usd_avoided_24h
FROM idle_actions WHERE acted_at > $now - INTERVAL 24 HOUR AND acted_at <= $now
"""


def ladder_gauges(con, now: datetime) -> dict[str, float]:
    """``{wandb.idle_ladder.<gauge>: value}`` (``LADDER_GAUGES_SQL``)."""
    cursor = con.execute(LADDER_GAUGES_SQL, {"now": now})
    names = [d[0] for d in cursor.description]
    return {f"wandb.idle_ladder.{name}": float(value) for name, value in zip(names, cursor.fetchone(), strict=True)}


def ladder_payload(gauges: dict[str, float], now: datetime, tags: list[str]) -> dict:
    """The v2 series payload of the ladder's gauges: one gauge series each, one point at ``now``."""
    timestamp = int(now.replace(tzinfo=UTC).timestamp())
    return {
        "series": [
            {"metric": name, "type": GAUGE_TYPE, "tags": tags, "points": [{"timestamp": timestamp, "value": value}]}
            for name, value in gauges.items()
        ]
    }


# --- the preview: what the ladder would do now, decided on a scratch copy of the ledger, nothing recorded ---

#: The columns of ``runs`` the ledger's decisions read (a run's creation time; its moved copies).
_RUN_COLUMNS = {
    "entity": "VARCHAR",
    "project": "VARCHAR",
    "run_id": "VARCHAR",
    "created_at": "TIMESTAMP",
    "state": "VARCHAR",
}


def rehearse(con, seen: list[Seen], policy: IdlePolicy, now: datetime, datadog: bool) -> tuple[list[dict], dict]:
    """What the ladder would decide at ``now`` for the runs ``seen``, decided by the tick's own code
    (``record_decisions``, ``claim_pending``) on an in-memory copy of what ``con`` (read only) holds of them: their
    rows of ``runs`` and the ledger, and every row waiting in it. Returns ``(rows, known_stops)``: the rows decided
    now that need no sending (``would_stop``, ``skipped``) and the rows a tick would send, as ``deliver`` takes them.
    Nothing is written to ``con``."""
    import duckdb
    import pandas

    from wandb_assets.lib.warehouse import has_table

    scratch = duckdb.connect()
    try:
        prepare_ledger(scratch, now)
        scratch.execute(f"CREATE TABLE runs ({', '.join(f'{c} {t}' for c, t in _RUN_COLUMNS.items())})")
        keys = pandas.DataFrame([(s.run.entity, s.run.run_id) for s in seen], columns=["entity", "run_id"])
        con.register("preview_keys", keys)
        try:
            runs = con.execute(
                f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs JOIN preview_keys USING (entity, run_id)"
            ).df()
            ledger = (
                con.execute(
                    f"SELECT * REPLACE (details::VARCHAR AS details) FROM idle_actions a WHERE outcome = '{PENDING}' "
                    "OR EXISTS (SELECT 1 FROM preview_keys k WHERE k.entity = a.entity AND k.run_id = a.run_id)"
                ).df()
                if has_table(con, "idle_actions")
                else None
            )
        finally:
            con.unregister("preview_keys")
        for name, frame, cast in (("runs", runs, ""), ("idle_actions", ledger, " REPLACE (details::JSON AS details)")):
            if frame is None or frame.empty:
                continue
            scratch.register("copied", frame)
            scratch.execute(f"INSERT INTO {name} BY NAME SELECT *{cast} FROM copied")
            scratch.unregister("copied")
        record_decisions(scratch, seen, policy, now, datadog)
        decided = ledger_rows(
            scratch,
            f"decided_at = $now AND outcome IN ('{WOULD_STOP}', '{SKIPPED}') ORDER BY entity, project, run_id, step, "
            "audience",
            {"now": now},
        )
        claimed = claim_pending(scratch, "preview", now)
        return decided + claimed, stop_outcomes(scratch, claimed)
    finally:
        scratch.close()


def format_preview(where: str, now: datetime, outcomes: list[dict], said: dict[tuple, list[str]], idle: int) -> str:
    """What ``wandb-assets idle --preview`` prints: for each row the ladder would act on now, who would hear what (the
    text as it would go out: ``said`` by the row's ``LEDGER_KEY``) or what would become of the stop."""
    lines = [
        f"Preview of the idle ladder ({where}) at {now:%Y-%m-%d %H:%M} UTC: nothing is sent, stopped or recorded.",
        f"Runs idle at their latest sample: {idle}; actions due now: {len(outcomes)}",
    ]
    for o in outcomes:
        what = f"  {o['entity']}/{o['project']}/{o['run_id']} step {o['step']} ({o['audience']}): "
        told = said.get(tuple(o[c] for c in LEDGER_KEY))
        if o["audience"] == STOP and o["outcome"] == STOPPED:
            lines.append(what + "would be stopped now (W&B read now: running, the same run, not exempt)")
        elif told:
            lines += [what + line for line in told]
        else:
            lines.append(what + o["outcome"] + (f": {o['reason']}" if o.get("reason") else ""))
    return "\n".join(lines)
