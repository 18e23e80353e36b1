"""Shared fixtures: an isolated environment, a local W&B server the real client talks to, a Dagster instance."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The warehouse path and partition start are read when the definitions are imported: fix them first.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="wandb-assets-tests-"))
os.environ["WANDB_ASSETS_DUCKDB"] = str(_SESSION_DIR / "warehouse" / "test.duckdb")
os.environ["WANDB_ASSETS_START_DATE"] = "2026-01-01"
os.environ["WANDB_DIR"] = str(_SESSION_DIR / "wandb")
os.environ["WANDB_CACHE_DIR"] = str(_SESSION_DIR / "wandb-cache")
os.environ["XDG_CACHE_HOME"] = str(_SESSION_DIR / "xdg-cache")
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)
os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)

from wandb_assets.localwandb import LocalWandbServer  # noqa: E402

API_KEY = "local-" + "t" * 40
ENTITY, PROJECT = "test-team", "test-project"


@pytest.fixture(autouse=True)
def fresh_warehouse(monkeypatch):
    """Every test starts without a warehouse file and with fast, bounded W&B retries."""
    path = Path(os.environ["WANDB_ASSETS_DUCKDB"])
    for leftover in (path, path.with_suffix(".duckdb.wal")):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(path.parent / "staging", ignore_errors=True)
    monkeypatch.setenv("WANDB_ASSETS_HTTP_TIMEOUT", "5")
    monkeypatch.setenv("WANDB_ASSETS_HTTP_RETRIES", "2")
    monkeypatch.setenv("WANDB_ASSETS_RETRY_WAIT_MAX", "0.5")
    yield path


@pytest.fixture
def warehouse_path(fresh_warehouse) -> Path:
    return fresh_warehouse


@pytest.fixture
def wandb_server(monkeypatch):
    """Start a local W&B server with the given run nodes and point the environment at it."""
    servers = []

    def start(nodes, *, api_key: str | None = None) -> LocalWandbServer:
        server = LocalWandbServer(nodes, entity=ENTITY, project=PROJECT, api_key=api_key).start()
        servers.append(server)
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        monkeypatch.setenv("WANDB_API_KEY", API_KEY)
        monkeypatch.setenv("WANDB_ENTITY", ENTITY)
        monkeypatch.setenv("WANDB_PROJECT", PROJECT)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def instance():
    from dagster import instance_for_test

    with instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def memory_con():
    """An in-memory DuckDB connection."""
    import duckdb

    connection = duckdb.connect(":memory:")
    yield connection
    connection.close()


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    """A persistent instance configured by the repository's dagster.yaml, in a temporary folder."""
    import shutil

    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)  # the instance's storage paths are relative to the working directory
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    return tmp_path


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``wandb-assets ARGS`` in this process: (exit status, stdout, stderr)."""
    from wandb_assets.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
