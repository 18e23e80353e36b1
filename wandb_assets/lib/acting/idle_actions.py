"""The idle ladder's ledger, ``idle_actions``: one row per episode, step and audience (the owner, the team, the stop,
the Datadog event), written once (``record_decisions``: inside one transaction it reads what the ledger holds and
inserts only what is missing, so two ticks at once decide each row once), then sent from it as from an outbox
(``claim_pending``: a row is claimed before it goes out, so it goes out at most once; ``record_outcomes``). No
Dagster, no network: the sending is ``lib/acting/idle_delivery.py``'s.

A row's ``outcome``: ``pending`` (waits in the outbox; a channel that failed leaves it pending for the next tick),
``sending`` (claimed), ``sent`` (``channel`` says where: only ``slack``, the owner's user or the team's channel, counts
as told), ``stopped``, ``would_stop`` (the policy's stop step with ``stop_runs`` off: nothing reaches W&B),
``not_stopped`` (the run had ended), ``refused`` (W&B refused the stop: recorded and told, never tried again),
``skipped`` (nothing to say), ``undeliverable`` (nobody to tell, or Slack will never take it: ``reason`` says why),
``withdrawn`` (an intent found no longer valid when it was to act: a stop is valid only for the tick that decided it,
and a message that waited for Slack only while its run is still idle in the same episode; ``reason`` says why; a
withdrawn step is decided again from scratch) or ``unknown`` (the process sending it ended before it could record
whether it went out: never sent again, so never doubled).

A run is its entity, run id and creation time (``runs_lifecycle.same_run_sql``): each row records the run's
``run_created_at``, and a run's ledger is its own rows and those of its copies the lifecycle marked ``moved`` into its
project, never another run's that happens to share its id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from wandb_assets.lib.accounting.gpus import SOURCE_DEFAULT, SOURCE_METADATA, SOURCE_SYSTEM_METRICS, valid_gpu_count
from wandb_assets.lib.accounting.idle import ladder_idle_sql
from wandb_assets.lib.accounting.prices import PRICE_SCHEDULE_CTE, price_on_sql
from wandb_assets.lib.acting.idle_episodes import Episode
from wandb_assets.lib.acting.idle_policy import DATADOG, OWNER, STOP, TEAM, Done, IdlePolicy, decide, exemption
from wandb_assets.lib.lake import retry_on_conflict
from wandb_assets.lib.runs_lifecycle import moved_copy_sql
from wandb_assets.lib.sql import MIRRORED_RUNS_SQL, dict_rows, transaction

if TYPE_CHECKING:
    import pandas  # imported where used: every process that loads the definitions imports this module (0.39 s)

IDLE_ACTIONS_COLUMNS = {
    "entity": "VARCHAR",
    "project": "VARCHAR",
    "run_id": "VARCHAR",
    "episode_started_at": "TIMESTAMP",
    "step": "INTEGER",
    "audience": "VARCHAR",
    "decided_at": "TIMESTAMP",
    "acted_at": "TIMESTAMP",
    "channel": "VARCHAR",
    "recipient": "VARCHAR",
    "outcome": "VARCHAR",
    "reason": "VARCHAR",
    "idle_gpu_hours": "DOUBLE",
    "idle_usd": "DOUBLE",
    "details": "JSON",
    "attempts": "INTEGER",
    "last_error": "VARCHAR",
    "claim": "VARCHAR",
    "claimed_at": "TIMESTAMP",
    "run_created_at": "TIMESTAMP",
}
IDLE_ACTIONS_SQL = (
    f"CREATE TABLE IF NOT EXISTS idle_actions ({', '.join(f'{c} {t}' for c, t in IDLE_ACTIONS_COLUMNS.items())})"
)
#: The columns naming one row: each is written once.
LEDGER_KEY = ("entity", "project", "run_id", "episode_started_at", "step", "audience")

PENDING, SENDING, SENT, STOPPED, WOULD_STOP = "pending", "sending", "sent", "stopped", "would_stop"
NOT_STOPPED, REFUSED, SKIPPED, UNDELIVERABLE, UNKNOWN = "not_stopped", "refused", "skipped", "undeliverable", "unknown"
WITHDRAWN = "withdrawn"
#: The digest's rows in the ledger: audience ``digest``, step 0, ``episode_started_at`` the week's Monday, ``run_id``
#: ``user:<name>`` or ``team:<name>`` (entity and project empty): each once per week like every step.
DIGEST = "digest"
#: ``warehouse_meta`` key every decision writes first: deciders take turns.
LADDER_TURN_KEY = "idle_ladder_turn"
#: ``warehouse_meta`` key: when the ladder first ran here (its weekly digest never goes out on that tick).
LADDER_SINCE_KEY = "idle_ladder_since"
#: A claim older than this whose outcome was never recorded: its process ended mid-send.
STALE_CLAIM = timedelta(minutes=10)


def _idle_share(policy: IdlePolicy) -> str:
    idle = ladder_idle_sql(
        "len(list_filter(r.latest_gpu_sample, g -> g.utilisation < $pct))",
        "len(list_filter(r.latest_gpu_sample, g -> g.utilisation IS NOT NULL))",
        "r.gpu_count",
    )
    return f"{idle} >= $fraction * r.gpu_count"


#: Running runs whose latest system sample (``runs.latest_gpu_sample``, read by each refresh) is idle by the policy:
#: the few whose sampled stream a tick reads.
CANDIDATES_SQL = """
WITH {prices}
SELECT r.entity, r.project, r.run_id, r.name, r.url, r."user", r.tags, r.config::VARCHAR AS config, r.gpu_count,
       r.gpu_model, r.gpu_count * {usd} AS usd_per_hour, r.created_at, r.gpu_count_source
