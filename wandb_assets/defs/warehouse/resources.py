"""The warehouse resource: dagster-duckdb's resource, made to create its folder and schema and to always
close its connection (the upstream context manager skips ``close()`` when the body raises, which would
keep DuckDB's file lock until garbage collection)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
from dagster_duckdb import DuckDBResource
from pydantic import PrivateAttr

from wandb_assets.lib.warehouse import ensure_schema
from wandb_assets.settings import load_settings

#: Every asset that writes the warehouse runs in this Dagster concurrency pool; `dagster.yaml` limits pools
#: to one slot, so a backfill and a tick never fight over DuckDB's single-writer file lock.
WAREHOUSE_POOL = "warehouse"


class WarehouseResource(DuckDBResource):
    """Read-write connections to the DuckDB warehouse file."""

    _last_writer_hold_s: float = PrivateAttr(default=0.0)

    def last_writer_hold_s(self) -> float:
        """How long the last writer connection stayed open: what another writer would have waited at most.

        Per connection, not per resource: one resource serves every step of a run, and each step reports its own.
        """
        return self._last_writer_hold_s

    @contextmanager
    def get_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The writer connection: waits up to ``WANDB_ASSETS_LOCK_WAIT`` seconds for another process's lock."""
        with self._connect(read_only=False) as con:
            ensure_schema(con)
            yield con

    @contextmanager
    def get_read_connection(self) -> Iterator[duckdb.DuckDBPyConnection | None]:
        """A read-only connection (shares the file with other readers), or None when there is no warehouse yet."""
        if self.database == ":memory:" or not Path(self.database).exists():
            yield None
            return
        with self._connect(read_only=True) as con:
            yield con

    @contextmanager
    def _connect(self, read_only: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.database != ":memory:":
            Path(self.database).parent.mkdir(parents=True, exist_ok=True)
        wait_s = load_settings().WANDB_ASSETS_LOCK_WAIT
        deadline = time.monotonic() + wait_s
        delay = 0.1
        while True:
            try:
                con = duckdb.connect(
                    self.database,
                    read_only=read_only,
                    config={"custom_user_agent": "wandb-assets", **self.connection_config},
                )
                break
            except duckdb.IOException as exc:
                first_line = str(exc).splitlines()[0]
                if not is_lock_conflict(exc):
                    raise RuntimeError(
                        f"The warehouse {self.database} could not be opened; it looks damaged or is not a DuckDB "
                        f"file (restore it from its .snapshot.duckdb copy, or move it away and backfill): {first_line}"
                    ) from None
                if time.monotonic() + delay > deadline:
                    raise RuntimeError(
                        f"The warehouse {self.database} is locked by another process (a notebook holding it open? "
                        f"notebooks should use wandb_assets.warehouse.open_snapshot()); gave up after {wait_s:g} s "
                        f"(WANDB_ASSETS_LOCK_WAIT): {first_line}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        opened = time.monotonic()
        try:
            con.execute("SET TimeZone = 'UTC'")
            yield con
        finally:
            con.close()
            if not read_only:
                self._last_writer_hold_s = time.monotonic() - opened


def is_lock_conflict(exc: Exception) -> bool:
    """DuckDB's answer when another process holds the file ("Could not set lock on file ... Conflicting lock")."""
    return "lock" in str(exc).lower()


def warehouse_resource() -> WarehouseResource:
    """The warehouse at ``WANDB_ASSETS_DUCKDB``, as an absolute path."""
    return WarehouseResource(database=str(load_settings().WANDB_ASSETS_DUCKDB.resolve()))
