"""The repository's SQLite instance storage: a batch of asset events stored in one transaction per shard, and read
back exactly as Dagster's own storage stores them one by one.

Real parts: the repository's ``dagster.yaml`` (``storage: custom:``) loaded as Dagster loads it, real SQLite files,
one real partitioned job run; the reference is Dagster's ``storage: sqlite:`` in the same folder layout.
"""

import yaml
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    EventRecordsFilter,
    MaterializeResult,
    StaticPartitionsDefinition,
    asset,
    define_asset_job,
)
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log import SqliteEventLogStorage

from tests.conftest import REPO
from wandb_assets.instance_storage import BatchedSqliteEventLogStorage, BatchedSqliteStorage

DAYS = StaticPartitionsDefinition(["2026-01-01", "2026-01-02", "2026-01-03"])


@asset(partitions_def=DAYS)
def per_day(context) -> MaterializeResult:
    return MaterializeResult(metadata={"days": len(context.partition_keys)})


@asset(partitions_def=DAYS, deps=[per_day])
def per_day_after(context) -> MaterializeResult:
    return MaterializeResult(metadata={"days": len(context.partition_keys)})


DEFS = Definitions(assets=[per_day, per_day_after], jobs=[define_asset_job("both", [per_day, per_day_after])])


def _instance(home, storage: dict) -> DagsterInstance:
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["storage"] = storage
    for key in ("local_artifact_storage", "compute_logs"):
        config[key]["config"]["base_dir"] = str(home / key)
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def _backfill(instance: DagsterInstance) -> list[tuple]:
    """One run over the three partitions; what the event log then says of the two assets, cross-run (index
    shard) and in the run (its shard)."""
    result = DEFS.resolve_job_def("both").execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": "2026-01-01", "dagster/asset_partition_range_end": "2026-01-03"},
    )
    assert result.success
    seen = []
    for key in ("per_day", "per_day_after"):
        for kind in (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_MATERIALIZATION_PLANNED):
            records = instance.get_event_records(EventRecordsFilter(kind, asset_key=AssetKey(key)), ascending=True)
            # (Dagster emits a step's partitions in set order: which comes first varies from process to process.)
            seen.append((key, kind.value, sorted(r.partition_key for r in records), {r.run_id for r in records}))
            if kind == DagsterEventType.ASSET_MATERIALIZATION:
                stored_last = records[-1]
        latest = instance.get_latest_materialization_event(AssetKey(key))  # the asset's row: the last one stored
        seen.append((key, "latest", latest.dagster_event.partition == stored_last.partition_key, latest.run_id))
        seen.append((key, "materialized", sorted(instance.get_materialized_partitions(AssetKey(key)))))
    logged = instance.all_logs(result.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    seen.append(("run shard", sorted((e.dagster_event.asset_key.path[0], e.dagster_event.partition) for e in logged)))
    this_run = (result.run_id, {result.run_id})
    return [tuple("run" if part in this_run else part for part in row) for row in seen]


EXPECTED = [
    ("per_day", "ASSET_MATERIALIZATION", ["2026-01-01", "2026-01-02", "2026-01-03"], "run"),
    ("per_day", "ASSET_MATERIALIZATION_PLANNED", ["2026-01-01", "2026-01-02", "2026-01-03"], "run"),
    ("per_day", "latest", True, "run"),
    ("per_day", "materialized", ["2026-01-01", "2026-01-02", "2026-01-03"]),
    ("per_day_after", "ASSET_MATERIALIZATION", ["2026-01-01", "2026-01-02", "2026-01-03"], "run"),
    ("per_day_after", "ASSET_MATERIALIZATION_PLANNED", ["2026-01-01", "2026-01-02", "2026-01-03"], "run"),
    ("per_day_after", "latest", True, "run"),
    ("per_day_after", "materialized", ["2026-01-01", "2026-01-02", "2026-01-03"]),
    (
        "run shard",
        [("per_day", d) for d in ("2026-01-01", "2026-01-02", "2026-01-03")]
        + [("per_day_after", d) for d in ("2026-01-01", "2026-01-02", "2026-01-03")],
    ),
]


def test_the_repository_instance_stores_a_runs_asset_events_in_batches_read_back_as_dagster_stores_them(
    tmp_path, monkeypatch
):
    batches = []
    original = BatchedSqliteEventLogStorage.store_event_batch

    def counted(self, events):
        batches.append(sorted({e.dagster_event_type.value for e in events}) + [len(events)])
        return original(self, events)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "store_event_batch", counted)
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    repository = yaml.safe_load((REPO / "dagster.yaml").read_text())["storage"]
    repository["custom"]["config"]["base_dir"] = str(tmp_path / "batched" / "storage")  # not the repository's
    with _instance(tmp_path / "batched", repository) as instance:
        assert type(instance.event_log_storage) is BatchedSqliteEventLogStorage  # as loaded from dagster.yaml
        assert instance.get_ref().storage_data.class_name == BatchedSqliteStorage.__name__
        assert _backfill(instance) == EXPECTED
    # the planned events of the run (2 assets x 3 partitions) as one batch, then each step's materializations
    assert batches == [
        ["ASSET_MATERIALIZATION_PLANNED", 6],
        ["ASSET_MATERIALIZATION", 3],
        ["ASSET_MATERIALIZATION", 3],
    ]
    # Dagster's own storage, event by event, reads back the same
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE")
    with _instance(tmp_path / "dagster", {"sqlite": {"base_dir": str(tmp_path / "dagster" / "storage")}}) as plain:
        assert type(plain.event_log_storage) is SqliteEventLogStorage
        assert _backfill(plain) == EXPECTED


