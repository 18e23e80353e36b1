"""Ingestion benchmark: 30,000 runs over 60 days, against an instant and a slow local W&B server, side by side.

The slow server charges what a real one does per ``Runs`` page: a fixed cost per request plus a cost per run
returned (default 0.25 s + 2 ms per run), and counts requests in flight. For each server:
  (a) floor       - the wandb client alone, sequential: ``api.runs(..., lazy=False, per_page=1000)``, iterated;
  (b) ours, cli   - ``wandb-assets backfill`` as a whole process (imports, Dagster instance, configuration
                    check, fetch, load, fleet tables, analysts' snapshot): wall time of the process;
  (b) ours, in process - ``execute_backfill`` of the same range, imports excluded;
  (c) naive       - the old cron collector: default ``lazy=True``, ``per_page=50``, reading each run's summary.
Each phase runs in its own process (peak RSS is its own). Reported per phase: seconds, runs/s, peak RSS, the
most requests the server saw in flight, total requests, and for (b) the longest time any warehouse writer
connection was held open. Then a scale run (``--scale``): 100,000 runs over 120 days, our backfill in process,
the warehouse's size, and one whole tick (refresh + feed) in process on top of that history.

Usage: ``uv run python benchmarks/bench_ingest.py`` (``--only instant|slow``, ``--no-scale``, ``--days``,
``--runs-per-day``, ``--cost-per-request``, ``--cost-per-run``).
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

ENTITY, PROJECT = "bench-team", "bench-project"
KEY = "local-" + "b" * 40
REPO = Path(__file__).resolve().parent.parent


def _record_writer_holds() -> list[float]:
    """Time every read-write warehouse connection in this process (benchmark instrumentation only)."""
    from contextlib import contextmanager

    from wandb_assets.defs.warehouse.resources import WarehouseResource

    holds: list[float] = []
    original = WarehouseResource._connect

    @contextmanager
    def timed(self, read_only: bool):
        with original(self, read_only) as con:
            opened = time.perf_counter()
            try:
                yield con
            finally:
                if not read_only:
                    holds.append(time.perf_counter() - opened)

    WarehouseResource._connect = timed
    return holds


#: The notebook helpers of ``wandb_assets.warehouse``, with their arguments, timed on the analysts' snapshot.
HELPERS = (
    ("gauges_over_time", {}),
    ("daily_fleet", {}),
    ("main_sps", {}),
    ("ci_runs", {}),
    ("sps_regressions", {}),
    ("change_points", {}),
    ("sweeps", {}),
    ("gpu_costs", {}),
    ("top_idle_runs", {}),
    ("gpu_hours_by_source", {}),
    ("alive_runs", {}),
    ("partial_days", {}),
)


def _helpers() -> dict:
    """Each notebook helper once on the snapshot, as an analyst calls it: seconds per helper (the slowest is the
    phase's ``seconds``)."""
    from wandb_assets import warehouse

    con = warehouse.open_snapshot()
    timings = {}
    for name, kwargs in HELPERS:
        started = time.perf_counter()
        getattr(warehouse, name)(con, **kwargs)
        timings[name] = time.perf_counter() - started
    con.close()
    return {
        "runs": 0,
        "seconds": max(timings.values()),
        "helpers": timings,
        "import_seconds": 0.0,
        "peak_rss_mib": _peak_rss_mib(os.getpid()),
        "writer_held_max_s": None,
    }


def _phase(name: str, days: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    now = datetime.fromisoformat(os.environ["BENCH_NOW"])
    first = (now - timedelta(days=days)).date()
    count, holds, parts = 0, [], {}
    imports_started = time.perf_counter()
    if name in ("floor", "naive"):
        import wandb
    else:
        import wandb  # noqa: F401 - imported lazily by the pipeline; an import cost, as in (a)
        from dagster import DagsterInstance

        from wandb_assets.ticks import execute_analytics, execute_backfill, run_tick

        holds = _record_writer_holds()
    import_seconds = time.perf_counter() - imports_started
    started = time.perf_counter()
    if name == "helpers":
        return _helpers()
    if name in ("floor", "naive"):
        api = wandb.Api(timeout=120)
        if name == "floor":
            for _ in api.runs(f"{ENTITY}/{PROJECT}", order="+created_at", per_page=1000, lazy=False):
                count += 1
        else:
            for run in api.runs(f"{ENTITY}/{PROJECT}"):
                run.summary.get("overview/sps")
                count += 1
    else:
        # BENCH_INSTANCE=home: the instance a command uses (DAGSTER_HOME, the repository's dagster.yaml: SQLite
        # storage), else an in-memory one (no storage cost: the figures before 2026-11-29's seventh session)
        home = os.environ.get("BENCH_INSTANCE") == "home"
        instance = DagsterInstance.get() if home else DagsterInstance.ephemeral()
        if name == "ours":
            result = execute_backfill(instance, first, now.date())
        elif name == "analytics":  # the analysts' dbt project: build, tests, docs, snapshot (its own run)
            result = execute_analytics(instance)
            steps = instance.get_records_for_run(result.run_id).records
            ends = {
                r.event_log_entry.dagster_event.step_key: r.event_log_entry.timestamp
                for r in steps
                if r.event_log_entry.dagster_event
                and r.event_log_entry.dagster_event.event_type_value == "STEP_SUCCESS"
            }
            starts = {
                r.event_log_entry.dagster_event.step_key: r.event_log_entry.timestamp
                for r in steps
                if r.event_log_entry.dagster_event and r.event_log_entry.dagster_event.event_type_value == "STEP_START"
            }
            holds.append(ends["analytics_models"] - starts["analytics_models"])  # dbt holds the warehouse slot
        else:
            results = run_tick(instance, now.date())  # refresh, then the feed job: a whole tick
            result, parts = results[-1], _step_seconds(instance, results)
        assert result.success, f"{name} failed"
        from wandb_assets.warehouse import query_read_only

        ((count,),) = query_read_only(None, "SELECT count(*) FROM runs")  # the file, or the lake (bench_lake.py)
    seconds = time.perf_counter() - started
    return {
        "runs": count,
        "seconds": seconds,
        "import_seconds": import_seconds,
        "peak_rss_mib": _peak_rss_mib(os.getpid()),
        "writer_held_max_s": max(holds, default=None),
        "parts": parts,
    }


def _step_seconds(instance, results) -> dict[str, float]:
    """Each step of the runs ``results`` made, in seconds (its ``STEP_START`` to its success or failure in the event
    log): a tick's time by part."""
    parts = {}
    for result in results:
        started = {}
        for record in instance.get_records_for_run(result.run_id).records:
            event = record.event_log_entry.dagster_event
            if event is None:
                continue
            if event.event_type_value == "STEP_START":
                started[event.step_key] = record.event_log_entry.timestamp
            elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE") and event.step_key in started:
                parts[event.step_key] = record.event_log_entry.timestamp - started[event.step_key]
    return parts


def _peak_rss_mib(pid: int) -> float | None:
    """The process's peak RSS so far (``VmHWM``), or None once it is gone. Not ``ru_maxrss``: Linux keeps that
    across ``execve``, so a child forked from this process (which holds the synthetic fleet: 6 GiB at a million
    runs) would report this process's size, whatever it used itself."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _run_child(command: list[str], env: dict) -> tuple[str, float, float]:
    """Run a process; returns (stdout, wall seconds, its peak RSS in MiB, sampled every 50 ms until it exits)."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
    peak = 0.0
    while True:
        waited, status, _ = os.wait4(child.pid, os.WNOHANG)
        if waited:
            break
        peak = max(peak, _peak_rss_mib(child.pid) or 0.0)
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    if os.environ.get("BENCH_LOG_DIR"):  # keep every child's log, to see where its time went
        log = Path(os.environ["BENCH_LOG_DIR"]) / f"{time.strftime('%H%M%S')}-{command[-5].replace('/', '_')}.log"
        log.write_text(err.read())
        err.seek(0)
    if child.returncode != 0:
        sys.exit(f"{' '.join(command[-4:])} failed:\n{err.read()[-3000:]}")
    return out.read(), seconds, peak


def _measure(server, label: str, command: list[str], env: dict, parse_json: bool = True) -> dict:
    server.requests.clear()
    server.max_in_flight = 0
    if not env.get("BENCH_KEEP_WANDB_DIR"):  # every phase starts from the same state: an empty WANDB_DIR
        shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)
        os.makedirs(env["WANDB_DIR"])
    stdout, wall, rss = _run_child(command, env)
    result = json.loads(stdout.strip().splitlines()[-1]) if parse_json else {"seconds": wall, "runs": None}
    result.update(
        label=label,
        wall_seconds=wall,
        peak_rss_mib=rss,
        max_in_flight=server.max_in_flight,
        requests=server.count("Runs") + server.count("Run"),
    )
    return result


def measured(server, label: str, command: list[str], env: dict, parse_json: bool = True) -> dict:
    """``_measure``, or what broke (a finding at this size: said, and the script goes on), printed as it ends."""
    try:
        result = _measure(server, label, command, env, parse_json=parse_json)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - what broke is the finding
        result = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    print(json.dumps({label: result}, default=str), flush=True)
    return result


def print_phases(results: dict[str, dict]) -> None:
    """The phases as a table (seconds in process, whole process, peak RSS, the longest writer hold), then each
    tick's eight longest parts."""
    print("| phase | seconds (in process) | whole process | peak RSS | writer held (max) |")
    print("|---|---|---|---|---|")
    for label, r in results.items():
        if "error" in r:
            print(f"| {label} | failed: {r['error']} | | | |")
            continue
        held = r.get("writer_held_max_s")
        held_text = f"{held:.2f} s" if held is not None else ""
        rss = f"{r['peak_rss_mib']:,.0f} MiB"
        print(f"| {label} | {r.get('seconds', 0):.2f} | {r['wall_seconds']:.2f} | {rss} | {held_text} |")
    for label, r in results.items():
        if r.get("parts"):
            parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["parts"].items(), key=lambda kv: -kv[1])[:8])
            print(f"{label} by part: {parts}")


