"""Offline run logs: read 1,000 logs of 10,000 history rows each into a warehouse, against a baseline measured
in the same run (every record parsed on its own, the way ``lib/wandb_records`` reads a log).

    uv run python benchmarks/bench_offline.py [--runs 1000] [--rows 10000] [--workers 2] [--baseline-sample 20]

One real log is written by the installed wandb (``WANDB_MODE=offline``): per row the five SPS keys, ``loss``
and a nested ``eval/acc``; ``wandb-core`` adds a summary update per row, so ~30,000 records, ~6.9 MB. It is
copied ``--runs`` times with a different run id (the run record's chunk re-checksummed), so every copy is a
valid log of its own run. Then, timed: (a) the baseline per log on a sample; (b) our reader per log, one
process, native (the C extension) and Python (what an install without a C compiler uses); (c) the whole
ingest of every log as ``offline_runs`` does it (find, read with ``--workers`` processes, stage, one
transaction into a fresh DuckDB file).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

WRITER = r"""
import sys, wandb
rows = int(sys.argv[1])
run = wandb.init(id="bench0000", name="github.sky.main.abc1234.ppo_atari.20261120T101010", project="bench",
                 entity="bench", mode="offline", config={"compute": {"gpu_count": 8}, "lr": 0.001})
for i in range(rows):
    run.log({"overview/steps_per_second": 1000.0 + i, "overview/epoch_steps_per_second": 2000.0 + i,
             "overview/sps": 3000.0 + i, "timing_cumulative/sps": 4000.0 + i, "timing_per_epoch/sps": 5000.0 + i,
             "loss": 1.0 / (i + 1), "eval": {"acc": i / rows}})
