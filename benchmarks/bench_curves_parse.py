"""Our CPU per run's curves, without the network (issue 54: the curves drain at <= 5 ms of our CPU a run).

One synthetic request answer per 20 runs, as the curves job gets it from the client: each run 3 history specs of
500 points and 500 system samples of 8 GPUs (JSON strings, as W&B sends ``events``), ~0.5 MB of JSON a run. Timed
in this process, CPU seconds (``time.process_time``: every thread, DuckDB's included) per run:
- ``client parse``: the bare client's own work on an answer (``json.loads`` of the body): the baseline;
- ``read + stage``: ours, from the parsed answer to the point files (``read_curves`` of each node and
  ``CurvesFolder.add`` of each request, as ``staged_curves`` does);
- ``load``: ``load_curves`` of the folder into a fresh warehouse file: wall seconds, the time the writer is held.
At two sizes (``--runs``, default 200 and 2,000). Run it against another checkout's code to compare (before/after):
``uv run --project <checkout> python benchmarks/bench_curves_parse.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

KEYS = ["overview/sps", "train/loss", "charts/SPS"]
PER_REQUEST = 20


def _answer(start: float) -> str:
    """The body of one request's answer: 20 runs' curves."""

    def series(key: str) -> list[dict]:
        return [
            {"_step": s, "_timestamp": start + s, key: (1000.0 + s % 7) if key != "train/loss" else 1 / (s + 1)}
            for s in range(0, 5000, 10)
        ]

    events = [
        json.dumps(
            {"_timestamp": start + 15 * k}
            | {f"system.gpu.{g}.{m}": float((k + g) % 100) for g in range(8) for m in ("gpu", "memory", "powerWatts")}
        )
        for k in range(500)
    ]
    node = {"sampledHistory": [series(k) for k in KEYS], "events": events}
    edges = [{"node": {"name": f"r{i:02d}", **node}} for i in range(PER_REQUEST)]
    return json.dumps({"data": {"project": {"runs": {"edges": edges}}}})


def measure(runs: int) -> dict:
    import duckdb

    from wandb_assets.lib.curves import CurvesFolder, read_curves
    from wandb_assets.lib.curves_warehouse import load_curves
    from wandb_assets.lib.warehouse import ensure_schema

    now = datetime.now(UTC).replace(tzinfo=None)
    body = _answer((now - timedelta(days=1)).timestamp())
    requests = runs // PER_REQUEST
    workdir = Path(tempfile.mkdtemp())
    folder = CurvesFolder(workdir, "bench")

    t = time.process_time()
    answers = [json.loads(body) for _ in range(requests)]
    client = time.process_time() - t
    # The job drops each answer once staged; here they all stay alive: kept out of the garbage collector's passes
    # (else they cost every later phase time that grows with the round, not with our work).
    gc.collect()
    gc.freeze()

    t = time.process_time()
    for r, answer in enumerate(answers):
        nodes = [edge["node"] for edge in answer["data"]["project"]["runs"]["edges"]]
        read = {f"q{r:05d}-{node['name']}": read_curves(node, KEYS, now) for node in nodes}
        folder.add("bench-team/bench", dict.fromkeys(read, True), read)
    ours = time.process_time() - t
    published = folder.publish()

    con = duckdb.connect(str(workdir / "warehouse.duckdb"))
    ensure_schema(con)
    con.execute(
        "INSERT INTO runs (entity, project, run_id, state, created_at) "
        "SELECT 'bench-team', 'bench', 'q' || lpad((i // 20)::VARCHAR, 5, '0') || '-r' || lpad((i % 20)::VARCHAR, 2, "
        "'0'), 'finished', $created FROM range($n) t(i)",
        {"n": runs, "created": now - timedelta(days=1)},
    )
    t = time.perf_counter()
    counts = load_curves(con, [published], "overview/sps", 5.0, now)
    load = time.perf_counter() - t
    points = con.execute(
        "SELECT (SELECT count(*) FROM run_history) + (SELECT count(*) FROM run_gpu_samples)"
    ).fetchone()
    con.close()
    del answers
    gc.unfreeze()
    return {
        "runs": runs,
        "client_ms_per_run": 1000 * client / runs,
        "ours_ms_per_run": 1000 * ours / runs,
        "load_s": load,
        "points": points[0],
        "read": counts.get("read", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[200, 2000])
    args = parser.parse_args()
    print(
        "| runs | client parse (ms CPU/run) | read + stage (ms CPU/run) | ours / client | load (s, writer held) "
        "| points |"
    )
    print("|---|---|---|---|---|---|")
    for runs in args.runs:
        m = measure(runs)
        ratio = m["ours_ms_per_run"] / m["client_ms_per_run"]
        print(
            f"| {m['runs']:,} | {m['client_ms_per_run']:.2f} | {m['ours_ms_per_run']:.2f} | {ratio:.1f}x | "
            f"{m['load_s']:.2f} | {m['points']:,} ({m['read']:,} runs read) |"
        )


if __name__ == "__main__":
    main()
