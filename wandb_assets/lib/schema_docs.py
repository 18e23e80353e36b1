"""What every warehouse table, view and column holds, and in what unit: one source for the DuckDB
``COMMENT``s and for ``docs/warehouse.md`` (``python -m wandb_assets.lib.schema_docs`` regenerates it)."""

from __future__ import annotations

import json

from wandb_assets.lib.naming import CATEGORIES
from wandb_assets.lib.normalize import ALIVE_STATES, ENDED_STATES, MOVED, VANISHED
from wandb_assets.lib.sql import ENDED_SQL, FAILED_SQL, run_gpu_hours_sql, sql_string, success_rate_sql

_SPS = {
    "sps_overview_steps_per_second": "summary `overview/steps_per_second`, steps/s (NULL if absent or not finite)",
    "sps_overview_epoch_steps_per_second": "summary `overview/epoch_steps_per_second`, steps/s",
    "sps_overview_sps": "summary `overview/sps`, steps/s",
    "sps_timing_cumulative_sps": "summary `timing_cumulative/sps`, steps/s",
    "sps_timing_per_epoch_sps": "summary `timing_per_epoch/sps`, steps/s",
}
_CI = {
    "ci_branch": "`main` or `pr<N>`, parsed from a `github.sky.*` name",
    "ci_commit": "commit parsed from a `github.sky.*` name",
    "ci_config": "CI config parsed from a `github.sky.*` name (may contain dots)",
    "ci_timestamp": "the name's trailing timestamp, UTC (NULL when it is not a recognised time)",
}

_PROJECT = {
    "entity": "W&B entity (team or user) of the run's project",
    "project": "W&B project of the run",
}

#: The columns of gpu_charges and of the closed months' record (closed_month_charges).
_CHARGES = {
    "month": "the calendar month (its first day) the row is billed in",
    "charge_category": "usage (the month's own GPU-hours) or adjustment (a change to a closed month's usage, "
    "booked to the first open month after it)",
    "adjustment_of": "for an adjustment, the closed month (its first day) it restates; else NULL",
    "first_day": "the first UTC day of usage the row holds (an adjustment: the restated month's first day)",
    "last_day": "the last UTC day of usage the row holds (an adjustment: the restated month's last day)",
    "team": "team of the user (WANDB_ASSETS_TEAMS), unassigned when not mapped",
    **_PROJECT,
    "username": "W&B user (NULL when W&B names none)",
    "gpu_model": "canonical GPU model; NULL when no source names it",
    "price_basis": "the rule that priced it (gpu_usage.price_basis)",
    "price_from": "the first UTC day of the price period (gpu_usage.price_from)",
    "usd_per_gpu_hour": "the USD per GPU-hour of that period (NULL: no price)",
    "gpu_hours": "GPU-hours (an adjustment: the change, may be negative)",
    "cost_usd": "USD (an adjustment: the change); NULL when unpriced",
    "idle_gpu_hours": "of gpu_hours, idle",
    "idle_cost_usd": "the dollars of those idle GPU-hours",
    "failed_gpu_hours": "of gpu_hours, those of runs that failed or crashed",
    "failed_cost_usd": "the dollars of failed runs",
}