def test_a_run_connects_through_one_kept_engine_per_sqlite_file(tmp_path, monkeypatch):
    """Dagster's SQLite storages make a new SQLAlchemy engine for every connection; the repository's keeps one per
    file: a whole run (dozens of events, each two transactions, and the run's status updates) makes at most one
    engine for each file it touches first, and reads back as Dagster's own storage stores it (above)."""
    from wandb_assets import instance_storage

    made = []
    original = instance_storage.create_engine

    def counted(conn_string, **kwargs):
        made.append(conn_string.rsplit("/", 1)[-1])
        return original(conn_string, **kwargs)

    repository = yaml.safe_load((REPO / "dagster.yaml").read_text())["storage"]
    repository["custom"]["config"]["base_dir"] = str(tmp_path / "kept" / "storage")
    with _instance(tmp_path / "kept", repository) as instance:
        assert type(instance.run_storage) is instance_storage.CachedEngineSqliteRunStorage
        monkeypatch.setattr(instance_storage, "create_engine", counted)
        assert _backfill(instance) == EXPECTED
        run_id = instance.get_runs(limit=1)[0].run_id
        stored = len(instance.all_logs(run_id))
    assert stored >= 20
    # the run's own shard once; the index shard and runs.db at most once (kept since the instance opened)
    assert made.count(f"{run_id}.db") == 1
    assert len(made) == len(set(made)) <= 3


def test_the_engine_cache_keeps_the_most_recently_used_and_disposes_the_rest():
    from wandb_assets.instance_storage import EngineCache

    cache = EngineCache(size=2)
    a, b = cache.engine("sqlite:///a.db"), cache.engine("sqlite:///b.db")
    assert cache.engine("sqlite:///a.db") is a  # used again: now the most recent
    cache.engine("sqlite:///c.db")  # b, the least recently used, leaves
    assert len(cache) == 2 and cache.engine("sqlite:///a.db") is a
    assert cache.engine("sqlite:///b.db") is not b  # made again when asked again


def test_a_batch_whose_index_transaction_fails_is_stored_once_in_each_shard(tmp_path, monkeypatch):
    """Finding 11 of code-review-2026-11c: the index transaction of the planned batch fails once mid-batch ('database
    is locked' on the shared index): Dagster falls back to storing the events one by one, and every event is still in
    its run's log once (6 planned, not 12) and in the index once."""
    original = BatchedSqliteEventLogStorage._store_asset_event
    calls = {"n": 0}

    def flaky(self, conn, event, event_id):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("database is locked")
        return original(self, conn, event, event_id)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "_store_asset_event", flaky)
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    repository = yaml.safe_load((REPO / "dagster.yaml").read_text())["storage"]
    repository["custom"]["config"]["base_dir"] = str(tmp_path / "batched" / "storage")
    with _instance(tmp_path / "batched", repository) as instance:
        assert _backfill(instance) == EXPECTED
        run_id = instance.get_runs()[0].run_id
        planned = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
        assert len(planned) == 6
    assert calls["n"] > 2  # the failure happened and the fallback indexed the rest


def _open_at_once(base_dir: str, barrier, answers) -> None:
    try:
        barrier.wait(timeout=60)
        BatchedSqliteStorage(base_dir)
        answers.put("opened")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        answers.put(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")


def test_processes_opening_a_fresh_storage_at_once_each_open_it_and_it_has_one_schema(tmp_path):
    """Dagster creates and stamps a fresh SQLite storage's schema unguarded: six processes opening a new one at once
    failed in 10 of 10 trials without the opening lock ("table runs already exists", a second alembic revision), and
    every later opening could fail. With it each opens it, and each database holds one alembic revision."""
    import multiprocessing
    import sqlite3

    context = multiprocessing.get_context("fork")
    processes = 6
    barrier, answers = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_open_at_once, args=(str(tmp_path), barrier, answers), daemon=True)
        for _ in range(processes)
    ]  # daemons: one stuck never keeps the test's process from ending
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert sorted(answers.get(timeout=5) for _ in range(processes)) == ["opened"] * processes
    storage = BatchedSqliteStorage(str(tmp_path))
    assert list(storage.run_storage.get_runs()) == []
    for database in ("history/runs.db", "schedules/schedules.db", "history/runs/index.db"):
        with sqlite3.connect(tmp_path / database) as con:
            assert con.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,), database


