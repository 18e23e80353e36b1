"""For training jobs: log compute metadata and custom x-axes to W&B the way the warehouse reads them.

    import wandb
    from wandb_assets.instrument import attach_compute_metadata, StepAxis

    run = wandb.init(project="...")
    attach_compute_metadata(run, cfg)            # prints "8 CPUs, 4 GPUs"; config keys compute.*, system.*, slurm.*
    env_axis = StepAxis(run, "env")             # env/* charts use env/step as their x-axis
    env_axis.log(step=env_steps, reward=r)       # logs {"env/step": ..., "env/reward": ...} with no step=

Detection never raises and never imports torch (importing it can break GPU visibility in child processes).
"""

from __future__ import annotations

import getpass
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: A cgroup v1 limit this large means "no limit" (the kernel reports about 2^63 rounded to a page).
UNLIMITED_BYTES = 2**60
SLURM_KEYS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_CLUSTER_NAME",
)
CFG_SECTIONS = ("model", "runtime")


def _count_list(value: str) -> int:
    entries = [e.strip() for e in value.split(",")]
    return 0 if entries in ([""], ["-1"], ["NoDevFiles"]) else len([e for e in entries if e])


def parse_slurm_gpus(value: str) -> tuple[int, str | None] | None:
    """``4``, ``gpu:4``, ``a100:4``, ``gpu:a100:4`` -> (count, type or None); None when unparseable."""
    parts = [p for p in value.strip().split(":") if p]
    if not parts or not parts[-1].split("(")[0].isdigit():
        return None
    count = int(parts[-1].split("(")[0])
    kinds = [p for p in parts[:-1] if p.lower() != "gpu"]
    return count, (kinds[-1] if kinds else None)


def parse_slurm_cpus(value: str) -> int | None:
    """``16`` -> 16, ``16(x2)`` -> 32, ``2,2`` -> 4 (SLURM_CPUS_ON_NODE's compressed forms)."""
    total = 0
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            return None
        total += int(match.group(1)) * int(match.group(2) or 1)
    return total or None


