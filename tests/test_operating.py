"""Issue 53: the third hour of operating it. A warehouse another process writes makes a command wait as runs do and,
past the wait, exit 1 with one sentence naming the holder, paged; a named project W&B does not list exits 2 before
anything changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.test_projects import _nodes
from wandb_assets.warehouse import query_read_only

#: Another process writing the warehouse (holding DuckDB's write lock) until told to close.
HOLD_WRITER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
con.close()
"""


def _hold_for_writing(path: Path) -> subprocess.Popen:
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "open"
    return writer


def test_a_refresh_while_another_process_writes_the_warehouse_exits_1_in_one_sentence_and_pages_once(
    wandb_server, dagster_home, warehouse_path, capture, capsys, monkeypatch
):
    """The projects-leaving preflight read the held file and died with DuckDB's IOException traceback before any
    run (5d25e50), so nothing paged. Now the run waits WANDB_ASSETS_LOCK_WAIT, fails, and the command says so in one
    line naming the holder's PID; the pipeline_failure page reaches the webhook once."""
    wandb_server(_nodes("r", 2, "llm"))
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project")
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    monkeypatch.setenv("WANDB_ASSETS_LOCK_WAIT", "1")
    writer = _hold_for_writing(warehouse_path)
    try:
        code, out, err = cli(capsys, "refresh", "--quiet")
    finally:
        writer.stdin.write("close\n")
        writer.stdin.flush()
        writer.wait(timeout=30)
    assert code == 1
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("error: refresh failed in step ")
    assert "is locked by another process" in errors[0] and f"(PID {writer.pid})" in errors[0]
    hooks = [h["text"] for h in capture.bodies("/hook/")]
    assert len(hooks) == 1 and hooks[0].startswith(":rotating_light: [critical] pipeline_failure (refresh): ")


