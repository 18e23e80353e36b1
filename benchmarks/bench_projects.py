"""Org-wide benchmark: many projects in one deployment, against the slow local W&B server.

(1) Backfill: 20 projects in two entities x 1,500 runs (30,000 runs over 30 days), the server charging what a
    real one does per ``Runs`` request (default 0.25 s + 2 ms per run returned, as in ``bench_ingest.py``):
      (a) floor - the wandb client alone iterating the 20 projects one after another
                  (``api.runs(path, lazy=False, per_page=1000)``), a process;
      (b) ours  - ``wandb-assets backfill`` as a whole process, ``WANDB_ASSETS_PROJECTS=bench-a/*,bench-b/*``,
                  ``WANDB_ASSETS_FETCH_CONCURRENCY=8``.
    Reported: wall seconds of each process, (b)/(a) (target <= 0.4), requests, most requests in flight (<= 8).
(2) Ticks: 50 projects backfilled; a tick with nothing new, then 5 projects gain a run and the next tick runs:
    the W&B requests of each tick by operation (target: they grow with the 5 that changed, not with the 50).

Usage: ``uv run python benchmarks/bench_projects.py`` (``--only backfill|ticks``, ``--projects``, ``--runs``,
``--days``, ``--cost-per-request``, ``--cost-per-run``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

KEY = "local-" + "p" * 40
REPO = Path(__file__).resolve().parent.parent
ENTITIES = ("bench-a", "bench-b")
FLOOR = """
import os, sys, wandb
api = wandb.Api(timeout=120)
count = 0
for path in sys.argv[1:]:
    for _ in api.runs(path, order="+created_at", per_page=1000, lazy=False):
        count += 1
