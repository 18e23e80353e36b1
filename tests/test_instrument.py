"""Compute metadata detection (every branch, with injected environment, cgroup root and a fake nvidia-smi),
and the helpers exercised on real offline runs read back from the .wandb file."""

import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from wandb_assets.instrument import (
    collect_compute_metadata,
    describe,
    parse_slurm_cpus,
    parse_slurm_gpus,
)
from wandb_assets.lib.wandb_records import find_run_files, read_run

GIB = 2**30


@pytest.fixture
def no_cgroup(tmp_path) -> Path:
    return tmp_path / "no-cgroup"


@pytest.fixture
def fake_smi(tmp_path) -> str:
    """A PATH holding an ``nvidia-smi`` that lists two A100s, the way the real one prints them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\nprintf '0, NVIDIA A100-SXM4-80GB, 81920, 8.0\\n1, NVIDIA A100-SXM4-80GB, 81920, 8.0\\n'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


@pytest.mark.parametrize(
    ("environ", "count", "source"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}, 2, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "-1", "SLURM_GPUS_ON_NODE": "4"}, 0, "CUDA_VISIBLE_DEVICES"),
        ({"SLURM_GPUS_PER_NODE": "4"}, 4, "SLURM"),
        ({"SLURM_GPUS_PER_NODE": "gpu:2"}, 2, "SLURM"),
        ({"SLURM_GPUS_ON_NODE": "8"}, 8, "SLURM"),
        ({"SLURM_GPUS_PER_NODE": "garbage"}, 0, "none"),
        ({}, 0, "none"),
    ],
)
def test_gpu_count_detection_order(environ, count, source, no_cgroup):
    meta = collect_compute_metadata(environ={"PATH": "/nonexistent", **environ}, cgroup_root=no_cgroup)
    assert (meta["compute.gpu_count"], meta["compute.gpu_source"]) == (count, source)


def test_slurm_gpu_type():
    assert parse_slurm_gpus("a100:4") == (4, "a100")
    assert parse_slurm_gpus("gpu:h100:8") == (8, "h100")
    assert parse_slurm_gpus("gpu:4") == (4, None)
    assert parse_slurm_gpus("none") is None


def test_nvidia_smi_details_and_type(fake_smi, no_cgroup):
    meta = collect_compute_metadata(environ={"PATH": fake_smi}, cgroup_root=no_cgroup)
    assert (meta["compute.gpu_count"], meta["compute.gpu_source"]) == (2, "nvidia-smi")
    assert meta["compute.gpu_type"] == "NVIDIA A100-SXM4-80GB"
    assert meta["compute.gpus"] == [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80.0, "compute_capability": "8.0"},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80.0, "compute_capability": "8.0"},
    ]
    # CUDA_VISIBLE_DEVICES still decides the count; nvidia-smi only describes the cards.
    narrowed = collect_compute_metadata(environ={"PATH": fake_smi, "CUDA_VISIBLE_DEVICES": "1"}, cgroup_root=no_cgroup)
    assert (narrowed["compute.gpu_count"], narrowed["compute.gpu_type"]) == (1, "NVIDIA A100-SXM4-80GB")


@pytest.mark.parametrize(("value", "expected"), [("16", 16), ("16(x2)", 32), ("2,2", 4), ("8(x2),4", 20), ("x", None)])
def test_slurm_cpus_on_node_forms(value, expected):
    assert parse_slurm_cpus(value) == expected


@pytest.mark.parametrize(
    ("environ", "cpus"),
    [
        ({"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "16"}, 6),
        ({"SLURM_CPUS_ON_NODE": "16(x2)"}, 32),
        ({"SLURM_CPUS_ON_NODE": "2,2"}, 4),
        ({}, os.cpu_count()),
    ],
)
def test_cpu_detection_order(environ, cpus, no_cgroup):
    assert collect_compute_metadata(environ={"PATH": "", **environ}, cgroup_root=no_cgroup)["compute.cpu_count"] == cpus


def _cgroup(tmp_path, v2: str | None = None, v1: str | None = None) -> Path:
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True)
    if v2 is not None:
        (root / "memory.max").write_text(v2 + "\n")
    if v1 is not None:
        (root / "memory" / "memory.limit_in_bytes").write_text(v1 + "\n")
    return root


@pytest.mark.parametrize(
    ("v2", "v1", "environ", "gb", "source"),
    [
        (str(16 * GIB), None, {}, 16.0, "cgroup v2"),
        ("max", str(8 * GIB), {}, 8.0, "cgroup v1"),
        ("max", "9223372036854771712", {"SLURM_MEM_PER_NODE": "65536"}, 64.0, "SLURM_MEM_PER_NODE"),
        (None, None, {"SLURM_MEM_PER_CPU": "4096", "SLURM_CPUS_PER_TASK": "4"}, 16.0, "SLURM_MEM_PER_CPU"),
    ],
)
def test_memory_detection_order(tmp_path, v2, v1, environ, gb, source):
    meta = collect_compute_metadata(environ={"PATH": "", **environ}, cgroup_root=_cgroup(tmp_path, v2, v1))
    assert (meta["compute.memory_gb"], meta["compute.memory_source"]) == (gb, source)


def test_machine_memory_when_nothing_limits_it(tmp_path):
    meta = collect_compute_metadata(environ={"PATH": ""}, cgroup_root=_cgroup(tmp_path, "max", None))
    assert meta["compute.memory_source"] == "machine"
    # independently of the code's sysconf arithmetic: the kernel's own MemTotal line
    mem_total_kib = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal:")).split()[1])
    assert meta["compute.memory_gb"] == pytest.approx(mem_total_kib / 2**20, abs=0.01)


def test_slurm_keys_system_keys_and_cfg_sections(no_cgroup):
    class Cfg:  # attribute-style, like an omegaconf DictConfig seen through getattr
        def __init__(self):
            self.model = {"name": "vit", "depth": 12, "attn": {"heads": 8}}
            self.runtime = {"bf16": True}
            self.data = {"path": "/not/logged"}

    meta = collect_compute_metadata(
        Cfg(), environ={"PATH": "", "SLURM_JOB_ID": "4242", "SLURM_JOB_PARTITION": "gpu"}, cgroup_root=no_cgroup
    )
    assert (meta["slurm.job_id"], meta["slurm.job_partition"]) == ("4242", "gpu")
    assert {k: v for k, v in meta.items() if k.startswith(("model.", "runtime."))} == {
        "model.name": "vit",
        "model.depth": 12,
        "model.attn.heads": 8,
        "runtime.bf16": True,
    }
    assert {"system.platform", "system.python_version", "system.hostname", "system.user"} <= set(meta)


def test_never_raises_on_hostile_input(tmp_path):
    class Exploding(Mapping):  # a config object whose every read blows up
        def __getitem__(self, key):
            raise RuntimeError("boom")

        def __iter__(self):
            raise RuntimeError("boom")

        def __len__(self):
            raise RuntimeError("boom")

    root = tmp_path / "cgroup"
    (root / "memory.max").mkdir(parents=True)  # a directory where a file should be
    meta = collect_compute_metadata(Exploding(), environ={"PATH": "", "SLURM_CPUS_ON_NODE": "??"}, cgroup_root=root)
    assert meta["compute.gpu_count"] == 0
    assert not any(k.startswith(("model.", "runtime.")) for k in meta)  # the config was skipped, nothing else
    assert {"system.platform", "compute.cpu_count", "compute.memory_gb"} <= set(meta)


def test_describe_line():
    assert describe({"compute.cpu_count": 8, "compute.gpu_count": 4}) == "8 CPUs, 4 GPUs"
    assert (
        describe({"compute.cpu_count": 1, "compute.gpu_count": 1, "compute.gpu_type": "a100"}) == "1 CPU, 1 GPU (a100)"
    )


TRAINING_JOB = textwrap.dedent("""
    import wandb
    from wandb_assets.instrument import StepAxis, attach_compute_metadata

    run = wandb.init(project="jobs", id="job0001", mode="offline")
    attach_compute_metadata(run, {"model": {"depth": 2}},
                            environ={"PATH": "", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "77",
                                     "SLURM_CPUS_PER_TASK": "8"})
    axis = StepAxis(run, "env")
    for i in range(3):
        axis.log(step=1000 * i, reward=0.5 * i)
    run.finish()
""")


def test_helpers_on_a_real_offline_run(tmp_path):
    env = {**os.environ, "WANDB_DIR": str(tmp_path), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, "-c", TRAINING_JOB], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("8 CPUs, 2 GPUs")
    (path,) = find_run_files(tmp_path)
    run = read_run(path)
    assert (run.run_id, run.exit_code) == ("job0001", 0)
    assert {k: run.config[k] for k in ("compute.gpu_count", "compute.cpu_count", "slurm.job_id", "model.depth")} == {
        "compute.gpu_count": 2,
        "compute.cpu_count": 8,
        "slurm.job_id": "77",
        "model.depth": 2,
    }
    assert {"name": "", "glob_name": "env/*", "step_metric": "env/step"} in run.metrics
    assert {"name": "env/step", "glob_name": "", "step_metric": ""} in run.metrics
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]
    assert rows == [
        {"env/step": 0, "env/reward": 0},
        {"env/step": 1000, "env/reward": 0.5},
        {"env/step": 2000, "env/reward": 1},
    ]
    assert [row["_step"] for row in run.history] == [0, 1, 2]  # W&B's own step untouched: no step= was passed
