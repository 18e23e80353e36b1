"""GPU count, model and utilisation of a run (``lib.gpus``), pure and through the pipeline."""

from datetime import UTC, date, datetime, timedelta

import pytest

from wandb_assets.lib.accounting.gpus import canonical_gpu_model, gpu_count, mean_utilisation, system_gpus

STALL = timedelta(minutes=30)

#: Strings W&B records in ``wandb-metadata.json`` (``gpu``) or people log as ``compute.gpu_type``.
REAL_MODELS = {
    "NVIDIA H100 80GB HBM3": "H100-80GB",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "Tesla T4": "T4",
    "NVIDIA L4": "L4",
    "NVIDIA A10G": "A10G",
    "NVIDIA RTX A6000": "RTX-A6000",
    "NVIDIA RTX 6000 Ada Generation": "RTX-6000-Ada",
    "NVIDIA GeForce RTX 3090 Ti": "RTX-3090Ti",
    "NVIDIA GeForce RTX 2080 Ti": "RTX-2080Ti",
    "NVIDIA GeForce GTX 1080 Ti": "GTX-1080Ti",
    "Tesla P100-PCIE-16GB": "P100-16GB",
    "Tesla K80": "K80",
    "Tesla V100-PCIE-32GB": "V100-32GB",
    "NVIDIA H100 NVL": "H100-94GB",
    "NVIDIA H100 PCIe": "H100-80GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA A40": "A40",
    "NVIDIA TITAN V": "TITAN-V",
    "AMD Instinct MI250X": "MI250X",
}


@pytest.mark.parametrize(("raw", "canonical"), sorted(REAL_MODELS.items()))
def test_the_strings_w_and_b_records_become_one_canonical_name_each(raw, canonical):
    assert canonical_gpu_model(raw) == (canonical, True)
    assert canonical_gpu_model(canonical) == (canonical, True)  # a canonical name (config compute.gpu_type) stays


def test_an_unknown_model_is_kept_as_recorded_and_said_unknown_and_nothing_is_none():
    assert canonical_gpu_model("  Apple M2 Max ") == ("Apple M2 Max", False)
    assert canonical_gpu_model("") == (None, True)
    assert canonical_gpu_model(None) == (None, True)
    assert canonical_gpu_model(8) == (None, True)


EIGHT_GPUS = {f"system.gpu.{i}.gpu": (97.0 if i == 3 else 0.0) for i in range(8)} | {
    **{f"system.gpu.{i}.memory": 12.5 for i in range(8)},
    "system.cpu": 40.0,
    "system.gpu.process.0.gpu": 50.0,  # a per-process key: not a GPU index
}
KEYS = ("compute.gpu_count", "world_size", "dist/world_size", "resources.num_gpus")


def test_precedence_config_keys_then_metadata_then_system_metrics_then_the_default():
    metadata = {"gpu_count": 4, "gpu": "NVIDIA A100-SXM4-40GB"}
    # (1) the first configured key holding a count, nested objects and flat dotted keys alike
    assert gpu_count({"resources": {"num_gpus": 2}}, metadata, EIGHT_GPUS, KEYS, 1) == (2, "config", False)
    assert gpu_count({"resources.num_gpus": "16"}, metadata, EIGHT_GPUS, KEYS, 1) == (16, "config", False)
    assert gpu_count({"dist/world_size": 32.0, "world_size": 64}, metadata, {}, KEYS, 1) == (64, "config", False)
    # a key that holds no count falls through, and says so
    assert gpu_count({"compute": {"gpu_count": "eight"}}, metadata, {}, KEYS, 1) == (4, "metadata", True)
    # (2) W&B's metadata
    assert gpu_count({"lr": 0.1}, metadata, EIGHT_GPUS, KEYS, 1) == (4, "metadata", False)
    # (3) distinct GPU indices of the latest system sample
    assert gpu_count({}, {"gpu": "NVIDIA H100 80GB HBM3"}, EIGHT_GPUS, KEYS, 1) == (8, "system_metrics", False)
    assert gpu_count({}, None, {"system.gpu.0.gpu": 5, "system.gpu.1.memoryAllocated": 3}, KEYS, 1)[:2] == (
        2,
        "system_metrics",
    )
    # (4) the default
    assert gpu_count({}, {"gpu_count": 0}, {"system.cpu": 3.0}, KEYS, 1) == (1, "default", False)
    assert gpu_count({"world_size": True}, None, {}, KEYS, 2) == (2, "default", True)  # a boolean is no count


def test_utilisation_is_the_mean_over_the_gpus_of_the_latest_sample():
    assert sorted(system_gpus(EIGHT_GPUS)) == list(range(8))
    assert mean_utilisation(EIGHT_GPUS) == pytest.approx(97.0 / 8)
    assert mean_utilisation({"system.gpu.0.gpu": float("nan"), "system.gpu.1.gpu": 50}) == 50.0
    assert mean_utilisation({"system.cpu": 3}) is None


