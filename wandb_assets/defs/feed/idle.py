"""The idle ladder after each snapshot (``idle_actions``): the running runs whose latest GPU sample is idle have their
own sampled stream read (the warehouse closed), their episodes judged by the policy (``WANDB_ASSETS_IDLE_POLICY``),
what is due written once to the ledger, then sent (the warehouse closed again) and the outcomes recorded."""

import time
import uuid
from collections import Counter
from dataclasses import dataclass

from dagster import (
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from wandb_assets.defs.feed.assets import FEED, ClockConfig
from wandb_assets.defs.feed.resources import (
    SLACK_TOKEN_SETTING,
    AlertChannelsResource,
    DatadogResource,
    SlackResource,
    slack_call,
)
from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WarehouseResource
from wandb_assets.lib.acting.channels import Outage, http_error
from wandb_assets.lib.acting.idle_actions import (
    LEDGER_KEY,
    NOT_STOPPED,
    REFUSED,
    STOPPED,
    Seen,
    candidates,
    claim_pending,
    exempt_reason,
    record_decisions,
    record_outcomes,
    stop_outcomes,
    with_own_gpu_count,
)
from wandb_assets.lib.acting.idle_delivery import StopAnswer, deliver
from wandb_assets.lib.acting.idle_digest import record_digest
from wandb_assets.lib.acting.idle_episodes import current_episodes
from wandb_assets.lib.acting.idle_readout import format_preview, ladder_gauges, ladder_payload, rehearse
from wandb_assets.lib.fetch import WandbFetchError
from wandb_assets.lib.throttle import Throttle
from wandb_assets.settings import ConfigError, PipelineSettings, idle_policy, pipeline_settings


class LadderChannels:
    """``acting.idle_delivery.IdleChannels`` over the resources: Slack's Web API, the alert webhook, Datadog events, W&B
    stops. Nothing secret leaves: errors are Slack's error codes and the client's own sentences."""

    #: False: a stop reads the run and checks it as at send time, and asks W&B for nothing (the preview)
    acts = True

    def __init__(
        self,
        slack: SlackResource,
        channels: AlertChannelsResource,
        datadog: DatadogResource,
        wandb: WandbResource,
        pipeline: PipelineSettings,
    ) -> None:
        self._wandb, self._channels, self._datadog, self._pipeline = wandb, channels, datadog, pipeline
        self._slack_error: str | None = None
        self._client = None
        try:
            token = slack.token()
        except ConfigError as exc:
            token, self._slack_error = None, str(exc)
        if token:
            self._client = slack.client(token)
        self._dd_key: str | None = None
        self._dd_error: str | None = None
        try:
            self._dd_key = datadog.api_key()
        except ConfigError as exc:
            self._dd_error = str(exc)
        self._dd_tags: list[str] | None = None

    def slack_missing(self) -> str | None:
        if self._client is not None:
            return None
        return self._slack_error or f"no Slack bot token ({SLACK_TOKEN_SETTING})"

    def _slack(self, call, absent: str | None = None):
        return slack_call(call, absent)

    def post_slack(self, channel: str, text: str) -> None:
        self._slack(lambda: self._client.chat_postMessage(channel=channel, text=text, unfurl_links=False))

    def slack_user_by_email(self, email: str) -> str | None:
        answer = self._slack(lambda: self._client.users_lookupByEmail(email=email), absent="users_not_found")
        return None if answer is None else (answer.get("user") or {}).get("id")

    def webhook_missing(self) -> str | None:
        return None if self._channels.slack_enabled else "no alert webhook (WANDB_ASSETS_SLACK_WEBHOOK_URL)"

    def post_webhook(self, text: str) -> None:
        error = self._channels.post_slack(text, markup=True)
        if error is not None:
            raise Outage(error)

    def datadog_missing(self) -> str | None:
        return None if self._dd_key else (self._dd_error or "DD_API_KEY not configured")

    def send_event(self, title: str, text: str) -> None:
        if self._dd_tags is None:
            self._dd_tags = self._datadog.tags()
        result = self._datadog.send_event(self._dd_key, title, text, False, [*self._dd_tags, "source:idle_ladder"])
        if result.status is None:
            raise Outage(f"Datadog unreachable ({result.error or 'no answer'})")
        if not result.accepted:  # the notifier's classes: 429/5xx wait, 401/403 name the key, other 4xx never take it
            raise http_error("Datadog", result.status, result.error, "an idle-ladder event", "DD_API_KEY")

    def send_gauges(self, gauges: dict[str, float], now) -> str:
        """The ladder's gauges to Datadog (one point each; the next tick sends fresh ones: nothing waits)."""
        if not self._dd_key:
            return f"not sent: {self.datadog_missing()}"
        if self._dd_tags is None:
            self._dd_tags = self._datadog.tags()
        result = self._datadog.submit_series(self._dd_key, ladder_payload(gauges, now, self._dd_tags))
        return "sent" if result.accepted else f"not sent: Datadog answered {result.status or result.error}"

    def stop_run(self, path: str, check) -> StopAnswer:
        try:
            stopped, why = self._wandb.stop_run(path, self._pipeline, check, act=self.acts)
        except WandbFetchError as exc:
            raise Outage(str(exc)) from None
        if stopped:
            return StopAnswer(STOPPED)
        return StopAnswer(REFUSED if why.refused else NOT_STOPPED, why.reason)


@dataclass(frozen=True)
class Observed:
    """What the ladder knows of the idle runs at a tick: each run ``Seen`` (its episode from its own sampled stream,
    its owner's and team's Slack targets, its exemption), by run key the episodes and exemptions, and the runs whose
    stream could not be read (not judged this tick)."""

    seen: list[Seen]
    episodes: dict[tuple, object]
    exempt: dict[tuple, str | None]
    unread: list[tuple]


def own_gpu_counts(found: list, streams: dict, wandb: WandbResource, pipeline: PipelineSettings) -> list:
    """The candidates whose GPU count came from their node's sample (or the default), with their own count read from
    their ``wandb-metadata.json`` (``acting.idle_actions.with_own_gpu_count``): the files the stream's request located,
    ``WANDB_ASSETS_METADATA_DOWNLOADS`` at a time; only those candidates', each tick (few: idle and running)."""
    wanted: dict[str, dict[str, str]] = {}
    for c in found:
        url = streams.get(c.key, {}).get("metadata_url")
        if url and c.count_may_be_its_nodes:
            wanted.setdefault(f"{c.entity}/{c.project}", {})[c.run_id] = url
    if not wanted:
        return found
    downloads = Throttle(pipeline.metadata_downloads)
    read = {
        (*path.split("/", 1), run_id): answer
        for path, urls in wanted.items()
        for run_id, answer in wandb.runs_metadata(path, urls, downloads, pipeline).items()
    }
    return [with_own_gpu_count(c, read.get(c.key)) for c in found]


def observe(found: list, wandb: WandbResource, policy, pipeline: PipelineSettings) -> Observed:
    """The idle runs ``found`` (``acting.idle_actions.candidates``) judged as the ladder judges them: the unexempt ones'
    sampled GPU streams read from W&B, their episodes found. The tick and ``wandb-assets idle --preview`` share it."""
    directory = pipeline.team_directory
    teams = {c.key: directory.teams.get(c.user or "") for c in found}
    exempt = {c.key: exempt_reason(policy, c, teams[c.key]) for c in found}
    to_read = [c.key for c in found if exempt[c.key] is None]
    streams = wandb.idle_streams(to_read, pipeline) if to_read else {}
    found = own_gpu_counts(found, streams, wandb, pipeline)
    unread = [key for key in to_read if streams.get(key, {}).get("status") == "failed"]
    gpu_streams = {key: read.get("gpu", []) for key, read in streams.items()}
    counts = {c.key: c.gpu_count for c in found}
    episodes = {
        (e.entity, e.project, e.run_id): e
        for e in current_episodes(gpu_streams, counts, policy.idle_gpu_pct, policy.gpu_fraction)
    }
    seen = [
        Seen(
            c,
            episodes.get(c.key),
            streams.get(c.key, {}).get("email"),
            teams[c.key],
            directory.slack_users.get(c.user or ""),
            directory.channels.get(teams[c.key] or ""),
            exempt[c.key],
            read=c.key not in unread,
        )
        for c in found
    ]
    return Observed(seen, episodes, exempt, unread)


#: Outcomes logged one line each (every one is in the ledger and the asset's metadata); the rest are counted.
LOGGED_OUTCOMES = 20

LEDGER_SCHEMA = TableSchema(
    columns=[
        TableColumn("run", "string", description="entity/project/run_id, step: audience"),
        TableColumn("outcome", "string", description="what became of it (idle_actions.outcome), and why"),
    ]
)


@asset(
    description="The idle ladder (idle_actions): with WANDB_ASSETS_IDLE_POLICY set, each running run whose latest GPU "
    "sample is idle has its own sampled stream read; its idle episode (the unbroken idle time up to its latest "
    "sample) climbs the policy's ladder: the owner told (Slack), then the team, then (stop_runs: true) the run "
    "stopped through the W&B client. Each step acts once per episode; messages wait in the ledger while Slack is "
    "down and are never sent twice. Off (nothing read, nothing sent) without a policy.",
    kinds={"duckdb", "slack"},
    **FEED,
)
@names_the_warehouse
def idle_actions(
    context: AssetExecutionContext,
    config: ClockConfig,
    warehouse: WarehouseResource,
    wandb: WandbResource,
    datadog: DatadogResource,
    channels: AlertChannelsResource,
    slack: SlackResource,
) -> MaterializeResult:
    policy = idle_policy()
    if policy is None:
        context.log.info("The idle ladder is off (WANDB_ASSETS_IDLE_POLICY is not set).")
        return MaterializeResult(metadata={"policy": "off (WANDB_ASSETS_IDLE_POLICY not set)"})
    now = config.resolve()
    pipeline = pipeline_settings()
    directory = pipeline.team_directory
    clock = [time.perf_counter()]
    spent: dict[str, float] = {}

    def lap(what: str) -> None:
        clock.append(time.perf_counter())
        spent[what] = round(clock[-1] - clock[-2], 3)

    with warehouse.get_read_connection() as con:  # short and read-only: closed before any request goes out
        found = candidates(con, policy, now) if con is not None else []
    lap("candidates_s")
    observed = observe(found, wandb, policy, pipeline)
    lap("streams_read_s")
    if observed.unread:
        context.log.warning(
            f"The GPU stream of {len(observed.unread)} idle run(s) could not be read; judged next tick."
        )
    seen, episodes, exempt = observed.seen, observed.episodes, observed.exempt
    ladder_channels = LadderChannels(slack, channels, datadog, wandb, pipeline)
    token = uuid.uuid4().hex
    with warehouse.get_connection() as con:
        written = record_decisions(con, seen, policy, now, ladder_channels.datadog_missing() is None)
        digests = record_digest(con, now, directory)
        claimed = claim_pending(con, token, now)
        known = stop_outcomes(con, claimed)
    lap("decided_s")
    outcomes = deliver(claimed, ladder_channels, now, known)
    lap("sent_s")
    with warehouse.get_connection() as con:
        record_outcomes(con, token, outcomes)
        gauges = ladder_gauges(con, now)
    sent_gauges = ladder_channels.send_gauges(gauges, now)
    lap("recorded_s")
    waiting = [o for o in outcomes if o["outcome"] == "pending"]
    for error in sorted({o["error"] for o in waiting if o.get("error")}):
        context.log.warning(f"Idle ladder: {error}; its messages wait for the next tick.")
    done = [o for o in outcomes if o["outcome"] != "pending"]
    for o in done[:LOGGED_OUTCOMES]:  # each is in the ledger and the metadata table: the log names the first ones
        context.log.info(
            f"Idle ladder: {o['entity']}/{o['project']}/{o['run_id']} step {o['step']} {o['audience']}: "
            f"{o['outcome']}" + (f" ({o['reason']})" if o.get("reason") else "")
        )
    if len(done) > LOGGED_OUTCOMES:
        by_outcome = Counter(o["outcome"] for o in done)
        context.log.info(f"Idle ladder: {len(done)} outcomes this tick ({dict(by_outcome)}); see idle_actions.")
    ledger = [
        TableRecord(
            {
                "run": f"{o['entity']}/{o['project']}/{o['run_id']}, step {o['step']}: {o['audience']}",
                "outcome": o["outcome"] + (f": {o['reason']}" if o.get("reason") else ""),
            }
        )
        for o in outcomes
    ]
    return MaterializeResult(
        metadata={
            "policy": f"stop_runs={'on' if policy.stop_runs else 'off'}, {len(policy.ladder)} steps",
            "idle_now": len(found),
            "exempt": sum(reason is not None for reason in exempt.values()),
            "episodes": len(episodes),
            "decided": len(written),
            "weekly_digests_decided": digests,
            "sent": sum(o["outcome"] not in ("pending",) for o in outcomes),
            "waiting": len(waiting),
            **{name.removeprefix("wandb.idle_ladder."): value for name, value in gauges.items()},
            "gauges_to_datadog": sent_gauges,
            "seconds": MetadataValue.json(spent),
            "this_tick": MetadataValue.table(ledger, LEDGER_SCHEMA),
        }
    )


class PreviewChannels(LadderChannels):
    """``LadderChannels`` that read and send nothing: Slack is asked who has an owner's e-mail and W&B is read before a
    stop (the send-time check), but each message is kept with where it would have gone, and no run is stopped."""

    acts = False

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.said: list[str] = []

    def post_slack(self, channel: str, text: str) -> None:
        self.said.append(f"to Slack {channel}: {text}")

    def post_webhook(self, text: str) -> None:
        self.said.append(f"to the alert webhook: {text}")

    def send_event(self, title: str, text: str) -> None:
        self.said.append(f"as a Datadog event: {title}: {text}")


def preview_ladder(con, policy, where: str, now, resources: dict) -> str:
    """``wandb-assets idle --preview``: what the ladder would do at ``now`` under ``policy`` (from ``where``), the
    tick's own code on a scratch copy of the ledger (``acting.idle_readout.rehearse``): the idle runs' streams read
    from W&B, the decisions made, each message written as it would go out (``deliver`` over ``PreviewChannels``), each
    stop checked against W&B as at send time. Nothing is sent, stopped or recorded. ``con``: the warehouse, read only;
    ``resources``: the resources by name (``wandb``, ``slack``, ``channels``, ``datadog``)."""
    pipeline = pipeline_settings()
    found = candidates(con, policy, now)
    observed = observe(found, resources["wandb"], policy, pipeline)
    channels = PreviewChannels(
        resources["slack"], resources["channels"], resources["datadog"], resources["wandb"], pipeline
    )
    rows, known = rehearse(con, observed.seen, policy, now, channels.datadog_missing() is None)
    outcomes = deliver([r for r in rows if r["outcome"] == "sending"], channels, now, known)
    settled = [r for r in rows if r["outcome"] != "sending"]
    messages = iter(channels.said)
    said = {tuple(o[c] for c in LEDGER_KEY): [next(messages)] for o in outcomes if o["outcome"] == "sent"}
    text = format_preview(where, now, settled + outcomes, said, len(found))
    if observed.unread:
        text += f"\nThe GPU stream of {len(observed.unread)} idle run(s) could not be read: not judged."
    return text