run.finish(exit_code=0)
"""


def write_template(folder: Path, rows: int) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_DIR=str(folder), WANDB_MODE="offline", WANDB_SILENT="true")
    subprocess.run([sys.executable, "-c", WRITER, str(rows)], env=env, check=True, timeout=600)
    (path,) = folder.rglob("run-bench0000.wandb")
    return path


def run_id_chunks(template: bytes, old: bytes = b"bench0000") -> list[int]:
    """Offsets of the chunks that hold the run id (the run record, the run-start request, record infos)."""
    offsets, offset = [], 7
    while offset + 7 <= len(template):
        room = 32768 - offset % 32768
        if room < 7:
            offset += room
            continue
        _, length, kind = struct.unpack_from("<IHB", template, offset)
        if kind == 1 and old in template[offset + 7 : offset + 7 + length]:
            offsets.append(offset)
        offset += 7 + length
    return offsets


def with_run_id(template: bytes, chunks: list[int], run_id: str, old: bytes = b"bench0000") -> bytes:
    """``template`` with the run id replaced (same length) in ``chunks``, each re-checksummed."""
    out = bytearray(template)
    for offset in chunks:
        _, length, kind = struct.unpack_from("<IHB", template, offset)
        patched = template[offset + 7 : offset + 7 + length].replace(old, run_id.encode())
        crc = zlib.crc32(patched, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
        out[offset : offset + 7 + length] = struct.pack("<IHB", crc, length, kind) + patched
    return bytes(out)


def baseline_read(path: Path) -> dict:
    """Every record parsed on its own, folded in Python (the test-only reader's way)."""
    from wandb_assets.lib.wandb_records import iter_records

    summary: dict = {}
    history: dict = {}
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "summary":
            for item in record.summary.update:
                summary[item.key or ".".join(item.nested_key)] = item.value_json
        elif kind == "history":
            for item in record.history.item:
                history[item.key or ".".join(item.nested_key)] = item.value_json
    return {**history, **summary}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline-sample", type=int, default=20)
    args = parser.parse_args()

    from wandb_assets.lib import offline_runs
    from wandb_assets.lib.normalize import SPS_KEYS
    from wandb_assets.lib.offline_runs import read_changed_logs, read_offline_run
    from wandb_assets.lib.warehouse import load_offline_runs, stage_rows
    from wandb_assets.warehouse import connect

    root = Path(tempfile.mkdtemp(prefix="bench-offline-"))
    try:
        started = time.perf_counter()
        template_path = write_template(root / "template", args.rows)
        template = template_path.read_bytes()
        print(
            f"template: {args.rows:,} history rows, {len(template) / 1e6:.1f} MB, written in "
            f"{time.perf_counter() - started:.1f} s by wandb {__import__('wandb').__version__}"
        )
        tree = root / "tree"
        chunks = run_id_chunks(template)
        for n in range(args.runs):
            folder = tree / f"offline-run-20261120_000000-b{n:08d}"
            folder.mkdir(parents=True)
            (folder / f"run-b{n:08d}.wandb").write_bytes(with_run_id(template, chunks, f"b{n:08d}"))
        logs = sorted(tree.rglob("*.wandb"))
        total_mb = sum(p.stat().st_size for p in logs) / 1e6
        print(f"tree: {len(logs):,} logs, {total_mb:,.0f} MB")

        read_offline_run(logs[0])  # imports and the protobuf view, outside the timings
        sample = logs[: args.baseline_sample]
        t0 = time.perf_counter()
        expected = [baseline_read(p) for p in sample]
        baseline = (time.perf_counter() - t0) / len(sample)
        t0 = time.perf_counter()
        ours = [read_offline_run(p) for p in sample]
        per_log = (time.perf_counter() - t0) / len(sample)
        for got, want in zip(ours, expected, strict=True):  # same final values as the baseline
            assert got.summary["overview/sps"] == float(want["overview/sps"]) == 3000.0 + args.rows - 1
            assert got.summary["eval"]["acc"] == float(want["eval.acc"])
        print(f"(a) baseline, every record parsed alone: {baseline * 1000:.0f} ms per log ({len(sample)} logs)")
        native, offline_runs._native = offline_runs._native, None
        t0 = time.perf_counter()
        in_python = [read_offline_run(p) for p in sample]
        python_per_log = (time.perf_counter() - t0) / len(sample)
        offline_runs._native = native
        assert [r.summary for r in in_python] == [r.summary for r in ours]
        print(
            f"(b) ours, one process, {offline_runs.reader()} reader: {per_log * 1000:.1f} ms per log; (b)/(a) = "
            f"{per_log / baseline:.3f}; the Python reader: {python_per_log * 1000:.0f} ms per log, "
            f"{python_per_log / baseline:.2f}"
        )

        warehouse = root / "bench.duckdb"
        now = datetime.now(UTC).replace(tzinfo=None)
        t0 = time.perf_counter()
        report = read_changed_logs(
            [tree], {}, now=now, stall=timedelta(minutes=30), default_gpus=1, workers=args.workers
        )
        read_s = time.perf_counter() - t0
        staged, _ = stage_rows(report.rows)
        con = connect(warehouse, read_only=False)
        t1 = time.perf_counter()
        counts = load_offline_runs(con, staged, report.files, now)
        load_s = time.perf_counter() - t1
        rows = con.execute("SELECT count(*), min(sps_overview_sps), max(sps_overview_sps) FROM runs").fetchone()
        con.close()
        os.unlink(staged)
        whole = time.perf_counter() - t0
        assert counts["loaded"] == args.runs and rows == (args.runs, 3000.0 + args.rows - 1, 3000.0 + args.rows - 1), (
            counts,
            rows,
        )
        print(
            f"(c) ingest of {args.runs:,} logs x {args.rows:,} rows with {args.workers} worker(s): {whole:.1f} s "
            f"(read {read_s:.1f} s, warehouse transaction {load_s:.2f} s); "
            f"{args.runs * args.rows / whole / 1e6:.2f} M history rows/s; (c) per log / (a) = "
            f"{whole / args.runs / baseline:.2f}"
        )
        t0 = time.perf_counter()
        with_curves = read_changed_logs(
            [tree],
            {},
            now=now,
            stall=timedelta(minutes=30),
            default_gpus=1,
            workers=args.workers,
            curves=(list(SPS_KEYS), 500),
        )
        curves_s = time.perf_counter() - t0
        points = sum(len(c["history"]) for c in with_curves.curves.values())
        assert len(with_curves.curves) == args.runs and points == args.runs * len(SPS_KEYS) * min(500, args.rows)
        print(
            f"(d) the same read with each log's curves (the {len(SPS_KEYS)} SPS keys, 500 samples each; "
            f"WANDB_ASSETS_FETCH_HISTORY's default): {curves_s:.1f} s against {read_s:.1f} s without "
            f"({(curves_s - read_s) / args.runs * 1000:.1f} ms more per log)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
