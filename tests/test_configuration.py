"""Settings: environment first, then AWS Secrets Manager (moto's real server), and clear one-line errors."""

import json
from datetime import date

import duckdb
import pytest
from dagster import materialize

from tests.conftest import API_KEY, ENTITY, PROJECT, put_secret
from tests.test_pipeline_e2e import at
from wandb_assets.defs.wandb_runs.assets import runs, staged_runs
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.resources import warehouse_resource
from wandb_assets.localwandb import make_run_node
from wandb_assets.settings import ConfigError, pipeline_settings, resolve_wandb_settings
from wandb_assets.ticks import failure_message, settle_pipeline_alert


def test_environment_wins_over_nothing():
    settings = resolve_wandb_settings({"WANDB_API_KEY": "k" * 40, "WANDB_PROJECT": "p"})
    assert (settings.project, settings.entity, settings.base_url) == ("p", None, None)
    assert "k" * 40 not in repr(settings)


def test_missing_project_names_the_setting():
    with pytest.raises(ConfigError, match=r"^WANDB_PROJECT is not set: export the W&B project"):
        resolve_wandb_settings({"WANDB_API_KEY": "k" * 40})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("WANDB_ASSETS_DEFAULT_GPUS_PER_RUN", "two", "WANDB_ASSETS_DEFAULT_GPUS_PER_RUN must be a number"),
        ("WANDB_ASSETS_DEFAULT_GPUS_PER_RUN", "-1", "WANDB_ASSETS_DEFAULT_GPUS_PER_RUN must be at least 0"),
        ("WANDB_ASSETS_START_DATE", "June", "WANDB_ASSETS_START_DATE must be a date"),
        # issue 33: an upper bound is said as such (it said "must be a number")
        ("WANDB_ASSETS_FETCH_CONCURRENCY", "16", r"WANDB_ASSETS_FETCH_CONCURRENCY must be from 1 to 8 \(got '16'\)"),
        ("WANDB_ASSETS_IDLE_GPU_PCT", "-1", r"WANDB_ASSETS_IDLE_GPU_PCT must be from 0 to 100 \(got '-1'\)"),
        ("WANDB_ASSETS_DUCKDB_MEMORY_LIMIT", "lots", r"^WANDB_ASSETS_DUCKDB_MEMORY_LIMIT must be a size like 4GB or "),
        ("WANDB_ASSETS_DUCKDB_MEMORY_LIMIT", "80%", r"must be a size like 4GB or 1500MB \(got '80%'\); unset it"),
    ],
)
def test_malformed_pipeline_settings(name, value, message):
    with pytest.raises(ConfigError, match=message):
        pipeline_settings({name: value})


def test_pipeline_defaults():
    settings = pipeline_settings({})
    assert (str(settings.warehouse), settings.default_gpus_per_run, settings.page_size) == (
        "data/warehouse.duckdb",
        1,
        1000,
    )


def test_key_entity_and_project_come_from_the_secret(
    moto_endpoint, monkeypatch, wandb_server, warehouse_path, instance
):
    wandb_server([make_run_node("s1", display_name="from-secret", state="finished", created_at=at(2, 3))])
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_ASSETS_SECRET_NAME", "test/wandb")
    put_secret(
        moto_endpoint,
        "test/wandb",
        json.dumps({"WANDB_API_KEY": API_KEY, "WANDB_ENTITY": ENTITY, "WANDB_PROJECT": PROJECT}),
    )
    result = materialize(
        [staged_runs, runs],
        partition_key="2026-06-02",
        instance=instance,
        resources={"wandb": wandb_resource(), "warehouse": warehouse_resource()},
    )
    assert result.success
    con = duckdb.connect(str(warehouse_path), read_only=True)
    assert con.execute("SELECT run_id, name FROM runs").fetchall() == [("s1", "from-secret")]
    con.close()


def test_environment_beats_the_secret(moto_endpoint, monkeypatch):
    put_secret(moto_endpoint, "test/partial", json.dumps({"WANDB_API_KEY": "s" * 40, "WANDB_PROJECT": "secret-p"}))
    monkeypatch.setenv("WANDB_ASSETS_SECRET_NAME", "test/partial")
    monkeypatch.setenv("WANDB_PROJECT", "env-p")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    settings = wandb_resource().wandb_settings()
    assert (settings.api_key, settings.project, settings.entity) == ("s" * 40, "env-p", None)


