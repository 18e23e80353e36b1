"""The pull requests' verdicts on their way to GitHub (issue 45): the outbox ``github_deliveries``, what each item says,
and its delivery through a ``GitHubChannel`` (given: the REST client lives in ``defs``). No Dagster, no network here.

Two kinds of item per pull request: ``check:<commit>``, the verdict on a judged commit (``failure`` when a metric
regressed and gating is on, ``neutral`` when a metric has no baseline or gating is off, ``success`` otherwise), and
``comment``, the PR's one comment (found by its hidden marker), showing the commit judged last. A commit has one check
run, ``wandb-assets / throughput``, holding the verdicts of every PR whose item names it and that GitHub lists it for
(``compose_check``: two PRs on one commit never overwrite each other's verdict; the worst conclusion stands). An item is
queued again when what it says changes. An item, check or comment, goes out only when GitHub lists its commit as the
PR's (its head or one of its commits, ``GET /pulls/N/commits``): the commit comes from a W&B run name, which anyone who
can log a run chooses, and must never pick whose required check or conversation it writes. Delivery first looks for what
it delivered before (the check run by its name on the commit, the comment by its marker and its author: this deployment)
and edits it: an outage, a retry or a sender that died mid-send never makes a second one. GitHub down: the item waits
(``pending``, its error kept) for the next run; GitHub refusing it (a commit it does not know, a PR that is not there, a
commit not the PR's): ``refused`` with the reason, not tried again until what it says changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from wandb_assets.lib.acting.channels import Outage
from wandb_assets.lib.acting.pr_checks import NO_BASELINE, REGRESSION, format_pr_table, markdown_cell
from wandb_assets.lib.sql import dict_rows, transaction

CHECK_NAME = "wandb-assets / throughput"
#: The comment's hidden marker: the comment carrying it is this project's, edited in place.
MARKER = "<!-- wandb-assets:throughput -->"
COMMENT = "comment"
PENDING, SENDING, DELIVERED, REFUSED = "pending", "sending", "delivered", "refused"
#: A claim older than this belongs to a sender that ended mid-send: the item is pending again (delivery is an edit of
#: what exists, so sending it again doubles nothing).
STALE_CLAIM = timedelta(minutes=10)

OUTBOX_KEY = ("repo", "pr", "item")
GITHUB_DELIVERIES_SQL = """
CREATE TABLE IF NOT EXISTS github_deliveries (
    repo VARCHAR, pr INTEGER, item VARCHAR, "commit" VARCHAR, conclusion VARCHAR, title VARCHAR, body VARCHAR,
    body_hash VARCHAR, state VARCHAR, queued_at TIMESTAMP, delivered_at TIMESTAMP, head_sha VARCHAR,
    target_id BIGINT, channel VARCHAR, attempts INTEGER, last_error VARCHAR, claim VARCHAR, claimed_at TIMESTAMP
)"""


class Refused(Exception):
    """GitHub answered that it will not take this item as it is (a 4xx other than a rate limit or credentials)."""


class GitHubChannel(Protocol):
    def full_sha(self, commit: str) -> str:
        """The full 40-hex SHA of ``commit`` (a prefix); ``Refused`` when the repository has no such commit."""

    def upsert_check(self, sha: str, conclusion: str, title: str, summary: str) -> tuple[int, str]:
        """Create or edit the check run ``CHECK_NAME`` on ``sha``; returns its id and the channel used (``check_run``,
        or ``commit_status`` where the credential cannot make check runs)."""

    def pr_commits(self, pr: int) -> set[str]:
        """The full SHAs of PR ``pr``'s commits, its head among them; ``Refused`` when it is no pull request."""

    def upsert_comment(self, pr: int, body: str) -> int:
        """Create or edit the PR's comment carrying ``MARKER`` that this deployment wrote (its author, never another's
        comment that quotes the marker); returns its id."""


