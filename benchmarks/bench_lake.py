"""DuckLake at a million runs beside the DuckDB file, and with more run workers (issue 54).

One script run builds ``bench_ingest.py``'s fleet (120 days, 8,334 runs a day: a million runs), serves it from the
local W&B server, starts a PostgreSQL 15 (the lake's catalog; the lake's files in a local folder, as a volume would
hold them) and measures, each in a process of its own with its peak RSS: the backfill, the first tick and a steady
tick into a DuckDB file, then the same into a DuckLake; then the backfill again into a fresh lake by ``--workers``
processes at once, each `wandb-assets backfill` of its share of the days (what DuckLake allows and a file does not:
several writers), timed as a whole.

    uv run python benchmarks/bench_lake.py                       # ~20 minutes on 2 cores
    uv run python benchmarks/bench_lake.py --runs-per-day 834    # the same at 100,000 runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import bench_ingest as bench  # noqa: E402 - the same fleet, environment, phases and measurements

from tests.pg_server import running_postgres  # noqa: E402 - the tests' throwaway PostgreSQL

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)
PASSWORD = "bench-" + "p" * 16


def _lake_env(env: dict, server: dict, database: str, data: Path) -> dict:
    conninfo = f"host={server['host']} port={server['port']} user={server['user']} dbname={database}"
    return {
        **env,
        "WANDB_ASSETS_DUCKDB": f"ducklake:postgres:{conninfo}",
        "PGPASSWORD": server["password"],
        "WANDB_ASSETS_DUCKLAKE_DATA_PATH": str(data),
    }


def _workers_backfill(env: dict, first: datetime, last: datetime, workers: int, workdir: Path) -> dict:
    """``workers`` `wandb-assets backfill` processes at once, each of a share of the days (its own Dagster home):
    the wall time of all, and each one's peak RSS."""
    days = (last - first).days + 1
    shares = [
        (first + timedelta(days=days * i // workers), first + timedelta(days=days * (i + 1) // workers - 1))
        for i in range(workers)
    ]
    children = []
    started = time.perf_counter()
    for i, (start, end) in enumerate(shares):
        home = workdir / f"dagster-home-{i}"
        home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        command = [
            sys.executable,
            "-m",
            "wandb_assets.cli",
            "backfill",
            "--start",
            f"{start:%Y-%m-%d}",
            "--end",
            f"{end:%Y-%m-%d}",
        ]
        log = open(workdir / f"worker-{i}.log", "w")  # noqa: SIM115 - closed below
        children.append(
            (subprocess.Popen(command, env={**env, "DAGSTER_HOME": str(home)}, stdout=log, stderr=log), log)
        )
    peaks = [0.0] * workers
    while any(child.poll() is None for child, _ in children):
        for i, (child, _) in enumerate(children):
            peaks[i] = max(peaks[i], bench._peak_rss_mib(child.pid) or 0.0)
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    for child, log in children:
        log.close()
        if child.returncode != 0:
            sys.exit(
                f"a backfill worker failed (exit {child.returncode}): {(workdir / 'worker-0.log').read_text()[-2000:]}"
            )
    return {
        "seconds": seconds,
        "wall_seconds": seconds,
        "peak_rss_mib": max(peaks),
        "shares": [list(map(str, s)) for s in shares],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--runs-per-day", type=int, default=8334)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip", nargs="*", default=[], help="phases to leave out: file, lake, workers")
    args = parser.parse_args()

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    now = NOW.replace(tzinfo=None)
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-lake-"))
    me = [sys.executable, bench.__file__, "--days", str(args.days), "--phase"]
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    results: dict[str, dict] = {}
    phases = [("backfill", "ours"), ("the first tick", "tick"), ("a steady tick", "tick")]
    with (
        LocalWandbServer(nodes, entity=bench.ENTITY, project=bench.PROJECT) as server,
        running_postgres(PASSWORD, databases=("lake_one", "lake_many")) as pg,
    ):
        env = bench._environment(server, workdir, now, args.days)
        env["BENCH_KEEP_WANDB_DIR"] = "1"
        places = {
            "file": env,
            "lake": _lake_env(env, pg, "lake_one", workdir / "lake-one"),
        }
        for place, place_env in places.items():
            if place in args.skip:
                continue
            for label, phase in phases:
                key = f"{place}: {label}"
                results[key] = bench.measured(server, key, [*me, phase], place_env)
        if "workers" not in args.skip:
            many = _lake_env(env, pg, "lake_many", workdir / "lake-many")
            first = datetime.combine((now - timedelta(days=args.days)).date(), datetime.min.time())
            key = f"lake: backfill by {args.workers} processes at once"
            try:
                results[key] = _workers_backfill(many, first, now, args.workers, workdir)
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                results[key] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
            print(json.dumps({key: results[key]}, default=str), flush=True)
    print(f"\n{len(nodes):,} runs over {args.days} days")
    bench.print_phases(results)
    shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)
    if os.environ.get("BENCH_KEEP_WORKDIR"):
        print(f"kept {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