FROM {runs} r
WHERE r.state = 'running' AND r.gpu_count > 0 AND len(r.latest_gpu_sample) > 0 AND {idle}
ORDER BY r.entity, r.project, r.run_id
"""


@dataclass(frozen=True)
class Candidate:
    entity: str
    project: str
    run_id: str
    name: str | None
    url: str | None
    user: str | None
    tags: list[str] | None
    config: str | None
    gpu_count: int
    gpu_model: str | None
    usd_per_hour: float | None
    #: with entity and run id, the run's identity (``runs_lifecycle.same_run_sql``); None: the warehouse's row says
    created_at: datetime | None = None
    #: where ``gpu_count`` came from (``gpus.gpu_count``): a running run's ``system_metrics`` count is its node's
    gpu_count_source: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.entity, self.project, self.run_id)

    @property
    def count_may_be_its_nodes(self) -> bool:
        """Its GPU count came from its node's system sample (or the default), not from the run itself: a 2-GPU run on
        an 8-GPU node counts 8 (``with_own_gpu_count`` reads its own)."""
        return self.gpu_count_source in (SOURCE_SYSTEM_METRICS, SOURCE_DEFAULT)


def with_own_gpu_count(run: Candidate, metadata: dict | None) -> Candidate:
    """The candidate with its own GPU count, from its ``wandb-metadata.json`` (``metadata``: what was read of it,
    ``fetch.read_metadata_file``), where its count came from its node's system sample or the default: a 2-GPU run on
    an 8-GPU node is 2 GPUs (its dollars an hour with it), never 8. A count from its config stands (it comes first in
    ``gpus.gpu_count`` too); an unread or unusable file changes nothing."""
    if not run.count_may_be_its_nodes or not metadata:
        return run
    count = valid_gpu_count(metadata.get("gpu_count")) if metadata.get("status") == "read" else None
    if count is None or count == run.gpu_count:
        return run
    usd = None if run.usd_per_hour is None else run.usd_per_hour * count / run.gpu_count
    return replace(run, gpu_count=count, usd_per_hour=usd, gpu_count_source=SOURCE_METADATA)


def candidates(con, policy: IdlePolicy, now: datetime) -> list[Candidate]:
    """The running runs idle by ``policy`` on their latest sample, with their dollars an hour at today's price for
    their model and cluster (``now``'s UTC day, ``gpu_price_periods``)."""
    sql = CANDIDATES_SQL.format(
        prices=PRICE_SCHEDULE_CTE, usd=price_on_sql("r", "$today"), runs=MIRRORED_RUNS_SQL, idle=_idle_share(policy)
    )
    params = {"pct": policy.idle_gpu_pct, "fraction": policy.gpu_fraction, "today": now.date()}
    return [Candidate(*row) for row in con.execute(sql, params).fetchall()]


@dataclass(frozen=True)
class Seen:
    """One candidate as the tick saw it: its episode (None: its stream shows no idle episode now), the W&B user's
    e-mail (read with the stream), its team, where its owner and team are told, and why it is exempt (None: it is
    not)."""

    run: Candidate
    episode: Episode | None
    email: str | None
    team: str | None
    owner_slack: str | None
    team_channel: str | None
    exempt: str | None = None
    #: False: its stream could not be read this tick (not judged: what waits for it keeps waiting)
    read: bool = True


def exempt_reason(policy: IdlePolicy, run: Candidate, team: str | None) -> str | None:
    return exemption(policy, run.entity, run.project, run.user, team, run.tags, run.config)


def _ledger(con, runs: list[Candidate]) -> pandas.DataFrame:
    """The ledger's rows of each run (``for_project``: the project it is in now; ``runs`` carry their creation time):
    its own (recorded for this run: the same creation time, or rows written before it was recorded), and those of its
    copies the run lifecycle marked ``moved`` into this project (``moved_copy_sql``: the same run, so a run W&B moved
    mid-episode goes on with its ladder and nobody is told twice); never another run's with the same id."""
    import pandas

    keys = pandas.DataFrame(
        [(r.entity, r.project, r.run_id, r.created_at) for r in runs],
        columns=["entity", "project", "run_id", "created_at"],
    ).astype({"created_at": "datetime64[us]"})
    con.register("idle_keys", keys)
    try:
        return con.execute(
            "SELECT k.project AS for_project, a.entity, a.project, a.run_id, a.episode_started_at, a.step, a.audience, "
            "a.outcome, a.channel, a.decided_at, a.acted_at FROM idle_actions a "
            "JOIN idle_keys k ON a.entity = k.entity AND a.run_id = k.run_id "
            "WHERE (a.run_created_at IS NULL OR k.created_at IS NULL OR a.run_created_at = k.created_at) "
            f"AND (a.project = k.project OR {moved_copy_sql('a', 'k.project')})"
        ).df()
    finally:
        con.unregister("idle_keys")


def _episode_start(rows: pandas.DataFrame, seen: Seen) -> datetime:
    """The episode's start as the ledger knows it: a run that has not been busy since the ledger's latest episode of it
    began is still in that episode (its start stays what it was when first recorded, however the stream is sampled
    now); else the start its stream shows."""
    assert seen.episode is not None
    rows = rows[rows["outcome"] != WITHDRAWN] if not rows.empty else rows
    if not rows.empty:
        recorded = rows["episode_started_at"].max().to_pydatetime()
        if seen.episode.last_busy_at is None or seen.episode.last_busy_at < recorded:
            return recorded
    return seen.episode.started_at


def _done(rows: pandas.DataFrame) -> Done:
    """The steps an episode's rows hold (a withdrawn step is not done: it is decided again), and when its owner or team
    was first told: a message ``sent`` to the owner's Slack user or the team's channel, never the webhook fallback (a
    run whose owner and team nobody can reach in Slack is never stopped)."""
    rows = rows[rows["outcome"] != WITHDRAWN]
    told = rows[rows["audience"].isin([OWNER, TEAM]) & (rows["outcome"] == SENT) & (rows["channel"] == "slack")]
    told_at = told["acted_at"].dropna()
    return Done(frozenset(int(s) for s in rows["step"]), told_at.min().to_pydatetime() if not told_at.empty else None)


def _details(seen: Seen, policy: IdlePolicy, step: int, started_at: datetime, next_step, next_at) -> dict[str, Any]:
    run, episode = seen.run, seen.episode
    assert episode is not None
    return {
        "run_name": run.name,
        "url": run.url,
        "user": run.user,
        "email": seen.email,
        "team": seen.team,
        "owner_slack": seen.owner_slack,
        "team_channel": seen.team_channel,
        "gpu_count": run.gpu_count,
        "gpu_model": run.gpu_model,
        "idle_gpus": round(episode.idle_gpus, 3),
        "idle_minutes": round((episode.latest_at - started_at).total_seconds() / 60, 1),
        "latest_sample_at": episode.latest_at.isoformat(),
        "usd_per_hour": run.usd_per_hour,
        "step_does": policy.ladder[step - 1].describe(),
        "stop_step": policy.ladder[step - 1].stop,
        "next_step": next_step,
        "next_step_does": policy.ladder[next_step - 1].describe() if next_step else None,
        "next_at": next_at.isoformat() if next_at else None,
        "stop_runs": policy.stop_runs,
        "exempt_tags": sorted(policy.exempt.tags),
        "exempt_config_keys": list(policy.exempt.config_keys),
    }


def _rows_of_step(
    seen: Seen, policy: IdlePolicy, step: int, started_at: datetime, now: datetime, details: dict, datadog: bool
) -> list[dict]:
    ladder_step = policy.ladder[step - 1]
    episode = seen.episode
    assert episode is not None
    idle_hours = (episode.latest_at - started_at).total_seconds() / 3600 * episode.idle_gpus
    price = seen.run.usd_per_hour / seen.run.gpu_count if seen.run.usd_per_hour is not None else None
    base = {
        "entity": seen.run.entity,
        "project": seen.run.project,
        "run_id": seen.run.run_id,
        "episode_started_at": started_at,
        "step": step,
        "decided_at": now,
        "idle_gpu_hours": round(idle_hours, 6),
        "idle_usd": round(idle_hours * price, 6) if price is not None else None,
        "details": json.dumps(details, default=str),
        "attempts": 0,
        "run_created_at": seen.run.created_at,
    }
    rows = [{**base, "audience": audience, "outcome": PENDING} for audience in ladder_step.tell]
    if ladder_step.stop:
        path = f"{seen.run.entity}/{seen.run.project}/{seen.run.run_id}"
        if policy.stop_runs:
            rows.append({**base, "audience": STOP, "channel": "wandb", "recipient": path, "outcome": PENDING})
            # the owner and the team hear what became of the stop, once it is known (lib/acting/idle_delivery)
            rows += [{**base, "audience": audience, "outcome": PENDING} for audience in (OWNER, TEAM)]
        else:
            rows.append(
                {
                    **base,
                    "audience": STOP,
                    "channel": "none",
                    "recipient": path,
                    "outcome": WOULD_STOP,
                    "acted_at": now,
                    "reason": "stop_runs is off in the policy: the run would have been stopped now",
                }
            )
    if datadog:
        rows.append({**base, "audience": DATADOG, "channel": "datadog_event", "outcome": PENDING})
    return rows


def prepare_ledger(con, now: datetime) -> None:
    """The ledger, the deciders' turn row (``take_turn``) and when the ladder was switched on (``LADDER_SINCE_KEY``:
    ``now`` at its first tick; a ledger older than the key, its first decision), each made if missing."""
    con.execute(IDLE_ACTIONS_SQL)
    con.execute("CREATE TABLE IF NOT EXISTS warehouse_meta (key VARCHAR, value VARCHAR)")
    con.execute(
        "INSERT INTO warehouse_meta SELECT $k, '' WHERE NOT EXISTS (SELECT 1 FROM warehouse_meta WHERE key = $k)",
        {"k": LADDER_TURN_KEY},
    )
    con.execute(
        "INSERT INTO warehouse_meta SELECT $k, strftime(coalesce((SELECT min(decided_at) FROM idle_actions), $now), "
        "'%Y-%m-%dT%H:%M:%S') WHERE NOT EXISTS (SELECT 1 FROM warehouse_meta WHERE key = $k)",
        {"k": LADDER_SINCE_KEY, "now": now},
    )


def ladder_since(con) -> datetime | None:
    """When the ladder was switched on in this warehouse (its first tick), None before."""
    row = con.execute("SELECT value FROM warehouse_meta WHERE key = $k", {"k": LADDER_SINCE_KEY}).fetchone()
    return datetime.fromisoformat(row[0]) if row and row[0] else None


def take_turn(con, now: datetime) -> None:
    """Every decider writes this one row first in its transaction: two deciding at once conflict here (DuckLake, or
    two connections of one process), and the one that loses decides again from what the other wrote
    (``retry_on_conflict``). Across processes a DuckDB file admits one writer at a time anyway."""
    con.execute("UPDATE warehouse_meta SET value = $v WHERE key = $k", {"k": LADDER_TURN_KEY, "v": now.isoformat()})


def _created_at(con, runs: list[Candidate]) -> dict[tuple[str, str, str], datetime | None]:
    """Each run's creation time: the candidate's, else the warehouse row's (with entity and id, its identity)."""
    known = {r.key: r.created_at for r in runs}
    missing = [key for key, at in known.items() if at is None]
    if missing:
        found = con.execute(
            "SELECT entity, project, run_id, created_at FROM runs WHERE (entity, project, run_id) IN "
            "(SELECT unnest($e::VARCHAR[]), unnest($p::VARCHAR[]), unnest($r::VARCHAR[]))",
            {"e": [k[0] for k in missing], "p": [k[1] for k in missing], "r": [k[2] for k in missing]},
        ).fetchall()
        known |= {(e, p, r): at for e, p, r, at in found}
    return known


def _withdraw(con, key: tuple, reason: str, now: datetime) -> None:
    """Mark this pending row (its ``LEDGER_KEY`` values) withdrawn, with the reason."""
    con.execute(
        f"UPDATE idle_actions SET outcome = '{WITHDRAWN}', reason = $reason, acted_at = $now WHERE outcome = "
        f"'{PENDING}' AND " + " AND ".join(f"{c} = ${c}" for c in LEDGER_KEY),
        {"reason": reason, "now": now, **dict(zip(LEDGER_KEY, key, strict=True))},
    )


def _revalidate_waiting(con, seen: list[Seen], now: datetime) -> None:
    """Re-validate what waits in the ledger from an earlier decision (an earlier tick, or one at the same moment),
    against what this tick saw (``seen``: their creation times filled in): a stop (and what its messages were to say)
    is an intent valid only for the tick that decided it, so one still pending is withdrawn (and its step decided again
    from scratch); a telling message that waited for Slack goes out only while its run is still idle in the same
    episode and not exempt, else it is withdrawn (never a stale "idle for 60 minutes" for a run that went back to
    work). A run whose stream this tick could not read keeps its messages waiting."""
    waiting = con.execute(
        f"SELECT {', '.join(LEDGER_KEY)}, run_created_at, coalesce((details->>'stop_step')::BOOLEAN, false) "
        f"FROM idle_actions WHERE outcome = '{PENDING}' AND audience IN ('{OWNER}', '{TEAM}', '{STOP}') ORDER BY ALL",
    ).fetchall()
    if not waiting:
        return
    by_identity = {(s.run.entity, s.run.run_id, s.run.created_at): s for s in seen}
    by_key = {s.run.key: s for s in seen}
    stale_steps = {tuple(w[:5]) for w in waiting if w[5] == STOP}
    for w in waiting:
        key, run_created_at, stop_step = tuple(w[: len(LEDGER_KEY)]), w[-2], w[-1]
        entity, project, run_id, started_at, step, audience = key
        if audience == STOP or (stop_step and tuple(key[:5]) in stale_steps):
            why = (
                f"decided at an earlier tick and not sent then: a stop is valid only for the tick that decided it "
                f"(decided again from scratch at {now:%H:%M} UTC)"
            )
        elif stop_step:
            continue  # what became of a stop already made: told once Slack takes it
        else:
            s = by_identity.get((entity, run_id, run_created_at)) if run_created_at else by_key.get(key[:3])
            if s is not None and not s.read:
                continue
            if s is None or s.episode is None:
                why = "its run is no longer idle at its latest sample (or no longer running) since it was written"
            elif s.exempt is not None:
                why = f"its run is exempt now ({s.exempt})"
            elif s.episode.last_busy_at is not None and s.episode.last_busy_at >= started_at:  # as _episode_start
                why = "its run was busy again since it was written (a new idle episode began)"
            else:
                continue
        _withdraw(con, key, f"not sent: {why}", now)


@retry_on_conflict
def record_decisions(con, seen: list[Seen], policy: IdlePolicy, now: datetime, datadog: bool) -> list[dict]:
    """What each seen run's episode is due, written to the ledger in one transaction, each row only if the ledger does
    not hold it yet; returns the rows written. First what waits from earlier ticks is re-validated against what this
    tick saw (``_revalidate_waiting``)."""
    import pandas

    prepare_ledger(con, now)
    written: list[dict] = []
    with transaction(con):
        take_turn(con, now)
        created = _created_at(con, [s.run for s in seen]) if seen else {}
        seen = [replace(s, run=replace(s.run, created_at=created.get(s.run.key))) for s in seen]
        _revalidate_waiting(con, seen, now)
        acting = [s for s in seen if s.episode is not None and s.exempt is None and s.read]
        ledger = _ledger(con, [s.run for s in acting]) if acting else None
        for s in acting:
            assert s.episode is not None and ledger is not None
            mine = ledger[
                (ledger["entity"] == s.run.entity)
                & (ledger["for_project"] == s.run.project)
                & (ledger["run_id"] == s.run.run_id)
            ]
            started_at = _episode_start(mine, s)
            episode_rows = mine[mine["episode_started_at"] == pandas.Timestamp(started_at)]
            decision = decide(policy, started_at, s.episode.latest_at, now, _done(episode_rows))
            for step in decision.act:
                details = _details(s, policy, step, started_at, decision.next_step, decision.next_at)
                written += _rows_of_step(s, policy, step, started_at, now, details, datadog)
            for step in decision.skip:
                details = _details(s, policy, step, started_at, decision.next_step, decision.next_at)
                for row in _rows_of_step(s, policy, step, started_at, now, details, False):
                    row |= {"outcome": SKIPPED, "acted_at": now, "reason": "due together with a later step"}
                    written.append(row)
        if written:
            frame = pandas.DataFrame(written, columns=list(IDLE_ACTIONS_COLUMNS)).astype(
                {
                    "episode_started_at": "datetime64[us]",
                    "decided_at": "datetime64[us]",
                    "acted_at": "datetime64[us]",
                    "run_created_at": "datetime64[us]",
                }
            )
            key = " AND ".join(f"a.{c} = f.{c}" for c in LEDGER_KEY)
            con.register("idle_decided", frame)
            try:
                con.execute(
                    "INSERT INTO idle_actions BY NAME SELECT * REPLACE (details::JSON AS details) FROM idle_decided f "
                    f"WHERE NOT EXISTS (SELECT 1 FROM idle_actions a WHERE {key} AND a.outcome <> '{WITHDRAWN}')"
                )
            finally:
                con.unregister("idle_decided")
    return written


@retry_on_conflict
def claim_pending(con, token: str, now: datetime) -> list[dict]:
    """Claim every pending row for this sender (``token``) in one transaction, so no other sender sends it, and mark
    ``unknown`` the claims of a sender that ended mid-send; returns the claimed rows, oldest decision first."""
    con.execute(IDLE_ACTIONS_SQL)
    with transaction(con):
        con.execute(
            f"UPDATE idle_actions SET outcome = '{UNKNOWN}', reason = 'the sender ended before recording whether it "
            f"went out; not sent again' WHERE outcome = '{SENDING}' AND claimed_at < $stale",
            {"stale": now - STALE_CLAIM},
        )
        con.execute(
            f"UPDATE idle_actions SET outcome = '{SENDING}', claim = $token, claimed_at = $now WHERE outcome = "
            f"'{PENDING}'",
            {"token": token, "now": now},
        )
    return ledger_rows(
        con,
        f"claim = $token AND outcome = '{SENDING}' ORDER BY decided_at, entity, project, run_id, step, audience",
        {"token": token},
    )


def ledger_rows(con, where: str, params: dict) -> list[dict]:
    """The ledger's rows ``WHERE where`` as dicts, ``details`` parsed (what ``deliver`` takes)."""
    rows = dict_rows(con, f"SELECT * FROM idle_actions WHERE {where}", params)
    for row in rows:
        row["details"] = json.loads(row["details"]) if isinstance(row["details"], str) else (row["details"] or {})
    return rows


@retry_on_conflict
def record_outcomes(con, token: str, outcomes: list[dict]) -> None:
    """Each claimed row's outcome (``{key columns..., outcome, acted_at, channel, recipient, reason, error}``): a row
    whose channel failed goes back to ``pending`` with the error (the outbox tries it next tick)."""
    with transaction(con):
        for o in outcomes:
            con.execute(
                "UPDATE idle_actions SET outcome = $outcome, acted_at = $acted_at, channel = coalesce($channel, "
                "channel), recipient = coalesce($recipient, recipient), reason = coalesce($reason, reason), "
                "attempts = attempts + 1, last_error = coalesce($error, last_error), claim = NULL "
                "WHERE claim = $token AND " + " AND ".join(f"{c} = ${c}" for c in LEDGER_KEY),
                {
                    "token": token,
                    **{c: o[c] for c in LEDGER_KEY},
                    "outcome": o["outcome"],
                    "acted_at": o.get("acted_at"),
                    "channel": o.get("channel"),
                    "recipient": o.get("recipient"),
                    "reason": o.get("reason"),
                    "error": (o.get("error") or None) and o["error"][:500],
                },
            )


def stop_outcomes(con, claimed: list[dict]) -> dict[tuple, tuple[str, str | None]]:
    """The recorded outcomes of the stops whose messages are among ``claimed`` (a stop done at an earlier tick whose
    messages waited for Slack), by ``(entity, project, run_id, episode_started_at, step)``."""
    import pandas

    steps = {
        (r["entity"], r["project"], r["run_id"], r["episode_started_at"], r["step"])
        for r in claimed
        if r["audience"] in (OWNER, TEAM) and r["details"].get("stop_step")
    }
    if not steps:
        return {}
    con.register("stop_steps", pandas.DataFrame(list(steps), columns=list(LEDGER_KEY[:5])))
    try:
        rows = con.execute(
            f"SELECT a.entity, a.project, a.run_id, a.episode_started_at, a.step, a.outcome, a.reason "
            f"FROM idle_actions a JOIN stop_steps USING (entity, project, run_id, episode_started_at, step) "
            f"WHERE a.audience = '{STOP}' AND a.outcome NOT IN ('{PENDING}', '{SENDING}', '{WITHDRAWN}')"
        ).fetchall()
    finally:
        con.unregister("stop_steps")
    return {tuple(row[:5]): (row[5], row[6]) for row in rows}
