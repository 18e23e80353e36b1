"""A realistic synthetic W&B fleet for the demo and the benchmark (deterministic for a given seed).

What it holds, per day: push-to-main CI runs on ``main`` (every config per commit) and on PRs, each
logging the five SPS keys, a few of which end ``crashed`` after logging their metrics and a few
``failed``; sweeps recognised by sweep id and others only by a ``.sweep`` name; ordinary training runs,
some multi-day and some still running or pending; a few runs with no display name; a share of
summaries served double-encoded (the known client quirk) and a few GPU counts stored nested.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

from wandb_assets.localwandb.server import make_run_node

#: GPU models as W&B's client records them, with how often the synthetic fleet uses each.
GPU_MODELS = {
    "NVIDIA H100 80GB HBM3": 3,
    "NVIDIA A100-SXM4-80GB": 4,
    "NVIDIA A100-SXM4-40GB": 3,
    "Tesla V100-SXM2-16GB": 2,
    "NVIDIA GeForce RTX 4090": 1,
    "Tesla T4": 1,
    "NVIDIA RTX 6000 Ada Generation": 1,  # no shipped price: costs NULL
}
CI_CONFIGS = {"ppo_atari": 5200.0, "impala.large": 18400.0, "dqn_cartpole": 950.0, "muzero.v2": 2300.0}
#: Each CI config's benchmark machine (8 GPUs of this model): CI runs on fixed hardware, so each config's main
#: series is one testbed (issue 45), and its runs always record their machine.
CI_GPU_MODELS = {
    "ppo_atari": "NVIDIA H100 80GB HBM3",
    "impala.large": "NVIDIA A100-SXM4-80GB",
    "dqn_cartpole": "NVIDIA A100-SXM4-40GB",
    "muzero.v2": "NVIDIA H100 80GB HBM3",
}
USERS = ["alice", "bob", "carol", "dan", "erin"]


def _ci_summary(rng: random.Random, base_sps: float, step: int) -> dict:
    sps = base_sps * rng.uniform(0.93, 1.07)
    return {
        "overview/steps_per_second": round(sps, 3),
        "overview/epoch_steps_per_second": round(sps * 0.97, 3),
        "overview/sps": round(sps, 3),
        "timing_cumulative/sps": round(sps * 0.95, 3),
        "timing_per_epoch/sps": round(sps * 1.01, 3),
        "_step": step,
        "_runtime": 0,
        "loss": round(rng.uniform(0.05, 1.5), 4),
    }


def _machine(rng: random.Random, state: str, config: dict) -> dict:
    """What W&B would hold of a run's machine: ``wandb-metadata.json`` for most runs (GPU count and model; a few
    runs have none, as in real projects) and a latest system sample with each GPU's utilisation."""
    flat = config.get("compute.gpu_count")
    nested = (config.get("compute") or {}).get("gpu_count") if isinstance(config.get("compute"), dict) else None
    gpus = flat or nested or rng.choice([1, 2, 4, 8])
    model = rng.choices(list(GPU_MODELS), weights=list(GPU_MODELS.values()))[0]
    has_metadata = rng.random() < 0.75
    machine: dict = {"metadata": {"gpu_count": gpus, "gpu": model, "os": "Linux"} if has_metadata else None}
    if state != "pending" and rng.random() < 0.9:
        busy = rng.uniform(35, 99)
        machine["system_metrics"] = {
            **{f"system.gpu.{i}.gpu": round(min(100.0, busy + rng.uniform(-10, 10)), 1) for i in range(gpus)},
            **{f"system.gpu.{i}.memory": round(rng.uniform(20, 90), 1) for i in range(gpus)},
            "system.cpu": round(rng.uniform(5, 60), 1),
        }
    return machine


def _ended_state(rng: random.Random, end: datetime, now: datetime, weights: tuple[float, ...]) -> str:
    if end > now:
        return "running"
    return rng.choices(["finished", "crashed", "failed", "killed"], weights=weights)[0]


