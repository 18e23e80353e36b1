"""Shared fixtures: an isolated environment, a local W&B server the real client talks to, a Dagster instance."""

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.pg_server import free_port, running_postgres  # noqa: F401 - free_port: the tests' too


def _temporary_files_in_memory() -> None:
    """Every temporary file of the session (pytest's tmp_path, the warehouse and W&B folders below, the instances'
    SQLite files, PostgreSQL's data) on /dev/shm where it is a writable tmpfs with room, unless TMPDIR says
    otherwise: a test's DuckDB and SQLite commits then cost no disk flush. Measured on 2 cores (docs/testing.md):
    the everyday tier 262 s -> 231 s wall, 433 s -> 401 s of CPU. Set here, before anything asks `tempfile`, so
    the workers and every process a test starts inherit it."""
    if os.environ.get("TMPDIR"):
        return
    try:
        room = os.statvfs("/dev/shm")
    except OSError:
        return
    if room.f_bavail * room.f_frsize >= 4 * 2**30 and os.access("/dev/shm", os.W_OK):
        os.environ["TMPDIR"] = "/dev/shm"
        tempfile.tempdir = None  # asked again, from TMPDIR


_temporary_files_in_memory()


def _hypothesis_profile() -> None:
    """`HYPOTHESIS_PROFILE=ci` (set by `.ci/run`): every property test tries the same examples on every run of a
    commit (derandomized, no example database), so CI never fails by chance; a developer's run searches at random, and
    what it finds is written out as a test (docs/testing.md, "Property tests")."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_hypothesis_profile()

# The warehouse path and partition start are read when the definitions are imported: fix them first.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="wandb-assets-tests-"))
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)  # each process's own; in memory, kept would add up
os.environ["WANDB_ASSETS_DUCKDB"] = str(_SESSION_DIR / "warehouse" / "test.duckdb")
os.environ["WANDB_ASSETS_START_DATE"] = "2026-01-01"
os.environ["WANDB_ASSETS_ANALYTICS"] = "false"  # dbt (~6 s a build) only where a test asks for it
os.environ["WANDB_DIR"] = str(_SESSION_DIR / "wandb")
os.environ["WANDB_CACHE_DIR"] = str(_SESSION_DIR / "wandb-cache")
os.environ["XDG_CACHE_HOME"] = str(_SESSION_DIR / "xdg-cache")
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)
os.environ["NETRC"] = str(_SESSION_DIR / "no-netrc")  # never a developer's `wandb login` key
os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)

from wandb_assets.localwandb import LocalWandbServer  # noqa: E402

#: Test files by how long they take here, longest first (`--durations`): with pytest-xdist each file runs whole on
#: one worker (`--dist loadfile`, the module fixtures such as the demo UI are made once), and handing out the
#: longest first keeps one long file from starting last.
SLOWEST_FIRST = (
    "test_browser.py",
    "test_ducklake.py",
    "test_postgres_instance.py",
    "test_reconcile_model.py",
    "test_feed_e2e.py",
    "test_projects.py",
    "test_cli_and_definitions.py",
    "test_analytics.py",
    "test_ingestion.py",
    "test_notebooks.py",
    "test_offline_runs.py",
    "test_deploy.py",
    "test_pipeline_e2e.py",
    "test_alerts.py",
    "test_native_reader_sanitized.py",
    "test_report_and_compare.py",
    "test_pool_slots.py",
)


def pytest_configure(config):
    """The environment's bytecode compiled once before the workers start (``wandb_assets.bytecode``), as the first
    command would: every worker and child process then loads dagster from it."""
    if not hasattr(config, "workerinput"):
        from wandb_assets.bytecode import ensure_compiled

        ensure_compiled(print)
    # Started in the background by a script (CI, a stress loop), pytest and its workers ignore SIGINT; Dagster then
    # sets SIGTERM to "ignore" as each run of a test ends (it maps SIGTERM to SIGINT's handler), and every process a
    # later test starts inherits that: a UI or daemon stopped with SIGTERM waited out its whole timeout, Dagster's
    # log mirrors their 30 s each (issue 53's stalls). The tests run as from a terminal; the product's handling of
    # such a start has a test of its own (test_a_command_started_in_the_background_...).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: the tests of a file keep their order


API_KEY = "local-" + "t" * 40
ENTITY, PROJECT = "test-team", "test-project"


def assert_invariants(con, request) -> None:
    """The warehouse's invariants (``wandb-assets check``) hold on ``con``, unless the test breaks them on purpose
    (``@pytest.mark.breaks_invariants``)."""
    from datetime import UTC, datetime

    from wandb_assets.lib.checks import broken

    if request.node.get_closest_marker("breaks_invariants") is None:
        problems = broken(con, datetime.now(UTC).replace(tzinfo=None))
        assert problems == [], f"{request.node.nodeid} left a warehouse that breaks its invariants: {problems}"


@pytest.fixture(autouse=True)
def fresh_warehouse(monkeypatch, request):
    """Every test starts without a warehouse file and with fast, bounded W&B retries; whatever it loaded into the
    warehouse file holds the warehouse's invariants when it ends."""
    path = Path(os.environ["WANDB_ASSETS_DUCKDB"])
    for leftover in (path, path.with_suffix(".duckdb.wal")):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(path.parent / "staging", ignore_errors=True)
    monkeypatch.setenv("WANDB_ASSETS_HTTP_TIMEOUT", "5")
    monkeypatch.setenv("WANDB_ASSETS_HTTP_RETRIES", "2")
    monkeypatch.setenv("WANDB_ASSETS_RETRY_WAIT_MAX", "0.5")
    yield path
    if path.exists():
        import duckdb

        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error:  # a test's deliberately unreadable file
            return
        try:
            assert_invariants(con, request)
        finally:
            con.close()


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


