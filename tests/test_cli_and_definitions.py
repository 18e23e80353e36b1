"""The code location loads, the schedule plans ticks, and the CLI behaves as the README says."""

import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import pytest
from dagster import Definitions, RunRequest, build_schedule_context

from tests.conftest import API_KEY, child_processes, cli
from tests.test_pipeline_e2e import at, dataset
from wandb_assets.definitions import defs
from wandb_assets.defs.fleet.schedules import every_15_minutes
from wandb_assets.localwandb import make_run_node
from wandb_assets.ticks import execute_backfill
from wandb_assets.warehouse import query_read_only

#: With one request in flight (one slice per day): backfill: check + 3 days; refresh (today is months after
#: the data): check + yesterday and today + the older unfinished runs by id.
RUNS_QUERIES = (1 + 3) + (1 + 2 + 1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, env_updates: dict | None = None) -> subprocess.CompletedProcess:
    """The installed entry point in a child process: only for the one smoke test."""
    env = {**os.environ, **(env_updates or {})}
    env.pop("DAGSTER_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def alert_runs() -> int:
    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:
        return len([r for r in instance.get_runs() if r.job_name == "pipeline_alert"])


def test_definitions_validate():
    Definitions.validate_loadable(defs)


def test_definitions_contents():
    assert {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()} == {
        "staged_runs",
        "runs",
        "wandb_projects",
        "staged_curves",
        "run_curves",
        "push_to_main_sps",
        "success_rates",
        "gpu_hours",
        "gpu_usage",
        "fleet_snapshot",
        "datadog_feed",
        "fleet_alerts",
        "idle_actions",
        "pr_checks",
        "github_checks",
        "warehouse_snapshot",
        "fleet_report",
        "offline_runs",
        # the analysts' dbt project: its seed, staging views and marts
        "stg_runs",
        "stg_gpu_usage",
        "stg_gpu_charges",
        "stg_success_rates",
        "stg_run_curve_idle",
        "team_gpu_cost_monthly",
        "run_efficiency",
        "fleet_health_daily",
        "team_budget_vs_spend",
        "idle_by_user_weekly",
        "marts_build",
    }
    curves = defs.get_schedule_def("curves_between_ticks")  # between the ticks, never on their path
    assert (curves.cron_schedule, curves.default_status.value, curves.job_name) == (
        "7,22,37,52 * * * *",
        "RUNNING",
        "curves",
    )
    schedule = defs.get_schedule_def("every_15_minutes")
    assert schedule.cron_schedule == "*/15 * * * *"
    assert schedule.default_status.value == "RUNNING"
    assert defs.resolve_job_def("refresh").tags["dagster/max_runtime"] == "900"
    assert defs.resolve_job_def("offline").tags["dagster/max_runtime"] == "3600"  # a crafted log cannot hold the slot
    assert {s.name for s in defs.sensors} == {
        "after_fleet_snapshot",
        "pipeline_failure_opens",
        "pipeline_failure_resolves",
        "offline_run_logs",
        "analytics_after_feed",
        "after_feed_to_github",
    }
    assert all(s.default_status.value == "RUNNING" for s in defs.sensors)
    # a failed run of any job that writes the warehouse or feeds Datadog opens (and its next success resolves)
    # the pipeline_failure alert: the sensor-launched offline job included
    from wandb_assets.defs.feed.pipeline_failure import MONITORED_JOBS

    # each sensor watches every job of the code location and passes over the others by name (test_feed_e2e: a run
    # of one not named requests nothing), so every name is a job of it
    assert MONITORED_JOBS == {
        "refresh",
        "backfill",
        "offline",
        "curves",
        "feed",
        "github_delivery",
        "warehouse_maintenance",
        "analytics",
    }
    assert MONITORED_JOBS <= {j.name for j in defs.jobs}
    assert {j.name for j in defs.jobs} == {
        "refresh",
        "backfill",
        "feed",
        "pipeline_alert",
        "report",
        "offline",
        "curves",
        "warehouse_maintenance",
        "analytics",
        "github_delivery",
    }
    maintenance = defs.get_schedule_def("daily_warehouse_maintenance")
    assert (maintenance.cron_schedule, maintenance.default_status.value) == ("40 3 * * *", "RUNNING")


def test_no_module_imports_the_definitions_back():
    """``definitions -> defs -> lib``: nothing imports the code location; it and ticks.py (the CLI's runs, beside
    it) build their definitions with ``wandb_assets.defs.build_definitions``."""
    package = Path(REPO) / "wandb_assets"
    importers = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"^\s*(from|import) wandb_assets\.definitions", path.read_text(), re.M)
    }
    assert importers == set()
    builders = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "build_definitions(" in path.read_text() and path != package / "defs" / "__init__.py"
    }
    assert builders == {"definitions.py", "ticks.py"}
    lib_imports = {
        str(path.relative_to(package))
        for path in (package / "lib").rglob("*.py")
        if re.search(r"^\s*(from|import) (dagster|wandb_assets\.(defs|settings|definitions))", path.read_text(), re.M)
    }
    assert lib_imports == set()


