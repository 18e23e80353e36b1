"""Issue 53: the third hour of operating it. A warehouse another process writes makes a command wait as runs do and,
past the wait, exit 1 with one sentence naming the holder, paged; a named project W&B does not list exits 2 before
anything changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