def _entry(run_id: str, message: str):
    import time

    from dagster._core.events.log import EventLogEntry

    return EventLogEntry(error_info=None, level="INFO", user_message=message, run_id=run_id, timestamp=time.time())


def test_the_ui_watching_a_run_sees_each_event_as_it_is_stored(tmp_path):
    """The kept connections hold each file's WAL open, where a closed connection wrote it into the file: the UI
    follows a running run by watching its shard's file (Dagster's ``SqliteEventLogStorageWatchdog``), so each run-shard
    transaction is checkpointed into the file. Events stored after the watch starts reach the watcher (with those
    before it: no cursor), in order."""
    import threading

    storage = BatchedSqliteEventLogStorage(str(tmp_path))
    storage.store_event(_entry("r1", "before"))
    seen: list[str] = []
    four = threading.Event()

    def watcher(entry, cursor):
        seen.append(entry.user_message)
        if len(seen) == 4:
            four.set()

    storage.watch("r1", None, watcher)
    try:
        for message in ("one", "two", "three"):
            storage.store_event(_entry("r1", message))
        four.wait(timeout=60)  # inotify's notice; returns at the fourth event
    finally:
        storage.end_watch("r1", watcher)
        storage.dispose()
    assert seen == ["before", "one", "two", "three"]


def test_a_wiped_event_log_writes_its_next_events_into_new_files(tmp_path):
    """Dagster's ``wipe`` deletes the run shards' files: a connection kept to a deleted file would write where no
    other connection or process ever reads. The next events are in the new file, read by a fresh connection."""
    import sqlite3

    storage = BatchedSqliteEventLogStorage(str(tmp_path))
    storage.store_event(_entry("r1", "old"))
    storage.wipe()
    storage.store_event(_entry("r1", "new"))
    with sqlite3.connect(tmp_path / "r1.db") as con:
        stored = [row[0] for row in con.execute("SELECT event FROM event_logs ORDER BY id")]
    assert [e for e in stored if '"new"' in e] and not [e for e in stored if '"old"' in e]


def test_a_forked_child_never_uses_its_parents_kept_connections(tmp_path):
    """A child forked after the parent connected starts with no engine (SQLAlchemy: a pooled connection must not
    cross a fork); the parent's stays usable."""
    import os

    from sqlalchemy import text

    from wandb_assets.instance_storage import EngineCache

    cache = EngineCache(size=4)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    engine = cache.engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when it holds none of the parent's engines
        os._exit(0 if len(cache) == 0 and cache.engine(url) is not engine else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert cache.engine(url) is engine
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1


def test_the_run_storage_knows_a_stored_plan_by_its_id_without_unpacking_it(tmp_path, monkeypatch):
    """Every run's creation asks whether its execution plan's snapshot is stored; Dagster's SQL run storage unpacks
    the whole stored plan to answer. The repository's answers from the id: the same answers, nothing unpacked."""
    from wandb_assets import instance_storage

    repository = yaml.safe_load((REPO / "dagster.yaml").read_text())["storage"]
    repository["custom"]["config"]["base_dir"] = str(tmp_path / "kept" / "storage")
    with _instance(tmp_path / "kept", repository) as instance:
        assert _backfill(instance) == EXPECTED
        plan = instance.get_runs(limit=1)[0].execution_plan_snapshot_id
        storage = instance.run_storage
        assert isinstance(storage, instance_storage.CachedEngineSqliteRunStorage)
        assert storage.get_execution_plan_snapshot(plan) is not None  # stored, as Dagster reads it

        def unpacked(*args, **kwargs):
            raise AssertionError("unpacked a stored plan to answer whether it is stored")

        monkeypatch.setattr(storage, "_get_snapshot", unpacked)
        assert storage.has_execution_plan_snapshot(plan) is True
        assert storage.has_execution_plan_snapshot("0" * 40) is False
        one_day = {f"dagster/asset_partition_range_{end}": "2026-01-01" for end in ("start", "end")}
        again = DEFS.resolve_job_def("both").execute_in_process(instance=instance, tags=one_day)  # its plan found
        assert again.success and again.dagster_run.execution_plan_snapshot_id == plan


def test_an_engine_opens_as_many_connections_as_are_asked_for_at_once_and_keeps_one(tmp_path):
    """A webserver's threads may each need a file at once: none waits for another's connection (Dagster's opened one
    for each); once they are all given back, one stays open for the next transaction."""
    from sqlalchemy import text

    from wandb_assets.instance_storage import EngineCache

    engine = EngineCache(size=4).engine(f"sqlite:///{tmp_path / 'runs.db'}")
    held = [engine.connect() for _ in range(40)]
    assert [conn.execute(text("SELECT 1")).scalar() for conn in held] == [1] * 40
    for conn in held:
        conn.close()
    assert engine.pool.checkedin() == 1