def test_missing_secret_is_one_clear_sentence(moto_endpoint, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_ASSETS_SECRET_NAME", "test/absent")
    with pytest.raises(ConfigError) as raised:
        wandb_resource().wandb_settings()
    assert str(raised.value) == (
        "WANDB_API_KEY is not set and the secret 'test/absent' could not be read from AWS Secrets Manager "
        "(ResourceNotFoundException): export WANDB_API_KEY or fix WANDB_ASSETS_SECRET_NAME / AWS credentials."
    )


def test_secret_that_is_not_json(moto_endpoint, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    put_secret(moto_endpoint, "test/garbled", "WANDB_API_KEY=" + "z" * 40)
    monkeypatch.setenv("WANDB_ASSETS_SECRET_NAME", "test/garbled")
    with pytest.raises(ConfigError) as raised:
        wandb_resource().wandb_settings()
    assert "must hold a JSON object" in str(raised.value)
    assert "z" * 40 not in str(raised.value)


def test_datadog_dry_run_is_a_configuration_decision_not_a_failed_read(
    moto_endpoint, monkeypatch, wandb_server, warehouse_path, instance
):
    """The secret holds DD_API_KEY. While it cannot be read the feed fails loudly and records nothing (no
    ``dry_run``); once readable, the same snapshot is delivered. The secret is read once per run."""
    import botocore.client

    from tests.capture import CaptureServer
    from wandb_assets.ticks import execute_feed, execute_refresh

    capture = CaptureServer()
    monkeypatch.setenv("WANDB_ASSETS_DATADOG_URL", capture.url)
    dd_key = "dd" + "7" * 30
    wandb_server([make_run_node("s1", display_name="from-secret", state="finished", created_at=at(2, 3))])
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_ASSETS_SECRET_NAME", "test/feed")
    secret = {"WANDB_API_KEY": API_KEY, "WANDB_ENTITY": ENTITY, "WANDB_PROJECT": PROJECT, "DD_API_KEY": dd_key}
    put_secret(moto_endpoint, "test/feed", json.dumps(secret))
    calls = []
    original = botocore.client.BaseClient._make_api_call

    def counting(self, operation, params):
        calls.append(operation)
        return original(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", counting)
    try:
        assert execute_refresh(instance, date(2026, 6, 2), snapshot_at="2026-06-02T12:00:00").success
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # Secrets Manager unreachable
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        failed = execute_feed(instance, now="2026-06-02T12:00:30")
        assert not failed.success
        assert "DD_API_KEY is not set and the secret 'test/feed' could not be read" in failure_message(failed)
        assert dd_key not in failure_message(failed)
        con = duckdb.connect(str(warehouse_path), read_only=True)
        assert con.execute("SELECT status FROM datadog_deliveries").fetchall() == [("pending",)]  # not dry_run
        con.close()
        assert capture.requests == []
        # The failure alert still goes out during the outage: Slack now (straight to the channel), the Datadog event
        # queued in the warehouse's outbox for later.
        monkeypatch.setenv("WANDB_ASSETS_SLACK_WEBHOOK_URL", capture.url + "/hook")
        settle_pipeline_alert(instance, failed)
        (hook,) = capture.bodies("/hook")
        assert hook["text"].startswith(":rotating_light: [critical] pipeline_failure (feed): Dagster run ")
        con = duckdb.connect(str(warehouse_path), read_only=True)
        waiting = con.execute(
            "SELECT channel, status FROM alert_notifications WHERE alert_key = 'pipeline_failure:feed' ORDER BY channel"
        ).fetchall()
        assert waiting == [("datadog_event", "pending")]
        # the Datadog channel stopped at its oldest message (order is kept), saying why
        (reason,) = con.execute(
            "SELECT DISTINCT last_error FROM alert_notifications "
            "WHERE channel = 'datadog_event' AND last_error IS NOT NULL"
        ).fetchone()
        assert reason.startswith("DD_API_KEY is not set and the secret 'test/feed' could not be read")
        con.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
        calls.clear()
        assert execute_feed(instance, now="2026-06-02T12:00:45").success
        assert calls.count("GetSecretValue") == 1  # once per run, not once per call
        # the queued event went out once the key could be read
        titles = [e["title"] for e in capture.bodies("/api/v1/events")]
        # in the order they were queued: the ci_silent alert of the failed feed, then the pipeline failure
        assert [t.split(":")[0] for t in titles] == [
            "[warning] ci_silent (push_to_main)",
            "[critical] pipeline_failure (feed)",
        ]
        con = duckdb.connect(str(warehouse_path), read_only=True)
        assert con.execute("SELECT status FROM datadog_deliveries").fetchall() == [("delivered",)]
        con.close()
        assert [r["headers"]["DD-API-KEY"] for r in capture.requests if r["path"] == "/api/v2/series"] == [dd_key]
    finally:
        capture.stop()


def test_a_yaml_mistake_names_its_line_and_column(tmp_path):
    """Issue 33: a YAML error said only "not valid YAML"."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100-80GB: 2.99\nA100: [1.79\nT4: 0.35\n")
    with pytest.raises(ConfigError) as caught:
        pipeline_settings({"WANDB_ASSETS_GPU_PRICES": str(prices)})
    assert str(caught.value).startswith(f"WANDB_ASSETS_GPU_PRICES names {prices}, which is not valid YAML at line 3,")


def test_the_key_wandb_login_stored_is_used_when_the_environment_has_none(tmp_path):
    """`wandb login` writes the key to the netrc file (NETRC, else ~/.netrc) under the server's host: the pipeline
    reads it there when WANDB_API_KEY is unset, before any secret; the environment's key still wins."""
    from wandb_assets.settings import resolve_wandb_settings

    netrc_file = tmp_path / "netrc"
    netrc_file.write_text(
        "machine api.wandb.ai\n  login user\n  password cloud-key-0123\n"
        "machine 127.0.0.1:8799\n  login user\n  password local-key-4567\n"
    )

    def no_secret(name):
        raise AssertionError("the secret is not read when `wandb login` stored a key")

    env = {"NETRC": str(netrc_file), "WANDB_PROJECT": "p"}
    assert resolve_wandb_settings(env, no_secret).api_key == "cloud-key-0123"
    local = {**env, "WANDB_BASE_URL": "http://127.0.0.1:8799"}
    assert resolve_wandb_settings(local, no_secret).api_key == "local-key-4567"
    assert resolve_wandb_settings({**env, "WANDB_API_KEY": "env-key"}, no_secret).api_key == "env-key"
    other = {**env, "WANDB_BASE_URL": "http://127.0.0.1:9999"}  # no entry for that host: the secret is next
    assert resolve_wandb_settings(other, lambda name: {"WANDB_API_KEY": "secret-key"}).api_key == "secret-key"
    netrc_file.write_text("machine api.wandb.ai login\n")  # unreadable: as if absent, nothing of it shown
    assert resolve_wandb_settings(env, lambda name: {"WANDB_API_KEY": "secret-key"}).api_key == "secret-key"


def test_the_warehouse_connections_take_the_memory_limit_set(warehouse_path, monkeypatch):
    """``WANDB_ASSETS_DUCKDB_MEMORY_LIMIT``: each connection to the warehouse file, the pipeline's and a reader's, has
    DuckDB's memory_limit set to it (1GB: DuckDB says 953.6 MiB); unset, DuckDB's own default (80 % of RAM)."""
    from wandb_assets.warehouse import connect

    def limits() -> tuple[str, str]:
        with warehouse_resource().get_connection() as con:
            pipeline = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        reader = connect(warehouse_path)
        try:
            return pipeline, reader.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        finally:
            reader.close()

    monkeypatch.setenv("WANDB_ASSETS_DUCKDB_MEMORY_LIMIT", "1GB")
    assert limits() == ("953.6 MiB", "953.6 MiB")
    monkeypatch.delenv("WANDB_ASSETS_DUCKDB_MEMORY_LIMIT")
    assert "953.6 MiB" not in limits()