def test_the_runs_table_carries_count_source_model_and_utilisation(wandb_server, warehouse_path, instance, monkeypatch):
    """Four runs through the real client and a backfill, one per source; WANDB_ASSETS_GPU_COUNT_KEYS names
    world_size before compute.gpu_count."""
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    at = datetime(2026, 6, 1, 12)
    wandb_server(
        [
            make_run_node(
                "cfg",
                display_name=None,
                state="finished",
                created_at=at,
                config={"world_size": 16, "compute": {"gpu_count": 2, "gpu_type": "NVIDIA H100 80GB HBM3"}},
                system_metrics=EIGHT_GPUS,
            ),
            make_run_node("sys", display_name=None, state="finished", created_at=at, system_metrics=EIGHT_GPUS),
            make_run_node("dflt", display_name=None, state="finished", created_at=at, config={"world_size": "x"}),
            make_run_node(
                "bad", display_name=None, state="finished", created_at=at, config={"compute.gpu_type": "Apple M2 Max"}
            ),
        ]
    )
    monkeypatch.setenv("WANDB_ASSETS_GPU_COUNT_KEYS", "world_size, compute.gpu_count")
    monkeypatch.setenv("WANDB_ASSETS_DEFAULT_GPUS_PER_RUN", "3")
    assert execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 1)).success
    rows = query_read_only(
        warehouse_path,
        "SELECT run_id, gpu_count, gpu_count_source, gpu_model, round(gpu_util_pct, 3), anomalies FROM runs ORDER BY 1",
    )
    assert rows == [
        ("bad", 3, "default", "Apple M2 Max", None, []),
        ("cfg", 16, "config", "H100-80GB", 12.125, []),
        ("dflt", 3, "default", None, None, ["gpu_count"]),
        ("sys", 8, "system_metrics", None, 12.125, []),
    ]
    assert query_read_only(
        warehouse_path, "SELECT latest_gpu_sample[4].utilisation, len(latest_gpu_sample) FROM runs WHERE run_id = 'sys'"
    ) == [(97.0, 8)]  # GPU 3, the busy one (lists count from 1)


# ----------------------------------------------------------------------------------- prices, teams, gpu_usage


def _usage_fleet() -> list[dict]:
    """At 2026-06-10 12:00: alice's 8-GPU H100 run over midnight (22:00-02:00: 16 GPU-hours each day), bob's
    2-GPU A100-40GB run running since 09:00 (6 GPU-hours so far), carol's 1-GPU run on a model without a price
    (00:00-05:00), alice's 4-GPU H100 run in project b (10:00-11:00), and a pending run (no GPU-hours)."""
    from tests.fleet import fleet_row

    def row(run_id, project, user, model, gpus, state, start, end=None):
        base = fleet_row(run_id, state, "regular", start, end, gpus, entity="team", project=project)
        return base | {"user": user, "gpu_model": model}

    d = datetime
    return [
        row("r1", "a", "alice", "H100-80GB", 8, "finished", d(2026, 6, 9, 22), d(2026, 6, 10, 2)),
        row("r2", "a", "bob", "A100-40GB", 2, "running", d(2026, 6, 10, 9)),
        row("r3", "b", "carol", "Apple M2 Max", 1, "finished", d(2026, 6, 10, 0), d(2026, 6, 10, 5)),
        row("r4", "b", "alice", "H100-80GB", 4, "finished", d(2026, 6, 10, 10), d(2026, 6, 10, 11)),
        row("r5", "b", "dan", "H100-80GB", 8, "pending", d(2026, 6, 10, 11)),
    ]


