"""Read a ``.wandb`` transaction log (what ``wandb.init`` writes, online or offline) back into Python, record by
record (the tests' view of what a run logged). The framing is ``offline_runs.read_frames``: a truncated tail
(a killed process) is tolerated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb_assets.lib.offline_runs import HEADER, read_frames


def iter_records(path: str | Path) -> Iterator[Any]:
    """Yield each ``Record`` of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path} is not a .wandb file (bad header)")
    payloads, _ = read_frames(data)
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _value(item) -> Any:
    return json.loads(item.value_json) if item.value_json else None


def _key(item) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key


@dataclass
class RunLog:
    """What a ``.wandb`` file says a run logged."""

    run_id: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    exit_code: int | None = None


def read_run(path: str | Path) -> RunLog:
    """Collect config, summary, history, metric definitions, artifacts and files from a ``.wandb`` file."""
    log = RunLog()
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            log.run_id, log.project = record.run.run_id, record.run.project
            for item in record.run.config.update:
                log.config[_key(item)] = _value(item)
        elif kind == "config":
            for item in record.config.update:
                log.config[_key(item)] = _value(item)
        elif kind == "summary":
            for item in record.summary.update:
                log.summary[_key(item)] = _value(item)
        elif kind == "history":
            log.history.append({_key(item): _value(item) for item in record.history.item})
        elif kind == "metric":
            m = record.metric
            log.metrics.append({"name": m.name, "glob_name": m.glob_name, "step_metric": m.step_metric})
        elif kind == "artifact":
            a = record.artifact
            log.artifacts.append(
                {
                    "name": a.name,
                    "type": a.type,
                    "aliases": list(a.aliases),
                    "metadata": json.loads(a.metadata) if a.metadata else {},
                    "files": [entry.path for entry in a.manifest.contents],
                    "local_paths": {entry.path: entry.local_path for entry in a.manifest.contents},
                    "ttl_duration_seconds": a.ttl_duration_seconds,
                }
            )
        elif kind == "files":
            log.files += [f.path for f in record.files.files]
        elif kind == "exit":
            log.exit_code = record.exit.exit_code
    return log


def find_run_files(wandb_dir: str | Path) -> list[Path]:
    """Every ``run-*.wandb`` under a ``WANDB_DIR``, oldest first."""
    return sorted(Path(wandb_dir).rglob("run-*.wandb"), key=lambda p: p.stat().st_mtime)
