import json
import math
from datetime import datetime

import pytest

from wandb_assets.lib.normalize import (
    finite_float,
    lookup_dotted,
    normalize_summary,
    parse_timestamp,
    run_row,
    unwrap_config,
)
from wandb_assets.lib.warehouse import replace_runs_window


def _encode(value, layers):
    for _ in range(layers):
        value = json.dumps(value)
    return value


@pytest.mark.parametrize("layers", [0, 1, 2, 3, 4, 5])
def test_summary_any_depth(layers):
    summary = {"overview/sps": 12.5, "_step": 7}
    assert normalize_summary(_encode(summary, layers)) == (summary, True)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ({}, True)),
        ("null", ({}, True)),
        ("", ({}, False)),
        ("[1, 2]", ({}, False)),
        (json.dumps(json.dumps([1, 2])), ({}, False)),
        ("{not json", ({}, False)),
        (b'{"a": 1}', ({"a": 1}, True)),
        (42, ({}, False)),
    ],
)
def test_summary_malformed_values(raw, expected):
    assert normalize_summary(raw) == expected


def test_config_is_unwrapped_and_internal_keys_dropped():
    raw = json.dumps(
        {
            "lr": {"value": 0.001, "desc": None},
            "model": {"value": {"depth": 4}, "desc": "the model"},
            "plain": 3,
            "not_a_wrapper": {"value": 1, "other": 2},
            "_wandb": {"value": {"cli_version": "0.31.0"}, "desc": None},
        }
    )
    config, ok = unwrap_config(raw)
    assert ok
    assert config == {"lr": 0.001, "model": {"depth": 4}, "plain": 3, "not_a_wrapper": {"value": 1, "other": 2}}


def test_lookup_dotted_flat_and_nested():
    assert lookup_dotted({"compute.gpu_count": 4}, "compute.gpu_count") == 4
    assert lookup_dotted({"compute": {"gpu_count": 2}}, "compute.gpu_count") == 2
    assert lookup_dotted({"compute": 3}, "compute.gpu_count") is None
    assert lookup_dotted({}, "compute.gpu_count") is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, 1.5),
        (3, 3.0),
        (float("nan"), None),
        (float("inf"), None),
        ("Infinity", None),
        ("12", None),
        (True, None),
        (None, None),
        ([1], None),
    ],
)
def test_finite_float(value, expected):
    assert finite_float(value) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-06-01T10:00:00Z", datetime(2026, 6, 1, 10)),
        ("2026-06-01T10:00:00", datetime(2026, 6, 1, 10)),
        ("2026-06-01T12:00:00+02:00", datetime(2026, 6, 1, 10)),
        ("2026-06-01T10:00:00.250000Z", datetime(2026, 6, 1, 10, 0, 0, 250000)),
        ("2026-05-31T22:30:00-11:30", datetime(2026, 6, 1, 10)),
        ("", None),
        (None, None),
        ("yesterday", None),
    ],
)
def test_parse_timestamp_is_utc(raw, expected):
    assert parse_timestamp(raw) == expected


def _node(**overrides):
    node = {
        "name": "abc123",
        "displayName": "github.sky.main.c0ffee1.ppo.1700000000",
        "state": "crashed",
        "sweepName": None,
        "tags": ["ci"],
        "group": None,
        "jobType": "train",
        "createdAt": "2026-06-01T10:00:00Z",
        "heartbeatAt": "2026-06-01T12:30:00Z",
        "user": {"name": "CI", "username": "ci-bot"},
        "config": json.dumps({"compute": {"value": {"gpu_count": 4}, "desc": None}}),
        "summaryMetrics": json.dumps(
            json.dumps(
                {"overview/sps": 100.0, "timing_per_epoch/sps": "NaN", "overview/steps_per_second": "fast", "_step": 9}
            )
        ),
    }
    node.update(overrides)
    return node


def test_run_row_fields():
    row = run_row(_node(), entity="ent", project="proj", app_url="http://127.0.0.1:9/", default_gpus=1)
    assert row["run_id"] == "abc123"
    assert row["category"] == "push_to_main"
    assert (row["ci_branch"], row["ci_commit"], row["ci_config"]) == ("main", "c0ffee1", "ppo")
    assert row["created_at"] == datetime(2026, 6, 1, 10)
    assert row["ended_at"] == datetime(2026, 6, 1, 12, 30)  # crashed is ended: heartbeat is the end
    assert row["duration_hours"] == 2.5
    assert row["gpu_count"] == 4
    assert row["sps_overview_sps"] == 100.0
    assert row["sps_timing_per_epoch_sps"] is None
    assert row["sps_overview_steps_per_second"] is None
    assert row["summary_step"] == 9.0
    assert row["url"] == "http://127.0.0.1:9/ent/proj/runs/abc123"
    assert row["user"] == "ci-bot"
    assert row["anomalies"] == []


def test_running_run_has_no_end_and_default_gpus():
    row = run_row(_node(state="running", config="{}"), entity="e", project="p", app_url="http://x", default_gpus=3)
    assert (row["ended_at"], row["duration_hours"], row["gpu_count"]) == (None, None, 3)


def test_malformed_fields_are_kept_null_and_listed():
    node = _node(summaryMetrics="", config="[oops", createdAt="later", displayName=None)
    row = run_row(node, entity="e", project="p", app_url="http://x", default_gpus=1)
    assert row["anomalies"] == ["summary", "config", "created_at"]
    assert (row["summary"], row["config"], row["created_at"], row["category"]) == ("{}", "{}", None, "regular")
    assert row["sps_overview_sps"] is None