#: name -> (kind, description, {column: description})
SCHEMA_DOCS: dict[str, tuple[str, str, dict[str, str]]] = {
    "runs": (
        "table",
        "One row per W&B run, mirrored daily by creation day (UTC); a run is (entity, project, run_id).",
        {
            **_PROJECT,
            "run_id": "W&B run id (the `name` of the GraphQL node); unique within its project",
            "name": "display name (NULL when the run has none)",
            "state": "W&B state: running, pending, preempting, finished, failed, crashed, killed, preempted; "
            "vanished: W&B no longer returns it while it was alive, or its project left the mirror set (anomaly "
            "unmirrored); moved: W&B now returns it from another project of its entity (it counts there)",
            "category": "push_to_main, sweep or regular (see the README for the rules)",
            "created_at": "creation time, UTC",
            "heartbeat_at": "last heartbeat, UTC",
            "ended_at": "end time, UTC: the heartbeat of an ended run; NULL while alive",
            "duration_hours": "ended_at - created_at, hours; NULL while alive",
            "latest_gpu_sample": "the run's GPUs in the latest system sample W&B returned: gpu_index, utilisation "
            "(system.gpu.<i>.gpu, percent), memory (system.gpu.<i>.memory, percent); [] without one",
            "log_idle_gpu_hours": "offline runs read before their GPU stream was loaded as curves: idle GPU-hours "
            "per UTC day from the log's own stats records (the former rule: each sample held until the next, an hour "
            "at most); NULL otherwise (an offline run's idle hours are in run_curve_idle, by the one hold rule)",
            "wandb_metadata": "what was read of W&B's wandb-metadata.json (read once per run first seen finished, "
            "crashed or failed): {status: read, gpu_count, gpu}, {status: missing} (asked again for a day after the "
            "run's last heartbeat), {status: malformed} or {status: error, cause} (a read that failed: asked again "
            "after an hour, then six, three reads at most; attempts and asked_at say how many and when); NULL: not "
            "read (alive, WANDB_ASSETS_FETCH_METADATA=false, offline)",
            "curves_status": "the run's curves (run_history, run_gpu_samples): read (some rows), none (it logged none "
            "of WANDB_ASSETS_HISTORY_KEYS and no system stream) or failed (read again by a later tick); NULL: not "
            "yet (pending, offline, WANDB_ASSETS_FETCH_HISTORY=false, or waiting in the backlog: each tick reads "
            "WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs' curves at most, the newest ended first)",
            "curves_read_at": "when its curves were last read, UTC: a running run's at most every "
            "WANDB_ASSETS_HISTORY_REFRESH_MINUTES",
            "curves_final": "its curves were read after it ended (finished, crashed, failed, killed, preempted): never "
            "read again",
            "sps_steady": "steady-state steps per second: the median of its WANDB_ASSETS_SPS_METRIC curve "
            "(run_history) after warm-up, the first 10% of its steps dropped; NULL without that curve",
            "gpu_count": "GPUs: the first config key of WANDB_ASSETS_GPU_COUNT_KEYS holding a count, else W&B's "
            "metadata, else the GPUs in the latest system sample, else WANDB_ASSETS_DEFAULT_GPUS_PER_RUN",
            "gpu_count_source": "where gpu_count came from: config (WANDB_ASSETS_GPU_COUNT_KEYS), metadata (W&B's "
            "wandb-metadata.json), system_metrics (the GPUs in the run's latest system sample) or default",
            "gpu_model": "canonical GPU model (H100-80GB, A100-40GB, V100-16GB, RTX-4090, T4, ...) from config "
            "compute.gpu_type, else W&B's metadata; an unknown name as recorded; NULL when neither says",
            "gpu_util_pct": "mean utilisation of the run's GPUs in its latest system sample, percent; NULL without one",
            "cost_usd": "USD: gpu_count x hours from created_at to ended_at (alive: to ingested_at), each UTC day at "
            "the USD per GPU-hour in force that day for its model and cluster (gpu_price_periods: an edit of the price "
            "file takes effect from the day it is first seen); NULL when a day has no price (never 0)",
            "gpu_type": "GPU model, config `compute.gpu_type` (wandb_assets.instrument)",
            "cpu_count": "CPUs given to the job, config `compute.cpu_count`",
            "memory_gb": "memory available to the job, GiB, config `compute.memory_gb`",
            "slurm_job_id": "Slurm job id, config `slurm.job_id`",
            "hostname": "host the run started on, config `system.hostname`",
            "sweep_id": "W&B sweep id, when the run belongs to a sweep",
            "tags": "W&B tags",
            "user": "username of the run's owner",
            "group_name": "W&B group",
            "job_type": "W&B job type",
            "url": "the run's W&B page",
            **_CI,
            **_SPS,
            "summary_step": "summary `_step`, the last logged step (NULL when the summary has none)",
            "cli_version": "wandb client version that wrote the run (config `_wandb.cli_version`)",
            "config": "the run config as JSON, `{value, desc}` wrapping removed, without the client's `_wandb` "
            "and `wandb_version` keys; NaN/Infinity kept as JSON numbers",
            "summary": "the run summary as JSON; NaN, Infinity and -Infinity kept as numbers (DuckDB reads the tokens)",
            "anomalies": "fields that were malformed and stored as NULL or {} (summary, config, created_at, "
            "gpu_count), and SPS columns whose value was NaN or infinite",
            "ingested_at": "when this row was written, UTC",
            "state_changed_at": "when the run lifecycle last marked this row without loading it (vanished, unmirrored "
            "or moved), UTC; NULL: as loaded",
            "source": "wandb (mirrored from the W&B API; authoritative) or offline (read from a .wandb log by "
            "`wandb-assets ingest-offline` / the offline_runs asset; replaced by the mirrored copy once synced)",
            "log_path": "the offline .wandb log an offline row was read from (NULL for mirrored rows)",
        },
    ),
    "push_to_main_sps": (
        "view",
        "One row per push-to-main CI run with its throughput (a view of runs: category push_to_main).",
        {
            **_PROJECT,
            "run_id": "W&B run id",
            "name": "display name",
            **_CI,
            "state": "W&B state",
            "created_at": "creation time, UTC",
            "ended_at": "end time, UTC; NULL while alive",
            "url": "W&B page",
            **_SPS,
            "sps_steady": "steady-state SPS from the run's curve (runs.sps_steady); NULL until its curves are read",
        },
    ),
    "success_rates": (
        "table",
        "Outcomes per project, UTC day of ended_at and category (plus 'all').",
        {
            **_PROJECT,
            "day": "UTC day the runs ended",
            "category": "push_to_main, sweep, regular or all",
            "completed": "runs finished, count",
            "failed": "runs failed or crashed, count",
            "other_ended": "runs killed or preempted, count",
            "success_rate_pct": "100 x completed / (completed + failed), percent; NULL when both are 0",
        },
    ),
    "gpu_hours": (
        "table",
        "GPU time consumed per project, UTC day and category (plus 'all'): gpu_usage's run-days and GPU-hours summed, "
        "as gpu_usage was last built.",
        {
            **_PROJECT,
            "day": "UTC day",
            "category": "push_to_main, sweep, regular or all",
            "runs": "runs that consumed GPU time that day, count",
            "gpu_hours": "sum of gpu_count x hours of [created_at, ended_at or now] inside the day, GPU-hours",
        },
    ),
    "gpu_usage": (
        "table",
        "GPU-hours and dollars per UTC day, project, user, team, category and GPU model (rebuilt each tick; "
        "running runs count up to then).",
        {
            "day": "UTC day the GPU-hours were spent on",
            **_PROJECT,
            "username": "W&B user who ran them (NULL when W&B names none)",
            "team": "team of the user (WANDB_ASSETS_TEAMS), unassigned when not mapped",
            "category": "push_to_main, sweep or regular",
            "gpu_model": "canonical GPU model (runs.gpu_model); NULL when no source names it",
            "runs": "runs that used GPUs that day, count",
            "gpu_hours": "GPUs times busy hours that day (the gpu_hours table's rule)",
            "cost_usd": "gpu_hours times the USD per GPU-hour in force that day for the runs' model and cluster "
            "(gpu_price_periods), else the fallback price (WANDB_ASSETS_GPU_DEFAULT_PRICE); NULL when neither prices "
            "it (never 0)",
            "idle_gpu_hours": "of those, GPU-hours idle (below WANDB_ASSETS_IDLE_GPU_PCT): for a run whose curves were "
            "read after it ended, from its whole sampled GPU stream (run_curve_idle); else in the samples taken "
            "while it ran (gpu_samples); each sample holds until the run's next one, its end or now, at most the "
            "longer of an hour and twice the stream's sampling interval (docs/gpu-accounting.md); for offline runs "
            "from their logs; 0 without samples",
            "price_basis": "the rule that priced cost_usd: list (the model's unmatched price), a match such as "
            "`hosts cw-*` (WANDB_ASSETS_GPU_PRICES' periods), fallback (WANDB_ASSETS_GPU_DEFAULT_PRICE) or NULL "
            "(no price)",
            "price_from": "the first UTC day of the price period that priced this day (gpu_price_periods); NULL: since "
            "always",
            "usd_per_gpu_hour": "the USD per GPU-hour in force that day for the rule (NULL: no price)",
            "partly_idle_gpu_hours": "of idle_gpu_hours, those of GPUs idle while another GPU of the same run was "
            "busy (from runs' sampled GPU streams, run_curve_idle; 0 for runs without one)",
            "idle_cost_usd": "idle_gpu_hours at cost_usd's price: the dollars of idle GPUs; NULL when unpriced",
            "failed_gpu_hours": "of gpu_hours, those of runs that failed or crashed (their state at the rebuild)",
            "failed_cost_usd": "failed_gpu_hours at cost_usd's price: the dollars of failed runs; NULL when unpriced",
        },
    ),
    "run_history": (
        "table",
        "Each run's sampled training curves: WANDB_ASSETS_HISTORY_KEYS by step, at most WANDB_ASSETS_HISTORY_SAMPLES "
        "points per metric (W&B's sampledHistory; the first and last step kept). Loaded by run_curves with the "
        "run's curves_status in one transaction; a re-read replaces the run's curves.",
        {
            **_PROJECT,
            "run_id": "W&B run id",
            "metric": "history key (such as overview/sps)",
            "step": "the run's _step",
            "timestamp": "when the step was logged, UTC (NULL when W&B sent no _timestamp)",
            "value": "the logged value (finite numbers only)",
        },
    ),
    "run_gpu_samples": (
        "table",
        "Each run's sampled system stream, per GPU: at most WANDB_ASSETS_HISTORY_SAMPLES samples of the run (W&B's "
        "events). Loaded by run_curves with the run's curves_status; a re-read replaces the run's samples. The live "
        "per-tick samples of running runs stay in gpu_samples (what the idle_gpus alert judges, 8 days).",
        {
            **_PROJECT,
            "run_id": "W&B run id",
            "timestamp": "sample time, UTC",
            "gpu": "the GPU's index on its machine (system.gpu.<i>)",
            "util_pct": "GPU utilisation, percent (NULL when not sampled)",
            "memory_pct": "GPU memory busy, percent (NULL when not sampled)",
            "power_w": "power draw, watts (NULL when not sampled)",
        },
    ),
    "run_curve_idle": (
        "table",
        "Per ended run whose GPU stream was read (run_gpu_samples) and UTC day: its idle and partly idle GPU-hours, "
        "judged once when its curves are loaded (the idle rule of gpu_usage: each sample holds until the next one or "
        "the run's end, an hour at most, never past its day; idle GPUs scaled to the run's gpu_count). gpu_usage "
        "sums these instead of scanning every sample on each tick; rows judged at another WANDB_ASSETS_IDLE_GPU_PCT "
        "are judged again before gpu_usage is rebuilt.",
        {
            **_PROJECT,
            "run_id": "W&B run id",
            "day": "UTC day",
            "idle_pct": "the WANDB_ASSETS_IDLE_GPU_PCT the row was judged at",
            "idle_gpu_hours": "GPU-hours of its GPUs below idle_pct that day",
            "partly_idle_gpu_hours": "of those, GPU-hours of GPUs idle while another GPU of the run was busy",
        },
    ),
    "gpu_samples": (
        "table",
        "Each running run's GPUs at every fleet snapshot (from its latest system sample), kept 8 days: what the "
        "idle_gpus alert judges.",
        {
            "snapshot_at": "snapshot time, UTC",
            **_PROJECT,
            "run_id": "W&B run id",
            "gpu_index": "the GPU's index on its machine (system.gpu.<i>)",
            "utilisation": "GPU utilisation, percent",
            "memory": "GPU memory busy, percent (NULL when not sampled)",
        },
    ),
    "fleet_metrics": (
        "table",
        "The 24 fleet gauges (the old cron's 20, four of GPU cost and idleness), one row per metric per snapshot "
        "(a time series).",
        {
            "snapshot_at": "snapshot time, UTC; the window is the 24 h before it",
            "metric": "gauge name, as sent to Datadog (see the README)",
            "value": "gauge value in the metric's unit (runs, hours, GPU-hours, percent or steps/s); NULL if undefined",
        },
    ),
    "project_metrics": (
        "table",
        "The same 24 gauges per W&B project at every snapshot (fleet_metrics holds them over the whole fleet).",
        {
            "snapshot_at": "snapshot time, UTC; the window is the 24 h before it",
            **_PROJECT,
            "metric": "gauge name, as in fleet_metrics",
            "value": "the gauge over this project's runs alone, in the metric's unit; NULL if undefined",
        },
    ),
    "datadog_deliveries": (
        "table",
        "Delivery ledger: each fleet snapshot sent to Datadog at least once (a re-send repeats the same point, "
        "which Datadog stores once per timestamp).",
        {
            "snapshot_at": "the snapshot, UTC",
            "status": "pending, delivered, expired, rejected, dry_run, or replayed (a past snapshot the demo "
            "replayed: never sent)",
            "attempts": "submissions tried, count",
            "last_error": "last failure, one line (never the key)",
            "delivered_at": "when Datadog accepted it, UTC",
            "enqueued_at": "when it entered the ledger, UTC",
        },
    ),
    "wandb_projects": (
        "table",
        "The W&B projects the deployment mirrors (WANDB_ASSETS_PROJECTS, or WANDB_ENTITY/WANDB_PROJECT), as the "
        "last fetch found them: one row per project ever mirrored; one that failed keeps its rows in runs.",
        {
            "entity": "W&B entity (team or user)",
            "project": "W&B project; * for an entity/* item whose projects could not be listed",
            "mirrored": "whether the last fetch was asked to mirror it (false: dropped from the configuration or "
            "no longer listed by W&B; its runs stay)",
            "first_seen_at": "the first fetch that mirrored it, UTC",
            "last_checked_at": "the last fetch that tried it, UTC",
            "last_fetched_at": "the last fetch that read it whole, UTC (NULL: never)",
            "runs": "rows of this project in runs, count",
            "failing_since": "the first of the fetches in a row that failed for it, UTC; NULL when it reads",
            "last_error": "why the last fetch failed for it, one line (never the key); NULL when it read",
        },
    ),
    "offline_log_files": (
        "table",
        "Every offline .wandb log read by `wandb-assets ingest-offline` or the offline_runs asset: a log whose "
        "size and modification time are unchanged is not read again.",
        {
            "path": "absolute path of the .wandb file",
            "size": "file size when read, bytes",
            "mtime_ns": "file modification time when read, nanoseconds since the epoch",
            "run_id": "the run id the log records (empty when the log has no run record)",
            "records": "records read, count",
            "history_items": "history values read (only the last value of each key is kept), count",
            "damage": "JSON list of damaged stretches: kind (corrupt, truncated, bad_header, unparsable, "
            "unreadable), byte offset, detail; [] for an intact log",
            "loaded": "loaded, kept mirrored (W&B already has the run: the mirrored row stays), or why not "
            "(no run record)",
            "read_at": "when it was read, UTC",
        },
    ),
    "alerts": (
        "table",
        "Alert lifecycle: one row per opening of rule + subject.",
        {
            "alert_key": "rule:subject",
            "rule": "alert rule name",
            "subject": "what it is about (config, run id...)",
            "severity": "warning or critical",
            "message": "latest human-readable message, with links",
            "details": "latest details as JSON",
            "opened_at": "when it opened, UTC",
            "last_seen_at": "last evaluation at which it still held, UTC",
            "resolved_at": "when it resolved, UTC; NULL while open",
        },
    ),
    "alert_notifications": (
        "table",
        "Notification outbox: one message per channel per alert opening or resolution, delivered at least once "
        "(a crash between sending and marking repeats it).",
        {
            "id": "order of creation",
            "alert_key": "rule:subject",
            "event": "opened or resolved",
            "channel": "slack or datadog_event",
            "text": "the message",
            "status": "pending or sent",
            "attempts": "deliveries tried, count",
            "last_error": "last failure, one line",
            "created_at": "queued at, UTC",
            "sent_at": "delivered at, UTC",
        },
    ),
    "idle_actions": (
        "table",
        "The idle ladder's ledger (WANDB_ASSETS_IDLE_POLICY, docs/alerts.md): one row per idle episode, ladder step "
        "and audience, written once (two ticks at once decide it once) and sent from here as from an outbox (a "
        "message Slack could not take waits here; none is sent twice).",
        {
            "entity": "W&B entity of the run",
            "project": "W&B project of the run",
            "run_id": "W&B run id",
            "episode_started_at": "first idle sample of the episode (the unbroken idle time up to the run's latest "
            "sample), UTC",
            "step": "ladder step, 1-based, in the policy's order",
            "audience": "owner, team, stop (the stop itself) or datadog (the step's Datadog event)",
            "decided_at": "when the tick found the step due, UTC",
            "acted_at": "when it went out, was stopped or was recorded, UTC; NULL while it waits",
            "channel": "slack, webhook (nobody found: see reason), wandb (a stop), datadog_event, or none",
            "recipient": "Slack user or channel id, the alert webhook, or the run's entity/project/run_id",
            "outcome": "pending, sending, sent (channel slack: told; webhook: on-call only), stopped, would_stop "
            "(stop_runs off), not_stopped (the send-time check: ended, another run, exempt now), refused (W&B refused "
            "the stop), skipped, undeliverable (nobody to tell, or Slack refuses the target for good), withdrawn (an "
            "intent no longer valid when it was to act: decided again) or unknown (its sender ended mid-send: never "
            "sent again)",
            "reason": "why this channel or outcome, one line",
            "idle_gpu_hours": "idle GPU-hours of the episode when decided (idle GPUs x idle hours)",
            "idle_usd": "their dollars at the run's price (NULL: no price)",
            "details": "what the message says, as JSON: run name and link, user, team, GPUs idle, minutes, price, "
            "the next step and when",
            "attempts": "sends tried, count",
            "last_error": "last failure of a send, one line",
            "claim": "the sender holding it while it goes out; NULL otherwise",
            "claimed_at": "when that sender took it, UTC",
            "run_created_at": "the run's creation time, UTC: with entity and run_id its identity (NULL: rows written "
            "before it was kept)",
        },
    ),
    "pr_checks": (
        "table",
        "Each pull request's training throughput against main on the same testbed (issue 45; docs/alerts.md): one row "
        "per PR, commit, config, testbed and SPS metric, replaced each time it is judged.",
        {
            "repo": "GitHub repository (owner/name) when configured; NULL otherwise",
            "pr": "pull request number (github.sky.pr<N>.<commit>.<config>.<ts>)",
            "commit": "the commit in the PR runs' names (may be short)",
            "config": "CI config in the names",
            "testbed": "GPU count and model of the runs (8xH100-80GB), unknown where either is missing",
            "metric": "SPS summary key (the configured one: steady SPS where curves gave one)",
            "pr_value": "mean of the PR runs of this commit and config (one sample)",
            "pr_n": "PR runs in it, count",
            "baseline_median": "median of the baseline main runs",
            "baseline_n": "main runs in the baseline (the last 10 ended of the same config and testbed), count",
            "boundary": "lower boundary: Student-t at 99 % (mean - t x sd x sqrt(1 + 1/n)) or the percentage; NULL "
            "without a baseline",
            "change_pct": "PR value against the baseline median, percent",
            "verdict": "regression, improvement, no change or no baseline",
            "judged_at": "when judged, UTC",
            "pr_runs": "W&B run ids of the PR runs",
            "baseline_runs": "W&B run ids of the baseline's main runs, oldest first",
            "pr_run_urls": "the PR runs' W&B pages, in the order of pr_runs",
        },
    ),
    "github_deliveries": (
        "table",
        "The pull requests' verdicts on their way to GitHub (WANDB_ASSETS_GITHUB_REPO; docs/pr-checks.md), an outbox: "
        "one row per PR and item (a commit's check run, the PR's comment), queued when what it says changes, sent by "
        "github_checks; GitHub down, it waits here; delivery edits what it sent before, never a second one.",
        {
            "repo": "GitHub repository, owner/name",
            "pr": "pull request number",
            "item": "check:<commit> (the check run on that commit) or comment (the PR's one comment)",
            "commit": "the commit it shows, as in the run names (may be short)",
            "conclusion": "the check's conclusion: failure, neutral or success; NULL for the comment",
            "title": "the check's title, one line",
            "body": "the Markdown it sends (the check's summary, the comment's text)",
            "body_hash": "hash of what it says: queued again only when that changes",
            "state": "pending (waits; after an outage too), sending (a sender holds it), delivered, refused (GitHub "
            "would not take it: see last_error; queued again when what it says changes)",
            "queued_at": "when last queued, UTC",
            "delivered_at": "when last delivered, UTC",
            "head_sha": "the full SHA the check went on (resolved through the API)",
            "target_id": "GitHub's id of the check run, commit status or comment",
            "channel": "check_run, commit_status (a personal token cannot make check runs) or comment",
            "attempts": "sends tried, count",
            "last_error": "the last failure, one line (GitHub's status and message)",
            "claim": "the sender holding it while it goes out; NULL otherwise",
            "claimed_at": "when that sender took it, UTC",
        },
    ),
    "run_progress": (
        "table",
        "Each running run's summary `_step` at each alert evaluation (two days kept).",
        {
            "run_id": "W&B run id",
            "observed_at": "evaluation time, UTC",
            "step": "summary `_step` then",
            **_PROJECT,
        },
    ),
    "sps_change_points": (
        "table",
        "Every SPS regression the detector finds on main, recovered ones too, as of the last alert evaluation "
        "(`fleet_alerts`); the `sps_regression` rule and the `change_points` helper read it while the main series "
        "are unchanged (the same runs holding the same values, however often they were fetched), else they run "
        "the detector again.",
        {
            "ordinal": "the order found in: by project and CI config, each config's regressions oldest first",
            **_PROJECT,
            "ci_config": "CI config of the series",
            "testbed": "GPU count and model of the series' runs (8xH100-80GB; unknown without them): a config's main "
            "runs on each testbed are a series of their own",
            "metric": "summary key watched (`WANDB_ASSETS_SPS_METRIC`)",
            "evaluated_at": "the snapshot time it was evaluated at, UTC",
            "last_good_commit": "last commit of the old regime",
            "last_good_url": "its run's W&B page",
            "first_slow_commit": "first commit of the slow regime",
            "first_slow_run_id": "its W&B run id",
            "first_slow_created_at": "its creation time, UTC",
            "first_slow_url": "its run's W&B page",
            "detected_commit": "the commit at which the detector found it (the tick that would have paged)",
            "before": "robust level of the old regime, steps/s",
            "after": "robust level of the slow regime, steps/s",
            "change_pct": "after against before, percent (negative: slower)",
            "noise_pct": "the old regime's noise, percent",
            "confirming_runs": "slow runs that confirm it, count",
            "recovered_commit": "first commit of a later regime back within the noise of before; NULL while slow",
            "recovered": "true when it recovered (its alert resolved)",
        },
    ),
    "report_publications": (
        "table",
        "What the fleet report run has published: one row per fleet snapshot logged to a report run, written "
        "before the run is finished so that a crash cannot publish a snapshot twice.",
        {
            "snapshot_at": "the fleet snapshot, UTC",
            "published_at": "when it was logged, UTC",
            "project": "W&B project of the report run",
            "run_id": "id of the report run",
            "artifact": "the warehouse artifact logged with this publication (name:alias), else NULL; "
            "at most one a day",
        },
    ),
    "gpu_price_periods": (
        "table",
        "The history of WANDB_ASSETS_GPU_PRICES (and WANDB_ASSETS_GPU_DEFAULT_PRICE), recorded at each refresh: a "
        "dated period as dated; an undated price from the UTC day it was first seen (since always on the warehouse's "
        "first record), so editing the file never re-prices the past (docs/gpu-accounting.md).",
        {
            "model": "canonical GPU model; empty: the fallback price",
            "rule": "list (the model's unmatched price), fallback, or the match: `hosts cw-*`, `projects e/*`, "
            "`entities e`",
            "match_on": "hosts (the run's hostname), projects (entity/project) or entities; NULL: no match",
            "patterns": "the match's glob patterns",
            "rank": "the rule's place in the file (first match wins; the unmatched price after every rule)",
            "valid_from": "the UTC day the period takes effect; NULL: since always",
            "usd": "USD per GPU-hour; NULL: no price of this rule from valid_from (removed from the file)",
            "dated": "the file dated it (true) or it took effect the day it was first seen (false)",
            "source": "where the row came from (the file dated it, first seen, since always, removed, or an upgrade)",
            "recorded_at": "when it was recorded, UTC",
            "seq": "order of recording",
        },
    ),
    "gpu_charges": (
        "table",
        "What is billed, per month, team, project, user, GPU model and price: an open month's usage as gpu_usage "
        "computes it, a closed month exactly as recorded when it was closed (closed_month_charges), and every later "
        "change to a closed month's usage as an adjustment booked to the first open month after it. Rebuilt with "
        "gpu_usage; the chargeback reads it.",
        _CHARGES,
    ),
    "closed_month_charges": (
        "table",
        "The rows of gpu_charges billed in each closed month, as they were when it was closed (`wandb-assets close`, "
        "or WANDB_ASSETS_CLOSE_AFTER_DAYS): never changed after.",
        _CHARGES,
    ),
    "team_budgets": (
        "table",
        "Each team's monthly GPU budget from WANDB_ASSETS_BUDGETS, replaced at every gpu_usage build: a row holds "
        "from its month until a later row of the same team (the team_budget_vs_spend mart reads it).",
        {
            "team": "team name as in WANDB_ASSETS_TEAMS",
            "from_month": "first day of the first month the budget holds (1970-01-01: a budget given as one number)",
            "monthly_budget_usd": "USD a month",
        },
    ),
    "closed_months": (
        "table",
        "The months closed: when, how, the usage days they held and their totals as recorded.",
        {
            "month": "the closed month (its first day)",
            "closed_at": "when it was closed, UTC",
            "closed_by": "wandb-assets close, or WANDB_ASSETS_CLOSE_AFTER_DAYS",
            "first_day": "the first UTC day of usage the month held when closed",
            "last_day": "the last UTC day of usage it held",
            "gpu_hours": "its GPU-hours as recorded",
            "cost_usd": "its USD as recorded",
            "digest": "md5 of its record's rows (closed_month_charges) when it was closed: `check` compares",
        },
    ),
    "warehouse_meta": (
        "table",
        "Bookkeeping, one value per key: the schema version the comments and views were made for, the price "
        "periods runs.cost_usd was priced with (gpu_price_periods_priced), the build of gpu_usage (gpu_usage_build: "
        "its time, price periods, teams and idle threshold, JSON), a token "
        "renewed by every write to what the derived tables are computed from "
        "(inputs_version), the steady-SPS metric the curves were read with.",
        {"key": "what the value is", "value": "the value (text; JSON for a build record)"},
    ),
    "main_sps_by_config": (
        "view",
        "Main-branch SPS per project and CI config, in commit order.",
        {
            **_PROJECT,
            "ci_config": "CI config",
            "commit_order": "1 for the oldest main run of the config in its project, then 2, 3...",
            "ci_commit": "commit",
            "ci_timestamp": "the name's timestamp, UTC",
            "created_at": "creation time, UTC",
            "ended_at": "end time, UTC",
            "state": "W&B state",
            **_SPS,
            "sps_steady": "steady-state SPS from the run's curve (runs.sps_steady); NULL until its curves are read",
            "url": "W&B page",
        },
    ),
    "daily_fleet": (
        "view",
        "Daily success rate and GPU-hours per category (plus 'all') of every mirrored project together (counts "
        "summed, then the rate computed).",
        {
            "day": "UTC day",
            "category": "push_to_main, sweep, regular or all",
            "completed": "runs finished that day, count",
            "failed": "runs failed or crashed that day, count",
            "other_ended": "runs killed or preempted that day, count",
            "success_rate_pct": "percent, NULL if 0/0",
            "gpu_runs": "runs consuming GPU time that day, count",
            "gpu_hours": "GPU-hours consumed that day",
        },
    ),
    "alive_runs": (
        "view",
        "Runs alive now (running, pending, preempting) with their age and GPUs.",
        {
            "entity": "W&B entity",
            "project": "W&B project",
            "run_id": "W&B run id",
            "name": "display name",
            "category": "category",
            "state": "W&B state",
            "user": "owner",
            "created_at": "creation time, UTC",
            "heartbeat_at": "last heartbeat, UTC",
            "age_hours": "now - created_at, hours",
            "gpu_count": "GPUs",
            "url": "W&B page",
        },
    ),
    "sweep_summary": (
        "view",
        "One row per sweep: run counts, success rate and GPU-hours.",
        {
            "sweep": "sweep id, or '(no sweep id)' for runs recognised only by a `.sweep` name",
            "runs": "runs, count",
            "completed": "finished, count",
            "failed": "failed or crashed, count",
            "alive": "running, pending or preempting, count",
            "success_rate_pct": "percent, NULL if 0/0",
            "gpu_hours": "GPU-hours consumed so far (alive runs up to now)",
            "first_created_at": "first run created, UTC",
            "last_created_at": "last run created, UTC",
        },
    ),
}