def generate_fleet(
    now: datetime, days: int = 30, runs_per_day: int = 150, seed: int = 7, incidents: bool = True
) -> list[dict]:
    """Run nodes created over the ``days`` before ``now`` (naive UTC), about ``runs_per_day`` a day.

    With ``incidents``, the last hours also hold what the alerts should catch: an SPS regression on main
    (``ppo_atari`` 30% slower for its last three main commits), a CI failure streak (eight failed push-to-main
    runs), a stalled run (still ``running``, no heartbeat for two hours), an idle one, and three pull requests' runs
    of ``impala.large`` (PR 4242 20 % slower than main, PR 4243 as fast, PR 4244 on 8 B200s: no baseline).
    """
    rng = random.Random(seed)
    machines = random.Random(seed + 1_000)  # GPUs drawn apart: the rest of the fleet is what it always was
    nodes: list[dict] = []
    counter = 0

    def add(created: datetime, hours: float, state: str, ci_machine: str | None = None, **kwargs) -> None:
        nonlocal counter
        counter += 1
        end = created + timedelta(hours=hours)
        if state == "running" and end <= now:
            state = "finished"
        heartbeat = min(end, now) if state != "pending" else created
        run_id = f"{rng.getrandbits(40):010x}"[:8] + f"{counter:05d}"
        kwargs.update(_machine(machines, state, kwargs.get("config") or {}))  # its draws: the rest stays as it was
        if ci_machine is not None:
            kwargs["metadata"] = {"gpu_count": 8, "gpu": ci_machine, "os": "Linux"}
        nodes.append(make_run_node(run_id, created_at=created, heartbeat_at=heartbeat, state=state, **kwargs))

    ci_share, sweep_share = 0.45, 0.25
    start = now - timedelta(days=days)
    for day in range(days):
        day_start = start + timedelta(days=day)
        n_ci = int(runs_per_day * ci_share)
        n_sweep = int(runs_per_day * sweep_share)
        n_regular = runs_per_day - n_ci - n_sweep
        configs = list(CI_CONFIGS)
        # push-to-main CI runs: a commit runs every config; PRs run two configs.
        while n_ci > 0:
            on_main = rng.random() < 0.6
            branch = "main" if on_main else f"pr{rng.randint(100, 999)}"
            commit = f"{rng.getrandbits(28):07x}"
            created = day_start + timedelta(seconds=rng.randint(0, 86_399))
            for config in configs if on_main else rng.sample(configs, 2):
                if n_ci <= 0:
                    break
                n_ci -= 1
                hours = rng.uniform(0.3, 1.5)
                end = created + timedelta(hours=hours)
                state = _ended_state(rng, end, now, (86, 7, 5, 2))
                stamp = int(created.timestamp())
                summary = _ci_summary(rng, CI_CONFIGS[config], rng.randint(10_000, 50_000))
                if state in ("failed", "killed") and rng.random() < 0.5:
                    summary = {"_step": 10, "loss": 3.0}
                if state == "running":
                    summary = {"_step": rng.randint(1, 500)}
                add(
                    created,
                    hours,
                    state,
                    display_name=f"github.sky.{branch}.{commit}.{config}.{stamp}",
                    ci_machine=CI_GPU_MODELS[config],
                    config={"compute.gpu_count": 8, "env": config, "seed": rng.randint(0, 9)},
                    summary=summary,
                    summary_encoding="double" if rng.random() < 0.05 else "json",
                    tags=["ci", branch],
                    username="ci-bot",
                    group=commit,
                    job_type="benchmark",
                )
        # sweeps: most carry a sweep id, some are only recognisable by name.
        sweep_ids = [f"sw{day:02d}{k}x{rng.getrandbits(16):04x}" for k in range(2)]
        for k in range(n_sweep):
            created = day_start + timedelta(seconds=rng.randint(0, 86_399))
            hours = rng.uniform(0.5, 4)
            state = _ended_state(rng, created + timedelta(hours=hours), now, (75, 5, 15, 5))
            by_name = k % 5 == 4
            add(
                created,
                hours,
                state,
                display_name=f"lr-search.sweep-{k}" if by_name else f"{rng.choice(['eager', 'brisk', 'quiet'])}-{k}",
                sweep=None if by_name else sweep_ids[k % 2],
                config={"compute": {"gpu_count": rng.choice([1, 2, 4])}, "lr": round(rng.uniform(1e-5, 1e-2), 6)},
                summary={"val/loss": round(rng.uniform(0.1, 2), 4), "_step": rng.randint(100, 5000)},
                username=rng.choice(USERS),
                job_type="sweep",
            )
        # regular training runs: some multi-day, some still running or pending, a few nameless.
        for k in range(n_regular):
            created = day_start + timedelta(seconds=rng.randint(0, 86_399))
            hours = rng.choice([rng.uniform(0.2, 6), rng.uniform(24, 96)]) if k % 4 == 0 else rng.uniform(0.2, 6)
            state = _ended_state(rng, created + timedelta(hours=hours), now, (80, 8, 8, 4))
            if state == "running" and rng.random() < 0.2:
                state = "pending"
            gpus = rng.choice([None, 1, 2, 4, 8])
            add(
                created,
                hours,
                state,
                display_name=None if k % 37 == 0 else f"train-{rng.choice(['llama', 'vit', 'resnet'])}-{k}",
                config={"compute.gpu_count": gpus} if gpus else {"batch_size": 64},
                summary={"train/loss": round(rng.uniform(0.1, 3), 4), "_step": rng.randint(10, 100_000)},
                summary_encoding="double" if rng.random() < 0.05 else "json",
                username=rng.choice(USERS),
            )
    if incidents:
        stamp = int(now.timestamp())
        regressed = _ci_summary(rng, CI_CONFIGS["ppo_atari"] * 0.7, 40_000)
        for key in ("overview/sps", "overview/steps_per_second"):
            regressed[key] = round(CI_CONFIGS["ppo_atari"] * 0.7, 3)
        # three slow main commits in a row: badc0de first, the last ending 30 s before now
        for hours_ago, commit in ((2, "badc0de"), (1, "badc0e1"), (0, "badc0f2")):
            add(
                now - timedelta(hours=hours_ago, minutes=30, seconds=30),
                0.5,
                "finished",
                display_name=f"github.sky.main.{commit}.ppo_atari.{stamp - 60 * hours_ago}",  # after the others
                ci_machine=CI_GPU_MODELS["ppo_atari"],
                config={"compute.gpu_count": 8},
                summary=regressed,
                username="ci-bot",
                job_type="benchmark",
            )
        for k in range(8):
            add(
                now - timedelta(hours=10 - k),
                0.5,
                "failed",
                display_name=f"github.sky.main.f{k:06x}.dqn_cartpole.{stamp}",
                ci_machine=CI_GPU_MODELS["dqn_cartpole"],
                config={"compute.gpu_count": 8},
                summary={"_step": 3, "loss": 9.9},
                username="ci-bot",
                job_type="benchmark",
            )
        nodes.append(  # eight H100s at 0 % for three hours: the idle_gpus alert names it
            make_run_node(
                "idlegpu0001",
                display_name="train-llama-idle",
                state="running",
                created_at=now - timedelta(hours=3),
                heartbeat_at=now,
                summary={"train/loss": 2.1, "_step": 5},
                config={"compute": {"gpu_count": 8, "gpu_type": "H100-80GB"}},  # as wandb_assets.instrument logs
                username="bob",
                system_metrics={f"system.gpu.{i}.{k}": 0.0 for i in range(8) for k in ("gpu", "memory")},
                metadata={"gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3"},
            )
        )
        nodes.append(
            make_run_node(
                "stalled0001",
                display_name="train-llama-stuck",
                state="running",
                created_at=now - timedelta(hours=9),
                heartbeat_at=now - timedelta(hours=2),
                config={"compute.gpu_count": 8},
                summary={"train/loss": 0.8, "_step": 1200},
                username="alice",
            )
        )
        # pull requests judged against main (issue 45), on impala.large: one 20 % slower, one as fast as main, one on
        # hardware main has never run on (no baseline)
        base = CI_CONFIGS["impala.large"]
        for pr, commit, factor, machine in (
            (4242, "5ca1ab1e", 0.8, CI_GPU_MODELS["impala.large"]),
            (4243, "c1ea4ed0", 1.0, CI_GPU_MODELS["impala.large"]),
            (4244, "b200b200", 1.6, "NVIDIA B200"),
        ):
            summary = _ci_summary(rng, base, 30_000)
            for key in ("overview/sps", "overview/steps_per_second"):
                summary[key] = round(base * factor, 3)
            add(
                now - timedelta(minutes=50),
                0.5,
                "finished",
                display_name=f"github.sky.pr{pr}.{commit}.impala.large.{stamp - 3000}",
                ci_machine=machine,
                config={"compute.gpu_count": 8},
                summary=summary,
                tags=["ci", f"pr{pr}"],
                username="ci-bot",
                job_type="benchmark",
            )
    return nodes


