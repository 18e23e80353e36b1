"""The warehouse resource: dagster-duckdb's resource, made to create its folder and schema and to always
close its connection (the upstream context manager skips ``close()`` when the body raises, which would
keep DuckDB's file lock until garbage collection)."""

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import duckdb
from dagster_duckdb import DuckDBResource
from pydantic import PrivateAttr

from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.lake import Lake, LakeMissingError, is_lake
from wandb_assets.lib.lake import connect as lake_connect
from wandb_assets.lib.warehouse import ensure_schema
from wandb_assets.settings import load_settings, warehouse_location
from wandb_assets.warehouse import file_open_error, memory_limit_config

#: Every asset that writes the warehouse runs in this Dagster concurrency pool; `dagster.yaml` limits pools
#: to one slot, so a backfill and a tick never fight over DuckDB's single-writer file lock.
WAREHOUSE_POOL = "warehouse"


class WarehouseResource(DuckDBResource):
    """Read-write connections to the DuckDB warehouse file.

    ``home_entity``/``home_project``: the configured W&B project (``WANDB_ENTITY``/``WANDB_PROJECT``), given to
    the offline rows of a warehouse written before runs carried their project when it is migrated."""

    home_entity: str | None = None
    home_project: str | None = None

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
            ensure_schema(con, home=(self.home_entity, self.home_project))
            yield con

    @property
    def lake(self) -> Lake | None:
        """The DuckLake this resource writes (``database`` is ``ducklake:postgres:...``), else None."""
        if not is_lake(self.database):
            return None
        return warehouse_location(value=self.database)

    @contextmanager
    def get_read_connection(self) -> Iterator[duckdb.DuckDBPyConnection | None]:
        """A read-only connection (shares the file with other readers), or None when there is no warehouse yet."""
        if self.lake is None and (self.database == ":memory:" or not Path(self.database).exists()):
            yield None
            return
        with ExitStack() as stack:
            try:
                con = stack.enter_context(self._connect(read_only=True))
            except LakeMissingError:  # a new lake: nothing written yet
                con = None
            yield con

    @contextmanager
    def _connect(self, read_only: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        lake = self.lake
        if lake is not None:
            if not read_only and lake.data_path is None:
                raise ConfigError(
                    "WANDB_ASSETS_DUCKLAKE_DATA_PATH is not set: name the folder or s3:// prefix of the lake's files."
                )
            # No file lock to wait for: DuckLake commits optimistically; writers are serialised by the pool and
            # a lost commit is retried (lib.lake.retry_on_conflict).
            with self._held(lake_connect(lake, read_only=read_only), read_only) as con:
                yield con
            return
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
                newer = file_open_error(self.database, exc)
                if newer:
                    raise RuntimeError(newer) from None
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
        con.execute("SET TimeZone = 'UTC'")
        with self._held(con, read_only) as held:
            yield held

    @contextmanager
    def _held(self, con: duckdb.DuckDBPyConnection, read_only: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield ``con``, close it whatever happens, and time how long a writer held it."""
        opened = time.monotonic()
        try:
            yield con
        finally:
            con.close()
            if not read_only:
                self._last_writer_hold_s = time.monotonic() - opened


def is_lock_conflict(exc: Exception) -> bool:
    """DuckDB's answer when another process holds the file ("Could not set lock on file ... Conflicting lock")."""
    text = str(exc).lower()
    return "could not set lock" in text or "conflicting lock" in text


def warehouse_resource() -> WarehouseResource:
    """The warehouse at ``WANDB_ASSETS_DUCKDB``: an absolute file path, or the DuckLake attach string."""
    location = warehouse_location()
    settings = load_settings()
    return WarehouseResource(
        database=str(location if isinstance(location, Lake) else location.resolve()),
        home_entity=settings.WANDB_ENTITY,
        home_project=settings.WANDB_PROJECT,
        connection_config=memory_limit_config(settings.WANDB_ASSETS_DUCKDB_MEMORY_LIMIT),
    )