def conclusion(rows: list[dict], gate: bool, gate_metric: str | None = None) -> tuple[str, str]:
    """The check's conclusion and title for one commit's verdicts. ``gate_metric``: only that metric's regressions
    fail the check (``WANDB_ASSETS_SPS_METRIC``; the others are reported): five keys each judged at 99 % would fail a PR
    within the noise by chance far more often than one in a hundred. None: every metric gates."""
    regressed = sum(r["verdict"] == REGRESSION for r in rows)
    gating = sum(r["verdict"] == REGRESSION and gate_metric in (None, r["metric"]) for r in rows)
    missing = sum(r["verdict"] == NO_BASELINE for r in rows)
    if regressed:
        title = f"{regressed} of {len(rows)} metric(s) regressed against main on the same testbed"
        if not gating:
            return "neutral", f"{title} (reported, not gating: only {gate_metric} gates)"
        return ("failure", title) if gate else ("neutral", title + " (not gating: WANDB_ASSETS_PR_GATE is false)")
    if missing:
        return "neutral", f"{missing} of {len(rows)} metric(s) have no baseline on their testbed yet; none regressed"
    return "success", f"No regression in {len(rows)} metric(s) against main on the same testbed"


HOW = (
    "Each metric: the mean of the PR runs of this commit and config against the last ended main runs of the same "
    "config and testbed (GPU count and model); a regression is below the Student-t lower boundary at 99 %, never "
    "closer to main's mean than the minimum change (WANDB_ASSETS_PR_MIN_CHANGE_PCT); testbed `unknown` has no "
    "baseline (docs/pr-checks.md)."
)


def how(gate_metric: str | None) -> str:
    """``HOW``, and which metric gates."""
    gates = f" Only `{markdown_cell(gate_metric)}` gates the check; the others are reported." if gate_metric else ""
    return HOW + gates


def check_text(rows: list[dict], gate_metric: str | None = None) -> str:
    return f"{format_pr_table(rows, links=True)}\n\n{how(gate_metric)}"


def comment_text(pr: int, commit: str, title: str, rows: list[dict], gate_metric: str | None = None) -> str:
    return (
        f"{MARKER}\n### Training throughput against main (wandb-assets)\n\n**{title}** at "
        f"`{markdown_cell(commit).replace('`', '')}`.\n\n"
        f"{format_pr_table(rows, links=True)}\n\n{how(gate_metric)} This comment is updated in place as more runs "
        "end."
    )


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Item:
    repo: str
    pr: int
    item: str
    commit: str
    conclusion: str | None
    title: str
    body: str

    @property
    def body_hash(self) -> str:
        return _hash(self.commit, self.conclusion or "", self.title, self.body)


def items_for(repo: str, rows: list[dict], gate: bool, gate_metric: str | None = None) -> list[Item]:
    """What GitHub should show for the verdicts ``rows`` (every row of the PRs concerned): one check per commit, one
    comment per PR (the commit judged last: latest ``judged_at``, then the latest PR run); ``gate_metric``: see
    ``conclusion``."""
    by_commit: dict[tuple[int, str], list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["pr"], r["commit"], r["config"], r["testbed"], r["metric"])):
        by_commit.setdefault((r["pr"], r["commit"]), []).append(r)
    items: list[Item] = []
    last: dict[int, tuple] = {}
    for (pr, commit), judged in by_commit.items():
        outcome, title = conclusion(judged, gate, gate_metric)
        items.append(Item(repo, pr, f"check:{commit}", commit, outcome, title, check_text(judged, gate_metric)))
        newest = max(r["judged_at"] for r in judged)
        if pr not in last or newest > last[pr][0]:
            last[pr] = (newest, commit, title, judged)
    for pr, (_, commit, title, judged) in sorted(last.items()):
        items.append(Item(repo, pr, COMMENT, commit, None, title, comment_text(pr, commit, title, judged, gate_metric)))
    return items