#: The demo's curves: the runs created in its last days carry them (earlier ones answer none), a sample every
#: ``CURVE_MINUTES`` of the run (at most ``CURVE_POINTS``) and one SPS point per sample.
CURVE_DAYS, CURVE_MINUTES, CURVE_POINTS = 3, 10, 60


def add_curves(nodes: list[dict], now: datetime, seed: int = 11) -> int:
    """Give the runs created in the last ``CURVE_DAYS`` days before ``now`` (not pending) the curves W&B would hold:
    an ``overview/sps`` history (a warm-up at half speed for the first tenth of the steps, then the summary's SPS
    within a few percent) and a GPU system stream over the run's life. Most runs keep their GPUs busy; one in five
    idles all its GPUs for a stretch; one in five of the multi-GPU ones leaves half of them idle throughout (the
    partly idle hours). Returns how many runs carry curves."""
    rng = random.Random(seed)
    carried = 0
    for node in nodes:
        created = datetime.fromisoformat(node["createdAt"].removesuffix("Z"))
        if node["state"] == "pending" or created < now - timedelta(days=CURVE_DAYS):
            continue
        heartbeat = datetime.fromisoformat(node["heartbeatAt"].removesuffix("Z"))
        span = max((heartbeat - created).total_seconds(), 60.0)
        points = max(2, min(CURVE_POINTS, int(span // (CURVE_MINUTES * 60)) + 1))
        every = span / (points - 1)
        gpus = len({k.split(".")[2] for k in _system_metrics(node) if k.startswith("system.gpu.")})  # 0: no stream
        sps = _summary_sps(node)
        history = []
        for k in range(points):
            row = {"_step": k * 100, "_timestamp": (created + timedelta(seconds=k * every)).timestamp()}
            if sps is not None:
                row["overview/sps"] = round(sps * (0.5 if k < points / 10 else rng.uniform(0.97, 1.03)), 3)
            history.append(row)
        pattern = rng.random()
        # a run whose latest system sample is all 0 % (the idle H100s) was idle all along: the idle ladder reads it
        idle_throughout = gpus > 0 and not any(
            v for k, v in _system_metrics(node).items() if k.startswith("system.gpu.") and k.endswith(".gpu")
        )
        events = []
        for k in range(points if gpus else 0):
            idle_stretch = pattern < 0.2 and points * 0.4 <= k < points * 0.7
            row = {"_timestamp": (created + timedelta(seconds=k * every)).timestamp()}
            for gpu in range(gpus):
                half_idle = 0.2 <= pattern < 0.4 and gpus > 1 and gpu >= gpus // 2
                util = (
                    0.0 if idle_throughout else rng.uniform(0, 3) if idle_stretch or half_idle else rng.uniform(70, 99)
                )
                row[f"system.gpu.{gpu}.gpu"] = round(util, 1)
                row[f"system.gpu.{gpu}.memory"] = round(rng.uniform(30, 80), 1)
                row[f"system.gpu.{gpu}.powerWatts"] = round(60 + 3.4 * util, 1)
            events.append(row)
        node["_history"], node["_events"] = history, events
        carried += 1
    return carried


def _system_metrics(node: dict) -> dict:
    value = node.get("systemMetrics")
    return json.loads(value) if isinstance(value, str) else value or {}


def _summary_sps(node: dict) -> float | None:
    summary = node.get("summaryMetrics")
    while isinstance(summary, str):
        try:
            summary = json.loads(summary)
        except ValueError:
            return None
    value = summary.get("overview/sps") if isinstance(summary, dict) else None
    return float(value) if isinstance(value, (int, float)) else None