def test_bad_gpu_count_falls_back_and_is_counted():
    node = _node(config=json.dumps({"compute.gpu_count": {"value": "lots", "desc": None}}))
    row = run_row(node, entity="e", project="p", app_url="http://x", default_gpus=2)
    assert (row["gpu_count"], row["anomalies"]) == (2, ["gpu_count"])


def test_compute_metadata_written_by_the_instrument_helpers_is_read():
    config = {
        "compute.gpu_count": 4,
        "compute.gpu_type": "NVIDIA H100",
        "compute.cpu_count": 32,
        "compute.memory_gb": 251.5,
        "slurm.job_id": 4242,
        "system.hostname": "node-17",
    }
    node = _node(config=json.dumps({k: {"value": v, "desc": None} for k, v in config.items()}))
    row = run_row(node, entity="e", project="p", app_url="http://x", default_gpus=1)
    assert {k: row[k] for k in ("gpu_count", "gpu_type", "cpu_count", "memory_gb", "slurm_job_id", "hostname")} == {
        "gpu_count": 4,
        "gpu_type": "NVIDIA H100",
        "cpu_count": 32,
        "memory_gb": 251.5,
        "slurm_job_id": "4242",
        "hostname": "node-17",
    }
    bare = run_row(_node(config="{}"), entity="e", project="p", app_url="http://x", default_gpus=1)
    assert [bare[k] for k in ("gpu_type", "cpu_count", "memory_gb", "slurm_job_id", "hostname")] == [None] * 5


def test_non_finite_values_read_back_as_numbers_from_the_warehouse(memory_con):
    # wandb-core writes NaN/Infinity as bare JSON tokens; they must come back as numbers, not "nan" strings.
    summary = '{"loss": NaN, "best": Infinity, "worst": -Infinity, "charts/SPS": 12.5, "overview/sps": NaN}'
    config = json.dumps(
        {
            "lr": {"value": float("nan"), "desc": None},
            "_wandb": {"value": {"cli_version": "0.27.1", "python_version": "3.11"}, "desc": None},
            "wandb_version": {"value": "0.27.1", "desc": None},
        }
    )
    row = run_row(
        _node(summaryMetrics=summary, config=config), entity="e", project="p", app_url="http://x", default_gpus=1
    )
    assert row["sps_overview_sps"] is None
    assert row["anomalies"] == ["sps_overview_sps"]  # a non-finite SPS is NULL and counted
    assert row["cli_version"] == "0.27.1"
    replace_runs_window(memory_con, [row], datetime(2026, 6, 1), datetime(2026, 6, 2))
    got = memory_con.execute(
        "SELECT (summary->>'loss')::DOUBLE, (summary->>'best')::DOUBLE, (summary->>'worst')::DOUBLE, "
        "summary->'loss', (config->>'lr')::DOUBLE, json_keys(config), cli_version, anomalies FROM runs"
    ).fetchone()
    assert math.isnan(got[0]) and math.isnan(got[4])
    assert got[1:4] == (math.inf, -math.inf, "NaN")
    assert got[5:] == (["lr"], "0.27.1", ["sps_overview_sps"])
    back = json.loads(memory_con.execute("SELECT summary FROM runs").fetchone()[0])
    assert math.isnan(back["loss"]) and back["best"] == math.inf and back["charts/SPS"] == 12.5


def test_a_lone_surrogate_loses_no_run_of_the_window(memory_con):
    """One lone UTF-16 surrogate (what surrogateescape makes of a non-UTF-8 byte) in a run name, tag, user, config
    or summary value used to fail the whole window's load: every run beside it was lost. Now it becomes U+FFFD,
    the run is kept and counted (``text_encoding``), and a valid character beyond the BMP is untouched."""
    clean = run_row(_node(name="clean1"), entity="e", project="p", app_url="http://x", default_gpus=1)
    poisoned = run_row(
        _node(
            name="bad1",
            displayName="train-caf\udce9",
            tags=["t\udce9"],
            user={"username": "u\udce9"},
            config=json.dumps({"data_dir": {"value": "/data/caf\udce9"}, "emoji": {"value": "\U0001f600"}}),
            summaryMetrics='{"path": "\\udce9x", "\\ud800key": 1, "escaped": "\\\\ud800"}',
        ),
        entity="e",
        project="p",
        app_url="http://x",
        default_gpus=1,
    )
    assert poisoned["anomalies"] == ["text_encoding"] and clean["anomalies"] == []
    assert replace_runs_window(memory_con, [clean, poisoned], datetime(2026, 6, 1), datetime(2026, 6, 2)) == 2
    got = memory_con.execute(
        "SELECT run_id, name, tags, \"user\", config->>'data_dir', config->>'emoji', summary->>'path', "
        "summary->>'\ufffdkey', summary->>'escaped' FROM runs ORDER BY run_id"
    ).fetchall()
    assert got == [
        ("bad1", "train-caf\ufffd", ["t\ufffd"], "u\ufffd", "/data/caf\ufffd", "\U0001f600", "\ufffdx", "1", "\\ud800"),
        ("clean1", "github.sky.main.c0ffee1.ppo.1700000000", ["ci"], "ci-bot", None, None, None, None, None),
    ]