def _wandb_dir(workdir: Path) -> Path:
    """Where the clients write (the floor makes an empty directory per run there): in memory when the machine has
    /dev/shm. On this machine's disk (ext4 mounted with ``discard``) the 30,000 directories one floor made and the
    next deleted slowed the next floor down, 3.3 s then 5.0, 6.4, 7.6, 8.8 s in five repetitions: a floor that
    grew with our repeats. In memory, every repetition of the floor pays the same, and as little as it can."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"{workdir.name}-wandb-", dir=shm))
    return workdir / "wandb"


def _environment(server, workdir: Path, now: datetime, days: int) -> dict:
    wandb_dir = _wandb_dir(workdir)
    env = {
        **os.environ,
        "WANDB_BASE_URL": server.url,
        "WANDB_API_KEY": KEY,
        "WANDB_ENTITY": ENTITY,
        "WANDB_PROJECT": PROJECT,
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "BENCH_NOW": now.isoformat(),
        "WANDB_ASSETS_DUCKDB": str(workdir / "bench.duckdb"),
        "WANDB_ASSETS_START_DATE": (now - timedelta(days=days)).date().isoformat(),
        # Like for like with the floor, which reads no run files: what reading wandb-metadata.json adds is
        # bench_gpu_metadata.py's to measure. Set it in the environment to measure it here too.
        "WANDB_ASSETS_FETCH_METADATA": os.environ.get("WANDB_ASSETS_FETCH_METADATA", "false"),
        # ... and curves (issue 34): bench_curves.py measures them.
        "WANDB_ASSETS_FETCH_HISTORY": os.environ.get("WANDB_ASSETS_FETCH_HISTORY", "false"),
        "DAGSTER_HOME": str(workdir / "dagster-home"),
        # a tick's runs without the dbt build (the scale run measures it as a phase of its own, then a tick again)
        "WANDB_ASSETS_ANALYTICS": "false",
    }
    wandb_dir.mkdir(parents=True, exist_ok=True)
    (workdir / "dagster-home").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", workdir / "dagster-home" / "dagster.yaml")
    return env


def _fresh_warehouse(workdir: Path) -> None:
    for leftover in ("bench.duckdb", "bench.duckdb.wal", "bench.snapshot.duckdb", "staging"):
        path = workdir / leftover
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _median(results: list[dict]) -> dict:
    """The run with the median time, plus every run's seconds."""
    ordered = sorted(results, key=lambda r: r["seconds"])
    middle = dict(ordered[len(ordered) // 2])
    middle["all_seconds"] = [r["seconds"] for r in results]
    return middle


def bench_server(
    mode: str,
    nodes: list[dict],
    now: datetime,
    days: int,
    cost: tuple[float, float],
    skip_naive: bool = False,
    repeat: int = 1,
) -> list[dict]:
    from wandb_assets.localwandb import LocalWandbServer

    workdir = Path(tempfile.mkdtemp(prefix=f"wandb-assets-bench-{mode}-"))
    me = [sys.executable, __file__, "--days", str(days), "--phase"]
    with LocalWandbServer(nodes, entity=ENTITY, project=PROJECT) as server:
        env = _environment(server, workdir, now, days)
        # The local server sorts and caches a query's runs on first use (a real server has indexes): warm it
        # for the floor's one unfiltered query, untimed, so (a) is not charged for the local server's cache.
        server.answer("Runs", {"entity": ENTITY, "project": PROJECT, "filters": "{}", "order": "+created_at"})
        if mode == "slow":
            server.faults.cost_per_request_s, server.faults.cost_per_run_s = cost
        first = (now - timedelta(days=days)).date().isoformat()
        cli = [sys.executable, "-m", "wandb_assets.cli", "backfill", "--start", first, "--end", now.date().isoformat()]
        floors, floors_again, ours, wholes = [], [], [], []
        for _ in range(repeat):  # interleaved, so a noisy neighbour hits every phase alike; medians reported
            floors.append(_measure(server, "(a) floor: wandb client alone", [*me, "floor"], env))
            # The client makes an empty directory per Run object; a second pass finds them made already.
            label = "(a') floor again, its 30k run directories already made"
            if mode == "instant":
                floors_again.append(_measure(server, label, [*me, "floor"], {**env, "BENCH_KEEP_WANDB_DIR": "1"}))
            _fresh_warehouse(workdir)
            ours.append(_measure(server, "(b) ours: backfill in process", [*me, "ours"], env))
            _fresh_warehouse(workdir)
            whole = _measure(server, "(b) ours: `wandb-assets backfill`", cli, env, parse_json=False)
            whole["runs"] = len(nodes)
            wholes.append(whole)
            _fresh_warehouse(workdir)
        results = [_median(floors), _median(wholes), _median(ours)] + ([_median(floors_again)] if floors_again else [])
        if not skip_naive:
            results.insert(3, _measure(server, "(c) old collector: lazy, per_page=50", [*me, "naive"], env))
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)
    return results


def bench_scale(now: datetime, days: int, runs_per_day: int, repeat: int = 1) -> dict:
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    nodes = generate_fleet(now, days=days, runs_per_day=runs_per_day)
    workdir = Path(tempfile.mkdtemp(prefix="wandb-assets-bench-scale-"))
    me = [sys.executable, __file__, "--days", str(days), "--phase"]
    with LocalWandbServer(nodes, entity=ENTITY, project=PROJECT) as server:
        env = _environment(server, workdir, now, days)
        backfill = _measure(server, "scale: backfill in process", [*me, "ours"], env)
        size = sum(p.stat().st_size for p in workdir.glob("bench*.duckdb"))
        staged = sum(p.stat().st_size for p in (workdir / "staging").rglob("*.ndjson"))
        ticks = [
            _measure(server, "scale: one tick (refresh + feed) in process", [*me, "tick"], env) for _ in range(repeat)
        ]
        tick = ticks[0]
        analytics = _measure(server, "scale: the analysts' dbt project (analytics job)", [*me, "analytics"], env)
        ticks_after = [
            _measure(server, "scale: one tick with the dbt marts built", [*me, "tick"], env) for _ in range(repeat)
        ]
        tick_after = ticks_after[0]
        exports = {
            fmt: _measure(
                server,
                f"scale: export runs --format {fmt} (whole process)",
                [sys.executable, "-m", "wandb_assets.cli", "export", "runs", "--since", "2000-01-01", "--format", fmt,
                 "--out", str(workdir / "exports")],
                env,
                parse_json=False,
            )
            for fmt in ("parquet", "csv")
        }  # fmt: skip
        helpers = _measure(server, "scale: the notebook helpers on the snapshot", [*me, "helpers"], env)
    if os.environ.get("BENCH_KEEP_WORKDIR"):  # to look into the warehouse afterwards
        print(f"kept {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)
    return {
        "runs": len(nodes),
        "days": days,
        "backfill": backfill,
        "tick": tick,
        "analytics": analytics,
        "tick_after_analytics": tick_after,
        "tick_seconds": [t["seconds"] for t in ticks],
        "tick_parts": [t["parts"] for t in ticks],
        "tick_after_seconds": [t["seconds"] for t in ticks_after],
        "exports": exports,
        "helpers": helpers,
        "warehouse_bytes": size,
        "staged_bytes": staged,
    }


def _spread(result: dict) -> str:
    runs = result.get("all_seconds") or []
    return f" ({' / '.join(f'{s:.2f}' for s in runs)})" if len(runs) > 1 else ""


def _print_table(mode: str, results: list[dict], cost: tuple[float, float]) -> None:
    what = "instant" if mode == "instant" else f"slow: {cost[0]:g} s per request + {cost[1] * 1000:g} ms per run"
    print(f"\n{results[0]['runs']:,} runs, {what}")
    print("| phase | seconds | runs/s | whole process | peak RSS | max in flight | requests | writer held (max) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        seconds = r["seconds"]
        held = f"{r['writer_held_max_s']:.2f} s" if r.get("writer_held_max_s") is not None else ""
        print(
            f"| {r['label']} | {seconds:.2f}{_spread(r)} | {r['runs'] / seconds:,.0f} | {r['wall_seconds']:.2f} "
            f"| {r['peak_rss_mib']:.0f} MiB "
            f"| {r['max_in_flight']} | {r['requests']:,} | {held} |"
        )
    a, b_cli, b_in = (r["seconds"] for r in results[:3])
    c = next((r["seconds"] for r in results if r["label"].startswith("(c)")), float("nan"))
    a_wall = results[0]["wall_seconds"]
    target = "<= 0.4" if mode == "slow" else "<= 1.2"
    print(
        f"(b)/(a) = {b_in / a:.2f} in process (target {target}), {b_cli / a_wall:.2f} whole processes;"
        f" (c)/(b) = {c / b_in:.2f}"
    )
    if "again" in results[-1]["label"]:
        print(f"(b)/(a') = {b_in / results[-1]['seconds']:.2f} against the floor whose directories already exist")
    held = results[2]["writer_held_max_s"]
    print(
        f"writer held at most {held:.2f} s for {results[2]['runs']:,} runs = {held / results[2]['runs'] * 10_000:.2f} s"
        " per 10,000 runs (target < 2)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--runs-per-day", type=int, default=500)
    parser.add_argument("--cost-per-request", type=float, default=0.25)
    parser.add_argument("--cost-per-run", type=float, default=0.002)
    parser.add_argument("--only", choices=("instant", "slow", "scale"))
    parser.add_argument("--no-scale", action="store_true")
    parser.add_argument("--no-naive", action="store_true", help="skip (c), the slowest phase")
    parser.add_argument("--repeat", type=int, default=3, help="runs of (a) and (b) on the instant server")
    parser.add_argument("--scale-days", type=int, default=120)
    parser.add_argument("--scale-runs-per-day", type=int, default=834)
    parser.add_argument("--scale-ticks", type=int, default=1, help="ticks before and after the dbt build")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(_phase(args.phase, args.days)))
        return

    from wandb_assets.localwandb.synthetic import generate_fleet

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    cost = (args.cost_per_request, args.cost_per_run)
    print(f"{os.cpu_count()} cores; fetch concurrency {os.environ.get('WANDB_ASSETS_FETCH_CONCURRENCY', '4')}")
    for mode in ("instant", "slow"):
        if args.only in (None, mode):
            repeat = args.repeat if mode == "instant" else 1
            _print_table(mode, bench_server(mode, nodes, now, args.days, cost, args.no_naive, repeat), cost)
    if not args.no_scale:
        scale = bench_scale(now, args.scale_days, args.scale_runs_per_day, args.scale_ticks)
        b, t = scale["backfill"], scale["tick"]
        print(f"\nscale: {scale['runs']:,} runs over {scale['days']} days, instant server")
        print(
            f"backfill in process {b['seconds']:.2f} s ({b['runs'] / b['seconds']:,.0f} runs/s), peak RSS "
            f"{b['peak_rss_mib']:.0f} MiB (target < 2048), writer held at most {b['writer_held_max_s']:.2f} s"
        )
        print(
            f"warehouse {scale['warehouse_bytes'] / 2**20:.0f} MiB (with its notebook snapshot), staged files "
            f"{scale['staged_bytes'] / 2**20:.0f} MiB"
        )
        print(
            f"one tick on top: {t['seconds']:.2f} s in process (target < 10), {t['wall_seconds']:.2f} s with "
            f"process start and imports, peak RSS {t['peak_rss_mib']:.0f} MiB"
        )
        a, t2 = scale["analytics"], scale["tick_after_analytics"]
        print(
            f"analytics job (dbt build + tests + docs + snapshot): {a['seconds']:.2f} s in process, dbt held the "
            f"warehouse slot {a['writer_held_max_s']:.2f} s, peak RSS {a['peak_rss_mib']:.0f} MiB; the tick again "
            f"with the marts built: {t2['seconds']:.2f} s in process (before: {t['seconds']:.2f} s)"
        )
        steps = list(scale["tick_parts"][0])
        print("\nthe ticks before the dbt build by part (seconds, from each step's start to its end):")
        print("| step | " + " | ".join(f"tick {i + 1}" for i in range(len(scale["tick_parts"]))) + " |")
        print("|---|" + "---|" * len(scale["tick_parts"]))
        for step in steps:
            print(f"| {step} | " + " | ".join(f"{p.get(step, 0):.2f}" for p in scale["tick_parts"]) + " |")
        if len(scale["tick_seconds"]) > 1:
            print(
                "ticks before the dbt build: "
                + ", ".join(f"{x:.2f}" for x in scale["tick_seconds"])
                + " s; after: "
                + ", ".join(f"{x:.2f}" for x in scale["tick_after_seconds"])
                + " s"
            )
        for fmt, e in scale["exports"].items():
            print(
                f"export runs --format {fmt}: {e['wall_seconds']:.2f} s whole process, "
                f"peak RSS {e['peak_rss_mib']:.0f} MiB"
            )
        slowest = sorted(scale["helpers"]["helpers"].items(), key=lambda item: -item[1])
        print(
            "notebook helpers on the snapshot (target < 1 s each): " + ", ".join(f"{n} {s:.2f} s" for n, s in slowest)
        )


if __name__ == "__main__":
    main()
