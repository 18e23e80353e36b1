"""The embedded Dagster instance's SQLite storage, writing a batch of asset events in one transaction.

A backfill of 61 days materializes ``staged_runs`` and ``runs`` once per day partition: Dagster writes an
``ASSET_MATERIALIZATION_PLANNED`` and an ``ASSET_MATERIALIZATION`` event for each, 250 events, and its SQLite event
log opens a new engine and two transactions (the run's shard and the cross-run index) for every one of them: 2.2 s
of a 10 s CLI backfill on this machine. Dagster hands such events over as one batch when
``DAGSTER_EVENT_BATCH_SIZE`` is set (the CLI sets it; its PostgreSQL storage batches them itself); the SQLite storage
then stores them one by one. This one stores a batch in one transaction per shard, the same rows as one by one.

A failed batch never duplicates or loses an event. When a batch fails, Dagster stores its events again one by one
(``store_event``). If the run's shard was written already and the index transaction failed (rolled back whole), those
events are remembered, and ``store_event`` then writes only their index part, exactly as Dagster's own does after its
run-shard insert: each event once in each shard.

Each SQLite file's engine is made once and kept (``EngineCache``), where Dagster's SQLite storages make a new
SQLAlchemy engine for every connection (for every event, twice): 20 steps of an in-process run took 1.4-1.7 s with an
engine a connection, 0.9-1.2 s with one a file. Each engine also keeps its connection between transactions (Dagster's
pool nothing): closing a file's last connection makes SQLite checkpoint and delete its WAL, and the next transaction
create it again (20 steps 0.67-0.93 -> 0.42-0.60 s). An idle connection holds no lock. The UI follows a running run by
watching its shard's file, which a WAL is not: each run-shard transaction is checkpointed into the file as it ends.

Used by the repository's ``dagster.yaml`` (``storage: custom:``); the PostgreSQL instance (``deploy/``) does not
need it. Imports Dagster only: the webserver and the daemon load it too.
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dagster._core.events import ASSET_EVENTS
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.runs import SqliteRunStorage
from dagster._core.storage.schedules import SqliteScheduleStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes.config_class import ConfigurableClassData
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine


class EngineCache:
    """SQLAlchemy engines by SQLite connection string, made once each, the ``size`` most recently used kept (a
    long-lived webserver sees a file per run). Each engine keeps one idle connection (``pool_size=1``; as many more
    as threads need at once, as Dagster's, each closed after its use): an idle connection holds no lock, and SQLite
    checkpoints and deletes a file's WAL whenever its last connection closes, which every transaction paid when each
    connection was closed after it. A process forked with engines here never uses them (``os.register_at_fork``):
    the child starts with none."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()
        _CACHES.add(self)

    def engine(self, conn_string: str, **connect_args) -> Engine:
        with self._lock:
            engine = self._engines.get(conn_string)
            if engine is None:
                engine = create_engine(conn_string, pool_size=1, max_overflow=-1, connect_args=connect_args)
                self._engines[conn_string] = engine
                while len(self._engines) > self.size:
                    self._engines.popitem(last=False)[1].dispose()
            else:
                self._engines.move_to_end(conn_string)
            return engine

    def clear(self) -> None:
        """Close every kept connection and forget the engines (before their files are deleted)."""
        with self._lock:
            while self._engines:
                self._engines.popitem()[1].dispose()

    def _forget(self) -> None:
        """In a forked child: the parent's connections are the parent's; never used nor closed here."""
        self._lock = threading.Lock()
        for engine in self._engines.values():
            engine.dispose(close=False)
        self._engines = OrderedDict()

    def __len__(self) -> int:
        return len(self._engines)


_CACHES: weakref.WeakSet[EngineCache] = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [cache._forget() for cache in list(_CACHES)])


class CachedEngineSqliteRunStorage(SqliteRunStorage):
    """``SqliteRunStorage`` connecting through one kept engine (Dagster's makes one per connection)."""

    _engines = EngineCache(size=8)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._engines.engine(self._conn_string).connect() as conn:
            with conn.begin():
                yield conn

    def has_execution_plan_snapshot(self, execution_plan_snapshot_id: str) -> bool:
        """Whether the snapshot is stored, by its id (as ``has_job_snapshot``). Dagster's reads and unpacks the whole
        plan to answer: ~0.1 s of every run's creation."""
        return self._has_snapshot_id(execution_plan_snapshot_id)


class BatchedSqliteEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` whose ``store_event_batch`` writes one run's asset events in one transaction on
    the run's shard and one on the index shard (what ``store_event`` writes for each, in order)."""

    def __init__(self, *args, **kwargs) -> None:
        self._engines = EngineCache()  # before Dagster's __init__, which may connect (a new index shard)
        super().__init__(*args, **kwargs)
        #: Events of a failed batch already in their run's shard, by ``id`` (the objects are kept, so an id is never
        #: reused meanwhile): Dagster's fallback stores each again through ``store_event``, which then indexes it only.
        self._in_run_shard: dict[int, EventLogEntry] = {}
        self._pending_lock = threading.Lock()

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        """Dagster's ``_connect`` (one transaction on the shard's file, its schema made on first use) through the
        shard's kept engine instead of a new one each time."""
        with self._db_lock:
            engine = self._engines.engine(self.conn_string_for_shard(shard), timeout=SQLITE_BUSY_TIMEOUT_SECONDS)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn:
                with conn.begin():
                    yield conn
                if shard != INDEX_SHARD_NAME:
                    # The UI follows a run by watching its shard's main file (``SqliteEventLogStorageWatchdog``):
                    # written at once, as when each connection closed, not at SQLite's automatic checkpoint.
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def wipe(self) -> None:
        self._engines.clear()  # Dagster's deletes the shards' files: no kept connection may write to them after
        super().wipe()

    def dispose(self) -> None:
        super().dispose()
        self._engines.clear()

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        run_ids = {event.run_id for event in events}
        if len(run_ids) != 1 or not all(
            event.is_dagster_event and event.dagster_event_type in ASSET_EVENTS for event in events
        ):
            super().store_event_batch(events)  # one by one, as Dagster's own
            return
        with self.run_connection(events[0].run_id) as conn:
            conn.execute(self.prepare_insert_event_batch(events))
        # Mirrored into the cross-run index, each with its id there (its tags and the asset's row refer to it).
        try:
            with self.index_transaction() as conn:
                event_ids = []
                for event in events:
                    with db_result(conn, self.prepare_insert_event(event)) as result:
                        event_ids.append(result.inserted_primary_key[0])
                self._store_asset_event_tags(conn, events, event_ids)
                for event, event_id in zip(events, event_ids, strict=True):
                    self._store_asset_event(conn, event, event_id)
        except Exception:
            with self._pending_lock:  # in the run's shard already: the fallback indexes them, nothing more
                self._in_run_shard.update((id(event), event) for event in events)
            raise

    def store_event(self, event: EventLogEntry) -> None:
        with self._pending_lock:
            in_run_shard = self._in_run_shard.get(id(event)) is event
            if in_run_shard:
                del self._in_run_shard[id(event)]
        if not in_run_shard:
            super().store_event(event)
            return
        # What Dagster's store_event writes to the index for an asset event after its run-shard insert.
        with self.index_transaction() as conn:
            with db_result(conn, self.prepare_insert_event(event)) as result:
                event_id = result.inserted_primary_key[0]
            self._store_asset_event_tags(conn, [event], [event_id])
            self._store_asset_event(conn, event, event_id)


#: Under ``base_dir``: held while a process opens the storage. Dagster creates and stamps a fresh storage's schema
#: unguarded, so processes opening a new one at once (a command and the UI's code server, two commands on a fresh
#: ``DAGSTER_HOME``) both did: "table runs already exists", a second alembic head, and every later opening failed.
OPENING_LOCK = ".opening.lock"


class BatchedSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage (``storage: sqlite:``, the same files under ``base_dir``) with the batched event
    log, each file's engine kept, opened by one process at a time (``OPENING_LOCK``)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        Path(base_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(base_dir) / OPENING_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, also by a process that dies holding it
            # DagsterSqliteStorage's own __init__ with these two storages (its would open a run storage first only to
            # be replaced: 17 ms of every command's start)
            self.base_dir = base_dir
            self._run_storage = CachedEngineSqliteRunStorage.from_local(_runs_directory(base_dir))
            self._event_log_storage = BatchedSqliteEventLogStorage(_event_logs_directory(base_dir))
            self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
            self._inst_data = inst_data
            super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: dict) -> BatchedSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)  # Dagster's names its own class, not ``cls``