def test_gpu_usage_costs_by_day_user_team_and_model_hand_worked(memory_con):
    """Prices H100-80GB 3.00 and A100-40GB 1.50 USD per GPU-hour (written with the names W&B records); teams
    vision = alice, infra = bob; carol is unassigned and her model has no price: NULL, not 0."""
    import yaml

    from tests.fleet import load
    from wandb_assets.lib.accounting.prices import parse_prices, prices_today
    from wandb_assets.lib.accounting.teams import parse_teams
    from wandb_assets.lib.derived import rebuild_gpu_usage

    prices = parse_prices(yaml.safe_load("NVIDIA H100 80GB HBM3: 3.0\nA100-SXM4-40GB: 1.5\n"), "prices")
    assert prices_today(prices) == {"H100-80GB": 3.0, "A100-40GB": 1.5}
    teams = parse_teams(yaml.safe_load("vision: [alice]\ninfra: [bob]\n"), "teams")
    load(memory_con, _usage_fleet())
    assert rebuild_gpu_usage(memory_con, datetime(2026, 6, 10, 12), prices, teams) == 5
    rows = memory_con.execute(
        "SELECT day::VARCHAR, project, username, team, gpu_model, runs, round(gpu_hours, 6), round(cost_usd, 6) "
        "FROM gpu_usage ORDER BY ALL"
    ).fetchall()
    assert rows == [
        ("2026-06-09", "a", "alice", "vision", "H100-80GB", 1, 16.0, 48.0),
        ("2026-06-10", "a", "alice", "vision", "H100-80GB", 1, 16.0, 48.0),
        ("2026-06-10", "a", "bob", "infra", "A100-40GB", 1, 6.0, 9.0),
        ("2026-06-10", "b", "alice", "vision", "H100-80GB", 1, 4.0, 12.0),
        ("2026-06-10", "b", "carol", "unassigned", "Apple M2 Max", 1, 5.0, None),
    ]
    # The same GPU-hours as the gpu_hours table (one rule).
    from wandb_assets.lib.derived import rebuild_gpu_hours

    rebuild_gpu_hours(memory_con)  # rolled up from the gpu_usage just built
    assert memory_con.execute("SELECT sum(gpu_hours) FROM gpu_hours WHERE category = 'all'").fetchone()[0] == 47.0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2]", "must map GPU models to USD per GPU-hour"),
        ("H100-80GB: cheap", "gives 'H100-80GB' the price 'cheap'"),
        ("T4: -1", "gives 'T4' the price -1"),
    ],
)
def test_a_malformed_price_file_is_one_sentence(text, says):
    import yaml

    from wandb_assets.lib.accounting.prices import parse_prices
    from wandb_assets.lib.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        parse_prices(yaml.safe_load(text), "WANDB_ASSETS_GPU_PRICES (p.yaml)")


def test_a_user_in_two_teams_is_refused():
    from wandb_assets.lib.accounting.teams import parse_teams
    from wandb_assets.lib.errors import ConfigError

    with pytest.raises(ConfigError, match="puts 'alice' in two teams"):
        parse_teams({"vision": ["alice"], "infra": ["alice"]}, "WANDB_ASSETS_TEAMS")


def test_the_gpu_usage_asset_reads_the_price_and_team_files_and_lists_models_without_a_price(
    wandb_server, warehouse_path, instance, monkeypatch, tmp_path
):
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    at = datetime(2026, 6, 1, 10)
    wandb_server(
        [
            make_run_node(
                "h",
                display_name=None,
                state="finished",
                created_at=at,
                heartbeat_at=datetime(2026, 6, 1, 12),
                config={"compute": {"gpu_count": 4, "gpu_type": "NVIDIA H100 80GB HBM3"}},
                username="alice",
            ),
            make_run_node(
                "t",
                display_name=None,
                state="finished",
                created_at=at,
                heartbeat_at=datetime(2026, 6, 1, 11),
                config={"compute": {"gpu_count": 1, "gpu_type": "Tesla T4"}},
                username="bob",
            ),
        ]
    )
    (tmp_path / "prices.yaml").write_text("H100-80GB: 2.5\n")
    (tmp_path / "teams.yaml").write_text("vision: [alice]\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_PRICES", str(tmp_path / "prices.yaml"))
    monkeypatch.setenv("WANDB_ASSETS_TEAMS", str(tmp_path / "teams.yaml"))
    result = execute_backfill(instance, date(2026, 6, 1), date(2026, 6, 1))
    assert result.success
    meta = result.asset_materializations_for_node("gpu_usage")[0].metadata
    assert (meta["gpu_hours_total"].value, meta["cost_usd_total"].value) == (9.0, 20.0)
    assert [r.data for r in meta["models_without_price"].records] == [{"gpu_model": "T4", "GPU-hours": 1.0}]
    assert query_read_only(
        warehouse_path, "SELECT username, team, gpu_model, gpu_hours, cost_usd FROM gpu_usage ORDER BY 1"
    ) == [("alice", "vision", "H100-80GB", 8.0, 20.0), ("bob", "unassigned", "T4", 1.0, None)]
    # each run's cost: 4 GPUs x 2 h x $2.5 = 20; the T4 has no price: NULL, never 0
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY 1") == [("h", 20.0), ("t", None)]
    # an undated price added to the file prices from the day it is first seen: June's T4 hour stays unpriced ...
    (tmp_path / "prices.yaml").write_text("H100-80GB: 2.5\nT4: 0.35\n")
    assert execute_backfill(instance, date(2026, 5, 31), date(2026, 5, 31)).success
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY 1") == [("h", 20.0), ("t", None)]
    # ... and a period dated from June 1 prices it, those runs not re-read too: 1 GPU-hour x $0.35
    (tmp_path / "prices.yaml").write_text("H100-80GB: 2.5\nT4:\n  - {from: 2026-06-01, usd: 0.35}\n")
    assert execute_backfill(instance, date(2026, 5, 31), date(2026, 5, 31)).success
    assert query_read_only(warehouse_path, "SELECT run_id, cost_usd FROM runs ORDER BY 1") == [("h", 20.0), ("t", 0.35)]