def query_nvidia_smi(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """GPUs as nvidia-smi lists them (index, name, memory GB, compute capability); [] when unavailable."""
    binary = shutil.which("nvidia-smi", path=environ.get("PATH", os.defpath))
    if not binary:
        return []
    try:
        done = subprocess.run(
            [binary, "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            env=dict(environ),
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[0].isdigit():
            continue
        try:
            memory_gb = round(float(fields[2]) / 1024, 2)
        except ValueError:
            memory_gb = None
        gpus.append(
            {"index": int(fields[0]), "name": fields[1], "memory_gb": memory_gb, "compute_capability": fields[3]}
        )
    return gpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_memory_bytes(environ: Mapping[str, str], cgroup_root: Path, cpus: int) -> tuple[int | None, str]:
    """Memory available to this job and where the number came from."""
    v2 = _read(cgroup_root / "memory.max")
    if v2 and v2 != "max" and v2.isdigit():
        return int(v2), "cgroup v2"
    v1 = _read(cgroup_root / "memory" / "memory.limit_in_bytes")
    if v1 and v1.isdigit() and int(v1) < UNLIMITED_BYTES:
        return int(v1), "cgroup v1"
    per_node = (environ.get("SLURM_MEM_PER_NODE") or "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node) * 2**20, "SLURM_MEM_PER_NODE"
    per_cpu = (environ.get("SLURM_MEM_PER_CPU") or "").strip()
    if per_cpu.isdigit() and int(per_cpu) > 0:
        return int(per_cpu) * 2**20 * cpus, "SLURM_MEM_PER_CPU"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "machine"
    except (ValueError, OSError, AttributeError):
        return None, "unknown"


def _plain(cfg: Any) -> Any:
    """A Hydra/omegaconf config (or any mapping/attribute object) as plain dicts and lists."""
    try:
        from omegaconf import OmegaConf  # optional: only if the job uses it

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # noqa: BLE001 - omegaconf missing or the config does not resolve
        pass
    if isinstance(cfg, Mapping):
        return {str(k): _plain(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [_plain(v) for v in cfg]
    if hasattr(cfg, "__dict__") and not isinstance(cfg, type):
        return {k: _plain(v) for k, v in vars(cfg).items() if not k.startswith("_")}
    return cfg


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    else:
        out[prefix] = value


def collect_compute_metadata(
    cfg: Any = None, environ: Mapping[str, str] | None = None, cgroup_root: str | os.PathLike = "/sys/fs/cgroup"
) -> dict[str, Any]:
    """Flat keys for ``wandb.config.update``: ``compute.*``, ``system.*``, ``slurm.*`` and the ``model.*`` /
    ``runtime.*`` settings of ``cfg``. Never raises: what cannot be detected is left out."""
    environ = os.environ if environ is None else environ
    meta: dict[str, Any] = {}
    try:
        gpus_detail = query_nvidia_smi(environ)
        gpu_type = None
        if "CUDA_VISIBLE_DEVICES" in environ:
            gpu_count, source = _count_list(environ["CUDA_VISIBLE_DEVICES"]), "CUDA_VISIBLE_DEVICES"
        elif (slurm := environ.get("SLURM_GPUS_PER_NODE") or environ.get("SLURM_GPUS_ON_NODE")) and parse_slurm_gpus(
            slurm
        ):
            gpu_count, gpu_type = parse_slurm_gpus(slurm)
            source = "SLURM"
        elif gpus_detail:
            gpu_count, source = len(gpus_detail), "nvidia-smi"
        else:
            gpu_count, source = 0, "none"
        meta["compute.gpu_count"] = gpu_count
        meta["compute.gpu_source"] = source
        if gpus_detail:
            meta["compute.gpus"] = gpus_detail
            gpu_type = gpus_detail[0]["name"]
        if gpu_type and gpu_count:
            meta["compute.gpu_type"] = gpu_type
    except Exception:  # noqa: BLE001 - never break a training job over metadata
        meta.setdefault("compute.gpu_count", 0)
    cpus = None
    try:
        per_task = (environ.get("SLURM_CPUS_PER_TASK") or "").strip()
        on_node = (environ.get("SLURM_CPUS_ON_NODE") or "").strip()
        cpus = (int(per_task) if per_task.isdigit() else None) or (parse_slurm_cpus(on_node) if on_node else None)
        cpus = cpus or os.cpu_count()
        meta["compute.cpu_count"] = cpus
        meta["compute.cpu_architecture"] = platform.machine()
        memory, memory_source = detect_memory_bytes(environ, Path(cgroup_root), cpus or 1)
        if memory:
            meta["compute.memory_gb"] = round(memory / 2**30, 2)
            meta["compute.memory_source"] = memory_source
    except Exception:  # noqa: BLE001
        pass
    for key, reader in (
        ("system.platform", platform.platform),
        ("system.python_version", platform.python_version),
        ("system.hostname", socket.gethostname),
        ("system.user", getpass.getuser),
    ):
        try:
            meta[key] = reader()
        except Exception:  # noqa: BLE001 - getpass fails without a passwd entry, for example
            continue
    for name in SLURM_KEYS:
        if environ.get(name):
            meta["slurm." + name[len("SLURM_") :].lower()] = environ[name]
    if cfg is not None:
        try:
            plain = _plain(cfg)
            for section in CFG_SECTIONS:
                if isinstance(plain, dict) and section in plain:
                    _flatten(section, plain[section], meta)
        except Exception:  # noqa: BLE001
            pass
    return meta


def describe(meta: Mapping[str, Any]) -> str:
    """The one line a job prints: ``8 CPUs, 4 GPUs`` (plus GPU type and memory when known)."""
    cpus, gpus = meta.get("compute.cpu_count"), meta.get("compute.gpu_count", 0)
    line = f"{cpus if cpus is not None else '?'} CPU{'' if cpus == 1 else 's'}, {gpus} GPU{'s' if gpus != 1 else ''}"
    if meta.get("compute.gpu_type"):
        line += f" ({meta['compute.gpu_type']})"
    if meta.get("compute.memory_gb"):
        line += f", {meta['compute.memory_gb']:g} GB memory"
    return line


def attach_compute_metadata(
    run, cfg: Any = None, environ: Mapping[str, str] | None = None, cgroup_root: str | os.PathLike = "/sys/fs/cgroup"
) -> dict[str, Any]:
    """Detect, log to ``run.config`` and print one line; returns what was logged."""
    meta = collect_compute_metadata(cfg, environ, cgroup_root)
    run.config.update(meta, allow_val_change=True)
    print(describe(meta), flush=True)
    return meta


class StepAxis:
    """A custom x-axis done right: ``<prefix>/*`` charts plot against ``<prefix>/step``, which is logged as
    data. Passing ``step=`` to ``run.log`` instead is what left charts empty (it moves W&B's own ``_step``)."""

    def __init__(self, run, prefix: str) -> None:
        self.run = run
        self.prefix = prefix.strip("/")
        self.step_key = f"{self.prefix}/step"
        run.define_metric(self.step_key)
        run.define_metric(f"{self.prefix}/*", step_metric=self.step_key)

    def log(self, step: float, commit: bool | None = None, **metrics: Any) -> None:
        row = {self.step_key: step, **{f"{self.prefix}/{k}": v for k, v in metrics.items()}}
        self.run.log(row, commit=commit)
