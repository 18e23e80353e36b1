"""Steady ticks on a kept million-run warehouse, code versions side by side, with a quarter hour's new runs arriving
before each round (issue 54).

Every steady tick measured before re-read the same runs; a real tick finds new PR runs (their groups judged against
main) and new main runs (the SPS detector). Before each round this adds to the server the runs the fleet created in a
15-minute window eight or more days earlier, with new ids, moved to 90-105 minutes before now (their CI names' times
too). Each version ticks on its own copy of the warehouse, one tick to warm up, then one a round, each in a process of
its own; who reads first after new runs alternates (the local server sorts a new answer once, 1.2-1.4 s, for whoever
asks first). Each step's time comes from its run's event log.

    BENCH_KEEP_WORKDIR=1 uv run python benchmarks/bench_ingest.py --only scale --scale-days 120 \\
        --scale-runs-per-day 8334 --scale-ticks 1          # prints "kept <dir>": its bench.duckdb is the warehouse
    git worktree add /tmp/before <commit>
    uv run python benchmarks/bench_steady_tick.py --from <dir>/bench.duckdb --rounds 4 before=/tmp/before now=.
    ... --no-arrivals                                          # the same runs re-read, as the earlier measurements
    ... --days 12 (a warehouse kept with --scale-days 12)       # the same daily volume over a tenth of the history
    BENCH_INSTANCE=home DAGSTER_EVENT_BATCH_SIZE=1000 ...     # on the instance a command uses (SQLite), not in memory
"""

from __future__ import annotations

import argparse
import runpy
import shutil
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run_from_checkout(checkout: str, argv: list[str]) -> None:
    """``bench_ingest.py`` of ``checkout`` with ``wandb_assets`` imported from it, not from the editable install."""
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in f"{type(f).__module__} {f!r}"]
    sys.path.insert(0, checkout)
    import wandb_assets

    assert wandb_assets.__file__.startswith(checkout), wandb_assets.__file__
    sys.argv = [str(Path(checkout) / "benchmarks" / "bench_ingest.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


def _arrivals(nodes: list[dict], now: datetime, round_: int) -> list[dict]:
    """The runs created in a 15-minute window ``8 + round_`` days and 2 hours before ``now``, as new runs created
    90-105 minutes before it (ended by then: runs still alive after the move are left out)."""
    from wandb_assets.localwandb.server import iso_z

    shift = timedelta(days=8 + round_, minutes=30)
    low, high = now - shift - timedelta(minutes=105), now - shift - timedelta(minutes=90)
    batch = []
    for node in nodes:
        created = datetime.fromisoformat(node["createdAt"].replace("Z", "+00:00")).replace(tzinfo=None)
        heartbeat = datetime.fromisoformat(node["heartbeatAt"].replace("Z", "+00:00")).replace(tzinfo=None)
        if not low <= created < high or heartbeat + shift > now:
            continue
        name = node.get("displayName") or ""
        if name.startswith("github.sky."):  # the CI name's trailing timestamp is its commit time
            name = f"{name.rsplit('.', 1)[0]}.{int((created + shift).timestamp())}"
        batch.append(
            {
                **node,
                "name": f"{node['name']}n{round_}",
                "displayName": name or node.get("displayName"),
                "createdAt": iso_z(created + shift),
                "heartbeatAt": iso_z(heartbeat + shift),
            }
        )
    return batch


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--in-checkout":
        _run_from_checkout(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--from", dest="source", type=Path, required=True, help="a kept million-run bench.duckdb")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--days", type=int, default=120, help="the kept warehouse's --scale-days")
    parser.add_argument("--runs-per-day", type=int, default=8334, help="... and its --scale-runs-per-day")
    parser.add_argument("--no-arrivals", action="store_true")
    parser.add_argument("versions", nargs="+", help="name=checkout ('.' is this one)")
    args = parser.parse_args()

    import duckdb

    sys.path.insert(0, str(HERE))
    import bench_ingest as bench

    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.localwandb.synthetic import generate_fleet

    with duckdb.connect(str(args.source), read_only=True) as con:  # the fleet's now: a running run's heartbeat
        now = con.execute("SELECT max(heartbeat_at) FROM runs").fetchone()[0]
    nodes = generate_fleet(now, days=args.days, runs_per_day=args.runs_per_day)
    versions = {}
    with LocalWandbServer(nodes, entity=bench.ENTITY, project=bench.PROJECT) as server:
        for name, checkout in (v.split("=", 1) for v in args.versions):
            workdir = Path(tempfile.mkdtemp(prefix=f"wandb-assets-steady-{name}-"))
            shutil.copy(args.source, workdir / "bench.duckdb")
            env = bench._environment(server, workdir, now, args.days)
            here = Path(checkout).resolve() == HERE.parent
            script = [str(HERE / "bench_ingest.py")] if here else [__file__, "--in-checkout", str(Path(checkout))]
            versions[name] = (env, [sys.executable, *script, "--days", str(args.days), "--phase", "tick"])
            warm = bench._measure(server, "warm", versions[name][1], env)
            print(f"{name}: warm-up tick {warm['seconds']:.2f} s", flush=True)
        for round_ in range(args.rounds):
            if not args.no_arrivals:
                batch = _arrivals(nodes, now, round_)
                server.add_project(bench.ENTITY, bench.PROJECT, batch)
                ci = [b.get("displayName") or "" for b in batch]
                print(
                    f"round {round_}: {len(batch)} new runs ({sum(n.startswith('github.sky.main.') for n in ci)} "
                    f"main CI, {sum(n.startswith('github.sky.pr') for n in ci)} PR)",
                    flush=True,
                )
            order = list(versions.items())
            for name, (env, command) in order if round_ % 2 == 0 else order[::-1]:
                r = bench._measure(server, name, command, env)
                parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["parts"].items(), key=lambda kv: -kv[1]))
                print(
                    f"{name} #{round_}: {r['seconds']:.2f} s in process, {r['wall_seconds']:.2f} s whole, "
                    f"{r['peak_rss_mib']:,.0f} MiB | {parts}",
                    flush=True,
                )
    for env, _ in versions.values():
        shutil.rmtree(Path(env["WANDB_ASSETS_DUCKDB"]).parent, ignore_errors=True)
        shutil.rmtree(env["WANDB_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
