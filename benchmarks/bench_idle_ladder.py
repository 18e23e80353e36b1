"""The idle ladder's share of a tick (issue 44: under 10 s in process on a million-run warehouse with 200 runs idle).

A warehouse of ``--runs`` runs (all but 1,000 ended; of the running ones ``--idle`` idle at their latest sample, 8
H100s each), a local W&B server serving the idle runs' sampled GPU streams (500 samples of 8 GPUs, idle the last 130
minutes: each is due step 2 at once), a local Slack. Measured in one process, each in the same run:

- ``ladder``: the ``idle_actions`` asset materialized through Dagster (the candidates query on the whole warehouse,
  the streams read, the episodes, the decisions, 2 messages per run to Slack, the outcomes, the gauges);
- ``ladder, nobody idle``: the same with no idle run (what every tick pays for the ladder);
- ``bare client``: the same streams read with the bare wandb client (one RunCurves request per 20 runs, sequential),
  the baseline the ladder's reading is compared with.

    uv run python benchmarks/bench_idle_ladder.py --runs 1000000 --idle 200
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

T = datetime(2026, 11, 27, 12, 0)
EPOCH = datetime(1970, 1, 1)


def idle_node(run_id: str):
    from wandb_assets.localwandb import make_run_node

    events = []
    for k in range(500):
        moment = T - timedelta(minutes=499 - k)
        util = 0.0 if moment >= T - timedelta(minutes=130) else 90.0
        events.append(
            {"_timestamp": (moment - EPOCH).total_seconds(), **{f"system.gpu.{g}.gpu": util for g in range(8)}}
        )
    return make_run_node(
        run_id,
        display_name=run_id,
        state="running",
        created_at=T - timedelta(hours=9),
        heartbeat_at=T,
        username=f"user{int(run_id[4:]) % 50}",
        config={"compute": {"gpu_count": 8, "gpu_type": "H100-80GB"}},
        events=events,
    )


def build_warehouse(path: Path, runs: int, idle: int) -> None:
    import duckdb

    from wandb_assets.lib.warehouse import ensure_schema, record_projects

    con = duckdb.connect(str(path))
    ensure_schema(con)
    con.execute(
        f"""INSERT INTO runs BY NAME SELECT 'bench' AS entity, 'fleet' AS project,
            CASE WHEN i < {idle} THEN 'idle' || i ELSE 'run' || i END AS run_id,
            CASE WHEN i < 1000 THEN 'running' ELSE 'finished' END AS state, 'regular' AS category,
            TIMESTAMP '2026-11-27 03:00' - to_minutes(i // 100) AS created_at,
            TIMESTAMP '2026-11-27 12:00' AS heartbeat_at,
            8 AS gpu_count, 'H100-80GB' AS gpu_model, 'user' || (i % 50) AS "user", [] AS tags, '{{}}' AS config,
            'wandb' AS source,
            list_transform(range(8), g -> {{'gpu_index': g::INTEGER,
                'utilisation': CASE WHEN i < {idle} THEN 0.0 ELSE 90.0 END, 'memory': 1.0}}) AS latest_gpu_sample
            FROM range({runs}) t(i)"""
    )
    record_projects(con, [{"entity": "bench", "project": "fleet", "error": None}], T)
    con.close()


def _serve(ids: list[str], pipe) -> None:
    """The child process: the local W&B server with the idle runs, and the local Slack; their URLs to ``pipe``."""
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.slack import LocalSlack

    server = LocalWandbServer([idle_node(i) for i in ids], entity="bench", project="fleet").start()
    slack = LocalSlack()
    pipe.send((server.url, slack.url, slack.token))
    pipe.recv()  # until the benchmark is done


def serve_elsewhere(ids: list[str]):
    """The servers in a process of their own: what they spend answering is not the ladder's (W&B and Slack are
    elsewhere in a deployment). Returns ``(W&B URL, Slack URL, token, stop)``."""
    import multiprocessing

    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(ids, child), daemon=True)
    process.start()
    url, slack_url, token = parent.recv()

    def stop() -> None:
        parent.send("stop")
        process.join(10)

    return url, slack_url, token, stop


def materialize_ladder(instance) -> float:
    from dagster import AssetKey

    from wandb_assets.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    started = time.perf_counter()
    result = job.execute_in_process(
        instance=instance,
        asset_selection=[AssetKey("idle_actions")],
        run_config={"ops": {"idle_actions": {"config": {"now": (T + timedelta(minutes=1)).isoformat()}}}},
    )
    elapsed = time.perf_counter() - started
    assert result.success
    meta = result.asset_materializations_for_node("idle_actions")[0].metadata
    print({k: v.value for k, v in meta.items() if k not in ("this_tick",)}, flush=True)
    return elapsed


def bare_client(url: str, run_ids: list[str]) -> float:
    import wandb

    from wandb_assets.lib.curves import CURVES_QUERY

    api = wandb.Api(overrides={"base_url": url}, api_key=os.environ["WANDB_API_KEY"], timeout=60)
    started = time.perf_counter()
    for first in range(0, len(run_ids), 20):
        chunk = run_ids[first : first + 20]
        api._service_api.execute_graphql(  # as lib/fetch sends every query, through wandb-core
            CURVES_QUERY,
            {
                "project": "fleet",
                "entity": "bench",
                "filters": __import__("json").dumps({"name": {"$in": chunk}}),
                "perPage": 20,
                "specs": [],
                "samples": 500,
                "order": "+created_at",
            },
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--idle", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    from dagster import DagsterInstance

    ids = [f"idle{i}" for i in range(args.idle)]
    url, slack_url, token, stop = serve_elsewhere(ids)
    (work / "policy.yaml").write_text("stop_runs: false\n")
    (work / "teams.yaml").write_text(
        "research:\n  channel: C0R\n  users: ["
        + ", ".join(f"{{user: user{u}, slack: U{u}}}" for u in range(50))
        + "]\n"
    )
    os.environ.update(
        WANDB_BASE_URL=url,
        WANDB_API_KEY="local-" + "b" * 40,
        WANDB_ENTITY="bench",
        WANDB_PROJECT="fleet",
        WANDB_ASSETS_IDLE_POLICY=str(work / "policy.yaml"),
        WANDB_ASSETS_TEAMS=str(work / "teams.yaml"),
        WANDB_ASSETS_SLACK_BOT_TOKEN=token,
        WANDB_ASSETS_SLACK_API_URL=slack_url,
        WANDB_ASSETS_STAGING_DIR=str(work / "staging"),
        DAGSTER_HOME=str(work),
    )
    for name in ("DD_API_KEY", "WANDB_ASSETS_SLACK_WEBHOOK_URL"):
        os.environ.pop(name, None)
    (work / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    bare_client(url, ids)  # the server samples each stream once and keeps it: every measurement below reads warm
    timings = {}
    path = work / "warehouse.duckdb"  # one path: the definitions' warehouse resource is made once, at their load
    os.environ["WANDB_ASSETS_DUCKDB"] = str(path)
    for label, idle in (("ladder, nobody idle", 0), ("ladder", args.idle)):
        path.unlink(missing_ok=True)
        started = time.perf_counter()
        build_warehouse(path, args.runs, idle)
        print(f"built {args.runs:,} runs ({idle} idle) in {time.perf_counter() - started:.1f} s", flush=True)
        with DagsterInstance.get() as instance:
            timings[label] = materialize_ladder(instance)
    timings["bare client"] = bare_client(url, ids)
    stop()
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        told = con.execute("SELECT count(*) FROM idle_actions WHERE channel = 'slack' AND outcome = 'sent'").fetchone()
    print(f"{args.runs:,} runs, {args.idle} idle: messages sent {told[0]}")
    for label, seconds in timings.items():
        print(f"  {label:<22} {seconds:6.2f} s")
    print(f"  reading's share: bare client {timings['bare client']:.2f} s of the ladder's {timings['ladder']:.2f} s")


if __name__ == "__main__":
    main()