def test_every_warehouse_writer_is_in_the_single_slot_pool(tmp_path, monkeypatch):
    import yaml
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    graph = defs.resolve_asset_graph()
    pools = {key.to_user_string(): graph.get(key).pools for key in graph.get_all_asset_keys()}
    # staged_runs and staged_curves only fetch and read the warehouse read-only: they run outside the pool, by design
    assert pools.pop("staged_runs") == set() and pools.pop("staged_curves") == set()
    assert all(p == {"warehouse"} for p in pools.values()), pools
    checks = {key.name: c.node_def.pools for c in defs.asset_checks for key in c.check_keys}
    assert checks == {"success_rate_low_check": {"warehouse"}, "sps_regression_check": {"warehouse"}}
    # publish (the report job) writes through pool-bound steps too; the pipeline_failure alert is outside the pool
    # by design: it must page while a writer holds the pool (it records in the warehouse only where it can)
    assert defs.resolve_job_def("pipeline_alert").graph.node_defs[0].pools == set()
    assert {n.name for n in defs.resolve_job_def("report").graph.node_defs} == {"fleet_report"}
    config = yaml.safe_load(open(os.path.join(REPO, "dagster.yaml")))
    assert config["concurrency"]["pools"]["default_limit"] == 1
    assert config["run_monitoring"]["free_slots_after_run_end_seconds"] == 60
    monkeypatch.chdir(tmp_path)  # the instance's storage paths are relative to the working directory
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path), config_dir=REPO)) as instance:
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert instance.run_monitoring_enabled


def test_schedule_reads_yesterday_and_today_or_reaches_back_to_the_oldest_unfinished_run_if_told(
    wandb_server, instance, monkeypatch
):
    wandb_server(
        [
            make_run_node("old", display_name="train", state="running", created_at=at(3, 5)),
            make_run_node("done", display_name="train", state="finished", created_at=at(1, 5)),
        ]
    )
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 10)).success
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 6, 10, 12, 15, tzinfo=UTC)
    )
    request = every_15_minutes(context)
    assert isinstance(request, RunRequest)  # "old" (running, created 06-03) is refreshed by id, not by its days
    assert request.tags["dagster/asset_partition_range_start"] == "2026-06-09"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-06-10"
    monkeypatch.setenv("WANDB_ASSETS_UNFINISHED_WINDOW_DAYS", "7")
    request = every_15_minutes(context)
    assert request.tags["dagster/asset_partition_range_start"] == "2026-06-03"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-06-10"


def test_schedule_on_an_empty_warehouse_reads_yesterday_and_today(instance):
    context = build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 6, 10, 0, 0, tzinfo=UTC)
    )
    request = every_15_minutes(context)
    assert (request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]) == (
        "2026-06-09",
        "2026-06-10",
    )


