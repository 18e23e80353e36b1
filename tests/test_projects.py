"""Which projects a deployment mirrors: ``WANDB_ASSETS_PROJECTS`` parsed and resolved (pure functions)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.projects import ProjectRef, ProjectSelection, parse_projects


def test_items_named_projects_and_whole_entities_in_order_each_once():
    selection = parse_projects(" research/llm-pretrain, ci/* ,research/vision,ci/*, research/llm-pretrain,")
    assert selection == ProjectSelection(
        projects=(ProjectRef("research", "llm-pretrain"), ProjectRef("research", "vision")),
        whole_entities=("ci",),
    )
    assert selection.entities == ("ci", "research")
    assert str(selection.projects[0]) == "research/llm-pretrain"


def test_resolve_adds_every_listed_project_of_a_whole_entity_and_keeps_named_ones_when_a_listing_failed():
    selection = parse_projects("research/llm, ci/*, lab/*, lab/named")
    listed = {"ci": ["bench", "smoke", "bench"], "research": ["llm", "other"]}  # lab's listing failed
    assert selection.resolve(listed) == [
        ProjectRef("ci", "bench"),
        ProjectRef("ci", "smoke"),
        ProjectRef("lab", "named"),
        ProjectRef("research", "llm"),  # named: "other" is not mirrored, research is not a whole entity
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "set but empty"),
        (" , ", "set but empty"),
        ("research", "'research': each item is entity/project or entity/*"),
        ("research/", "the project may not be empty"),
        ("/llm", "the entity may not be empty"),
        ("research/llm/extra", "'research/llm/extra'"),
        ("research/my project", "contain spaces"),
        ("re:search/llm", "'re:search/llm'"),
    ],
)
def test_a_malformed_item_is_one_sentence_naming_it(text, says):
    with pytest.raises(ConfigError) as caught:
        parse_projects(text)
    message = str(caught.value)
    assert says in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence


# ------------------------------------------------------------- the local server: several entities and projects


def _nodes(prefix: str, count: int, display: str) -> list[dict]:

    from wandb_assets.localwandb import make_run_node

    return [
        make_run_node(
            f"{prefix}{n}", display_name=f"{display}-{n}", state="finished", created_at=datetime(2026, 6, 1, n)
        )
        for n in range(count)
    ]


def _status(url: str, path: str) -> int:
    """The HTTP status of one ``Runs`` request for ``path`` (the wandb client would retry it for minutes)."""
    import base64
    import json
    import urllib.error
    import urllib.request

    from tests.conftest import API_KEY

    entity, project = path.split("/")
    body = {"query": "query Runs($project: String!, $entity: String!) { project { runCount } }"}
    body["variables"] = {"entity": entity, "project": project, "perPage": 1}
    auth = "Basic " + base64.b64encode(f"api:{API_KEY}".encode()).decode()
    request = urllib.request.Request(f"{url}/graphql", json.dumps(body).encode(), {"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_local_server_lists_and_serves_several_entities_to_the_real_client(monkeypatch, tmp_path):
    """What the wandb 0.31 client sends to list an entity's projects (``GetProjects``, paged) and read each
    one's runs; the same run id in two projects is two runs; one project failing leaves the others readable."""
    import wandb

    from tests.conftest import API_KEY
    from wandb_assets.localwandb import LocalWandbServer

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = LocalWandbServer(_nodes("r", 3, "llm"), entity="research", project="llm", api_key=API_KEY).start()
    try:
        server.add_project("research", "vision", _nodes("v", 2, "vision"))
        server.add_project("ci", "bench", _nodes("r", 1, "bench"))  # run id r0, as in research/llm
        api = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in api.projects("research", per_page=1)] == ["llm", "vision"]  # two pages
        assert [(p.entity, p.name) for p in api.projects("ci")] == [("ci", "bench")]
        assert list(api.projects("nobody")) == []
        assert server.count("GetProjects") == 4  # research: 2 pages, ci: 1, nobody: 1
        assert [r.display_name for r in api.runs("ci/bench")] == ["bench-0"]
        assert sorted(r.display_name for r in api.runs("research/llm")) == ["llm-0", "llm-1", "llm-2"]
        # A project created later is listed by a new client (the client keeps its first listing).
        server.add_project("ci", "smoke", _nodes("s", 1, "smoke"))
        assert [p.name for p in api.projects("ci")] == ["bench"]  # wandb 0.31 caches api.projects(entity)
        fresh = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in fresh.projects("ci")] == ["bench", "smoke"]
        # Failures injected for one project only.
        server.faults.fail_status, server.faults.fail_count = 500, -1
        server.faults.fail_projects = frozenset({"ci/bench"})
        assert [_status(server.url, path) for path in ("ci/bench", "research/vision", "ci/bench")] == [500, 200, 500]
        server.remove_project("ci", "smoke")
        server.faults.fail_status = None
        other = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in other.projects("ci")] == ["bench"]
    finally:
        server.stop()


def test_an_entitys_projects_are_listed_afresh_on_the_same_api(monkeypatch, tmp_path):
    """``entity/*`` must see a project created since the last tick although the process keeps one ``Api``; a
    failed listing names the entity and never the key."""
    from types import SimpleNamespace

    from tests.conftest import API_KEY
    from wandb_assets.lib.fetch import WandbFetchError, get_api, list_projects
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.settings import WandbSettings

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = LocalWandbServer(_nodes("b", 1, "bench"), entity="ci", project="bench", api_key=API_KEY).start()
    try:
        api = get_api(
            WandbSettings(api_key=API_KEY, project="bench", entity="ci", base_url=server.url),
            SimpleNamespace(http_timeout_s=5.0, http_retries=1, retry_wait_max_s=0.5),
        )
        assert list_projects(api, "ci", API_KEY) == ["bench"]
        server.add_project("ci", "smoke")
        assert list_projects(api, "ci", API_KEY) == ["bench", "smoke"]
        server.faults.fail_status, server.faults.fail_count = 403, -1
        server.faults.fail_operations = frozenset({"GetProjects"})
        with pytest.raises(WandbFetchError) as caught:
            list_projects(api, "ci", API_KEY)
        assert str(caught.value).startswith("Listing the projects of 'ci' failed: ")
        assert API_KEY not in str(caught.value)
    finally:
        server.stop()


# --------------------------------------------------------------- a warehouse written before runs had a project

