"""Upgrades: every warehouse schema the project has shipped migrates in place, on a DuckDB file, on DuckLake with a
DuckDB catalog and on DuckLake with a PostgreSQL catalog (the suite's real server), with and without
WANDB_ASSETS_PROJECTS on the first tick: no row lost, none vanished, no alert re-keyed but in place, every invariant
holding. Finding 3 and 7 of code-review-2026-11c (the first tick after an upgrade vanished every old running run;
a pre-project lake failed to migrate).

The fixtures were written by the code of each version (``tests/fixtures/README.md``): ``warehouse-before-projects``
by 6a544c8 (one project, keys without it), ``warehouse-668aee2`` by 668aee2's demo (three projects in two entities).
The first tick is emulated at the warehouse's interface, as ``staged_runs`` and ``runs`` call it: the unfinished runs
read (read-only) from the old warehouse, asked for by id, returned by W&B as they are, then loaded by a writer that
migrates first."""

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from tests.conftest import PG_PASSWORD
from wandb_assets.lib import lake
from wandb_assets.lib.alerts import RULE_FUNCTIONS, AlertThresholds, evaluate_rules, reconcile
from wandb_assets.lib.checks import broken
from wandb_assets.lib.warehouse import (
    ASKED_KEY,
    WHOLE_KEY,
    ensure_schema,
    load_runs_window,
    ndjson_lines,
    record_projects,
    unfinished_runs_by_project,
)

FIXTURES = Path(__file__).parent / "fixtures"
#: fixture -> (the project a one-project configuration names, whether its alert keys named their project)
VERSIONS = {
    "warehouse-before-projects": (("team", "fleet"), False),
    "warehouse-668aee2": (("demo-team", "fleet-demo"), True),
}


def _connect(backend: str, tmp_path: Path, postgres) -> duckdb.DuckDBPyConnection:
    if backend == "duckdb-file":
        con = duckdb.connect(str(tmp_path / "w.duckdb"))
        con.execute("SET TimeZone = 'UTC'")
        return con
    (tmp_path / "lake-files").mkdir()
    files = str(tmp_path / "lake-files") + "/"
    if backend == "ducklake-postgres-catalog":
        from tests.test_ducklake import _catalog

        return lake.connect(lake.Lake(catalog=_catalog(postgres), data_path=files))
    con = duckdb.connect(":memory:")  # a lake whose catalog is a DuckDB file (what a laptop or a test may run)
    lake.load_extensions(con, None)
    con.execute(f"ATTACH 'ducklake:{tmp_path / 'meta.ducklake'}' AS warehouse (DATA_PATH '{files}')")
    con.execute("USE warehouse")
    con.execute("SET TimeZone = 'UTC'")
    return con


def _import(con, folder: Path) -> None:
    """The fixture's tables as that version wrote them (its views are made again by the migration)."""
    for statement in (folder / "schema.sql").read_text().split(";;"):
        if statement.strip().startswith("CREATE TABLE"):
            con.execute(statement)
    con.execute((folder / "load.sql").read_text().replace("{dir}", str(folder)))


def _staged(path: Path, rows: list[dict], fetched_at: datetime, whole: list[str], asked: dict | None = None) -> str:
    header = {WHOLE_KEY: whole, **({ASKED_KEY: asked} if asked is not None else {})}
    path.write_text(json.dumps(header) + "\n" + "".join(ndjson_lines(rows, fetched_at)))
    stamp = fetched_at.replace(tzinfo=UTC).timestamp()
    os.utime(path, (stamp, stamp))
    return str(path)