def test_a_named_project_that_w_and_b_does_not_list_exits_2_and_changes_nothing(
    wandb_server, dagster_home, warehouse_path, capsys, monkeypatch
):
    """`heldout-ent/alpah,heldout-lab/*` skipped the typo with a warning, and the projects meant beside it left the
    mirror set (5d25e50). A named project W&B does not list is refused as a mistyped entity is: exit 2, one sentence
    saying what the entity lists, the warehouse as it was."""
    server = wandb_server(_nodes("r", 2, "llm"))
    server.add_project("lab", "rl", _nodes("q", 1, "rl"))
    server.add_project("lab", "vision", _nodes("v", 1, "vision"))
    monkeypatch.delenv("WANDB_PROJECT")
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project,lab/*")
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    held = query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY ALL")
    mirrored = query_read_only(warehouse_path, "SELECT * FROM wandb_projects ORDER BY ALL")
    for setting, says in (
        ("test-team/test-projcet,lab/*", "test-team/test-projcet, which W&B does not list for this key (test-team "
         "lists test-project)"),
        ("test-team/test-project,lab/rl,lab/visoin", "lab/visoin, which W&B does not list for this key (lab lists "
         "rl, vision)"),
        ("nobody/thing", "nobody/thing, which W&B does not list for this key (W&B lists no project of 'nobody')"),
    ):  # fmt: skip
        monkeypatch.setenv("WANDB_ASSETS_PROJECTS", setting)
        for command in (["refresh"], ["backfill", "--start", "2026-06-01", "--end", "2026-06-01"]):
            code, out, err = cli(capsys, *command)
            assert (code, out) == (2, ""), (setting, command, err)
            assert err == f"error: WANDB_ASSETS_PROJECTS names {says}: check its name; nothing was changed.\n"
    assert query_read_only(warehouse_path, "SELECT * FROM runs ORDER BY ALL") == held
    assert query_read_only(warehouse_path, "SELECT * FROM wandb_projects ORDER BY ALL") == mirrored


def test_a_key_too_short_for_the_client_says_so_not_that_a_server_rejected_it(
    wandb_server, dagster_home, capsys, monkeypatch
):
    """A `local-` key cut short is refused by the wandb client itself (40+ characters after its prefix); the
    message said "rejected by http://...", sending the newcomer to the server's keys page. Exit 2, the key's length,
    never the key."""
    wandb_server(_nodes("r", 1, "llm"))
    monkeypatch.setenv("WANDB_API_KEY", "local-abc123")
    code, out, err = cli(capsys, "refresh")
    assert (code, out) == (2, "")
    assert err == (
        "error: WANDB_API_KEY is 6 characters long after its prefix, and a W&B API key has 40 or more: the wandb "
        "client refuses it before asking any server; check that it was copied whole.\n"
    )


def test_a_reading_command_piped_into_head_ends_without_a_traceback(tmp_path):
    """`wandb-assets idle | head` ended in a BrokenPipeError traceback. A reader that closes the pipe before the
    command writes (`| true`) ends the command quietly, with the status a shell gives a process ended by SIGPIPE."""
    import shutil

    import duckdb

    from wandb_assets.lib.warehouse import ensure_schema
    from wandb_assets.warehouse import snapshot_file

    path = tmp_path / "w.duckdb"
    con = duckdb.connect(str(path))
    ensure_schema(con)
    con.close()
    shutil.copy(path, snapshot_file(path))
    command = f"{sys.executable} -m wandb_assets.cli alerts --warehouse {path}"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | true"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (141, "")
    whole = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0 and whole.stdout  # it does print, when read


def test_a_failed_or_malformed_metadata_read_is_asked_again_after_an_hour_then_six_then_never():
    """Issue 53: a truncated file or an HTML error page served with 200 was downloaded at every tick for a day. Hand
    worked from one run that ended at 09:00 and is read at 10:00: malformed; not at 10:15 (an hour's back-off), again
    at 11:00; not at 16:00 (six hours after that), again at 17:00; then never (3 reads), its cause kept. A network
    failure the same; a missing file (free: the page says it) is asked until a day after the heartbeat."""
    from datetime import datetime, timedelta

    from wandb_assets.lib.accounting.gpus import metadata_after_reading, metadata_settled

    ended, first = datetime(2026, 6, 1, 9), datetime(2026, 6, 1, 10)
    for failure in ({"status": "malformed"}, {"status": "error", "cause": "HTTP 502", "error": "GET https://x failed"}):
        kept, reads = None, []
        for minutes in range(0, 48 * 60, 15):  # a tick every 15 minutes for two days
            at = first + timedelta(minutes=minutes)
            if not metadata_settled(kept, ended, at):
                reads.append(at)
                kept = metadata_after_reading(kept, failure, at)
        assert reads == [first, first + timedelta(hours=1), first + timedelta(hours=7)], failure
        assert kept == {
            **{k: v for k, v in failure.items() if k != "error"},  # the cause kept, never the message (a URL)
            "attempts": 3,
            "asked_at": "2026-06-01 17:00:00",
        }
    missing = {"status": "missing"}
    assert metadata_after_reading(None, missing, first) == missing
    assert not metadata_settled(missing, ended, ended + timedelta(hours=23))
    assert metadata_settled(missing, ended, ended + timedelta(hours=24))
    read = {"status": "read", "gpu_count": 8, "gpu": "H100"}
    assert metadata_after_reading(read, {"status": "error", "cause": "timeout"}, first) == read  # never lost
    assert metadata_settled(read, ended, first)


def test_a_malformed_metadata_file_of_a_run_that_just_ended_is_downloaded_once_not_at_every_tick(
    wandb_server, warehouse_path, instance
):
    """Of the held-out malformed files, a truncated JSON and an HTML "502 Bad Gateway" page served with 200 were
    downloaded at the backfill and at every tick after (5d25e50). Two runs that ended now: each file is downloaded
    by the first backfill and not by the next two (the back-off is an hour); both are kept malformed, read once."""
    from datetime import UTC, date, datetime

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    at = datetime(2026, 6, 1, 12)

    def node(run_id: str, metadata: str) -> dict:
        return make_run_node(
            run_id, display_name=None, state="finished", created_at=at, heartbeat_at=now, metadata=metadata
        )

    server = wandb_server([node("cut", '{"gpu_count": 8, "gp'), node("html", "<html><h1>502 Bad Gateway</h1></html>")])
    day = date(2026, 6, 1)
    downloads = []
    for _ in range(3):
        server.file_downloads.clear()
        assert execute_backfill(instance, day, day).success
        downloads.append(sorted(server.file_downloads))
    assert downloads == [["test-team/test-project/cut", "test-team/test-project/html"], [], []]
    rows = query_read_only(
        warehouse_path,
        "SELECT run_id, wandb_metadata->>'status', (wandb_metadata->>'attempts')::INT FROM runs ORDER BY 1",
    )
    assert rows == [("cut", "malformed", 1), ("html", "malformed", 1)]


def test_projects_lists_the_entities_the_key_reads_and_marks_what_is_mirrored(
    wandb_server, dagster_home, capsys, monkeypatch
):
    """`wandb-assets projects`: the key's entities (its own and its teams') with their projects, a * before each
    mirrored one; the newcomer had found the second entity through a GraphQL call."""
    server = wandb_server(_nodes("r", 1, "llm"))
    server.add_project("lab", "rl", [])
    server.add_project("lab", "vision", [])
    server.add_project("test-team", "scratch", [])
    monkeypatch.setenv("WANDB_ASSETS_PROJECTS", "test-team/test-project,lab/*")
    code, out, err = cli(capsys, "projects")
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "  test-team: 2 project(s)",
        "      scratch",
        "    * test-project",
        "  lab: 2 project(s), mirrored whole (lab/*)",
        "    * rl",
        "    * vision",
        "3 of 4 project(s) mirrored (WANDB_ASSETS_PROJECTS).",
    ]
    assert out.startswith(f"Entities and projects this key can read at {server.url} (* mirrored):")
    monkeypatch.delenv("WANDB_ASSETS_PROJECTS")  # the one project of WANDB_ENTITY/WANDB_PROJECT
    code, out, _ = cli(capsys, "projects")
    assert code == 0 and out.splitlines()[-1] == "1 of 4 project(s) mirrored (WANDB_ENTITY/WANDB_PROJECT)."


@pytest.mark.slow  # a whole dbt build (26 s under a busy loop)
def test_a_dbt_build_launched_as_the_ui_does_keeps_dbts_lines_and_the_source_test_notes_off_the_terminal(
    warehouse_path, instance, capfd
):
    """The UI's terminal printed 540 dbt progress lines and 24 "Logging an AssetObservation instead of an
    AssetCheckResult" warnings in 16 minutes (5d25e50): the CLI hid them, a run launched by the daemon did not. The
    analytics job run as the daemon runs it (no CLI around it): nothing of dbt's on stdout or stderr, no such warning
    in the run's events; dbt's lines are in DBT_CONSOLE_LOG, each model and test an event of the run."""
    from dagster import DagsterEventType

    from tests.test_analytics import build_hand_made_warehouse
    from wandb_assets.defs.analytics.project import DBT_CONSOLE_LOG
    from wandb_assets.ticks import ANALYTICS_JOB, _execute

    build_hand_made_warehouse(warehouse_path)
    capfd.readouterr()
    result = _execute(instance, ANALYTICS_JOB, {"ops": {"analytics_models": {"config": {"docs": False}}}})
    assert result.success
    out, err = capfd.readouterr()
    assert "dbt" not in out.lower() and "START sql" not in out + err and "PASS" not in out + err, out[:2000]
    assert "AssetObservation" not in out + err
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert not [m for m in messages if "Logging an `AssetObservation`" in m]
    assert "PASS" in DBT_CONSOLE_LOG.read_text()
    # each model's materialization names the warehouse dbt built it in (as every asset's does)
    models = [
        event.asset_materialization
        for event in instance.all_logs(result.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    ]
    assert {"run_efficiency", "team_gpu_cost_monthly", "warehouse_snapshot"} <= {m.asset_key.path[-1] for m in models}
    assert {m.metadata["warehouse"].value for m in models} == {str(warehouse_path)}


def test_one_instance_serves_one_warehouse_and_a_command_writing_another_is_refused(
    wandb_server, dagster_home, warehouse_path, capsys, monkeypatch, tmp_path
):
    """CLI runs of a 3-day scratch warehouse and of the real one were recorded in one instance (5d25e50): the UI's
    gpu_usage page showed whichever ran last, and its daemon then ran the feed on its own warehouse. The first
    command records its warehouse in the instance; a command (and `ui`) writing another exits 2 with one sentence
    before any run; every run is tagged with the warehouse it wrote."""
    from dagster import DagsterEventType, DagsterInstance

    from wandb_assets.commands.common import INSTANCE_WAREHOUSE_MARK
    from wandb_assets.definitions import build_definitions
    from wandb_assets.ticks import WAREHOUSE_TAG

    wandb_server(_nodes("r", 1, "llm"))
    # a command refused for its configuration records nothing (the suite's smoke test, run twice in one checkout,
    # had left its throwaway warehouse in the checkout's instance and was refused the second time)
    monkeypatch.setenv("WANDB_PROJECT", "")
    assert cli(capsys, "refresh")[0] == 2
    assert not (dagster_home / INSTANCE_WAREHOUSE_MARK).exists()
    monkeypatch.setenv("WANDB_PROJECT", "test-project")
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-01")
    assert code == 0, err
    assert (dagster_home / INSTANCE_WAREHOUSE_MARK).read_text() == f"{warehouse_path}\n"
    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
        materialized = [
            event.asset_materialization
            for run in runs
            for event in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        ]
    assert {run.tags[WAREHOUSE_TAG] for run in runs} == {str(warehouse_path)}
    # every materialization names the warehouse it wrote, as the asset definitions (the UI's asset pages) do
    assert {"runs", "gpu_usage", "gpu_hours", "warehouse_snapshot"} <= {m.asset_key.path[-1] for m in materialized}
    assert {
        m.asset_key.path[-1]: m.metadata.get("warehouse") for m in materialized if "warehouse" not in m.metadata
    } == {}
    assert {m.metadata["warehouse"].value for m in materialized} == {str(warehouse_path)}
    assert {spec.metadata["warehouse"] for spec in build_definitions().resolve_all_asset_specs()} == {
        str(warehouse_path)
    }
    scratch = tmp_path / "scratch" / "scratch.duckdb"
    monkeypatch.setenv("WANDB_ASSETS_DUCKDB", str(scratch))
    for command in (["refresh"], ["backfill", "--start", "2026-06-01", "--end", "2026-06-01"], ["ui"]):
        code, out, err = cli(capsys, *command)
        assert (code, out) == (2, ""), command
        assert err == (
            f"error: The Dagster instance at {dagster_home} records the runs of the warehouse {warehouse_path}, and "
            f"WANDB_ASSETS_DUCKDB is {scratch}: give this warehouse an instance of its own (DAGSTER_HOME set to a "
            f"folder holding a copy of dagster.yaml), or remove {dagster_home / INSTANCE_WAREHOUSE_MARK} if the "
            "instance should serve this warehouse from now on.\n"
        )
    assert not scratch.exists()
    with DagsterInstance.get() as instance:
        assert len(instance.get_runs()) == len(runs)


def test_every_asset_of_the_code_location_names_the_warehouse_in_each_materialization():
    """Each asset's body is wrapped by names_the_warehouse (a new asset without it would report materializations
    that do not say which warehouse they wrote; the test above watches what the wrapper adds)."""
    from wandb_assets.definitions import defs

    bodies = {a.op.name: a.op.compute_fn.decorated_fn for a in defs.assets}
    assert len(bodies) == 19
    assert [name for name, body in bodies.items() if not getattr(body, "names_the_warehouse", False)] == []
