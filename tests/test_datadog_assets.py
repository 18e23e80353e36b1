"""Issue 53: the fleet's Datadog dashboard and monitors as code. `wandb-assets datadog --apply` against the loopback
Datadog (tests/capture.py: dashboards and monitors answered as Datadog's API answers, 403 without an application
key) creates what deploy/datadog/ ships, a second apply writes nothing, an edit made in Datadog is put back, and
the shipped JSON is what the code makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DD_KEY, cli
from wandb_assets.lib.datadog_assets import MANAGED_TAG, dashboard, differs, monitors

SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "datadog"
APP_KEY = "appkey" + "9" * 34


def test_the_shipped_json_is_what_the_code_makes_and_every_monitor_waits_two_pushes():
    """deploy/datadog/ is `wandb-assets datadog --export` of the defaults; gauges arrive every 15 minutes, so each
    monitor evaluates over 30 and says what missing data means (only the feed's own monitor notifies on it)."""
    assert json.loads((SHIPPED / "dashboard.json").read_text()) == dashboard()
    assert json.loads((SHIPPED / "monitors.json").read_text()) == monitors()
    found = monitors()
    assert all(m["query"].startswith(("max(last_30m):", "min(last_30m):")) for m in found)
    assert {m["name"]: m["options"]["on_missing_data"] for m in found} == {
        "[wandb-assets] The fleet gauges stopped arriving": "show_and_notify_no_data",
        "[wandb-assets] Push-to-main success rate low": "show_no_data",
        "[wandb-assets] GPUs idle": "show_no_data",
        "[wandb-assets] GPU-hours without a price": "show_no_data",
    }
    assert found[1]["query"].endswith("wandb.push_to_main.success_rate_pct{source:wandb-assets,!scope:project} < 80")
    assert all(MANAGED_TAG in m["tags"] for m in found)


def test_differs_compares_only_what_this_project_sets():
    assert not differs({"a": 1, "o": {"t": 80}}, {"a": 1.0, "id": 7, "o": {"t": 80.0, "x": None}})
    assert differs({"a": 1, "o": {"t": 80}}, {"a": 1, "o": {"t": 70}})
    assert differs({"l": [1, 2]}, {"l": [1]})


@pytest.fixture
def datadog_api(monkeypatch, dagster_home):
    from tests.capture import CaptureServer

    server = CaptureServer()
    monkeypatch.setenv("DD_API_KEY", DD_KEY)
    monkeypatch.setenv("DD_APP_KEY", APP_KEY)
    monkeypatch.setenv("WANDB_ASSETS_DATADOG_URL", server.url)
    monkeypatch.setenv("WANDB_ENTITY", "test-team")
    monkeypatch.setenv("WANDB_PROJECT", "test-project")
    yield server
    server.stop()


def test_apply_creates_the_shipped_dashboard_and_monitors_once_and_puts_back_an_edit(datadog_api, capsys):
    code, out, err = cli(capsys, "datadog", "--apply")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "Datadog: 5 changed, 0 as they should be (the monitors and the dashboard)."
    held = datadog_api.api
    shipped = json.loads((SHIPPED / "monitors.json").read_text())
    assert [{k: m[k] for k in shipped[0]} for m in held.monitors.values()] == shipped
    (board,) = held.dashboards.values()
    assert {k: board[k] for k in dashboard()} == json.loads((SHIPPED / "dashboard.json").read_text())
    # a second apply reads and writes nothing
    datadog_api.requests.clear()
    code, out, _ = cli(capsys, "datadog", "--apply")
    assert code == 0 and out.splitlines() == [
        "Datadog: 0 changed, 5 as they should be (the monitors and the dashboard)."
    ]
    assert datadog_api.writes("/api/v1/") == []
    # someone lowers a threshold in Datadog and retitles a widget: the dry run says so, --apply puts both back
    held.monitors[2]["options"]["thresholds"]["critical"] = 50.0
    board["widgets"][0]["definition"]["title"] = "mine"
    code, out, _ = cli(capsys, "datadog")
    assert code == 0 and out.splitlines()[:2] == [
        "would update monitor '[wandb-assets] Push-to-main success rate low' (2)",
        f"would update dashboard 'W&B fleet (wandb-assets)' ({board['id']})",
    ]
    assert datadog_api.writes("/api/v1/") == []
    datadog_api.requests.clear()
    assert cli(capsys, "datadog", "--apply")[0] == 0
    assert datadog_api.writes("/api/v1/") == [("PUT", "/api/v1/monitor/2"), ("PUT", f"/api/v1/dashboard/{board['id']}")]
    assert held.monitors[2]["options"]["thresholds"]["critical"] == 80.0
    assert held.dashboards[board["id"]]["widgets"][0]["definition"]["title"] == "Runs"
    assert len(held.monitors) == 4 and len(held.dashboards) == 1
    assert all(APP_KEY not in str(r) or r["headers"] for r in datadog_api.requests)


def test_without_an_application_key_it_exits_2_and_a_refusal_exits_1_naming_no_key(datadog_api, capsys, monkeypatch):
    monkeypatch.delenv("DD_APP_KEY")
    code, out, err = cli(capsys, "datadog", "--apply")
    assert (code, out) == (2, "")
    assert err.startswith("error: wandb-assets datadog needs DD_API_KEY and DD_APP_KEY")
    assert datadog_api.requests == []
    datadog_api.api.app_key = APP_KEY  # a key Datadog did not issue: 403
    monkeypatch.setenv("DD_APP_KEY", "wrong" + "0" * 35)
    code, out, err = cli(capsys, "datadog", "--apply")
    assert code == 1 and err == "error: listing the monitors: Datadog answered 403 Forbidden\n"
    assert DD_KEY not in out + err and "wrong" not in out + err