def test_cli_backfill_then_refresh(wandb_server, warehouse_path, dagster_home, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_ASSETS_FETCH_CONCURRENCY", "1")
    server = wandb_server(dataset())
    code, out, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-03")
    assert code == 0, err
    assert "Backfilled 2026-06-01..2026-06-03" in out
    code, out, err = cli(capsys, "refresh")
    assert code == 0, err
    assert "wandb.push_to_main.overview.sps" in out
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 8
    assert con.execute("SELECT count(DISTINCT snapshot_at), count(*) FROM fleet_metrics").fetchone() == (1, 24)
    con.close()
    assert server.count("Runs") == RUNS_QUERIES


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["backfill", "--start", "2026-06-01", "--end", "2026-06-02"],
            {"WANDB_PROJECT": "no-such-project"},
            "error: W&B project test-team/no-such-project was not found: check WANDB_ENTITY and WANDB_PROJECT.",
        ),
        (["refresh"], {"WANDB_PROJECT": ""}, "error: WANDB_PROJECT is not set: export the W&B project to mirror"),
        (["backfill", "--start", "June 1"], {}, "error: --start must be a day like 2026-06-01 (got 'June 1')."),
        (
            ["backfill", "--start", "2026-06-03", "--end", "2026-06-01"],
            {},
            "error: --end (2026-06-01) is before --start (2026-06-03).",
        ),
        (["refresh"], {"WANDB_ASSETS_PAGE_SIZE": "lots"}, "error: WANDB_ASSETS_PAGE_SIZE must be a number"),
        # issue 33: mistakes that printed a traceback, or blamed the key, or left a run "Starting..."
        (
            ["backfill", "--start", "2020-01-01", "--end", "2020-01-02"],
            {"WANDB_ASSETS_START_DATE": "2026-01-01"},
            "error: --start 2020-01-01 is before WANDB_ASSETS_START_DATE (2026-01-01), the first day the assets have: "
            "set WANDB_ASSETS_START_DATE=2020-01-01 to backfill from then.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_DUCKDB": "/dev/null/w.duckdb"},  # its folder is no folder: nothing can be made there
            "error: WANDB_ASSETS_DUCKDB names /dev/null/w.duckdb, but /dev/null cannot be written: point it at a "
            "writable place.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_PROJECTS": "ml-platfrom/*"},  # a mistyped entity lists nothing: said, not silent
            "error: WANDB_ASSETS_PROJECTS names no project W&B has now: W&B lists no project of 'ml-platfrom' for "
            "this key: check the entity's name in WANDB_ASSETS_PROJECTS.",
        ),
        (
            ["refresh"],
            {"WANDB_BASE_URL": "127.0.0.1:8799"},
            "error: WANDB_BASE_URL must start with http:// or https:// (got '127.0.0.1:8799'): for example "
            "WANDB_BASE_URL=http://127.0.0.1:8799.",
        ),
        (
            ["refresh"],
            {"WANDB_BASE_URL": "http://127.0.0.1:8799/graphql"},
            "error: WANDB_BASE_URL is the server's address, without /graphql (got 'http://127.0.0.1:8799/graphql'): "
            "set it to http://127.0.0.1:8799.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_PROJECTS": "test-team/test-project, research"},
            "error: WANDB_ASSETS_PROJECTS has 'research': each item is entity/project or entity/* (such as ml-team/*).",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_FETCH_CONCURRENCY": "16"},
            "error: WANDB_ASSETS_FETCH_CONCURRENCY must be from 1 to 8 (got '16'); unset it to use the default.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_PAGE_SIZE": "10"},
            "error: WANDB_ASSETS_PAGE_SIZE must be at least 25 (got '10'); unset it to use the default.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_TEAMS": "teams.yaml"},  # written by the test: a list item under a mapping, line 2
            "error: WANDB_ASSETS_TEAMS names teams.yaml, which is not valid YAML at line 2, column 1.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_STAGING_DIR": "/proc/staging"},
            "error: WANDB_ASSETS_STAGING_DIR names /proc/staging, but /proc cannot be written: point it at a "
            "writable place.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_GPU_DEFAULT_PRICE": "-1"},
            "error: WANDB_ASSETS_GPU_DEFAULT_PRICE must be at least 0 (got '-1'); unset it to use the default.",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_GITHUB_REPO": "acme", "WANDB_ASSETS_GITHUB_TOKEN": "ghp_x"},
            "error: WANDB_ASSETS_GITHUB_REPO must be owner/name, like acme/trainer (got 'acme').",
        ),
        (
            ["refresh"],
            {"WANDB_ASSETS_GITHUB_REPO": "acme/trainer"},
            "error: WANDB_ASSETS_GITHUB_REPO is acme/trainer, but no credential is set: set WANDB_ASSETS_GITHUB_APP_ID "
            "and WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY (a GitHub App), or WANDB_ASSETS_GITHUB_TOKEN.",
        ),
        (
            ["refresh"],
            {
                "WANDB_ASSETS_GITHUB_REPO": "acme/trainer",
                "WANDB_ASSETS_GITHUB_APP_ID": "77",
                "WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY": "MIIEsecretkeymaterial",
            },
            "error: WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY is neither PEM text nor the path of a readable .pem file.",
        ),
        (["costs", "--days", "0"], {}, "error: --days must be 1 or more (got 0)."),
        (["backfill"], {}, "usage: wandb-assets backfill [-h] --start START"),  # argparse's own: exit 2 too
    ],
)
def test_cli_configuration_errors_exit_2_and_open_no_alert(
    wandb_server, dagster_home, monkeypatch, capsys, args, env, message
):
    """Each mistake: exit 2, one line on stderr (argparse: its usage lines), no traceback, no key, no alert, no run
    left behind. In this process (the table's 20 processes took 100 s of the everyday tier under a busy loop); the
    test below runs the two kinds, a configuration error and argparse's, as a user does, a process each."""
    wandb_server(dataset())
    (dagster_home / "teams.yaml").write_text("vision: [alice]\n- bob\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        code, out, err = cli(capsys, *args)
    except SystemExit as exc:  # argparse's own exit
        code, (out, err) = exc.code, capsys.readouterr()
    _said_once_and_ran_nothing(code, out, err, message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["refresh"], "error: WANDB_ASSETS_PAGE_SIZE must be at least 25 (got '10'); unset it to use the default."),
        (["backfill"], "usage: wandb-assets backfill [-h] --start START"),
    ],
)
def test_a_configuration_error_run_as_a_user_runs_it_is_one_line_and_exit_2(wandb_server, dagster_home, args, message):
    """The same, as a process of its own: the exit status, stderr and stdout a shell sees."""
    wandb_server(dataset())
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_ASSETS_PAGE_SIZE": "10"},
        timeout=120,
    )
    _said_once_and_ran_nothing(done.returncode, done.stdout, done.stderr, message)