def test_a_price_file_that_cannot_be_read_is_one_sentence_naming_the_variable(tmp_path):
    from wandb_assets.lib.errors import ConfigError
    from wandb_assets.settings import pipeline_settings

    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        pipeline_settings({"WANDB_PROJECT": "p", "WANDB_ASSETS_GPU_PRICES": str(missing)})
    assert (
        str(caught.value)
        == f"WANDB_ASSETS_GPU_PRICES names {missing}, which cannot be read (No such file or directory)."
    )
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(ConfigError, match="WANDB_ASSETS_TEAMS names .*bad.yaml, which is not valid YAML."):
        pipeline_settings({"WANDB_PROJECT": "p", "WANDB_ASSETS_TEAMS": str(tmp_path / "bad.yaml")})


# -------------------------------------------------------------------------------------------- idle GPUs, live


def _sampled(run_id: str, utilisation: list[float], user: str = "alice") -> dict:
    from tests.fleet import fleet_row

    row = fleet_row(run_id, "running", "regular", datetime(2026, 6, 10, 9), None, len(utilisation) or 8)
    sample = [{"gpu_index": i, "utilisation": u, "memory": 40.0} for i, u in enumerate(utilisation)]
    return row | {
        "user": user,
        "gpu_model": "H100-80GB",
        "latest_gpu_sample": sample,
        "heartbeat_at": datetime(2026, 6, 10, 13),
    }


def test_an_idle_run_is_alerted_once_after_30_minutes_of_idle_samples_and_resolved_once_when_it_works(memory_con):
    """Ticks every 15 minutes from 12:00. ``idle8``: eight GPUs at 0-3 % on the 12:00, 12:15 and 12:30 samples,
    busy again at 12:45: opened at 12:30 (not at 12:15: 15 minutes), resolved at 12:45. ``onebusy``: one GPU of
    eight at 97 %: never idle. ``blind``: no system metrics: never idle."""
    from datetime import timedelta

    from tests.fleet import load
    from wandb_assets.lib.accounting.prices import record_prices
    from wandb_assets.lib.alerts import AlertThresholds, idle_gpus, reconcile
    from wandb_assets.lib.warehouse import ensure_schema, record_snapshot

    th = AlertThresholds()
    ensure_schema(memory_con)
    record_prices(memory_con, {"H100-80GB": 2.99}, date(2026, 6, 1), datetime(2026, 6, 1))
    idle, busy = [0.0, 3.0, 1.0, 0.0, 2.0, 0.0, 4.9, 0.0], [90.0] + [0.0] * 7
    one_busy = [0.0, 0.0, 0.0, 97.0, 0.0, 0.0, 0.0, 0.0]
    events = []
    for k in range(4):
        at = datetime(2026, 6, 10, 12) + timedelta(minutes=15 * k)
        load(
            memory_con,
            [_sampled("idle8", busy if k == 3 else idle), _sampled("onebusy", one_busy), _sampled("blind", [])],
        )
        record_snapshot(memory_con, at)
        found = idle_gpus(memory_con, at, th)
        events.append([(t.event, t.condition.key) for t in reconcile(memory_con, found, {"idle_gpus"}, at, [])])
        if k == 2:
            (condition,) = found
            assert condition.message == (
                "Run idle8 of alice holds 8 H100-80GB GPUs idle (all below 5%) on every sample since "
                "2026-06-10 12:00 UTC (30 min), burning $23.92/h (no link)."
            )
    assert events == [[], [], [("opened", "idle_gpus:idle8")], [("resolved", "idle_gpus:idle8")]]
    assert memory_con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 4 * 16  # blind has no sample


# ------------------------------------------------------------------------------ W&B's wandb-metadata.json, once


