"""Housekeeping that scale needs: a DuckLake's snapshots expired and small files merged, a DuckDB file checkpointed.

A lake written every 15 minutes keeps a snapshot per commit (tens of thousands a year; a catalog with 150k is
reported to take a minute or more to open) and a small Parquet file (or inlined rows) per write. Daily:
inlined rows are written out, files mostly deleted rewritten, adjacent small files merged, snapshots older
than the retention expired (time travel goes back that far, no further), and files nothing refers to any more
deleted a day after they were dropped (a reader scanning them by then is not expected). A DuckDB file is
checkpointed (its write-ahead log folded in): DuckDB already does that as the last connection closes
(checked: no ``.wal`` after a load), so this only matters after a writer was killed. Rows are never changed.
No Dagster here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from wandb_assets.lib.lake import in_lake

#: Files a lake no longer refers to are deleted this long after they were dropped (readers may still scan them).
UNREFERENCED_FILES_GRACE = timedelta(days=1)


def _lake_counts(con, alias: str) -> dict[str, int]:
    """Snapshots and live data files of the lake attached as ``alias``."""
    catalog = f"__ducklake_metadata_{alias}"
    snapshots = con.execute("SELECT count(*) FROM ducklake_snapshots(?)", [alias]).fetchone()[0]
    files = con.execute(f"SELECT count(*) FROM {catalog}.ducklake_data_file WHERE end_snapshot IS NULL").fetchone()[0]
    return {"snapshots": snapshots, "data_files": files}


def maintain_lake(con, now: datetime, snapshot_retention: timedelta) -> dict[str, int]:
    """Flush inlined rows, rewrite files mostly deleted, merge adjacent files, expire snapshots older than
    ``now - snapshot_retention`` and delete files unreferenced for ``UNREFERENCED_FILES_GRACE``, on the lake that
    is ``con``'s current database. Returns the snapshots and live data files before and after, and the files
    deleted."""
    alias = con.execute("SELECT current_database()").fetchone()[0]
    before = _lake_counts(con, alias)
    con.execute("CALL ducklake_flush_inlined_data(?)", [alias])
    con.execute("CALL ducklake_rewrite_data_files(?)", [alias])  # files mostly deleted by window rewrites
    con.execute("CALL ducklake_merge_adjacent_files(?)", [alias])
    con.execute("CALL ducklake_expire_snapshots(?, older_than => ?::TIMESTAMPTZ)", [alias, now - snapshot_retention])
    deleted = con.execute(
        "CALL ducklake_cleanup_old_files(?, older_than => ?::TIMESTAMPTZ)", [alias, now - UNREFERENCED_FILES_GRACE]
    ).fetchall()
    after = _lake_counts(con, alias)
    return {
        "snapshots_before": before["snapshots"],
        "snapshots_after": after["snapshots"],
        "data_files_before": before["data_files"],
        "data_files_after": after["data_files"],
        "files_deleted": len(deleted),
    }


def checkpoint(con) -> None:
    """Fold a DuckDB file's write-ahead log into the file (nothing to do for a lake: its commits are files)."""
    if not in_lake(con):
        con.execute("CHECKPOINT")