BEFORE = Path(__file__).parent / "fixtures" / "warehouse-before-projects"


def _old_warehouse(path: Path, offline_row: bool = True) -> None:
    """A DuckDB file as main wrote it before runs carried their project (the fixture's export, imported)."""
    con = duckdb.connect(str(path))
    con.execute((BEFORE / "schema.sql").read_text())
    con.execute((BEFORE / "load.sql").read_text().replace("{dir}", str(BEFORE)))
    if offline_row:  # an offline run read from a .wandb log: no URL to tell its project
        con.execute(
            "INSERT INTO runs BY NAME SELECT * REPLACE ('offline' AS source, NULL AS url, 'off-1' AS run_id, "
            "'/logs/run-off-1.wandb' AS log_path) FROM runs WHERE state = 'running' ORDER BY run_id LIMIT 1"
        )
    con.close()


PROJECT_TABLES = ("runs", "push_to_main_sps", "success_rates", "gpu_hours", "run_progress")


def _contents(con, new_columns: bool = False) -> dict[str, list]:
    """Every table's rows (as text, sorted), without the columns the migration adds when ``new_columns``."""
    tables = [  # push_to_main_sps: a table before 2026-11-29, a view of runs since, with the same rows
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views() "
            "WHERE view_name = 'push_to_main_sps' ORDER BY 1"
        ).fetchall()
    ]
    contents = {}
    for table in tables:
        columns = "* EXCLUDE (entity, project)" if new_columns and table in PROJECT_TABLES else "*"
        if new_columns and table == "push_to_main_sps":  # and the steady SPS of issue 34
            columns = "* EXCLUDE (entity, project, sps_steady)"
        if new_columns and table == "runs":  # and the GPU columns of issue 22
            columns = (
                "* EXCLUDE (entity, project, gpu_count_source, gpu_model, gpu_util_pct, latest_gpu_sample, "
                "wandb_metadata, log_idle_gpu_hours, cost_usd, curves_status, curves_read_at, curves_final, "
                "sps_steady, state_changed_at)"
            )
        contents[table] = sorted(map(repr, con.execute(f"SELECT {columns} FROM {table}").fetchall()))
    contents.pop("warehouse_meta")
    return contents


UNKEYED_ALERTS = "SELECT * EXCLUDE (alert_key, subject) FROM alerts ORDER BY ALL"


