"""The analysts' snapshot of the warehouse: where it lives and how it is swapped in. No Dagster here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def snapshot_file(warehouse_path: str | os.PathLike) -> Path:
    """``x.duckdb`` -> ``x.snapshot.duckdb``, in the same folder."""
    path = Path(warehouse_path)
    return path.with_name(f"{path.stem}.snapshot{path.suffix or '.duckdb'}")


def publish_snapshot(con, warehouse_path: str | os.PathLike) -> Path:
    """Copy the warehouse next to itself and swap the copy in atomically. Call with the writer connection
    open and idle: its file lock keeps any other writer out while the checkpointed file is copied."""
    target = snapshot_file(warehouse_path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    con.execute("CHECKPOINT")
    try:
        shutil.copyfile(warehouse_path, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