def test_metadata_is_read_once_per_ended_run_across_fetches_and_a_missing_or_malformed_file_falls_back(
    wandb_server, warehouse_path, instance, monkeypatch
):
    """Five runs: ``h100`` (metadata: 8 x "NVIDIA H100 80GB HBM3"), ``cfg`` (config compute.gpu_count 2 wins, the
    metadata still names the model), ``nofile`` (no metadata file: its systemMetrics' 4 GPUs), ``broken`` (a file
    that is not JSON: the default), ``alive`` (running: not asked). A second backfill of the day asks for nothing
    again and keeps what was read; a run that finishes later is read then."""
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    at = datetime(2026, 6, 1, 12)
    h100 = {"gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3", "os": "Linux"}
    four = {f"system.gpu.{i}.gpu": 50.0 for i in range(4)}

    def node(run_id: str, state: str = "finished", **kwargs) -> dict:
        return make_run_node(run_id, display_name=None, state=state, created_at=at, **kwargs)

    server = wandb_server(
        [
            node("h100", metadata=h100),
            node("cfg", metadata={"gpu_count": 8, "gpu": "Tesla V100-SXM2-16GB"}, config={"compute.gpu_count": 2}),
            node("nofile", system_metrics=four),
            node("broken", metadata="{not json"),
            node("alive", state="running", metadata=h100),
        ]
    )
    day = date(2026, 6, 1)
    result = execute_backfill(instance, day, day)
    assert result.success
    meta = result.asset_materializations_for_node("staged_runs")[0].metadata
    assert meta["metadata_files"].value == {"read": 2, "missing": 1, "malformed": 1}
    operations = {operation for operation, _ in server.requests}
    assert (operations, server.count("Runs"), server.pages_with_files, sorted(server.file_downloads)) == (
        {"Viewer", "Runs"},  # where the files are comes with the pages: no request of its own
        8,  # the day in 8 parts, one page each
        8,
        ["test-team/test-project/broken", "test-team/test-project/cfg", "test-team/test-project/h100"],
    )
    rows = "SELECT run_id, gpu_count, gpu_count_source, gpu_model, wandb_metadata->>'status' FROM runs ORDER BY 1"
    expected = [
        ("alive", 1, "default", None, None),
        ("broken", 1, "default", None, "malformed"),
        ("cfg", 2, "config", "V100-16GB", "read"),
        ("h100", 8, "metadata", "H100-80GB", "read"),
        ("nofile", 4, "system_metrics", None, "missing"),
    ]
    assert query_read_only(warehouse_path, rows) == expected

    server.requests.clear()
    server.file_downloads.clear()
    server.upsert_runs([node("alive", state="finished", metadata=h100)])  # it ended since
    result = execute_backfill(instance, day, day)
    assert result.success
    assert (server.count("Runs"), server.file_downloads) == (8, ["test-team/test-project/alive"])
    expected[0] = ("alive", 8, "metadata", "H100-80GB", "read")
    assert query_read_only(warehouse_path, rows) == expected

    # Turned off: nothing is asked, what was read is kept.
    monkeypatch.setenv("WANDB_ASSETS_FETCH_METADATA", "false")
    server.requests.clear()
    server.pages_with_files = 0
    server.file_downloads.clear()
    server.upsert_runs([node("late", metadata=h100)])
    assert execute_backfill(instance, day, day).success
    assert (server.count("Runs"), server.pages_with_files, server.file_downloads) == (8, 0, [])
    assert query_read_only(warehouse_path, rows)[:5] == [*expected[:4], ("late", 1, "default", None, None)]


def test_idle_gpu_hours_come_from_the_samples_taken_while_a_run_ran(memory_con):
    """Rebuilt at 12:45. ``done``: 8 GPUs, ran 11:00-12:40, samples 12:00 (8 idle), 12:15 (8 idle), 12:30 (4
    idle): 0.25 x 8 + 0.25 x 8 + (12:40 - 12:30) x 4 = 4 + 2/3. ``live``: running, 2 GPUs, one sample at 12:00,
    both idle: held until now, 0.75 h x 2 = 1.5.
    ``gap``: 1 GPU, samples at 09:00 (idle) and 12:00 (busy): the idle one holds an hour at most = 1.0."""
    from tests.fleet import fleet_row, load
    from wandb_assets.lib.derived import rebuild_gpu_usage

    d = datetime
    load(
        memory_con,
        [
            fleet_row("done", "finished", "regular", d(2026, 6, 10, 11), d(2026, 6, 10, 12, 40), 8),
            fleet_row("live", "running", "regular", d(2026, 6, 10, 11), None, 2),
            fleet_row("gap", "running", "regular", d(2026, 6, 10, 8), None, 1),
        ],
    )
    samples = [("done", 12, 0, [0.0] * 8), ("done", 12, 15, [1.0] * 8), ("done", 12, 30, [0.0] * 4 + [80.0] * 4)]
    samples += [("live", 12, 0, [2.0, 3.0]), ("gap", 9, 0, [0.0]), ("gap", 12, 0, [70.0])]
    memory_con.executemany(
        "INSERT INTO gpu_samples VALUES (?, 'test-team', 'test-project', ?, ?, ?, 10.0)",
        [(d(2026, 6, 10, h, m), run, i, u) for run, h, m, utils in samples for i, u in enumerate(utils)],
    )
    rebuild_gpu_usage(memory_con, d(2026, 6, 10, 12, 45), {}, {})
    idle = dict(memory_con.execute("SELECT day::VARCHAR, sum(idle_gpu_hours) FROM gpu_usage GROUP BY 1").fetchall())
    assert idle == {"2026-06-10": pytest.approx(4 + 2 / 3 + 1.5 + 1.0)}