def test_a_warehouse_written_before_runs_had_a_project_is_migrated_in_place_and_loses_nothing(tmp_path):
    from wandb_assets.lib.derived import rebuild_success_rates
    from wandb_assets.lib.warehouse import ensure_schema

    path = tmp_path / "w.duckdb"
    _old_warehouse(path)
    con = duckdb.connect(str(path))
    before = _contents(con)
    assert len(before["runs"]) == 25 and len(before["fleet_metrics"]) == 20 and len(before["alerts"]) == 2
    alerts_before = con.execute(UNKEYED_ALERTS).fetchall()
    ensure_schema(con, home=("team", "configured"))  # (a name no URL has: shows which rows took it)
    # Every row still there, every old column unchanged; entity and project filled, from the URL W&B's client
    # builds (…/team/fleet/runs/<id>) or, for the offline row, from the configured project.
    after = _contents(con, new_columns=True)
    assert after.pop("project_metrics") == []  # new: per-project gauges start with the next snapshot
    assert after.pop("wandb_projects") == []  # new: filled by the next fetch
    assert after.pop("gpu_usage") == [] and after.pop("gpu_samples") == []  # new: the next tick fills them
    assert after.pop("sps_change_points") == []  # new: the next alert evaluation fills it
    assert after.pop("run_history") == [] and after.pop("run_gpu_samples") == []  # new: curves read by next ticks
    assert after.pop("run_curve_idle") == []
    assert after.pop("idle_actions") == [] and after.pop("pr_checks") == []  # new: the ladder's ledger, the PR verdicts
    assert after.pop("github_deliveries") == []  # new: the PR verdicts' outbox to GitHub
    for table in ("gpu_price_periods", "gpu_charges", "closed_month_charges", "closed_months", "team_budgets"):
        assert after.pop(table, []) == [], table  # new: the price history, the billed ledger, closed months
    # The two open alerts keep going under the keys every alert has now (with its project), nothing else changed.
    rekeyed = sorted(con.execute("SELECT alert_key, subject FROM alerts").fetchall())
    assert rekeyed == [
        ("push_to_main_success_rate_low:team/fleet:push_to_main", "team/fleet:push_to_main"),
        ("stalled_run:team/fleet:stalled0001", "team/fleet:stalled0001"),
    ]
    assert con.execute(UNKEYED_ALERTS).fetchall() == alerts_before  # nothing but their keys
    after.pop("alerts"), before.pop("alerts")
    assert after == before
    assert con.execute("SELECT source, entity, project, count(*) FROM runs GROUP BY ALL ORDER BY ALL").fetchall() == [
        ("offline", "team", "configured", 1),
        ("wandb", "team", "fleet", 24),
    ]
    # Each run's GPU count says where it came from: these runs' configs hold compute.gpu_count or nothing.
    assert (
        con.execute("SELECT gpu_count_source, count(*) FROM runs GROUP BY 1 ORDER BY 1").fetchall()
        == con.execute(
            "SELECT CASE WHEN config::VARCHAR LIKE '%gpu_count%' THEN 'config' ELSE 'default' END, count(*) FROM runs "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
    )
    # The stalled-run rule's step history takes the project of its run (so a same-id run elsewhere never mixes).
    assert con.execute("SELECT DISTINCT entity, project FROM run_progress").fetchall() == [("team", "fleet")]
    for table in ("success_rates", "gpu_hours"):  # two projects now: left to the rebuild
        assert con.execute(f"SELECT DISTINCT entity, project FROM {table}").fetchall() == [(None, None)], table
    # A view of runs since 2026-11-29: the CI runs' projects at once.
    assert con.execute("SELECT DISTINCT entity, project FROM push_to_main_sps").fetchall() == [("team", "fleet")]
    with pytest.raises(duckdb.ConstraintException, match="runs.entity"):
        con.execute("INSERT INTO runs (run_id, project) VALUES ('x', 'p')")
    # Rebuilt over the migrated rows, the success rates are the old ones (the offline copy is still running).
    old_rates = con.execute("SELECT * EXCLUDE (entity, project) FROM success_rates ORDER BY ALL").fetchall()
    assert len(old_rates) == 6  # 2 days x (all + categories that ended)
    rebuild_success_rates(con)
    assert con.execute("SELECT DISTINCT entity, project FROM success_rates").fetchall() == [("team", "fleet")]
    assert con.execute("SELECT * EXCLUDE (entity, project) FROM success_rates ORDER BY ALL").fetchall() == old_rates
    con.close()


def test_a_migration_that_cannot_tell_an_offline_rows_project_changes_nothing_and_says_what_to_set(tmp_path):
    from wandb_assets.lib.warehouse import ensure_schema

    path = tmp_path / "w.duckdb"
    _old_warehouse(path)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM runs WHERE source IS DISTINCT FROM 'offline'")  # no mirrored row to learn it from
    with pytest.raises(RuntimeError, match="1 runs .* set WANDB_ENTITY and WANDB_PROJECT"):
        ensure_schema(con)
    columns = [
        r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs'").fetchall()
    ]
    assert "entity" not in columns and con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    con.close()


def test_a_one_project_warehouse_has_its_derived_tables_filled_by_the_migration(tmp_path):
    from wandb_assets.lib.warehouse import ensure_schema

    path = tmp_path / "w.duckdb"
    _old_warehouse(path, offline_row=False)
    con = duckdb.connect(str(path))
    ensure_schema(con)  # no configured project needed: every row has a URL
    for table in ("runs", "push_to_main_sps", "success_rates", "gpu_hours"):
        assert con.execute(f"SELECT DISTINCT entity, project FROM {table}").fetchall() == [("team", "fleet")], table
    con.close()


def _staged(path: Path, rows: list[tuple], fetched_at: datetime) -> str:
    """A staged file of ``(entity, project, run_id, state)`` rows created on 2026-06-01, fetched at ``fetched_at``:
    each project's runs a minute apart from the others' (the same id and creation time in two projects of an entity
    is one run moved between them)."""
    import os
    from datetime import UTC

    from wandb_assets.lib.warehouse import ndjson_lines

    created = datetime(2026, 6, 1, 12)
    dicts = [
        {
            "entity": e,
            "project": p,
            "run_id": r,
            "state": s,
            "created_at": created + timedelta(minutes=ord(p[0]) - ord("a")),
            "anomalies": [],
        }
        for e, p, r, s in rows
    ]
    path.write_text("".join(ndjson_lines(dicts, fetched_at)))
    stamp = fetched_at.replace(tzinfo=UTC).timestamp()
    os.utime(path, (stamp, stamp))
    return str(path)


def test_the_same_run_id_in_two_projects_is_two_rows_and_a_load_replaces_only_the_projects_it_holds(
    memory_con, tmp_path
):
    from wandb_assets.lib.warehouse import load_runs_window

    window = (datetime(2026, 6, 1), datetime(2026, 6, 2))
    first = [("team", "a", "r1", "finished"), ("team", "b", "r1", "running"), ("lab", "a", "r1", "failed")]
    load_runs_window(memory_con, [_staged(tmp_path / "1", first, datetime(2026, 6, 1, 13))], *window)
    rows = "SELECT entity, project, run_id, state FROM runs ORDER BY ALL"
    assert memory_con.execute(rows).fetchall() == sorted(first)
    # A later fetch that read team/a whole (r1 deleted there, r2 new) and failed for the others: their rows stay
    # as they were; team/a's r1 stays too, marked vanished (W&B no longer returns it).
    later = _staged(tmp_path / "2", [("team", "a", "r2", "running")], datetime(2026, 6, 1, 14))
    load_runs_window(memory_con, [later], *window, projects=[("team", "a")])
    marked = "SELECT entity, project, run_id, state, anomalies FROM runs ORDER BY ALL"
    assert memory_con.execute(marked).fetchall() == [
        ("lab", "a", "r1", "failed", []),
        ("team", "a", "r1", "finished", ["vanished"]),
        ("team", "a", "r2", "running", []),
        ("team", "b", "r1", "running", []),
    ]
    # team/b refreshed: its r1 replaced, nobody else's r1 touched.
    again = _staged(tmp_path / "3", [("team", "b", "r1", "finished")], datetime(2026, 6, 1, 15))
    load_runs_window(memory_con, [again], *window, projects=[("team", "b")])
    assert memory_con.execute(marked).fetchall() == [
        ("lab", "a", "r1", "failed", []),
        ("team", "a", "r1", "finished", ["vanished"]),
        ("team", "a", "r2", "running", []),
        ("team", "b", "r1", "finished", []),
    ]


def test_a_fetch_over_three_projects_shares_one_budget_and_a_failing_project_loses_only_itself(monkeypatch, tmp_path):
    """Slices of three projects in two entities in one fetch: at most the limit in flight across all of them;
    one project answering 500 to every page is abandoned (named, with why) while the other two arrive whole."""
    from types import SimpleNamespace

    from tests.conftest import API_KEY
    from wandb_assets.lib.fetch import FetchPolicy, Slice, created_between, fetch_slices, get_api
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.settings import WandbSettings

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = LocalWandbServer(_nodes("a", 7, "llm"), entity="research", project="llm", api_key=API_KEY).start()
    try:
        server.add_project("research", "vision", _nodes("v", 5, "vision"))
        server.add_project("ci", "bench", _nodes("a", 6, "bench"))  # the same run ids as research/llm
        server.faults.fail_status, server.faults.fail_count = 500, -1
        server.faults.fail_projects = frozenset({"research/vision"})
        server.faults.latency_s = 0.05  # requests overlap, so the in-flight limit is exercised
        api = get_api(
            WandbSettings(api_key=API_KEY, project="llm", entity="research", base_url=server.url),
            SimpleNamespace(http_timeout_s=5.0, http_retries=1, retry_wait_max_s=0.5),
        )
        hours = [(datetime(2026, 6, 1, h), datetime(2026, 6, 1, h + 2)) for h in range(0, 8, 2)]
        slices = [
            Slice(n, created_between(start, end), "2026-06-01", project)
            for n, (project, (start, end)) in enumerate(
                (p, window) for p in ("research/llm", "research/vision", "ci/bench") for window in hours
            )
        ]
        got: dict[str, set[str]] = {}

        def handle(piece: Slice, nodes: list[dict]) -> None:
            got.setdefault(piece.project, set()).update(node["name"] for node in nodes)

        policy = FetchPolicy(concurrency=2, page_size=4, min_page_size=2, retries=1, retry_wait_max_s=0.1)
        stats = fetch_slices(api, "research", "llm", slices, policy, handle, isolate_projects=True, secret=API_KEY)
        assert got == {"research/llm": {f"a{n}" for n in range(7)}, "ci/bench": {f"a{n}" for n in range(6)}}
        assert list(stats.failed_projects) == ["research/vision"]
        assert (
            "research/vision" in stats.failed_projects["research/vision"]
            and "500" in stats.failed_projects["research/vision"]
        )
        assert API_KEY not in stats.failed_projects["research/vision"]
        assert stats.max_in_flight <= 2 and server.max_in_flight <= 2
        # The failing project's pages were halved (a 5xx may mean "too big"); the others' never were.
        sizes = {(v["project"], v["perPage"]) for op, v in server.requests if op == "Runs"}
        assert sizes == {("llm", 4), ("bench", 4), ("vision", 4), ("vision", 2)}
        # Every project failing is a failed fetch.
        server.faults.fail_projects = None
        with pytest.raises(Exception, match="Every project failed"):
            fetch_slices(api, "research", "llm", slices[:5], policy, handle, isolate_projects=True, secret=API_KEY)
    finally:
        server.stop()


# ------------------------------------------------------------------ a backfill over the projects of two entities


def test_a_backfill_over_several_projects_lands_each_and_a_failing_project_keeps_its_rows(
    wandb_server, warehouse_path, instance, monkeypatch
):
    from datetime import date

    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    server = wandb_server(_nodes("r", 4, "llm"))  # test-team/test-project
    server.add_project("test-team", "vision", _nodes("v", 2, "vision"))
    server.add_project("lab", "rl", _nodes("r", 3, "rl"))  # run ids r0..r2, as in test-team/test-project
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/*, lab/rl")
    monkeypatch.setenv("WANDB_ASSETS_PAGE_SIZE", "50")
    day = date(2026, 6, 1)
    rows = "SELECT entity, project, count(*), string_agg(name, ',' ORDER BY name) FROM runs GROUP BY ALL ORDER BY ALL"

    assert execute_backfill(instance, day, day).success
    assert query_read_only(warehouse_path, rows) == [
        ("lab", "rl", 3, "rl-0,rl-1,rl-2"),
        ("test-team", "test-project", 4, "llm-0,llm-1,llm-2,llm-3"),
        ("test-team", "vision", 2, "vision-0,vision-1"),
    ]

    # lab/rl answers 500 to every page; W&B changed the others meanwhile (one run renamed, one deleted) and
    # test-team gained a project: the others are replaced, lab/rl's rows stay as they were.
    server.faults.fail_status, server.faults.fail_count = 500, -1
    server.faults.fail_projects = frozenset({"lab/rl"})
    server.upsert_runs(_nodes("r", 1, "llm-renamed"))
    server.remove_project("test-team", "vision")
    server.add_project("test-team", "vision", _nodes("v", 1, "vision"))
    server.add_project("test-team", "new", _nodes("n", 1, "new"))
    result = execute_backfill(instance, day, day)
    assert result.success
    meta = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert list(meta["failed_projects"].value) == ["lab/rl"]
    assert meta["projects"].value == ["lab/rl", "test-team/new", "test-team/test-project", "test-team/vision"]
    assert query_read_only(warehouse_path, rows) == [
        ("lab", "rl", 3, "rl-0,rl-1,rl-2"),
        ("test-team", "new", 1, "new-0"),
        ("test-team", "test-project", 4, "llm-1,llm-2,llm-3,llm-renamed-0"),
        ("test-team", "vision", 2, "vision-0,vision-1"),  # v1, deleted in W&B, stays marked
    ]
    vision = "SELECT run_id, state, anomalies FROM runs WHERE project = 'vision' ORDER BY 1"
    assert query_read_only(warehouse_path, vision) == [
        ("v0", "finished", []),
        ("v1", "finished", ["vanished"]),
    ]

    # Every project failing fails the run and changes nothing.
    server.faults.fail_projects = None
    assert not execute_backfill(instance, day, day).success
    assert len(query_read_only(warehouse_path, rows)) == 4


def test_the_cli_mirrors_named_projects_without_wandb_project_and_refuses_a_selection_that_names_none(
    wandb_server, dagster_home, warehouse_path, capsys, monkeypatch
):
    from tests.conftest import cli
    from wandb_assets.warehouse import query_read_only

    server = wandb_server(_nodes("r", 2, "llm"))
    server.add_project("lab", "rl", _nodes("r", 1, "rl"))
    monkeypatch.delenv("WANDB_PROJECT")
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "nobody/*")
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert (code, out) == (2, "")
    assert err == (
        "error: WANDB_ASSETS_PROJECTS names no project W&B has now: W&B lists no project of 'nobody' for this key: "
        "check the entity's name in WANDB_ASSETS_PROJECTS.\n"
    )
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "lab/rl,test-team/test-project")
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    assert query_read_only(warehouse_path, "SELECT entity, project, run_id FROM runs ORDER BY ALL") == [
        ("lab", "rl", "r0"),
        ("test-team", "test-project", "r0"),
        ("test-team", "test-project", "r1"),
    ]
    held = query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY ALL")
    # a mistyped entity beside real ones (issue 43): it would drop lab's projects; exit 2 before anything changes
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "lba/*,test-team/test-project")
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert (code, out) == (2, "")
    assert err == (
        "error: WANDB_ASSETS_PROJECTS names lba/*, but W&B lists no project of 'lba' for this key: check the "
        "entity's name in WANDB_ASSETS_PROJECTS.\n"
    )
    assert query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY ALL") == held
    # a set that drops a project is said before the change; its runs are kept
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project")
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    assert err.startswith(
        "warning: 1 project(s) mirrored now leave the mirror set with this WANDB_ASSETS_PROJECTS: lab/rl. Their runs "
        "are kept"
    )
    assert query_read_only(warehouse_path, "SELECT project, run_id, state FROM runs WHERE entity = 'lab'") == [
        ("rl", "r0", "finished")
    ]


# --------------------------------------------------------------------------- the gauges per project and in total


T_MIXED = datetime(2026, 6, 10, 12)


def _run(project: str, run_id: str, state: str, category: str, ago: float, gpus: int = 1) -> dict:
    """A row of ``project`` created ``ago`` hours before ``T_MIXED``, ended an hour later unless running."""
    from datetime import timedelta

    from tests.fleet import fleet_row

    entity, name = project.split("/")
    created = T_MIXED - timedelta(hours=ago)
    ended = None if state == "running" else created + timedelta(hours=1)
    return fleet_row(run_id, state, category, created, ended, gpus, entity=entity, project=name)


MIXED_FLEET = [
    _run("team/a", "x1", "finished", "push_to_main", 3),
    _run("team/a", "x2", "failed", "push_to_main", 5),
    _run("team/a", "x3", "running", "regular", 1, gpus=2),
    _run("team/b", "x1", "finished", "push_to_main", 6),  # the same run id as in team/a
    _run("team/b", "x2", "finished", "push_to_main", 8),
    _run("team/b", "x3", "finished", "push_to_main", 10),
    _run("lab/c", "x1", "failed", "sweep", 2, gpus=4),
]


def test_the_gauges_of_each_project_and_of_the_whole_fleet_over_three_projects_in_two_entities(memory_con):
    """Hand-worked (T = 12:00, W = the 24 h before): team/a has a finished and a failed CI run (1 GPU, 1 h each)
    and a regular run running for 1 h on 2 GPUs; team/b three finished CI runs (1 GPU, 1 h each); lab/c a failed
    sweep run (4 GPUs, 1 h). The fleet's CI success rate is 4 of 5 = 80 %, not the mean of 50 % and 100 %."""
    from tests.fleet import load
    from wandb_assets.lib.warehouse import record_snapshot

    t = T_MIXED
    load(memory_con, MIXED_FLEET)
    fleet = record_snapshot(memory_con, t)
    names = (
        "wandb.runs.active",
        "wandb.runs.completed_24h",
        "wandb.runs.failed_24h",
        "wandb.training.total_gpu_hours_24h",
        "wandb.push_to_main.success_rate_pct",
        "wandb.sweep.success_rate_pct",
    )
    assert [fleet[n] for n in names] == [1, 4, 2, 11.0, 80.0, 0.0]
    per_project = memory_con.execute(
        "SELECT entity || '/' || project, metric, value FROM project_metrics WHERE snapshot_at = $t "
        "AND list_contains($names, metric)",
        {"t": t, "names": list(names)},
    ).fetchall()
    table = {(p, m): v for p, m, v in per_project}
    assert [[table[(p, n)] for n in names] for p in ("team/a", "team/b", "lab/c")] == [
        [1, 1, 1, 4.0, 50.0, None],
        [0, 3, 0, 3.0, 100.0, None],
        [0, 0, 1, 4.0, None, 0.0],
    ]
    assert memory_con.execute("SELECT count(*) FROM project_metrics").fetchone()[0] == 3 * 24
    record_snapshot(memory_con, t)  # again: replaced, not doubled
    assert memory_con.execute("SELECT count(*) FROM project_metrics").fetchone()[0] == 3 * 24


def test_every_rule_runs_per_project_with_the_project_in_its_key_and_message(memory_con):
    """The mixed fleet plus: lab/c's run x2 crashed (so 2 of its 2 ended runs failed) and a run z1 alive for
    200 h in both team/b and lab/c. Per project (thresholds lowered to 2 runs): team/a's CI rate is 1 of 2 =
    50 % < 80 %, lab/c has a failure spike (100 % > 50 %), both z1 are long-running and stalled, and team/a's
    x3 is stalled (no heartbeat for 60 min). Over the whole fleet the same runs raise no rate alert (4 of 5 =
    80 %) and no spike (3 of 7 ended), and the two z1 would be one key."""
    from tests.fleet import load
    from wandb_assets.lib.alerts import AlertThresholds, evaluate_rules

    load(
        memory_con,
        MIXED_FLEET
        + [
            _run("lab/c", "x2", "crashed", "regular", 4),
            _run("team/b", "z1", "running", "regular", 200),
            _run("lab/c", "z1", "running", "regular", 200),
        ],
    )
    lowered = {"success_rate_min_runs": 2, "failure_spike_min_ended": 2}
    found = evaluate_rules(memory_con, T_MIXED, AlertThresholds(by_project=True, **lowered))
    assert sorted(c.key for c in found) == [
        "failure_spike:lab/c",
        "long_running:lab/c:z1",
        "long_running:team/b:z1",
        "push_to_main_success_rate_low:team/a:push_to_main",
        "stalled_run:lab/c:z1",
        "stalled_run:team/a:x3",
        "stalled_run:team/b:z1",
    ]
    by_key = {c.key: c for c in found}
    assert by_key["failure_spike:lab/c"].message == (
        "lab/c: Failure spike: 2 of 2 runs that ended in the last 24 h failed or crashed (100% > 50%)."
    )
    assert by_key["push_to_main_success_rate_low:team/a:push_to_main"].message.startswith(
        "team/a: Push-to-main success rate is 50.0% over the last 24 h (2 runs finished, failed or crashed"
    )
    assert by_key["stalled_run:team/a:x3"].details["project"] == "a"
    # One project (today's keys): the fleet as a whole, the two z1 collapse into one key.
    fleet = sorted(c.key for c in evaluate_rules(memory_con, T_MIXED, AlertThresholds(**lowered)))
    assert fleet == ["long_running:z1", "long_running:z1", "stalled_run:x3", "stalled_run:z1", "stalled_run:z1"]


def test_ci_silent_per_project_only_where_ci_ever_ran(memory_con):
    """team/a's last CI run was 20 h ago (silent past 12 h), team/b's 3 h ago; lab/c never had CI: not silent."""
    from tests.fleet import load
    from wandb_assets.lib.alerts import AlertThresholds, ci_silent

    load(
        memory_con,
        [
            _run("team/a", "c1", "finished", "push_to_main", 20),
            _run("team/b", "c1", "finished", "push_to_main", 3),
            _run("lab/c", "r1", "finished", "regular", 1),
        ],
    )
    found = ci_silent(memory_con, T_MIXED, AlertThresholds(by_project=True))
    assert [(c.key, c.message) for c in found] == [
        (
            "ci_silent:team/a:push_to_main",
            "team/a: No push-to-main run created in the last 12 h (none since 2026-06-09 16:00 UTC).",
        )
    ]
    assert ci_silent(memory_con, T_MIXED, AlertThresholds()) == []  # the fleet's latest is 3 h old


@pytest.mark.slow
def test_a_project_that_fails_on_every_page_opens_project_unreachable_once_and_resolves_it_once(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Four ticks over three projects in two entities; lab/rl answers 500 to every page on ticks 2 and 3. The
    other projects land each time, lab/rl keeps its rows, ``wandb_projects`` says since when and why it fails,
    and the alert opens on tick 2 (one alert, one message per channel), stays open on tick 3 and resolves on 4."""
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_feed, execute_refresh
    from wandb_assets.warehouse import query_read_only

    server = wandb_server(_nodes("r", 2, "llm"))  # test-team/test-project
    server.add_project("test-team", "vision", _nodes("v", 1, "vision"))
    server.add_project("lab", "rl", _nodes("r", 3, "rl"))
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/*, lab/rl")
    monkeypatch.setenv("WANDB_ASSETS_SLACK_WEBHOOK_URL", "")
    day = date(2026, 6, 1)
    projects = (
        "SELECT entity || '/' || project, mirrored, runs, failing_since IS NOT NULL, last_error IS NOT NULL, "
        "last_fetched_at = last_checked_at FROM wandb_projects ORDER BY 1"
    )
    alerts = (
        "SELECT alert_key, message, opened_at IS NOT NULL, resolved_at IS NOT NULL FROM alerts "
        "WHERE rule = 'project_unreachable'"
    )
    counts = "SELECT entity || '/' || project, count(*) FROM runs GROUP BY ALL ORDER BY 1"

    def tick(n: int):
        result = execute_refresh(instance, day, snapshot_at=f"2026-06-01T1{n}:00:00Z")
        assert result.success
        assert execute_feed(instance, now=f"2026-06-01T1{n}:00:30Z").success
        return result

    tick(1)
    assert query_read_only(warehouse_path, projects) == [
        ("lab/rl", True, 3, False, False, True),
        ("test-team/test-project", True, 2, False, False, True),
        ("test-team/vision", True, 1, False, False, True),
    ]
    assert query_read_only(warehouse_path, alerts) == []

    server.faults.fail_status, server.faults.fail_count = 500, -1
    server.faults.fail_projects = frozenset({"lab/rl"})
    moved = datetime.now(UTC).replace(tzinfo=None)  # both change (a tick reads only the projects that changed)
    server.upsert_runs(  # test-project gains r2 meanwhile
        [
            make_run_node(
                "r2", display_name="llm-2", state="finished", created_at=datetime(2026, 6, 1, 2), heartbeat_at=moved
            )
        ]
    )
    server.upsert_runs(
        [
            make_run_node(
                "r9", display_name="rl-9", state="finished", created_at=datetime(2026, 6, 1, 9), heartbeat_at=moved
            )
        ],
        "lab",
        "rl",
    )
    tick(2)
    first_failure = query_read_only(
        warehouse_path, "SELECT failing_since, last_error FROM wandb_projects WHERE project = 'rl'"
    )[0]
    assert "lab/rl" in first_failure[1] and "500" in first_failure[1]
    assert query_read_only(warehouse_path, projects) == [
        ("lab/rl", True, 3, True, True, False),  # its rows kept, last fetched whole on tick 1
        ("test-team/test-project", True, 3, False, False, True),
        ("test-team/vision", True, 1, False, False, False),  # nothing new: checked, not read (fetched on tick 1)
    ]
    [(key, message, opened, resolved)] = query_read_only(warehouse_path, alerts)
    assert (key, opened, resolved) == ("project_unreachable:lab/rl", True, False)
    assert message.startswith("W&B project lab/rl could not be read since ") and "its rows are kept" in message

    tick(3)  # still failing (read again although nothing new: its last fetch failed): the same alert
    assert query_read_only(warehouse_path, alerts)[0][2:] == (True, False)
    assert len(query_read_only(warehouse_path, alerts)) == 1
    again = query_read_only(warehouse_path, "SELECT failing_since, last_error FROM wandb_projects WHERE project = 'rl'")
    assert again[0][0] == first_failure[0] and "500" in again[0][1]

    server.faults.fail_projects = frozenset()
    tick(4)
    assert query_read_only(warehouse_path, alerts)[0][2:] == (True, True)
    assert len(query_read_only(warehouse_path, alerts)) == 1
    assert query_read_only(warehouse_path, projects)[0] == ("lab/rl", True, 4, False, False, True)  # r9 read
    assert query_read_only(warehouse_path, counts) == [
        ("lab/rl", 4),
        ("test-team/test-project", 3),
        ("test-team/vision", 1),
    ]
    events = query_read_only(
        warehouse_path,
        "SELECT event, count(*) FROM alert_notifications WHERE alert_key = 'project_unreachable:lab/rl' "
        "GROUP BY 1 ORDER BY 1",
    )
    assert [e for e, _ in events] in ([], ["opened", "resolved"])
    assert len({n for _, n in events}) <= 1  # as many "resolved" messages as "opened" ones: one per channel


def test_the_cli_backfills_one_project_and_refresh_prints_each_project_and_the_fleet(
    wandb_server, dagster_home, warehouse_path, capsys, monkeypatch
):
    """lab/rl: r0 running since 2026-06-01 (1 GPU, so 24 GPU-hours in any 24 h since), r1 and r2 finished
    that day; test-team/test-project: two runs finished that day. ``backfill --project lab/rl`` loads lab/rl
    alone (and leaves test-project's row in wandb_projects alone); ``refresh`` then prints per project the rows in
    the warehouse, active runs, failed in 24 h and GPU-hours in 24 h, and the fleet's sums."""
    from tests.conftest import cli
    from wandb_assets.localwandb import make_run_node
    from wandb_assets.warehouse import query_read_only

    server = wandb_server(_nodes("r", 2, "llm"))
    rl = _nodes("r", 3, "rl")
    rl[0] = make_run_node("r0", display_name="rl-0", state="running", created_at=datetime(2026, 6, 1, 0))
    server.add_project("lab", "rl", rl)
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project, lab/rl")
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01", "--project", "nope/x")
    assert (code, out) == (2, "")
    assert err == (
        "error: --project nope/x is not a mirrored project (mirrored now: lab/rl, test-team/test-project).\n"
    )
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01", "--project", "lab/rl")
    assert code == 0, err
    assert out.startswith("Backfilled 2026-06-01..2026-06-01 (lab/rl) into ")
    assert query_read_only(warehouse_path, "SELECT entity, project, count(*) FROM runs GROUP BY ALL") == [
        ("lab", "rl", 3)
    ]
    assert query_read_only(warehouse_path, "SELECT entity, project, mirrored FROM wandb_projects") == [
        ("lab", "rl", True)
    ]
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    code, out, err = cli(capsys, "refresh")
    assert code == 0, err
    table = out[out.index("Per project") : out.index("\nOpen alerts")]
    assert table.splitlines() == [
        "Per project (runs in the warehouse, active now, and the gauges' 24 hours):",
        "  project                 runs, all time   active  failed 24 h  GPU-hours 24 h",
        "  lab/rl                               3        1            0           24.00",
        "  test-team/test-project               2        0            0            0.00",
        "  fleet (2 projects)                   5        1            0           24.00",
    ]
    # A backfill of one project says nothing of the others: test-project stays mirrored.
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01", "--project", "lab/rl")
    assert code == 0, err
    assert query_read_only(warehouse_path, "SELECT project, mirrored FROM wandb_projects ORDER BY 1") == [
        ("rl", True),
        ("test-project", True),
    ]


# ------------------------------------------------------------------------- a tick reads what changed, not everything


def test_changed_projects_reads_again_what_is_new_alive_never_read_or_due():
    """Last whole fetches at 12:00 (``e/due`` at 05:00, past the 6 h recheck); activity probed at 12:15."""
    from datetime import timedelta

    from wandb_assets.lib.projects import changed_projects

    noon = datetime(2026, 6, 1, 12)
    last = {p: noon for p in ("e/quiet", "e/empty", "e/new-run", "e/alive", "e/skew", "e/not-probed")}
    last["e/due"] = datetime(2026, 6, 1, 5)
    activity = {
        "e/quiet": datetime(2026, 6, 1, 9),  # nothing since 09:00
        "e/empty": None,  # no runs at all
        "e/new-run": datetime(2026, 6, 1, 12, 10),
        "e/alive": datetime(2026, 6, 1, 9),  # quiet, but the warehouse holds one of its runs as running
        "e/skew": datetime(2026, 6, 1, 11, 55),  # within the clock margin before the last fetch: new
        "e/due": datetime(2026, 6, 1, 4),
        "e/never": datetime(2026, 6, 1, 1),  # never read whole
    }
    projects = [*last, "e/never"]
    fetch, unchanged = changed_projects(
        projects, activity, last, {"e/alive"}, noon + timedelta(minutes=15), timedelta(hours=6)
    )
    assert fetch == ["e/new-run", "e/alive", "e/skew", "e/not-probed", "e/due", "e/never"]
    assert unchanged == ["e/quiet", "e/empty"]


def test_a_tick_over_many_projects_reads_only_those_that_changed(wandb_server, warehouse_path, instance, monkeypatch):
    """Eight projects in two entities, backfilled. A tick with nothing new asks one question (which projects
    changed: one request for all eight) and reads none; after two projects gain a run, the next tick reads those
    two alone (their window in 8 slices: 2 projects x 2 days x 2 parts, two for each of the 4 workers), and the
    others' rows stay."""
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_refresh
    from wandb_assets.warehouse import query_read_only

    server = wandb_server(_nodes("r", 2, "p0"))  # test-team/test-project
    names = ["test-team/test-project"]
    for n in range(7):
        entity = "test-team" if n < 3 else "lab"
        # each project's own runs (the same id and creation time in two projects is one run: check counts it once)
        server.add_project(entity, f"p{n + 1}", _nodes(f"p{n + 1}r", 2, f"p{n + 1}"))
        names.append(f"{entity}/p{n + 1}")
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/*, lab/*")
    day = date(2026, 6, 1)
    from wandb_assets.ticks import execute_backfill

    assert execute_backfill(instance, day, day).success
    counts = "SELECT entity || '/' || project, count(*) FROM runs GROUP BY 1 ORDER BY 1"
    assert len(query_read_only(warehouse_path, counts)) == 8

    def tick() -> tuple[dict, list]:
        server.requests.clear()
        result = execute_refresh(instance, day)
        assert result.success
        meta = result.asset_materializations_for_node("staged_runs")[0].metadata
        runs = [f"{v['entity']}/{v['project']}" for op, v in server.requests if op == "Runs"]
        return {op: sum(1 for o, _ in server.requests if o == op) for op, _ in server.requests}, sorted(runs), meta

    requests, runs, meta = tick()
    assert requests == {"GetProjects": 2, "ProjectsActivity": 1} and runs == []
    assert len(meta["projects_unchanged"].value) == 8

    now = datetime.now(UTC).replace(tzinfo=None)
    server.upsert_runs(
        [
            make_run_node(
                "new", display_name="new", state="finished", created_at=datetime(2026, 6, 1, 20), heartbeat_at=now
            )
        ],
        "test-team",
        "p2",
    )
    server.upsert_runs(
        [
            make_run_node(
                "new", display_name="new", state="finished", created_at=datetime(2026, 6, 1, 21), heartbeat_at=now
            )
        ],
        "lab",
        "p5",
    )
    requests, runs, meta = tick()
    assert requests == {"GetProjects": 2, "ProjectsActivity": 1, "Runs": 8}  # the new runs' metadata files: no request
    assert runs == ["lab/p5"] * 4 + ["test-team/p2"] * 4
    assert meta["projects"].value == ["lab/p5", "test-team/p2"]
    assert dict(query_read_only(warehouse_path, counts)) == {
        name: 3 if name in ("lab/p5", "test-team/p2") else 2 for name in names
    }

    # A project created between two ticks is listed by the next one (test-team/*) and read whole. (p2 and p5 are
    # read once more: their new runs' heartbeats are within the 10-minute clock margin before their last read.)
    server.add_project("test-team", "fresh", _nodes("f", 1, "fresh"))
    requests, runs, meta = tick()
    assert requests == {"GetProjects": 2, "ProjectsActivity": 1, "Runs": 12}
    assert meta["projects"].value == ["lab/p5", "test-team/fresh", "test-team/p2"]
    assert len(meta["projects_unchanged"].value) == 6
    assert ("test-team/fresh", 1) in query_read_only(warehouse_path, counts)


def test_many_project_days_are_fetched_in_runs_of_whole_days_and_staged_per_day():
    """20 projects x 31 days with 8 workers: 620 project-days, so slices of 620 // 32 = 19 days (two per
    project: 19 + 12 days), not 620 one-day requests; a single project keeps its day slices."""
    from wandb_assets.lib.fetch import plan_slices

    start = datetime(2026, 5, 1)
    end = datetime(2026, 6, 1)
    spans = plan_slices(start, end, 8, projects=20)
    assert [(s.day, s.last_day, len(s.days)) for s in spans] == [
        ("2026-05-01", "2026-05-19", 19),
        ("2026-05-20", "2026-05-31", 12),
    ]
    assert spans[1].filters == {"createdAt": {"$gte": "2026-05-20T00:00:00Z", "$lt": "2026-06-01T00:00:00Z"}}
    assert len(plan_slices(start, end, 8)) == 31  # one project: one slice per day, as before
    assert len(plan_slices(start, datetime(2026, 5, 3), 4, projects=2)) == 4  # few project-days: parts of days


def test_a_backfill_of_several_projects_over_many_days_lands_every_run_on_its_day(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Three projects x 12 days with 2 workers (36 project-days: slices of 4 days); a run every day at 23:59
    and 00:00 in each project. Every run lands once, and each day's staged file holds that day's runs."""
    from datetime import date, timedelta

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    def nodes(tag: str) -> list[dict]:
        first = datetime(2026, 6, 1)
        return [
            make_run_node(
                f"{tag}{d}-{h}", display_name=None, state="finished", created_at=first + timedelta(days=d, hours=h)
            )
            for d in range(12)
            for h in (0, 23.99)
        ]

    server = wandb_server(nodes("a"))
    server.add_project("test-team", "b", nodes("b"))
    server.add_project("lab", "c", nodes("c"))
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/*, lab/c")
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "2")
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 12))
    assert result.success
    meta = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert meta["slices"].value == 9  # 3 projects x (4 + 4 + 4 days)
    assert query_read_only(warehouse_path, "SELECT count(*), count(DISTINCT (entity, project, run_id)) FROM runs") == [
        (72, 72)
    ]
    per_day = query_read_only(warehouse_path, "SELECT created_at::DATE, count(*) FROM runs GROUP BY 1 ORDER BY 1")
    assert per_day == [(date(2026, 6, 1) + timedelta(days=d), 6) for d in range(12)]
    staging = warehouse_path.parent / "staging" / "runs"
    for d in range(12):
        day = (date(2026, 6, 1) + timedelta(days=d)).isoformat()
        lines = (staging / f"{day}.ndjson").read_text().splitlines()[1:]  # after the header line
        assert len(lines) == 6 and all(f'"created_at": "{day} ' in line for line in lines), day


def test_a_new_run_without_a_heartbeat_yet_still_counts_as_activity(monkeypatch, tmp_path):
    """The suspected point of code-review-2026-11c: W&B orders a null heartbeat last in ``-heartbeat_at`` (as the
    local server does), so a brand-new run with none was not seen by the activity probe; the probe now also asks
    for the newest creation, in the same request."""
    from types import SimpleNamespace

    from tests.conftest import API_KEY
    from wandb_assets.lib.fetch import get_api, latest_activity
    from wandb_assets.localwandb import LocalWandbServer, make_run_node
    from wandb_assets.settings import WandbSettings

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    old = make_run_node("old", display_name="old", state="finished", created_at=datetime(2026, 6, 1, 8))
    new = make_run_node("new", display_name="new", state="running", created_at=datetime(2026, 6, 1, 12)) | {
        "heartbeatAt": None
    }
    server = LocalWandbServer([old, new], entity="e", project="p", api_key=API_KEY).start()
    try:
        api = get_api(
            WandbSettings(api_key=API_KEY, project="p", entity="e", base_url=server.url),
            SimpleNamespace(http_timeout_s=5.0, http_retries=1, retry_wait_max_s=0.5),
        )
        assert latest_activity(api, ["e/p"], API_KEY) == {"e/p": datetime(2026, 6, 1, 12)}
        assert [op for op, _ in server.requests].count("ProjectsActivity") == 1  # one request
    finally:
        server.stop()


def test_a_mistyped_project_among_several_is_skipped_with_the_setting_that_names_it(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Issue 33: the hint named WANDB_ENTITY/WANDB_PROJECT although WANDB_ASSETS_PROJECTS named the project."""
    from datetime import date

    from wandb_assets.ticks import execute_backfill

    wandb_server(_nodes("r", 2, "llm"))
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project, test-team/no-such-project")
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 1))
    assert result.success
    failed = result.asset_materializations_for_node("staged_runs")[0].metadata["failed_projects"].value
    assert failed == {
        "test-team/no-such-project": "W&B project test-team/no-such-project was not found: check its name in "
        "WANDB_ASSETS_PROJECTS."
    }


def test_the_mirrored_runs_are_those_of_mirrored_projects_and_offline_ones(memory_con):
    """``MIRRORED_NOW_SQL`` and its negation: e/kept is mirrored, e/left is not. Mirrored: e/kept's runs, an offline
    run of e/left, and every run while no project is recorded; e/left's W&B runs (source NULL: a row written before
    the column) are not, and ``NOT MIRRORED_NOW_SQL`` names exactly them."""
    from wandb_assets.lib.sql import MIRRORED_NOW_SQL
    from wandb_assets.lib.warehouse import ensure_schema

    ensure_schema(memory_con)
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, source) VALUES ('e', 'kept', 'a', 'wandb'), "
        "('e', 'left', 'b', 'wandb'), ('e', 'left', 'c', 'offline'), ('e', 'left', 'd', NULL), ('e', 'kept', 'f', NULL)"
    )

    def split() -> tuple[list[str], list[str]]:
        return tuple(
            [r for (r,) in memory_con.execute(f"SELECT run_id FROM runs WHERE {where} ORDER BY run_id").fetchall()]
            for where in (MIRRORED_NOW_SQL, f"NOT {MIRRORED_NOW_SQL}")
        )

    assert split() == (["a", "b", "c", "d", "f"], [])
    memory_con.execute(
        "INSERT INTO wandb_projects (entity, project, mirrored) VALUES ('e', 'kept', true), ('e', 'left', false)"
    )
    assert split() == (["a", "c", "f"], ["b", "d"])
