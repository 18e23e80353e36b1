"""What reading W&B's ``wandb-metadata.json`` of every run costs a backfill (issue 22).

30,000 runs over 60 days (the synthetic fleet: 75 % of runs have the file), against the slow local server of
``bench_ingest.py``: 0.25 s per request + 2 ms per run returned for ``Runs`` pages, ``--cost-per-run-files``
(1 ms: a lookup and a signed URL, half a run) per run whose ``files`` a page also asks (metadata on), and
``--cost-per-file`` (30 ms) per file download.
Two whole processes, ``wandb-assets backfill`` of the same range, interleaved ``--repeat`` times: metadata off
(``WANDB_ASSETS_FETCH_METADATA=false``) and on. Printed: seconds, requests by kind, file downloads, the most
requests in flight, and the ratio on/off (target <= 1.5 within the same in-flight limit).

Usage: ``uv run python benchmarks/bench_gpu_metadata.py`` (``--days``, ``--runs-per-day``, ``--repeat``,
``--cost-per-run-files``, ``--cost-per-file``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import ENTITY, PROJECT, _environment, _fresh_warehouse, _run_child  # noqa: E402


def _backfill(server, env: dict, command: list[str], metadata: bool) -> dict:
    server.requests.clear()
    server.file_downloads.clear()
    server.pages_with_files = 0
    server.max_in_flight = 0
    _, wall, rss = _run_child(command, {**env, "WANDB_ASSETS_FETCH_METADATA": str(metadata).lower()})
    return {
        "seconds": wall,
        "rss": rss,
        "runs_requests": server.count("Runs"),
        "other_requests": len(server.requests) - server.count("Runs"),
        "pages_with_files": server.pages_with_files,
        "downloads": len(server.file_downloads),
        "max_in_flight": server.max_in_flight,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--runs-per-day", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cost-per-request", type=float, default=0.25)
    parser.add_argument("--cost-per-run", type=float, default=0.002)
    parser.add_argument("--cost-per-run-files", type=float, default=0.001)
    parser.add_argument("--cost-per-file", type=float, default=0.03)
    args = parser.parse_args()

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    with_file = sum(node.get("_metadata") is not None for node in nodes)
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-metadata-"))
    first = (now - timedelta(days=args.days)).date().isoformat()
    command = [sys.executable, "-m", "wandb_assets.cli", "backfill", "--start", first, "--end", now.date().isoformat()]
    results: dict[bool, list[dict]] = {False: [], True: []}
    with LocalWandbServer(nodes, entity=ENTITY, project=PROJECT) as server:
        env = _environment(server, workdir, now, args.days)
        server.answer("Runs", {"entity": ENTITY, "project": PROJECT, "filters": "{}", "order": "+created_at"})
        server.faults.cost_per_request_s, server.faults.cost_per_run_s = args.cost_per_request, args.cost_per_run
        server.faults.cost_per_file_s = args.cost_per_file
        server.faults.cost_per_run_files_s = args.cost_per_run_files
        for _ in range(args.repeat):
            for metadata in (False, True):
                _fresh_warehouse(workdir)
                results[metadata].append(_backfill(server, env, command, metadata))
    print(
        f"{len(nodes):,} runs over {args.days} days ({with_file:,} with a wandb-metadata.json); slow server: "
        f"{args.cost_per_request:g} s per request + {args.cost_per_run * 1000:g} ms per run returned + "
        f"{args.cost_per_run_files * 1000:g} ms per run's files asked, "
        f"{args.cost_per_file * 1000:g} ms per file download; fetch concurrency "
        f"{os.environ.get('WANDB_ASSETS_FETCH_CONCURRENCY', '4')}"
    )
    print(
        "| metadata | seconds (whole process) | Runs requests | of them with files | other requests | downloads "
        "| max in flight |"
    )
    print("|---|---|---|---|---|---|---|")
    medians = {}
    for metadata, runs in results.items():
        ordered = sorted(runs, key=lambda r: r["seconds"])
        median = ordered[len(ordered) // 2]
        medians[metadata] = median["seconds"]
        spread = " / ".join(f"{r['seconds']:.2f}" for r in runs)
        print(
            f"| {'on' if metadata else 'off'} | {median['seconds']:.2f} ({spread}) | {median['runs_requests']:,} "
            f"| {median['pages_with_files']:,} | {median['other_requests']:,} | {median['downloads']:,} "
            f"| {median['max_in_flight']} |"
        )
    print(f"on/off = {medians[True] / medians[False]:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