@pytest.mark.parametrize("with_projects", [False, True], ids=["WANDB_PROJECT", "WANDB_ASSETS_PROJECTS"])
@pytest.mark.parametrize(
    "backend",
    # the PostgreSQL catalog starts a server per case (40 s of the everyday tier under a busy loop): slow tier
    ["duckdb-file", "ducklake-duckdb-catalog", pytest.param("ducklake-postgres-catalog", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("version", list(VERSIONS))
def test_every_shipped_schema_migrates_in_place_and_the_first_tick_loses_nothing(
    version, backend, with_projects, tmp_path, postgres, monkeypatch
):
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    home, scoped_keys = VERSIONS[version]
    con = _connect(backend, tmp_path, postgres)
    _import(con, FIXTURES / version)
    rows_before = con.execute("SELECT run_id, state FROM runs ORDER BY ALL").fetchall()
    open_before = con.execute("SELECT alert_key, subject FROM alerts WHERE resolved_at IS NULL ORDER BY 1").fetchall()
    last_tick = con.execute("SELECT max(snapshot_at) FROM fleet_metrics").fetchone()[0]  # the rules' last look
    newest = con.execute("SELECT max(created_at) FROM runs").fetchone()[0]
    start = datetime.combine(newest.date() + timedelta(days=2), datetime.min.time())  # the tick, two days on

    # staged_runs, on the old warehouse (read-only there): what it asks W&B for by id.
    unfinished = unfinished_runs_by_project(con, start)
    if not with_projects and "" in unfinished:
        unfinished.setdefault(f"{home[0]}/{home[1]}", []).extend(unfinished.pop(""))
    listed = (
        con.execute("SELECT DISTINCT entity || '/' || project FROM runs ORDER BY 1").fetchall()
        if (scoped_keys)
        else [(f"{home[0]}/{home[1]}",)]
    )
    mirrored = [p for (p,) in listed] if with_projects else [f"{home[0]}/{home[1]}"]
    asked = {project: unfinished.get(project, []) for project in mirrored}
    assert (
        sum(map(len, asked.values()))
        == con.execute(
            "SELECT count(*) FROM runs WHERE state IN ('running', 'pending', 'preempting') AND created_at < $s "
            "AND coalesce(source, 'wandb') = 'wandb'",
            {"s": start},
        ).fetchone()[0]
    ), "every old alive run is asked for by id"

    # runs: a writer migrates, then loads what W&B returned (every run as it was, read an hour after the last).
    ensure_schema(con, home=home)
    fetched = con.execute("SELECT max(ingested_at) FROM runs").fetchone()[0] + timedelta(hours=1)
    columns = [r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE runs)").fetchall()]

    def returned(where: str, params: dict) -> list[dict]:
        found = con.execute(f"SELECT * FROM runs WHERE {where}", params).fetchall()
        return [{k: v for k, v in zip(columns, r, strict=True) if k != "ingested_at"} for r in found]

    window_rows = returned(
        "created_at >= $s AND entity || '/' || project IN (SELECT unnest($m::VARCHAR[]))", {"s": start, "m": mirrored}
    )
    by_id_rows = returned(
        "(entity || '/' || project, run_id) IN (SELECT unnest($p::VARCHAR[]), unnest($r::VARCHAR[]))",
        {"p": [p for p, ids in asked.items() for _ in ids], "r": [i for ids in asked.values() for i in ids]},
    )
    window = _staged(tmp_path / f"{start:%Y-%m-%d}.ndjson", window_rows, fetched, mirrored)
    by_id = _staged(tmp_path / "refreshed.ndjson", by_id_rows, fetched, mirrored, asked)
    load_runs_window(con, [window], start, start + timedelta(days=3), [by_id], prices=[("H100-80GB", 2.99)])
    e, p = zip(*(m.split("/") for m in mirrored), strict=True)
    record_projects(con, [{"entity": a, "project": b, "error": None} for a, b in zip(e, p, strict=True)], fetched)

    assert con.execute("SELECT run_id, state FROM runs ORDER BY ALL").fetchall() == rows_before  # none lost
    assert con.execute("SELECT count(*) FROM runs WHERE list_contains(anomalies, 'vanished')").fetchone() == (0,)
    assert con.execute(
        "SELECT column_name, is_nullable FROM information_schema.columns WHERE table_name = 'runs' "
        "AND column_name IN ('entity', 'project') AND table_catalog = current_database() ORDER BY 1"
    ).fetchall() == [("entity", "NO"), ("project", "NO")]
    # The open alerts go on under the keys every alert has now (in place for a one-project warehouse of before).
    where = f"{home[0]}/{home[1]}"
    expected = (
        open_before
        if scoped_keys
        else sorted((f"{key.split(':', 1)[0]}:{where}:{subject}", f"{where}:{subject}") for key, subject in open_before)
    )
    assert con.execute("SELECT alert_key, subject FROM alerts WHERE resolved_at IS NULL ORDER BY 1").fetchall() == (
        expected
    )
    transitions = reconcile(
        con, evaluate_rules(con, last_tick, AlertThresholds(by_project=True)), set(RULE_FUNCTIONS), last_tick, []
    )
    # (An alert of a project the first tick no longer mirrors resolves: the mirror set changed, not the key.)
    kept = {key for key, subject in expected if subject.split(":")[0] in mirrored}
    assert [(t.event, t.condition.key) for t in transitions if t.condition.key in kept] == []
    assert broken(con, datetime.now(UTC).replace(tzinfo=None)) == []
    con.close()
