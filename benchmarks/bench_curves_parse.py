"""Our CPU per run's curves, without the network (issue 54: the curves drain at <= 5 ms of our CPU a run).

One synthetic request answer per 20 runs, as the curves job gets it from the client: each run 3 history specs of
500 points and 500 system samples of 8 GPUs (JSON strings, as W&B sends ``events``), ~0.5 MB of JSON a run. Timed
in this process, CPU seconds (``time.process_time``: every thread, DuckDB's included) per run:
- ``client parse``: the bare client's own work on an answer (``json.loads`` of the body): the baseline;
- ``read + stage``: ours, from the parsed answer to the point files (``read_curves`` of each node and
  ``CurvesFolder.add`` of each request, as ``staged_curves`` does);
- ``load``: ``load_curves`` of the folder into a fresh warehouse file: wall seconds, the time the writer is held;
- with ``--floor``, the same points inserted with nothing else into tables keyed by an integer run key instead of
  the three names (the storage's own share of the load: what no change of ours goes under).
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


def measure(runs: int, with_floor: bool = False) -> dict:
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
    floor = _insert_floor(published, workdir / "floor.duckdb") if with_floor else None
    del answers
    gc.unfreeze()
    return {
        "runs": runs,
        "client_ms_per_run": 1000 * client / runs,
        "ours_ms_per_run": 1000 * ours / runs,
        "load_s": load,
        "points": points[0],
        "read": counts.get("read", 0),
        "floor_s": floor,
    }


def _insert_floor(published: Path, path: Path) -> float:
    """Wall seconds to insert the folder's points, numbers only, under an integer run key, in one transaction."""
    import duckdb

    files = {kind: sorted(str(p) for p in published.glob(f"{kind}-*.parquet")) for kind in ("history", "gpu")}
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE h (k INTEGER, metric VARCHAR, step BIGINT, timestamp TIMESTAMP, value DOUBLE); "
        "CREATE TABLE g (k INTEGER, timestamp TIMESTAMP, gpu INTEGER, util_pct DOUBLE, memory_pct DOUBLE, "
        "power_w DOUBLE); CHECKPOINT"
    )
    con.execute(
        "CREATE TEMP TABLE keys AS SELECT entity, project, run_id, row_number() OVER () AS k "
        "FROM (SELECT DISTINCT entity, project, run_id FROM read_parquet($p))",
        {"p": files["gpu"] + files["history"]},
    )
    t = time.perf_counter()
    con.execute("BEGIN")
    con.execute(
        "INSERT INTO h SELECT k, metric, step, timestamp, value FROM read_parquet($p) JOIN keys USING (entity, "
        "project, run_id)",
        {"p": files["history"]},
    )
    con.execute(
        "INSERT INTO g SELECT k, timestamp, gpu, util_pct, memory_pct, power_w FROM read_parquet($p) "
        "JOIN keys USING (entity, project, run_id)",
        {"p": files["gpu"]},
    )
    con.execute("COMMIT")
    seconds = time.perf_counter() - t
    con.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--floor", action="store_true", help="also time the points' insert alone, integer-keyed")
    args = parser.parse_args()
    floor_head, floor_rule = (" insert alone, integer key (s) |", "---|") if args.floor else ("", "")
    print(
        "| runs | client parse (ms CPU/run) | read + stage (ms CPU/run) | ours / client | load (s, writer held) "
        f"| points |{floor_head}"
    )
    print(f"|---|---|---|---|---|---|{floor_rule}")
    for runs in args.runs:
        m = measure(runs, with_floor=args.floor)
        ratio = m["ours_ms_per_run"] / m["client_ms_per_run"]
        floor = f" {m['floor_s']:.2f} |" if args.floor else ""
        print(
            f"| {m['runs']:,} | {m['client_ms_per_run']:.2f} | {m['ours_ms_per_run']:.2f} | {ratio:.1f}x | "
            f"{m['load_s']:.2f} | {m['points']:,} ({m['read']:,} runs read) |{floor}"
        )


if __name__ == "__main__":
    main()