#: The Datadog key of the ``capture`` fixture.
DD_KEY = "ddkey" + "9" * 27


@pytest.fixture
def capture(monkeypatch):
    """A loopback capture server standing for Datadog (``DD_API_KEY`` set) and the alert webhook."""
    from tests.capture import CaptureServer

    server = CaptureServer()
    monkeypatch.setenv("DD_API_KEY", DD_KEY)
    monkeypatch.setenv("DD_ENV", "test")
    monkeypatch.setenv("WANDB_ASSETS_DATADOG_URL", server.url)
    monkeypatch.setenv("WANDB_ASSETS_SLACK_WEBHOOK_URL", server.url + "/hook/T000/B000/secret")
    yield server
    server.stop()


@pytest.fixture
def instance():
    from dagster import instance_for_test

    with instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def memory_con(request):
    """An in-memory DuckDB connection; what the test loaded into it holds the warehouse's invariants."""
    import duckdb

    connection = duckdb.connect(":memory:")
    yield connection
    try:
        assert_invariants(connection, request)
    finally:
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


# --- PostgreSQL (the Dagster instance on PostgreSQL, the DuckLake catalog) ---

PG_PASSWORD = "pg-" + "s" * 20


def child_processes() -> dict[int, list[bytes]]:
    """The processes this process started and still has: pid -> command line (``/proc``; one gone meanwhile is
    passed over)."""
    children = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().split(b"\0")
            parent = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid():
            children[int(cmdline.parent.name)] = command
    return children


def stop_process_group(process: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM a child started with ``start_new_session=True`` and all it started, then SIGKILL whatever of the
    group is left after ``timeout``: a slow shutdown never outlives its test to load the machine for the next."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader while a code server is left in it
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


@pytest.fixture
def datadog_capture(monkeypatch):
    """A loopback Datadog (``WANDB_ASSETS_DATADOG_URL``) that records every request the feed sends."""
    from tests.capture import CaptureServer

    server = CaptureServer()
    monkeypatch.setenv("WANDB_ASSETS_DATADOG_URL", server.url)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL 15 server for the session (``tests.pg_server.running_postgres``), stopped at the end."""
    with running_postgres(PG_PASSWORD) as server:
        yield server


CHROMIUM = "/usr/bin/chromium"


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")


@pytest.fixture
def chromium():
    """A 1440 x 900 tab of Debian's Chromium, driven by Playwright (the machine's binary: never a downloaded
    browser)."""
    from playwright.sync_api import sync_playwright

    require_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        yield browser.new_page(viewport={"width": 1440, "height": 900})
        browser.close()


# --- AWS Secrets Manager (moto's server on loopback) ---


@pytest.fixture
def moto_endpoint(monkeypatch):
    """moto's Secrets Manager (and S3) server on loopback, the environment pointed at it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    yield endpoint
    server.stop()


def put_secret(endpoint: str, name: str, value: str) -> None:
    import boto3

    client = boto3.client("secretsmanager", endpoint_url=endpoint, region_name="us-east-1")
    client.create_secret(Name=name, SecretString=value)