def _said_once_and_ran_nothing(code, out, err, message) -> None:
    assert code == 2, err
    assert err.startswith(message), err
    assert err.count("\n") == (1 if message.startswith("error:") else err.count("\n"))
    assert "Traceback" not in err
    assert API_KEY not in out + err
    assert alert_runs() == 0
    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:  # checked before any run starts: none is left behind
        assert instance.get_runs() == []


def test_cli_rejected_key_exits_2(wandb_server, dagster_home, capsys):
    wandb_server(dataset(), api_key="local-" + "r" * 40)
    code, _, err = cli(capsys, "refresh")
    assert code == 2
    assert err.startswith("error: WANDB_API_KEY was rejected by http://127.0.0.1:")
    assert API_KEY not in err and alert_runs() == 0


def test_cli_failed_run_exits_1_and_opens_the_alert(wandb_server, dagster_home, capsys, warehouse_path):
    server = wandb_server(dataset())
    server.faults.fail_status, server.faults.fail_count = 500, -1
    server.faults.fail_after = 1  # the configuration check passes; the fetch itself then fails
    code, _, err = cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-02")
    assert code == 1
    assert re.search(r"Fetching W&B runs of test-team/test-project created 2026-06-0[12]T\d\d:00:00Z\.\.", err)
    assert "HTTP 500" in err
    assert alert_runs() == 1
    open_alerts = "SELECT alert_key FROM alerts WHERE resolved_at IS NULL AND rule = 'pipeline_failure'"
    assert query_read_only(str(warehouse_path), open_alerts) == [("pipeline_failure:backfill",)]
    server.faults.fail_status = None
    assert cli(capsys, "refresh", "--quiet")[0] == 0  # a good tick is not a good backfill: still open
    assert query_read_only(str(warehouse_path), open_alerts) == [("pipeline_failure:backfill",)]
    assert cli(capsys, "backfill", "--start", "2026-06-01", "--end", "2026-06-02")[0] == 0
    assert query_read_only(str(warehouse_path), open_alerts) == []
    assert alert_runs() == 2  # opened once, resolved once