def queue(con, items: Iterable[Item], now: datetime) -> int:
    """Queue each item whose text changed (a new one, or what GitHub shows now differs); returns how many. An item
    another sender holds goes back to pending: that sender's outcome is then not recorded (it sent the old text)."""
    con.execute(GITHUB_DELIVERIES_SQL)
    queued = 0
    with transaction(con):
        for it in items:
            key = {"repo": it.repo, "pr": it.pr, "item": it.item}
            held = con.execute(
                "SELECT body_hash FROM github_deliveries WHERE repo = $repo AND pr = $pr AND item = $item", key
            ).fetchone()
            if held is not None and held[0] == it.body_hash:
                continue
            values = {
                **key,
                "commit": it.commit,
                "conclusion": it.conclusion,
                "title": it.title,
                "body": it.body,
                "hash": it.body_hash,
                "now": now,
            }
            if held is None:
                con.execute(
                    "INSERT INTO github_deliveries BY NAME SELECT $repo AS repo, $pr AS pr, $item AS item, $commit AS "
                    '"commit", $conclusion AS conclusion, $title AS title, $body AS body, $hash AS body_hash, '
                    f"'{PENDING}' AS state, $now AS queued_at, 0 AS attempts",
                    values,
                )
            else:
                con.execute(
                    'UPDATE github_deliveries SET "commit" = $commit, conclusion = $conclusion, title = $title, '
                    f"body = $body, body_hash = $hash, state = '{PENDING}', queued_at = $now, claim = NULL, "
                    "claimed_at = NULL WHERE repo = $repo AND pr = $pr AND item = $item",
                    values,
                )
            queued += 1
    return queued


def claim(con, repo: str, token: str, now: datetime) -> list[dict]:
    """Claim the repository's pending items for this sender (``token``), the stale claims of a sender that ended
    mid-send among them; returns them, checks before comments, oldest first."""
    con.execute(GITHUB_DELIVERIES_SQL)
    with transaction(con):
        con.execute(
            f"UPDATE github_deliveries SET state = '{PENDING}', claim = NULL WHERE state = '{SENDING}' AND "
            "claimed_at < $stale",
            {"stale": now - STALE_CLAIM},
        )
        con.execute(
            f"UPDATE github_deliveries SET state = '{SENDING}', claim = $token, claimed_at = $now WHERE state = "
            f"'{PENDING}' AND repo = $repo",
            {"token": token, "now": now, "repo": repo},
        )
    return dict_rows(
        con,
        f"SELECT * FROM github_deliveries WHERE claim = $token AND state = '{SENDING}' "
        f"ORDER BY item = '{COMMENT}', queued_at, pr, item",
        {"token": token},
    )


#: A check run's conclusion when several PRs' verdicts name its commit: the worst of theirs.
_SEVERITY = {"success": 0, "neutral": 1, "failure": 2}


def delivered_checks(con, repo: str, claimed: list[dict]) -> list[dict]:
    """The checks already delivered on the commits of the ``claimed`` checks, for other PRs: the one check run on a
    commit holds every PR's verdicts naming it (``compose_check``), so a claimed one is written with them."""
    commits = sorted({it["commit"] for it in claimed if it["item"] != COMMENT})
    if not commits:
        return []
    return dict_rows(
        con,
        f"SELECT * FROM github_deliveries WHERE repo = $repo AND item <> '{COMMENT}' AND state = '{DELIVERED}' "
        'AND list_contains($commits, "commit") ORDER BY pr',
        {"repo": repo, "commits": commits},
    )


def compose_check(items: list[dict]) -> tuple[str, str, str]:
    """The conclusion, title and text of the one check run on a commit, from every PR's check item naming it (each
    validated as that PR's commit): the worst conclusion, each PR's title and table under its number. Two PRs on one
    commit (a stacked branch, a re-opened PR) share one check run, and neither overwrites the other's verdict."""
    if len(items) == 1:
        return items[0]["conclusion"], items[0]["title"], items[0]["body"]
    items = sorted(items, key=lambda it: it["pr"])
    worst = max((it["conclusion"] for it in items), key=lambda c: _SEVERITY.get(c, 1))
    title = "; ".join(f"PR #{it['pr']}: {it['title']}" for it in items)
    body = "\n\n".join(f"#### PR #{it['pr']}\n\n{it['body']}" for it in items)
    return worst, title[:1000], body