#: The tables analysts' dbt models read (``analytics/models/sources.yml``) -> the Dagster asset that writes each, so
#: lineage runs from our assets through their models in one graph.
DBT_SOURCE_ASSETS: dict[str, str] = {
    "runs": "runs",
    "push_to_main_sps": "push_to_main_sps",
    "success_rates": "success_rates",
    "gpu_hours": "gpu_hours",
    "gpu_usage": "gpu_usage",
    "gpu_charges": "gpu_usage",
    "closed_months": "gpu_usage",
    "team_budgets": "gpu_usage",
    "run_history": "run_curves",
    "run_curve_idle": "run_curves",
    "fleet_metrics": "fleet_snapshot",
    "project_metrics": "fleet_snapshot",
    "wandb_projects": "wandb_projects",
    "alerts": "fleet_alerts",
    "sps_change_points": "fleet_alerts",
    "idle_actions": "idle_actions",
    "warehouse_meta": "gpu_usage",  # the marts record which gpu_usage build they were made from (marts_build)
}

#: The source tests: a run is (entity, project, run_id) and has each; its state and category are one of these.
RUN_STATES = (*ALIVE_STATES, *ENDED_STATES, VANISHED, MOVED)


def _yaml_text(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string


def render_dbt_sources() -> str:
    """``analytics/models/sources.yml``: the warehouse tables as dbt sources, described from ``SCHEMA_DOCS``."""
    lines = [
        "# Generated from wandb_assets/lib/schema_docs.py (`python -m wandb_assets.lib.schema_docs --dbt-sources`):",
        "# the same descriptions as docs/warehouse.md and the warehouse's COMMENTs. Do not edit by hand.",
        "version: 2",
        "",
        "sources:",
        "  - name: warehouse",
        "    description: \"The pipeline's tables (Dagster assets), in the warehouse's main schema.\"",
        "    schema: main",
        "    tables:",
    ]
    for name, asset in DBT_SOURCE_ASSETS.items():
        kind, description, columns = SCHEMA_DOCS[name]
        lines += [
            f"      - name: {name}",
            f"        description: {_yaml_text(description)}",
            "        config:",
            "          meta:",
            "            dagster:",
            f"              asset_key: [{asset}]",
        ]
        if name == "runs":
            lines += [
                "        data_tests:",
                "          - unique_combination:",
                "              arguments:",
                "                columns: [entity, project, run_id]",
                "              config: {severity: warn}  # stg_runs' own test is the gate (an asset check)",
            ]
        lines.append("        columns:")
        for col, text in columns.items():
            lines += [f"          - name: {_quote_column(col)}", f"            description: {_yaml_text(text)}"]
            tests = _source_column_tests(name, col)
            if tests:
                lines.append("            data_tests:")
                lines += [f"              {test}" for test in tests]
    return "\n".join(lines) + "\n"


def render_dbt_macros() -> str:
    """``analytics/macros/warehouse_rules.sql``: the pipeline's own rules as dbt macros, so the analysts' models
    count a failed run, an ended run and a run's GPU-hours exactly as the pipeline's tables do."""
    return "\n".join(
        [
            "{#- Generated from wandb_assets/lib (`python -m wandb_assets.lib.schema_docs --dbt-macros`): the",
            "    pipeline's rules, one definition. Do not edit by hand. -#}",
            "",
            f"{{% macro failed_states() %}}({FAILED_SQL}){{% endmacro %}}",
            "",
            f"{{% macro ended_states() %}}({ENDED_SQL}){{% endmacro %}}",
            "",
            "{#- A run's GPU-hours seen at `now` (SQL): its GPUs times the span it held them (the gpu_usage rule). -#}",
            f"{{% macro run_gpu_hours(now) %}}{run_gpu_hours_sql('{{ now }}')}{{% endmacro %}}",
            "",
            "{#- Completed out of completed + failed, percent; NULL when both are 0 (counts summed first). -#}",
            "{% macro success_rate_pct(completed, failed) %}"
            + success_rate_sql("{{ completed }}", "{{ failed }}")
            + "{% endmacro %}",
            "",
        ]
    )


def _quote_column(column: str) -> str:
    return f'"{column}"' if column in ("user",) else column


def _source_column_tests(table: str, column: str) -> list[str]:
    if table != "runs":
        return []
    warn = "    config: {severity: warn}"
    if column in ("entity", "project", "run_id"):
        return ["- not_null:", warn]
    allowed = {"state": RUN_STATES, "category": CATEGORIES}.get(column)
    if allowed is None:
        return []
    values = ", ".join(allowed)
    return ["- accepted_values:", "    arguments:", f"      values: [{values}]", warn]


def comment_statements(lake: bool = False) -> list[str]:
    """``COMMENT ON`` statements for every table, view and column.

    ``lake``: DuckLake takes no comments on view columns, so a view's comment lists its columns instead.
    """
    statements = []
    for name, (kind, description, columns) in SCHEMA_DOCS.items():
        if lake and kind == "view":
            described = "; ".join(f"{col}: {text}" for col, text in columns.items())
            statements.append(f"COMMENT ON VIEW {name} IS {sql_string(f'{description} Columns: {described}')}")
            continue
        statements.append(f"COMMENT ON {kind.upper()} {name} IS {sql_string(description)}")
        statements += [f'COMMENT ON COLUMN {name}."{col}" IS {sql_string(text)}' for col, text in columns.items()]
    return statements


def render_markdown() -> str:
    """The schema section of the docs."""
    lines = [
        "# Warehouse schema",
        "",
        "Generated from `wandb_assets/lib/schema_docs.py` (`python -m wandb_assets.lib.schema_docs`); the same",
        "text is stored as DuckDB `COMMENT`s, so `duckdb_columns()` and `duckdb_tables()` show it too.",
        "All times are UTC. Analysts read the snapshot `<warehouse>.snapshot.duckdb` "
        "(`wandb_assets.warehouse.open_snapshot()`), or in DuckLake mode the lake itself. A DuckLake takes no "
        "comments on view columns: there a view's comment lists its columns.",
        "",
    ]
    for name, (kind, description, columns) in SCHEMA_DOCS.items():
        lines += [f"## `{name}` ({kind})", "", description, "", "| column | meaning |", "|---|---|"]
        lines += [f"| `{col}` | {text} |" for col, text in columns.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    renders = {"--dbt-sources": render_dbt_sources, "--dbt-macros": render_dbt_macros}
    print(renders.get(sys.argv[-1], render_markdown)(), end="")
