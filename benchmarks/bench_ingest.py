"""Ingestion benchmark: 30,000 runs over 60 days from the local W&B server, in one run of this script.

Phases, each in its own process so that its peak RSS is its own:
  (a) floor   - the wandb client alone: ``api.runs(..., lazy=False, per_page=1000)``, touching nothing;
  (b) ours    - the full backfill job into a fresh DuckDB file (fetch, normalise, write, derived tables);
  (c) naive   - the old cron collector: default ``lazy=True``, ``per_page=50``, reading each run's summary;
  tick        - one whole tick over that history, in process: the refresh job (yesterday + today + days with
                unfinished runs, derived tables, fleet snapshot) then the feed job (Datadog dry run,
                alerts, warehouse snapshot for notebooks).
Prints runs/s, the ratios (b)/(a) and (c)/(b), and peak RSS. Usage: ``uv run python benchmarks/bench_ingest.py``
(``--runs-per-day`` / ``--days`` to change the size).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

ENTITY, PROJECT = "bench-team", "bench-project"
KEY = "local-" + "b" * 40


def _phase(name: str, days: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    now = datetime.fromisoformat(os.environ["BENCH_NOW"])
    first = (now - timedelta(days=days)).date()
    count = 0
    # Imports are process start-up, paid once per process whatever the volume: timed separately.
    imports_started = time.perf_counter()
    if name in ("floor", "naive"):
        import wandb
    else:
        from dagster import DagsterInstance

        from wandb_assets.ticks import execute_backfill, run_tick
    import_seconds = time.perf_counter() - imports_started
    started = time.perf_counter()
    if name in ("floor", "naive"):
        api = wandb.Api(timeout=60)
        if name == "floor":
            iterator = api.runs(f"{ENTITY}/{PROJECT}", order="+created_at", per_page=1000, lazy=False)
            for _ in iterator:
                count += 1
        else:
            for run in api.runs(f"{ENTITY}/{PROJECT}"):
                run.summary.get("overview/sps")
                count += 1
    else:
        instance = DagsterInstance.ephemeral()
        if name == "ours":
            result = execute_backfill(instance, first, now.date())
        else:
            results = run_tick(instance, now.date())  # refresh, then the feed job: a whole tick
            result = results[-1]
        assert result.success, f"{name} failed"
        import duckdb

        con = duckdb.connect(os.environ["WANDB_ASSETS_DUCKDB"], read_only=True)
        count = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        con.close()
    seconds = time.perf_counter() - started
    return {
        "phase": name,
        "runs": count,
        "seconds": seconds,
        "import_seconds": import_seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--runs-per-day", type=int, default=500)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(_phase(args.phase, args.days)))
        return

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    workdir = tempfile.mkdtemp(prefix="wandb-assets-bench-")
    with LocalWandbServer(nodes, entity=ENTITY, project=PROJECT) as server:
        env = {
            **os.environ,
            "WANDB_BASE_URL": server.url,
            "WANDB_API_KEY": KEY,
            "WANDB_ENTITY": ENTITY,
            "WANDB_PROJECT": PROJECT,
            "WANDB_DIR": workdir,
            "WANDB_SILENT": "true",
            "BENCH_NOW": now.isoformat(),
            "WANDB_ASSETS_DUCKDB": os.path.join(workdir, "bench.duckdb"),
            "WANDB_ASSETS_START_DATE": (now - timedelta(days=args.days)).date().isoformat(),
        }
        env.pop("DAGSTER_HOME", None)
        results = {}
        for phase in ("floor", "ours", "naive", "tick"):
            done = subprocess.run(
                [sys.executable, __file__, "--phase", phase, "--days", str(args.days)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                sys.exit(f"phase {phase} failed:\n{done.stderr[-3000:]}")
            results[phase] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{len(nodes):,} runs over {args.days} days, local W&B server, {os.cpu_count()} cores")
    print(f"{'phase':<40} {'runs':>7} {'seconds':>8} {'runs/s':>9} {'peak RSS':>10} {'imports':>8}")
    labels = {
        "floor": "(a) wandb client alone, lazy=False",
        "ours": "(b) our backfill into DuckDB",
        "naive": "(c) naive collector, lazy, per_page=50",
        "tick": "one tick (in process)",
    }
    for phase, r in results.items():
        print(
            f"{labels[phase]:<40} {r['runs']:>7,} {r['seconds']:>8.2f} {r['runs'] / r['seconds']:>9,.0f} "
            f"{r['peak_rss_mib']:>7.0f} MiB {r['import_seconds']:>7.2f}s"
        )
    a, b, c = (results[p]["seconds"] for p in ("floor", "ours", "naive"))
    print(f"(b)/(a) = {b / a:.2f}  (target <= 1.5)")
    print(f"(c)/(b) = {c / b:.2f}  (target >= 4)")
    print(f"peak RSS of (b) = {results['ours']['peak_rss_mib']:.0f} MiB  (target < 1024)")
    tick = results["tick"]
    print(
        f"tick = {tick['seconds']:.2f} s, {tick['seconds'] + tick['import_seconds']:.2f} s with imports"
        "  (target well under 10 s)"
    )
    print("seconds exclude imports (the 'imports' column): they are per process, not per run")


if __name__ == "__main__":
    main()