def test_cli_outside_the_repository_without_dagster_home_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    code, out, err = cli(capsys, "refresh")
    assert code == 2 and out == ""
    assert err == (
        "error: DAGSTER_HOME is not set and there is no dagster.yaml here: set DAGSTER_HOME to the folder holding the "
        "instance's dagster.yaml (the repository root, or a folder holding a copy of deploy/postgres/dagster.yaml for "
        "PostgreSQL), or run from the repository root.\n"
    )


def test_loading_the_definitions_imports_no_aws_and_no_wandb_client():
    """Every process that loads the code location (code server, run worker, CLI) pays its imports: boto3 comes
    only when a key is read from Secrets Manager, the wandb client only when W&B is asked, pandas only where the
    idle ladder builds a frame. (dagster-aws alone, through Dagster's component registry, cost every such process
    3.7 s here; pandas 0.39 s.)"""
    code = (
        "import sys, wandb_assets.definitions; "
        "print(sorted({'boto3', 'dagster_aws', 'wandb', 'pandas'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_command_running_the_other_jobs_loads_no_dbt():
    """The CLI builds the definitions of the job it runs: all but the analysts' dbt project (whose import,
    dagster-dbt and dbt, was 2.0 s of a tick's process here) unless the job is theirs. The definitions it runs the
    tick's jobs from are those of the code location less the analytics folder's, resources included."""
    code = (
        "import sys\n"
        "from wandb_assets.ticks import _definitions\n"
        "other = _definitions(analytics=False)\n"
        "jobs = sorted(j.name for j in other.resolve_all_job_defs())\n"
        "dbt = sorted(m for m in sys.modules if m.split('.')[0] in {'dagster_dbt', 'dbt'})\n"
        "print(dbt, jobs, sorted(other.resources))\n"
        "print(sorted(s.key.to_user_string() for s in other.resolve_all_asset_specs()), 'dagster_dbt' in sys.modules)\n"
        "full = _definitions(analytics=True)\n"
        "analytics = full.resolve_job_def('analytics').name\n"
        "print(len(full.resolve_all_asset_specs()), analytics, 'dagster_dbt' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    jobs = "'backfill', 'curves', 'feed', 'github_delivery', 'offline', 'pipeline_alert', 'refresh', 'report'"
    resources = "['channels', 'datadog', 'github', 'slack', 'wandb', 'warehouse']"
    from wandb_assets.defs.analytics.assets import analytics_models

    dbt_keys = {key.to_user_string() for key in analytics_models.keys}
    # less the dbt models and seed, but for the mart warehouse_snapshot depends on (there, a dependency's stub)
    ours = sorted(
        {s.key.to_user_string() for s in defs.resolve_all_asset_specs()} - dbt_keys | {"team_gpu_cost_monthly"}
    )
    assert done.stdout.splitlines() == [
        f"[] ['__ASSET_JOB', {jobs}, 'warehouse_maintenance'] {resources}",
        f"{ours} False",
        f"{len(defs.resolve_all_asset_specs())} analytics True",
    ]


def test_cli_entry_point_smoke():
    """One child process: the module runs as a program and maps a configuration error to exit 2."""
    done = run_cli("refresh", env_updates={"WANDB_API_KEY": API_KEY, "WANDB_PROJECT": ""})
    assert done.returncode == 2
    assert done.stderr == (
        "error: WANDB_PROJECT is not set: export the W&B project to mirror (or run `wandb-assets demo`).\n"
    )


@pytest.mark.slow  # the whole demo in a process (36 s under a busy loop); CI runs it in the slow tier
def test_the_demo_touches_nothing_but_its_own_folder_and_a_dry_run_feed(tmp_path):
    """`wandb-assets demo` started from an operator's shell that points at a real warehouse, staging folder,
    Dagster instance, Datadog and Slack: the real warehouse file is byte-for-byte unchanged, nothing is created
    in the real folders, Datadog and Slack receive nothing, and the demo's own folder holds its warehouse, whose
    feed ledger says dry run."""
    import hashlib

    import duckdb

    from tests.capture import CaptureServer
    from tests.conftest import free_port

    production = tmp_path / "prod"
    (production / "dagster-home").mkdir(parents=True)
    (production / "dagster-home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    warehouse = production / "warehouse.duckdb"
    with duckdb.connect(str(warehouse)) as con:
        con.execute("CREATE TABLE runs AS SELECT 'real-run' AS run_id")
    before = hashlib.sha256(warehouse.read_bytes()).hexdigest()
    capture = CaptureServer()
    try:
        env = {
            "WANDB_ASSETS_DUCKDB": str(warehouse),
            "WANDB_ASSETS_STAGING_DIR": str(production / "staging"),
            "DAGSTER_HOME": str(production / "dagster-home"),
            "DD_API_KEY": "0123456789abcdef0123456789abcdef",
            "WANDB_ASSETS_DATADOG_URL": capture.url,
            "WANDB_ASSETS_SLACK_WEBHOOK_URL": capture.url + "/slack",
            "WANDB_API_KEY": "real-" + "k" * 40,
            "WANDB_PROJECT": "real-project",
        }
        done = subprocess.run(
            [sys.executable, "-m", "wandb_assets.cli", "demo", "--dir", str(tmp_path / "demo"), "--days", "2"]
            + ["--runs-per-day", "20", "--history-hours", "2", "--wandb-port", str(free_port()), "--no-analytics"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        capture.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert hashlib.sha256(warehouse.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in production.iterdir()) == ["dagster-home", "warehouse.duckdb"]
    assert sorted(p.name for p in (production / "dagster-home").iterdir()) == ["dagster.yaml"]
    assert capture.requests == []
    assert not (tmp_path / "data").exists()  # nothing in the working directory's default places either
    with duckdb.connect(str(tmp_path / "demo" / "demo.duckdb"), read_only=True) as con:
        statuses = {s for (s,) in con.execute("SELECT DISTINCT status FROM datadog_deliveries").fetchall()}
        assert statuses == {"dry_run", "replayed"}
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
        ladder = con.execute(  # issue 44: one owner told (and the team), one run that would be stopped
            "SELECT run_id, step, audience, outcome, recipient FROM idle_actions WHERE run_id = 'idlegpu0001' "
            "ORDER BY step, audience"
        ).fetchall()
        judged = con.execute(  # issue 45: the demo's three pull requests, each on its testbed
            "SELECT pr, testbed FROM pr_checks WHERE pr > 4000 AND metric = 'overview/sps' ORDER BY pr"
        ).fetchall()
    assert judged == [(4242, "8xA100-80GB"), (4243, "8xA100-80GB"), (4244, "8xB200")]
    assert "  PR 4244 at b200b200: impala.large on 8xB200: " in done.stdout
    assert ladder == [
        ("idlegpu0001", 1, "owner", "skipped", None),
        ("idlegpu0001", 2, "owner", "sent", "U0BOB"),
        ("idlegpu0001", 2, "team", "sent", "C0RESEARCH"),
        ("idlegpu0001", 3, "stop", "would_stop", "demo-team/fleet-demo/idlegpu0001"),
    ]
    assert "  to U0BOB: :hourglass: Your run <http://127.0.0.1:" in done.stdout
    assert "demo-team/fleet-demo/idlegpu0001: stop_runs is off in the policy: the run would have been stopped" in (
        done.stdout
    )
    assert (tmp_path / "demo" / "dagster" / "storage").is_dir()


def test_the_alerts_command_lists_the_open_alerts_with_their_links_most_severe_first(tmp_path):
    from wandb_assets.lib.warehouse import ensure_schema

    snapshot = tmp_path / "w.snapshot.duckdb"
    con = duckdb.connect(str(snapshot))
    ensure_schema(con)
    con.execute(
        "INSERT INTO alerts (alert_key, rule, subject, severity, message, details, opened_at, last_seen_at, "
        "resolved_at) VALUES "
        "('a', 'stalled_run', 'e/p:r1', 'warning', 'Run r1 looks stalled (http://w/e/p/runs/r1).', '{}', "
        "'2026-06-01 10:00', '2026-06-01 11:00', NULL), "
        "('b', 'project_unreachable', 'e/q', 'critical', 'e/q cannot be read.', '{}', "
        "'2026-06-01 10:30', '2026-06-01 11:00', NULL), "
        "('c', 'stalled_run', 'e/p:r0', 'warning', 'resolved one', '{}', "
        "'2026-06-01 09:00', '2026-06-01 09:30', '2026-06-01 09:45')"
    )
    con.close()
    done = subprocess.run(
        [sys.executable, "-m", "wandb_assets.cli", "alerts", "--warehouse", str(snapshot)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "Open alerts: 2",
        "  [critical] project_unreachable (e/q), open since 2026-06-01 10:30 UTC: e/q cannot be read.",
        "  [warning] stalled_run (e/p:r1), open since 2026-06-01 10:00 UTC: Run r1 looks stalled "
        "(http://w/e/p/runs/r1).",
    ]


def test_every_subcommand_says_what_it_does_and_every_argument_has_help():
    """Issue 33: subcommands had no description paragraph and several arguments no help."""
    import argparse

    from wandb_assets.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in sub.choices.items():
        assert parser.description and len(parser.description) > 40, name
        bare = [a.dest for a in parser._actions if a.help is None and not isinstance(a, argparse._HelpAction)]
        assert bare == [], (name, bare)


@pytest.mark.slow  # a whole backfill process interrupted (30 s under a busy loop)
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_during_a_backfill_is_one_line_exit_130_a_canceled_run_and_no_page(
    wandb_server, dagster_home, warehouse_path, stop
):
    """Ctrl-C at a terminal (SIGINT to the whole foreground group) mid-fetch: one line, exit 130, the run recorded as
    CANCELED (which the pipeline_failure sensors pass over), no alert; the same command again completes. A
    supervisor's stop (SIGTERM to the command alone) the same: before issue 53 it killed the process mid-run, the run
    left STARTED."""
    import signal
    import time

    from dagster import DagsterInstance, DagsterRunStatus

    server = wandb_server(dataset())
    command = [sys.executable, "-m", "wandb_assets.cli", "backfill", "--start", "2026-06-01", "--end", "2026-06-03"]
    server.faults.latency_s = 1.0  # every request a second: the fetch is under way when the operator stops it
    child = subprocess.Popen(
        command, cwd=dagster_home, env={**os.environ, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # states, not times: the run's fetch asked W&B once (so the command's instance exists: opening it here
        # while the command creates its tables raced, "table runs already exists"), then once more (under way)
        while server.count("Runs") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        asked = server.count("Runs")
        while server.count("Runs") == asked and time.monotonic() < deadline:
            time.sleep(0.1)
        if stop == "ctrl-c":
            os.killpg(child.pid, signal.SIGINT)
        else:
            os.kill(child.pid, signal.SIGTERM)
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # where it hangs: SIGABRT makes faulthandler print every thread's stack
            os.kill(child.pid, signal.SIGABRT)
            out, err = child.communicate(timeout=30)
            pytest.fail(f"the command did not stop within 120 s of the {stop}; its threads:\n{err[-12000:]}")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted; run the same command to resume"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    with DagsterInstance.get() as instance:
        assert [(r.job_name, r.status) for r in instance.get_runs()] == [("backfill", DagsterRunStatus.CANCELED)]
    server.faults.latency_s = 0.0
    again = subprocess.run(
        command, cwd=dagster_home, env=os.environ.copy(), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert alert_runs() == 0  # neither the cancel nor the good run after it paged
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs")[0][0] > 0


def test_a_command_started_in_the_background_stops_its_runs_log_mirrors_and_leaves_none(
    wandb_server, dagster_home, warehouse_path
):
    """Issue 53 (CI stalled for minutes beside a busy loop): a command started in the background by a script ignores
    SIGINT, and Dagster sets SIGTERM to SIGINT's handler as a run ends, so SIGTERM was ignored too and every process
    a later run started inherited that: Dagster stops each step's ``tail -F`` log mirrors with SIGTERM, so each step
    waited 30 s for each of its two mirrors and left them running after the command. Our runs handle SIGTERM as
    Ctrl-C while they execute: nothing waits, nothing is left, and the dispositions are the caller's again after."""
    import signal

    from wandb_assets.cli import main

    wandb_server(dataset())
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(["backfill", "--start", "2026-06-01", "--end", "2026-06-02"])  # stdout is a file: mirrored
        after = {sig: signal.getsignal(sig) for sig in before}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        left = [pid for pid, command in child_processes().items() if command[0] == b"tail"]  # log mirrors
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert code == 0
    assert left == []
    assert after == {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
    assert list(dagster_home.glob(".dagster/compute_logs/**/*.out"))  # the steps' output was mirrored
    assert query_read_only(str(warehouse_path), "SELECT count(*) FROM runs")[0][0] > 0


def test_a_second_uv_run_compiles_nothing_and_costs_under_a_second_more_than_the_venvs_script(tmp_path):
    """uv's compile-bytecode setting re-checked 26,022 files on every `uv run` (2-4 s, a "Bytecode compiled" line
    each time); the environment is compiled once instead (wandb_assets.bytecode, marked beside it)."""
    import shutil
    import time

    from wandb_assets.bytecode import MARK

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH (.ci/run installs it)")
    assert MARK.exists()  # the session compiled it (conftest), as the first command does

    def seconds(command: list[str]) -> tuple[float, str]:
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return time.monotonic() - started, done.stderr

    seconds([uv, "run", "--frozen", "wandb-assets", "--help"])  # a first one may (re)install the project
    through_uv = [seconds([uv, "run", "--frozen", "wandb-assets", "--help"]) for _ in range(3)]
    script = [seconds([str(Path(sys.executable).parent / "wandb-assets"), "--help"])[0] for _ in range(3)]
    assert not [err for _, err in through_uv if "Bytecode compiled" in err]
    assert min(t for t, _ in through_uv) - min(script) < 1.0, (through_uv, script)


def test_the_ui_starts_on_an_instance_storage_already_made(tmp_path, monkeypatch):
    """`demo --ui` starts `dagster dev` and runs its backfill at once: a fresh SQLite storage made by the command's
    runs and the UI's code server together had its schema stamped twice ("more than one head"), and every later
    opening failed (the slow tier's browser tests, once the command stopped spending 2 s importing dbt first). The
    storage is made before `dagster dev` is started: what exists when it is."""
    from wandb_assets.commands import servers

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((Path(REPO) / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("WANDB_ASSETS_DUCKDB", str(tmp_path / "w.duckdb"))
    monkeypatch.setenv("PYTHONWARNINGS", "")  # start_dagster_dev extends it for its processes
    monkeypatch.chdir(home)  # the instance's folders are relative to where it is opened (.dagster/)

    class Started(Exception):
        pass

    made = []

    def starting(command, **options):  # observed: what the UI's processes would open, then stopped there
        made.append(sorted(str(path.relative_to(home)) for path in home.rglob("*.db")))
        raise Started

    monkeypatch.setattr(servers.subprocess, "Popen", starting)
    with pytest.raises(Started):
        servers.start_dagster_dev(port=3999)
    storage = ".dagster/storage"
    assert made == [
        [f"{storage}/history/runs.db", f"{storage}/history/runs/index.db", f"{storage}/schedules/schedules.db"]
    ]