def _log_with_gpu_stats(start: int, utilisation: list[tuple[float, float]], every: int, runtime: int) -> list:
    """An offline log (the client's record types): a run record without any GPU config, one stats record per
    ``every`` seconds with two GPUs' utilisation (as the client names them, without ``system.``), a clean exit."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = pb.Record()
    run.run.run_id, run.run.entity, run.run.project = "gpuoff01", "offline-team", "offline-proj"
    run.run.start_time.seconds = start
    records = [run]
    for i, (gpu0, gpu1) in enumerate(utilisation):
        stats = pb.Record()
        stats.stats.timestamp.seconds = start + i * every
        for key, value in (("gpu.0.gpu", gpu0), ("gpu.1.gpu", gpu1), ("gpu.0.memory", 30.0), ("cpu", 12.5)):
            item = stats.stats.item.add()
            item.key, item.value_json = key, repr(value)
        records.append(stats)
    exit_record = pb.Record()
    exit_record.exit.exit_code, exit_record.exit.runtime = 0, runtime
    return [*records, exit_record]


def test_an_offline_log_gives_its_idle_gpu_hours_from_its_own_stats_records(
    tmp_path, warehouse_path, instance, monkeypatch
):
    """Two GPUs sampled every 10 min from 23:40 to 00:20 UTC (end at +40 min): idle GPUs per sample 1, 2 | 1, 2,
    each held 600 s (the one hold rule, lib/accounting/idle.py, as an
    online run's stream: the log's GPU stream is loaded even
    with curves off), so 0.5 idle GPU-hours on each day; GPU-hours 2 GPUs x 20 min = 0.6667 per day. The count and
    model come from the client's wandb-metadata.json beside the log; without it, from the stats records."""
    import duckdb

    from tests.offline_logs import legacy_log_bytes
    from wandb_assets.lib.derived import rebuild_gpu_usage
    from wandb_assets.lib.offline_runs import read_changed_logs
    from wandb_assets.ticks import execute_offline

    start = 1_700_005_200  # 2023-11-14 23:40:00 UTC
    samples = [(0.0, 90.0), (2.0, 3.0), (50.0, 4.9), (1.0, 1.0)]
    folder = tmp_path / "offline-run-20231114_234000-gpuoff01"
    (folder / "files").mkdir(parents=True)
    (folder / "run-gpuoff01.wandb").write_bytes(legacy_log_bytes(_log_with_gpu_stats(start, samples, 600, 2400)))
    now = datetime(2023, 11, 16)
    report = read_changed_logs([tmp_path], {}, now=now, stall=STALL, default_gpus=1)
    (row,) = report.rows
    assert (row["gpu_count"], row["gpu_count_source"]) == (2, "system_metrics")
    assert (row["gpu_util_pct"], row["gpu_model"]) == (1.0, None)

    (folder / "files" / "wandb-metadata.json").write_text('{"gpu_count": 2, "gpu": "NVIDIA H100 80GB HBM3"}')
    (tmp_path / "prices.yaml").write_text("H100-80GB: 3.0\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_PRICES", str(tmp_path / "prices.yaml"))
    monkeypatch.setenv("WANDB_ASSETS_FETCH_HISTORY", "false")  # no curves asked for: the GPU stream still counts
    monkeypatch.setenv("WANDB_ASSETS_START_DATE", "2023-11-01")
    monkeypatch.setenv("WANDB_ASSETS_IDLE_GPU_PCT", "5")
    assert execute_offline(instance, [str(tmp_path)], now=now.isoformat()).success
    con = duckdb.connect(str(warehouse_path))
    try:
        assert con.execute(
            "SELECT gpu_count, gpu_count_source, gpu_model, wandb_metadata->>'status', log_idle_gpu_hours FROM runs"
        ).fetchone() == (2, "metadata", "H100-80GB", "read", None)
        assert con.execute("SELECT count(*), count(DISTINCT gpu) FROM run_gpu_samples").fetchone() == (8, 2)
        assert con.execute("SELECT count(*) FROM run_history").fetchone() == (0,)  # no history key asked for
        assert con.execute("SELECT day, idle_gpu_hours FROM run_curve_idle ORDER BY day").fetchall() == [
            (date(2023, 11, 14), 0.5),
            (date(2023, 11, 15), 0.5),
        ]
        rebuild_gpu_usage(con, now, {"H100-80GB": 3.0}, {})
        got = con.execute(
            "SELECT day, round(gpu_hours, 4), round(cost_usd, 4), round(idle_gpu_hours, 6) FROM gpu_usage ORDER BY day"
        ).fetchall()
    finally:
        con.close()
    assert got == [(date(2023, 11, 14), 0.6667, 2.0, 0.5), (date(2023, 11, 15), 0.6667, 2.0, 0.5)]