def deliver(claimed: list[dict], channel: GitHubChannel, now: datetime, delivered: list[dict] = ()) -> list[dict]:
    """Send each claimed item; returns its outcome (``{key..., body_hash, state, target_id, head_sha, channel,
    error}``). The checks go out one per commit (``compose_check`` of the claimed ones that are their PR's and those
    ``delivered`` before for other PRs on the same commit: ``delivered_checks``). After an outage the rest are not
    tried (they would time out too): they wait, pending."""
    outcomes, shas, members, down = [], {}, {}, None
    valid: dict[str, list[dict]] = {}  # commit -> the claimed checks that are their PR's

    def validate(it: dict) -> None:
        """``Refused`` unless GitHub lists the item's commit (its full SHA kept in ``shas``) as the PR's."""
        # a run name says which commit; GitHub says whose: neither the check nor the comment goes out otherwise
        if it["commit"] not in shas:
            shas[it["commit"]] = channel.full_sha(it["commit"])
        if it["pr"] not in members:
            members[it["pr"]] = channel.pr_commits(it["pr"])
        if shas[it["commit"]] not in members[it["pr"]]:
            raise Refused(
                f"commit {shas[it['commit']][:12]} is not a commit of PR {it['pr']} (neither its head nor one of "
                "its commits): nothing is written from a run name"
            )

    def base(it: dict) -> dict:
        return {c: it[c] for c in (*OUTBOX_KEY, "body_hash")} | {"delivered_at": None, "head_sha": None}

    def attempt(items: list[dict], send) -> bool:
        """``send()`` for ``items`` (its fields are their outcome; None: no outcome yet); False when it did not go."""
        nonlocal down
        try:
            if down is not None:
                raise Outage(f"not tried: {down}")
            fields = send()
        except Outage as exc:
            down = down or str(exc)
            outcomes.extend(base(it) | {"state": PENDING, "error": str(exc)} for it in items)
            return False
        except Refused as exc:
            outcomes.extend(base(it) | {"state": REFUSED, "error": str(exc)} for it in items)
            return False
        if fields is not None:
            outcomes.extend(base(it) | {"state": DELIVERED, "delivered_at": now} | fields for it in items)
        return True

    def comment(it: dict) -> dict:
        validate(it)
        return {"target_id": channel.upsert_comment(it["pr"], it["body"]), "channel": "comment"}

    def check(commit: str, mine: list[dict]) -> dict:
        claimed_prs = {it["pr"] for it in mine}
        together = mine + [d for d in delivered if d["commit"] == commit and d["pr"] not in claimed_prs]
        target, how = channel.upsert_check(shas[commit], *compose_check(together))
        return {"target_id": target, "channel": how, "head_sha": shas[commit]}

    checks = [it for it in claimed if it["item"] != COMMENT]
    for it in checks:
        if attempt([it], lambda it=it: validate(it)):
            valid.setdefault(it["commit"], []).append(it)
    for commit, mine in valid.items():
        attempt(mine, lambda commit=commit, mine=mine: check(commit, mine))
    for it in (it for it in claimed if it["item"] == COMMENT):
        attempt([it], lambda it=it: comment(it))
    return outcomes


def record(con, token: str, outcomes: list[dict]) -> None:
    """Each outcome onto its item, where this sender still holds it with the text it sent (an item queued again
    meanwhile stays pending)."""
    with transaction(con):
        for o in outcomes:
            con.execute(
                "UPDATE github_deliveries SET state = $state, delivered_at = coalesce($delivered_at, delivered_at), "
                "head_sha = coalesce($head_sha, head_sha), target_id = coalesce($target_id, target_id), "
                "channel = coalesce($channel, channel), attempts = attempts + 1, "
                "last_error = coalesce($error, last_error), claim = NULL "
                "WHERE claim = $token AND body_hash = $body_hash AND repo = $repo AND pr = $pr AND item = $item",
                {
                    "token": token,
                    **{c: o[c] for c in (*OUTBOX_KEY, "body_hash", "state", "delivered_at", "head_sha")},
                    "target_id": o.get("target_id"),
                    "channel": o.get("channel"),
                    "error": (o.get("error") or None) and o["error"][:500],
                },
            )
