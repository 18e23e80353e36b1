"""A warehouse of ten times a million runs on one 2-core machine: what a tick, `costs`, `check` and the dbt build take,
and what breaks first (issue 54).

The benchmark's W&B server holds its fleet as Python objects (6.5 GiB at a million runs), so ten million runs cannot
be served, nor backfilled from it, here. The warehouse is built instead: a million-run warehouse backfilled through
the pipeline (``bench_ingest.py``'s fleet, 120 days; or ``--from`` one kept with ``BENCH_KEEP_WORKDIR``), its runs
created before yesterday copied ``--times - 1`` times in SQL (new run ids, PR commits and CI commits: ten times the
runs, CI series, PR groups and GPU-hours; an older copy still alive is made finished, as no server will answer for it
by id). The server serves only what a tick reads: yesterday and today at ``--times`` the rate (``generate_fleet``).
Then, each in a process of its own, with its peak RSS: the first tick on it (every derived table and the PR verdicts
of the whole history, the detector from the start), a steady tick, `wandb-assets costs`, `wandb-assets check`, and
the analytics job (dbt build, tests, docs).

    uv run python benchmarks/bench_ten_million.py                  # ~25 minutes on 2 cores
    uv run python benchmarks/bench_ten_million.py --times 2        # the same at two million runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ingest as bench  # noqa: E402 - the same phases, environment and measurements

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)

#: Copies of the runs created before ``$before``: a new run id and, for CI runs, a new commit per copy (PR commits
#: stay 7-40 hex digits), so a copy is a run of its own in every table, series and PR group.
MULTIPLY_SQL = """
INSERT INTO runs BY NAME
SELECT * EXCLUDE (k) REPLACE (
    run_id || 'c' || k AS run_id,
    CASE WHEN ci_commit IS NULL THEN NULL ELSE left(ci_commit, 38) || lpad(k::VARCHAR, 2, '0') END AS ci_commit,
    replace(url, '/runs/' || run_id, '/runs/' || run_id || 'c' || k) AS url
)
FROM (SELECT r.*, t.k FROM runs r CROSS JOIN (SELECT range AS k FROM range(1, $times)) t WHERE r.created_at < $before)
"""


def multiply(path: Path, times: int, before: datetime) -> dict:
    import duckdb

    con = duckdb.connect(str(path))
    started = time.perf_counter()
    con.execute("BEGIN")
    # an older run still alive is finished: the server serves two days and would not return it by id
    con.execute(
        "UPDATE runs SET state = 'finished', ended_at = heartbeat_at "
        "WHERE state IN ('running', 'pending', 'preempting') AND created_at < $before",
        {"before": before},
    )
    con.execute(MULTIPLY_SQL, {"times": times, "before": before})
    con.execute("COMMIT")
    con.execute("CHECKPOINT")
    runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    return {"runs": runs, "seconds": time.perf_counter() - started, "bytes": path.stat().st_size}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "wandb_assets.cli", *args]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--runs-per-day", type=int, default=8334)
    parser.add_argument("--from", dest="source", type=Path, help="a warehouse bench_ingest's scale run left at NOW")
    parser.add_argument("--skip", nargs="*", default=[], help="phases to leave out: first, steady, costs, check, dbt")
    args = parser.parse_args()

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    now = NOW.replace(tzinfo=None)
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-ten-"))
    me = [sys.executable, bench.__file__, "--days", str(args.days), "--phase"]
    results: dict[str, dict] = {}
    if args.source is None:  # a million runs through the pipeline, as bench_ingest's scale run builds them
        nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
        with LocalWandbServer(nodes, entity=bench.ENTITY, project=bench.PROJECT) as server:
            env = bench._environment(server, workdir, now, args.days)
            results["backfill (1x)"] = bench._measure(server, "backfill", [*me, "ours"], env)
        del nodes
    else:
        shutil.copy(args.source, workdir / "bench.duckdb")
    yesterday = datetime.combine(now.date() - timedelta(days=1), datetime.min.time())
    built = multiply(workdir / "bench.duckdb", args.times, yesterday)
    size = built["bytes"] / 2**20
    print(f"multiplied x{args.times}: {built['runs']:,} runs in {built['seconds']:.1f} s, {size:,.0f} MiB", flush=True)
    nodes = generate_fleet(now, days=2, runs_per_day=args.runs_per_day * args.times)
    with LocalWandbServer(nodes, entity=bench.ENTITY, project=bench.PROJECT) as server:
        env = bench._environment(server, workdir, now, args.days)
        env["BENCH_KEEP_WANDB_DIR"] = "1"
        phases = [
            ("first", "the first tick", [*me, "tick"], True),
            ("steady", "a steady tick", [*me, "tick"], True),
            ("costs", "`wandb-assets costs` (whole process)", _cli("costs"), False),
            ("check", "`wandb-assets check` (whole process)", _cli("check"), False),
            ("dbt", "the analytics job (dbt build, tests, docs)", [*me, "analytics"], True),
        ]
        for key, label, command, parse in phases:
            if key not in args.skip:
                results[label] = bench.measured(server, label, command, env, parse_json=parse)
    size = (workdir / "bench.duckdb").stat().st_size
    print(f"\n{built['runs']:,} runs ({args.times} x), warehouse {size / 2**20:,.0f} MiB")
    bench.print_phases(results)
    if os.environ.get("BENCH_KEEP_WORKDIR"):
        print(f"kept {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