def test_the_gpu_gauges_hand_worked(memory_con):
    """At T = 06-01 12:00, W = (05-31 12:00, T]. ``a``: running since 10:00 on 2 H100s ($3/GPU-h), latest sample
    GPU0 1 % (idle), GPU1 50 %; samples 11:00 (both idle, held 30 min), 11:30 (one idle, held to T). ``b``: 4 T4s
    (no price) from 05-31 06:00 to 11:00 today: 23 h in W; samples 05-31 11:00 (held to 11:30, before W) and 11:30
    (held an hour at most: 30 min in W), all four idle. ``c``: 1 A100-40GB ($1.5) 08:00-09:00, one idle sample at
    08:00 held to its end. ``d``: 8 GPUs of no known model since 11:00, no system metrics.
    GPU-hours 4 + 92 + 1 + 8 = 105; USD 4 x 3 + 1 x 1.5 = 13.5; unpriced 92 + 8 = 100;
    idle GPU-hours (0.5 x 2 + 0.5 x 1) + 0.5 x 4 + 1 x 1 = 4.5; idle GPUs now: 1 (a's GPU0; d has no sample)."""
    from tests.fleet import fleet_row, load
    from wandb_assets.lib.accounting.prices import record_prices
    from wandb_assets.lib.gauges import compute_gauges
    from wandb_assets.lib.warehouse import ensure_schema

    t = datetime(2026, 6, 1, 12)

    def row(run_id, state, created, ended, gpus, model, sample=()):
        found = fleet_row(run_id, state, "regular", created, ended, gpus)
        return found | {
            "gpu_model": model,
            "latest_gpu_sample": [{"gpu_index": i, "utilisation": u, "memory": None} for i, u in enumerate(sample)],
        }

    load(
        memory_con,
        [
            row("a", "running", datetime(2026, 6, 1, 10), None, 2, "H100-80GB", [1.0, 50.0]) | {"heartbeat_at": t},
            row("b", "finished", datetime(2026, 5, 31, 6), datetime(2026, 6, 1, 11), 4, "T4"),
            row("c", "finished", datetime(2026, 6, 1, 8), datetime(2026, 6, 1, 9), 1, "A100-40GB"),
            row("d", "running", datetime(2026, 6, 1, 11), None, 8, None) | {"heartbeat_at": t},
        ],
    )
    ensure_schema(memory_con)
    samples = [
        ("a", datetime(2026, 6, 1, 11), [0.0, 0.0]),
        ("a", datetime(2026, 6, 1, 11, 30), [1.0, 50.0]),
        ("b", datetime(2026, 5, 31, 11), [0.0] * 4),
        ("b", datetime(2026, 5, 31, 11, 30), [0.0, 1.0, 2.0, 3.0]),
        ("c", datetime(2026, 6, 1, 8), [2.0]),
    ]
    memory_con.executemany(
        "INSERT INTO gpu_samples VALUES (?, 'test-team', 'test-project', ?, ?, ?, NULL)",
        [(at, run, i, u) for run, at, values in samples for i, u in enumerate(values)],
    )
    record_prices(memory_con, {"H100-80GB": 3.0, "A100-40GB": 1.5}, t.date(), t)
    gauges = compute_gauges(memory_con, t, idle_pct=5.0)
    got = {k: round(v, 4) for k, v in gauges.items() if k.startswith("wandb.gpu.") or "gpu_hours" in k}
    assert got == {
        "wandb.training.total_gpu_hours_24h": 105.0,
        "wandb.gpu.idle_gpus": 1,
        "wandb.gpu.cost_usd_24h": 13.5,
        "wandb.gpu.unpriced_gpu_hours_24h": 100.0,
        "wandb.gpu.idle_gpu_hours_24h": 4.5,
    }
    # a threshold of 1 %: a's 1 % GPU is busy now; idle hours 0.5 x 2 + 0.5 x 1 (b's 0 % GPU) + 0 (c at 2 %)
    memory_con.execute("DELETE FROM gpu_price_periods")  # and no prices recorded
    gauges = compute_gauges(memory_con, t, idle_pct=1.0)
    assert (
        gauges["wandb.gpu.idle_gpus"],
        gauges["wandb.gpu.idle_gpu_hours_24h"],
        gauges["wandb.gpu.cost_usd_24h"],
    ) == (0, 0.5 * 2 + 0.5 * 1, None)  # 105 GPU-hours, none priced: NULL, never 0


def test_the_w_and_b_key_goes_only_to_the_w_and_b_host_never_to_a_signed_storage_url():
    import base64

    from wandb_assets.lib.fetch import metadata_headers

    key = "local-" + "m" * 40
    basic = "Basic " + base64.b64encode(f"api:{key}".encode()).decode()
    assert metadata_headers("https://api.wandb.ai/files/e/p/r/wandb-metadata.json", "https://api.wandb.ai", key) == {
        "Authorization": basic
    }
    signed = "https://storage.googleapis.com/wandb-production/abc/wandb-metadata.json?X-Goog-Signature=1"
    assert metadata_headers(signed, "https://api.wandb.ai", key) == {}
    assert metadata_headers("http://127.0.0.1:9/files/x", "http://127.0.0.1:8/", key) == {}  # another port