print(count)
"""


def _nodes(now: datetime, tag: str, runs: int, days: int, seed: int) -> list[dict]:
    """``runs`` finished runs of one project, spread evenly over the ``days`` before ``now``."""
    import random

    from wandb_assets.localwandb import make_run_node

    rng = random.Random(seed)
    start = now - timedelta(days=days)
    nodes = []
    for n in range(runs):
        created = start + timedelta(seconds=rng.uniform(0, days * 86_400 - 7_200))
        nodes.append(
            make_run_node(
                f"{tag}{n:05d}",
                display_name=f"train-{n}",
                state="finished",
                created_at=created,
                heartbeat_at=created + timedelta(hours=1),
                config={"compute.gpu_count": rng.choice([1, 2, 4, 8]), "lr": rng.random()},
                summary={"loss": rng.random(), "_step": rng.randint(10, 10_000)},
            )
        )
    return nodes


def _server(now: datetime, projects: int, runs: int, days: int):
    from wandb_assets.localwandb import LocalWandbServer

    names = [(ENTITIES[n % 2], f"project-{n:02d}") for n in range(projects)]
    server = LocalWandbServer([], entity=names[0][0], project=names[0][1], api_key=KEY)
    for n, (entity, project) in enumerate(names):
        if n == 0:
            server.upsert_runs(_nodes(now, f"p{n}-", runs, days, n), entity, project)
        else:
            server.add_project(entity, project, _nodes(now, f"p{n}-", runs, days, n))
    return server.start(), [f"{e}/{p}" for e, p in names]


def _environment(server, workdir: Path, now: datetime, days: int) -> dict:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WANDB_", "DAGSTER_", "DD_")) or key == "WANDB_ASSETS_FETCH_CONCURRENCY"
    }
    env.update(
        WANDB_BASE_URL=server.url,
        WANDB_API_KEY=KEY,
        WANDB_ASSETS_PROJECTS=",".join(f"{e}/*" for e in ENTITIES),
        WANDB_DIR=str(workdir / "wandb"),
        WANDB_SILENT="true",
        WANDB_ASSETS_DUCKDB=str(workdir / "bench.duckdb"),
        WANDB_ASSETS_START_DATE=(now - timedelta(days=days)).date().isoformat(),
        DAGSTER_HOME=str(workdir / "dagster-home"),
        # The run pages alone, as the client floor reads them: reading wandb-metadata.json (issue 22) adds
        # requests of its own, measured apart.
        WANDB_ASSETS_FETCH_METADATA="false",
    )
    env.setdefault("WANDB_ASSETS_FETCH_CONCURRENCY", "8")
    (workdir / "wandb").mkdir(parents=True, exist_ok=True)
    (workdir / "dagster-home").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", workdir / "dagster-home" / "dagster.yaml")
    return env


def _timed(server, command: list[str], env: dict) -> tuple[float, str]:
    server.requests.clear()
    server.max_in_flight = 0
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[-4:])} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def bench_backfill(now: datetime, projects: int, runs: int, days: int, cost: tuple[float, float]) -> None:
    server, names = _server(now, projects, runs, days)
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-projects-"))
    try:
        env = _environment(server, workdir, now, days)
        server.faults.cost_per_request_s, server.faults.cost_per_run_s = cost
        floor_s, out = _timed(server, [sys.executable, "-c", FLOOR, *names], env)
        assert int(out.strip()) == projects * runs, out
        floor_requests, floor_flight = server.count("Runs"), server.max_in_flight
        first = (now - timedelta(days=days)).date().isoformat()
        cli = [sys.executable, "-m", "wandb_assets.cli", "backfill", "--start", first, "--end", now.date().isoformat()]
        ours_s, _ = _timed(server, cli, env)
        ours_requests, ours_flight = server.count("Runs"), server.max_in_flight
        import duckdb

        with duckdb.connect(str(workdir / "bench.duckdb"), read_only=True) as con:
            loaded = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\n{projects} projects x {runs:,} runs = {projects * runs:,} runs over {days} days; slow server: "
        f"{cost[0]:g} s per request + {cost[1] * 1000:g} ms per run; "
        f"concurrency {env['WANDB_ASSETS_FETCH_CONCURRENCY']}"
    )
    print("| process | seconds | runs | requests | most in flight |")
    print("|---|---|---|---|---|")
    print(
        f"| (a) wandb client alone, project after project | {floor_s:.1f} | {projects * runs:,} | {floor_requests} "
        f"| {floor_flight} |"
    )
    print(
        f"| (b) `wandb-assets backfill`, whole process | {ours_s:.1f} | {loaded:,} | {ours_requests} | {ours_flight} |"
    )
    print(f"(b)/(a) = {ours_s / floor_s:.2f} (target <= 0.4, at most 8 in flight)")


def bench_ticks(now: datetime, projects: int, changed: int) -> None:
    """In process, against an instant server: the requests of a quiet tick and of a tick after ``changed``
    projects gained a run."""
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-ticks-"))
    server, names = _server(now, projects, 20, 3)
    try:
        os.environ.update(_environment(server, workdir, now, 3))
        os.environ["WANDB_ASSETS_FETCH_CONCURRENCY"] = "4"
        from dagster import DagsterInstance

        from wandb_assets.localwandb import make_run_node
        from wandb_assets.ticks import execute_backfill, execute_refresh

        with DagsterInstance.get() as instance:
            assert execute_backfill(instance, (now - timedelta(days=3)).date(), now.date()).success

            def tick(label: str) -> None:
                server.requests.clear()
                started = time.perf_counter()
                result = execute_refresh(instance, now.date())
                seconds = time.perf_counter() - started
                assert result.success
                ops = Counter(op for op, _ in server.requests)
                read = sorted({f"{v['entity']}/{v['project']}" for op, v in server.requests if op == "Runs"})
                print(f"| {label} | {sum(ops.values())} | {dict(sorted(ops.items()))} | {len(read)} | {seconds:.2f} |")

            print(f"\nticks over {projects} projects (instant server, in process, concurrency 4)")
            print("| tick | W&B requests | by operation | projects read | seconds |")
            print("|---|---|---|---|---|")
            tick("nothing new")
            moment = datetime.now(UTC).replace(tzinfo=None)
            for path in names[:changed]:
                entity, project = path.split("/")
                node = make_run_node(
                    f"new-{project}", display_name="new", state="finished", created_at=moment, heartbeat_at=moment
                )
                server.upsert_runs([node], entity, project)
            tick(f"{changed} projects gained a run")
            os.environ["WANDB_ASSETS_PROJECT_RECHECK_HOURS"] = "0.0001"
            tick("every project due for its recheck (as without the probe)")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("backfill", "ticks"))
    parser.add_argument("--projects", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1500, help="runs per project")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--cost-per-request", type=float, default=0.25)
    parser.add_argument("--cost-per-run", type=float, default=0.002)
    parser.add_argument("--tick-projects", type=int, default=50)
    parser.add_argument("--changed", type=int, default=5)
    args = parser.parse_args()
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    print(f"{os.cpu_count()} cores, {date.today()}")
    if args.only in (None, "backfill"):
        bench_backfill(now, args.projects, args.runs, args.days, (args.cost_per_request, args.cost_per_run))
    if args.only in (None, "ticks"):
        bench_ticks(now, args.tick_projects, args.changed)


if __name__ == "__main__":
    main()
