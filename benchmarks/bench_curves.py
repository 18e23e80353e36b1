"""What reading every run's curves costs a backfill (issue 34).

A synthetic fleet (``--days`` x ``--runs-per-day``, every run ended but the last hours' few) against the slow local
server of ``bench_ingest.py``: 0.25 s per request + 2 ms per run returned for ``Runs`` pages, and ``--cost-per-curves``
(10 ms) per run whose curves a ``RunCurves`` request returns. Every run carries the same curves: 3 history keys over
``--steps`` steps and a system stream of ``--system-samples`` samples of 8 GPUs; 500 samples are asked per curve.
Whole processes, interleaved ``--repeat`` times, 8 requests in flight at most (``WANDB_ASSETS_FETCH_CONCURRENCY``):
``wandb-assets backfill`` of the range with curves off (``WANDB_ASSETS_FETCH_HISTORY=false``), the same backfill with
curves on (it reads WANDB_ASSETS_HISTORY_RUNS_PER_TICK runs' curves, the newest ended first; the rest is the
backlog of the next ticks), and ``wandb-assets curves`` after it, which reads the whole backlog round after round.
Printed: seconds, peak RSS, requests by kind, the most requests in flight, run_history / run_gpu_samples rows, the
warehouse's bytes per run's curves, the ratio backfill on/off (target <= 1.6) and the whole cost of every run's
curves (backfill + drain) against the backfill without them.

Usage: ``uv run python benchmarks/bench_curves.py`` (``--days``, ``--runs-per-day``, ``--repeat``, ``--steps``,
``--system-samples``, ``--cost-per-curves``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import ENTITY, PROJECT, _environment, _fresh_warehouse, _run_child  # noqa: E402

KEYS = "overview/sps,train/loss,charts/SPS"


def _curves(now: datetime, steps: int, samples: int) -> tuple[list[dict], list[dict]]:
    """One history and one system stream, shared by every run (the server only reads them)."""
    start = (now - timedelta(days=1)).timestamp()
    history = [
        {
            "_step": s,
            "_timestamp": start + s,
            "overview/sps": 1000.0 + s % 7,
            "train/loss": 1 / (s + 1),
            "charts/SPS": 9.0,
        }
        for s in range(steps)
    ]
    events = [
        {"_timestamp": start + 15 * k}
        | {f"system.gpu.{g}.{m}": float((k + g) % 100) for g in range(8) for m in ("gpu", "memory", "powerWatts")}
        for k in range(samples)
    ]
    return history, events


def _process(server, env: dict, command: list[str], curves: bool, workdir: Path) -> dict:
    import duckdb

    server.requests.clear()
    server.max_in_flight = 0
    _, wall, rss = _run_child(command, {**env, "WANDB_ASSETS_FETCH_HISTORY": str(curves).lower()})
    con = duckdb.connect(str(workdir / "bench.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT (SELECT count(*) FROM run_history), (SELECT count(*) FROM run_gpu_samples), "
            "(SELECT count(*) FROM runs WHERE curves_status = 'read')"
        ).fetchone()
    finally:
        con.close()
    return {
        "seconds": wall,
        "rss": rss,
        "runs_requests": server.count("Runs"),
        "curves_requests": server.count("RunCurves"),
        "max_in_flight": server.max_in_flight,
        "history_rows": rows[0],
        "gpu_rows": rows[1],
        "runs_with_curves": rows[2],
        "bytes": (workdir / "bench.duckdb").stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--runs-per-day", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--system-samples", type=int, default=2000)
    parser.add_argument("--cost-per-request", type=float, default=0.25)
    parser.add_argument("--cost-per-run", type=float, default=0.002)
    parser.add_argument("--cost-per-curves", type=float, default=0.01)
    args = parser.parse_args()

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    history, events = _curves(now, args.steps, args.system_samples)
    for node in nodes:
        node["_history"], node["_events"] = history, events
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-curves-"))
    first = (now - timedelta(days=args.days)).date().isoformat()
    command = [sys.executable, "-m", "wandb_assets.cli", "backfill", "--start", first, "--end", now.date().isoformat()]
    drain = [sys.executable, "-m", "wandb_assets.cli", "curves"]
    results: dict[str, list[dict]] = {"backfill, curves off": [], "backfill, curves on": [], "curves (drain)": []}
    with LocalWandbServer(nodes, entity=ENTITY, project=PROJECT) as server:
        env = {
            **_environment(server, workdir, now, args.days),
            "WANDB_ASSETS_HISTORY_KEYS": KEYS,
            "WANDB_ASSETS_FETCH_CONCURRENCY": "8",
        }
        server.faults.cost_per_request_s, server.faults.cost_per_run_s = args.cost_per_request, args.cost_per_run
        server.faults.cost_per_run_curves_s = args.cost_per_curves
        for _ in range(args.repeat):
            _fresh_warehouse(workdir)
            results["backfill, curves off"].append(_process(server, env, command, False, workdir))
            _fresh_warehouse(workdir)
            results["backfill, curves on"].append(_process(server, env, command, True, workdir))
            results["curves (drain)"].append(_process(server, env, drain, True, workdir))
    print(
        f"{len(nodes):,} runs over {args.days} days; each with 3 keys x {args.steps} steps and {args.system_samples} "
        f"system samples of 8 GPUs (500 samples asked per curve); slow server: {args.cost_per_request:g} s per "
        f"request + {args.cost_per_run * 1000:g} ms per run returned + {args.cost_per_curves * 1000:g} ms per run's "
        "curves; 8 requests in flight at most"
    )
    print(
        "| process | seconds (whole process) | peak RSS | Runs requests | RunCurves requests | max in flight "
        "| runs with curves | run_history rows | run_gpu_samples rows | warehouse |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    medians = {}
    for what, runs in results.items():
        median = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
        medians[what] = median
        spread = " / ".join(f"{r['seconds']:.2f}" for r in runs)
        print(
            f"| {what} | {median['seconds']:.2f} ({spread}) | {median['rss']:,.0f} MiB "
            f"| {median['runs_requests']:,} | {median['curves_requests']:,} | {median['max_in_flight']} "
            f"| {median['runs_with_curves']:,} | {median['history_rows']:,} | {median['gpu_rows']:,} "
            f"| {median['bytes'] / 2**20:,.0f} MiB |"
        )
    off, on, drained = medians["backfill, curves off"], medians["backfill, curves on"], medians["curves (drain)"]
    per_run = (drained["bytes"] - off["bytes"]) / max(drained["runs_with_curves"], 1)
    requests = on["curves_requests"] + drained["curves_requests"]
    print(
        f"backfill on/off = {on['seconds'] / off['seconds']:.2f} (target <= 1.6); every run's curves (backfill + "
        f"drain) / backfill off = {(on['seconds'] + drained['seconds']) / off['seconds']:.2f}; "
        f"{drained['runs_with_curves']:,} runs' curves in {requests:,} requests "
        f"({drained['runs_with_curves'] / max(requests, 1):.1f} runs per request); {per_run:,.0f} bytes per run's "
        "curves in DuckDB"
    )


if __name__ == "__main__":
    main()