def test_idle_gpu_hours_never_exceed_gpu_hours_when_a_sample_sees_the_whole_nodes_gpus(memory_con):
    """Finding 8 of code-review-2026-11c. A run configured with 2 GPUs whose system sample lists the node's 8 (NVML
    sees them all), 6 of them idle: each sample counts 6 x 2/8 = 1.5 idle GPUs of the run. Sampled every 15 min from
    00:15 to 06:00 (5.75 h held): 8.625 idle GPU-hours of 12 GPU-hours (it was 34.5 of 12, 46 with all 8 idle)."""
    from datetime import datetime, timedelta

    from wandb_assets.lib.derived import rebuild_gpu_usage
    from wandb_assets.lib.gauges import compute_gauges
    from wandb_assets.lib.warehouse import GPU_SAMPLES_SQL, ensure_schema

    ensure_schema(memory_con)
    sample = [{"gpu_index": i, "utilisation": 0.0 if i < 6 else 90.0, "memory": 1.0} for i in range(8)]
    memory_con.execute(
        "INSERT INTO runs (entity, project, run_id, state, category, created_at, heartbeat_at, gpu_count, "
        "gpu_count_source, latest_gpu_sample, ingested_at) VALUES ('e', 'p', 'r', 'running', 'regular', "
        "TIMESTAMP '2026-06-01 00:00', TIMESTAMP '2026-06-01 06:00', 2, 'config', $s, TIMESTAMP '2026-06-01 06:00')",
        {"s": sample},
    )
    at = datetime(2026, 6, 1, 0, 15)
    while at <= datetime(2026, 6, 1, 6):
        memory_con.execute(GPU_SAMPLES_SQL, {"snapshot_at": at})
        at += timedelta(minutes=15)
    now = datetime(2026, 6, 1, 6)
    rebuild_gpu_usage(memory_con, now, {}, {})
    assert memory_con.execute("SELECT gpu_hours, idle_gpu_hours FROM gpu_usage").fetchall() == [(12.0, 8.625)]
    gauges = compute_gauges(memory_con, now)
    assert gauges["wandb.gpu.idle_gpus"] == 1.5
    assert (gauges["wandb.training.total_gpu_hours_24h"], gauges["wandb.gpu.idle_gpu_hours_24h"]) == (12.0, 8.625)


def test_a_metadata_file_that_lands_after_its_run_ended_is_read_by_a_later_fetch(
    wandb_server, warehouse_path, instance
):
    """code-review-2026-11c: a "missing" (or "malformed") metadata file was kept for good, so a file uploaded after
    the run ended was never read. For a day after the run's last heartbeat it is asked again (the page says where
    files are: a missing one costs no request); later, what was found is final."""
    from datetime import date

    from wandb_assets.localwandb import make_run_node
    from wandb_assets.ticks import execute_backfill
    from wandb_assets.warehouse import query_read_only

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    at = datetime(2026, 6, 1, 12)
    h100 = {"gpu_count": 8, "gpu": "NVIDIA H100 80GB HBM3"}
    server = wandb_server(
        [
            make_run_node("late", display_name=None, state="finished", created_at=at, heartbeat_at=now),
            make_run_node("old", display_name=None, state="finished", created_at=at),  # ended months ago
        ]
    )
    day = date(2026, 6, 1)
    assert execute_backfill(instance, day, day).success
    rows = "SELECT run_id, gpu_count, wandb_metadata->>'status' FROM runs ORDER BY 1"
    assert query_read_only(warehouse_path, rows) == [("late", 1, "missing"), ("old", 1, "missing")]
    late = make_run_node("late", display_name=None, state="finished", created_at=at, heartbeat_at=now, metadata=h100)
    old = make_run_node("old", display_name=None, state="finished", created_at=at, metadata=h100)
    server.upsert_runs([late, old])  # both files land now
    server.file_downloads.clear()
    assert execute_backfill(instance, day, day).success
    assert server.file_downloads == ["test-team/test-project/late"]  # "old" was settled: not asked again
    assert query_read_only(warehouse_path, rows) == [("late", 8, "read"), ("old", 1, "missing")]


def test_two_price_keys_naming_one_gpu_model_exit_2_naming_both(tmp_path, monkeypatch, capsys, instance):
    """`H100-80GB: 2.49` and `H100-SXM: 2.10` are one model: read as one, the last won silently (10 days of H100s
    billed at $2.10 instead of $2.49, `check` passing). Now the file cannot mean two things: exit 2 naming both keys,
    before any run."""
    from tests.conftest import cli

    prices = tmp_path / "prices.yaml"
    prices.write_text("H100-80GB: 2.49\nA100-80GB: 1.79\nH100-SXM: 2.10\n")
    monkeypatch.setenv("WANDB_ASSETS_GPU_PRICES", str(prices))
    code, _, err = cli(capsys, "refresh")
    assert (code, err) == (
        2,
        f"error: WANDB_ASSETS_GPU_PRICES ({prices}) prices 'H100-80GB' and 'H100-SXM', which name the same GPU model "
        "(H100-80GB): keep one of them.\n",
    )
    assert instance.get_runs() == []
