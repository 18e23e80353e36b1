"""The Dagster UI as a user meets it, in a real browser: Playwright driving Debian's Chromium
(``/usr/bin/chromium``; never a downloaded browser) against ``wandb-assets demo --ui`` on a free port.

Screenshots of every step are saved under ``test-artifacts/browser/`` (git-ignored); on a failure the page
as it was is saved there too.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.conftest import REPO, free_port, require_chromium, stop_process_group
from wandb_assets.defs.fleet.jobs import RANGE_END_TAG, RANGE_START_TAG
from wandb_assets.warehouse import open_snapshot

#: Chromium on the Dagster UI and the demo: the slow tier (`uv run pytest -m slow`, CI runs it).
pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts" / "browser"
WIDTH = 1440


def _gql(base: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{base}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]


RUNS = "{ runsOrError { ... on Runs { results { runId jobName status tags { key value } } } } }"


def _runs(base: str) -> list[dict]:
    runs = _gql(base, RUNS)["runsOrError"]["results"]
    for run in runs:
        run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
    return runs


def _backfill_runs(base: str, before: set[str], other: str) -> list[dict]:
    """Runs launched by a backfill since ``before``, but not by the ``other`` backfill (the fleet-group test's,
    running meanwhile); the demo's 15-minute schedule may start a refresh meanwhile (no backfill tag)."""
    return [
        r for r in _runs(base) if r["runId"] not in before and r["tags"].get("dagster/backfill") not in (None, other)
    ]


def _wait(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture(scope="module")
def demo_ui(tmp_path_factory):
    """`wandb-assets demo --ui` (5 days) in its own instance folder; yields the UI's base URL and the folder."""
    require_chromium()
    home = tmp_path_factory.mktemp("demo-ui")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "DAGSTER_", "DD_"))}
    env.update(WANDB_DIR=str(home), WANDB_SILENT="true")
    # a dagster.yaml where the user stands, as in the repository's root: the demo's own instance is elsewhere
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    log = open(home / "demo.log", "w")
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wandb_assets.cli",
            "demo",
            "--ui",
            "--dir",
            str(home),
            "--days",
            "5",
            "--history-hours",
            "6",
            "--no-analytics",  # the dbt project is built and browsed in test_analytics
        ]
        + ["--port", str(port), "--wandb-port", str(free_port())],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:

        def answering():
            try:
                return _runs(base) is not None
            except OSError:
                return False

        _wait(answering, 240, "the demo's UI")
        DEMO_UI_TIMES["answered_s"] = time.monotonic() - started
        # the UI is up while the warehouse builds; the tests below browse the built one
        _wait(lambda: "Run links (the runs table" in (home / "demo.log").read_text(), 300, "the demo's warehouse")
        DEMO_UI_TIMES["built_s"] = time.monotonic() - started
        yield base, home
    finally:
        stop_process_group(demo)
        log.close()


#: When `demo --ui` answered and when its warehouse was built, from its start (issue 43 item 17).
DEMO_UI_TIMES: dict[str, float] = {}


def test_demo_ui_answers_within_a_minute_while_its_warehouse_builds(demo_ui):
    """Issue 43 item 17: the UI answered in 96 s (after the whole build); it starts first now and answers while the
    warehouse builds."""
    print(
        f"demo --ui: answered after {DEMO_UI_TIMES['answered_s']:.1f} s, warehouse built after "
        f"{DEMO_UI_TIMES['built_s']:.1f} s"
    )
    assert DEMO_UI_TIMES["answered_s"] < 60, DEMO_UI_TIMES
    assert DEMO_UI_TIMES["answered_s"] < DEMO_UI_TIMES["built_s"], DEMO_UI_TIMES


@pytest.fixture(scope="module")
def sensor_feed_finished(demo_ui) -> None:
    """The daemon's after_fleet_snapshot sensor launches the feed once for the demo's snapshot: let it finish."""
    base, _home = demo_ui
    _wait(
        lambda: any(
            r["tags"].get("dagster/sensor_name") == "after_fleet_snapshot" and r["status"] in ("SUCCESS", "FAILURE")
            for r in _runs(base)
        ),
        150,
        "the sensor-launched feed run",
    )


@pytest.fixture
def page(chromium):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return chromium


LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
FLEET = ["fleet_snapshot", "gpu_hours", "push_to_main_sps", "success_rates"]


def _last_three_days() -> list[str]:
    today = datetime.now(UTC).date()
    return [str(today - timedelta(days=n)) for n in (3, 2, 1)]


@pytest.fixture(scope="module")
def fleet_group_backfill(demo_ui) -> str:
    """The backfill of `runs` and the `fleet` group, launched as the UI's launch dialog would (its test reads
    the result). Launched before the UI test starts its own, so both wait on the same iterations of the
    daemon's backfill loop (every 30 s, fixed in Dagster) instead of one after the other."""
    base, _home = demo_ui
    params = {
        "assetSelection": [{"path": [key]} for key in ["staged_runs", "runs", *FLEET]],
        "partitionNames": _last_three_days(),
        "fromFailure": False,
    }
    launched = _gql(base, LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


ENDED = ("SUCCESS", "FAILURE", "CANCELED")


def _backfill_finished(base: str, backfill: str, runs: int) -> list[dict] | None:
    """The backfill's runs once there are `runs` of them and all have ended, else None."""
    found = [r for r in _runs(base) if r["tags"].get("dagster/backfill") == backfill]
    return found if len(found) == runs and all(r["status"] in ENDED for r in found) else None


def _tables_fit(page) -> list[str]:
    """The first column header of every metadata table on the page, after checking that each lies wholly inside
    the metadata table's box and on screen at WIDTH (the UI cuts off what is wider)."""
    found = page.evaluate(
        """() => [...document.querySelectorAll('td table')].map(t => {
            // the metadata table's own box: a wider inner table stretches its cell and is cut off at this edge
            const shown = t.closest('td').closest('table').parentElement.getBoundingClientRect();
            return {head: t.querySelector('th')?.innerText.trim(), right: t.getBoundingClientRect().right,
                    cell: shown.right};
        })"""
    )
    too_wide = [t for t in found if t["right"] > t["cell"] + 1 or t["right"] > WIDTH]
    assert too_wide == [], too_wide
    return [t["head"] for t in found]


def test_a_user_backfills_a_range_from_the_ui_and_reads_a_gauge(
    demo_ui, fleet_group_backfill, sensor_feed_finished, page
):
    try:
        _backfill_a_range_and_read_a_gauge(demo_ui, fleet_group_backfill, page)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "FAILED-backfill-and-gauge.png"))
        raise


def _backfill_a_range_and_read_a_gauge(demo_ui, other_backfill: str, page) -> None:
    base, home = demo_ui
    today = datetime.now(UTC).date()
    first, last = today - timedelta(days=3), today - timedelta(days=1)

    # The asset graph (Lineage): the four groups; the fleet group's graph shows its assets and a neighbour (the graph
    # draws only what is in view: `runs`, one of several upstream neighbours now, may lie outside it).
    page.goto(f"{base}/asset-groups")
    for group in ("wandb", "fleet", "feed", "warehouse"):
        page.get_by_text(group, exact=True).first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "1-asset-graph.png"))
    # (a tall tab: the graph lays out its neighbours too, the analysts' models below gpu_usage, and draws what is in
    # view; at 900 px a new neighbour pushed success_rates out of it)
    page.set_viewport_size({"width": WIDTH, "height": 2400})
    page.goto(f"{base}/locations/wandb_assets.definitions/asset-groups/fleet")
    for name in ("fleet_snapshot", "push_to_main_sps", "success_rates", "gpu_hours", "fleet_alerts"):
        page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "1-fleet-group-graph.png"))
    page.set_viewport_size({"width": WIDTH, "height": 900})

    # A partition range of `runs`, launched from the asset's partitions page: one backfill, one run.
    before = {r["runId"] for r in _runs(base)}
    page.goto(f"{base}/assets/runs?view=partitions")
    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    selection = dialog.locator("input[type=text]")
    selection.click()
    selection.fill(f"[{first}...{last}]")
    selection.press("Enter")
    dialog.get_by_text("3 partitions").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "2-launch-range.png"))
    dialog.get_by_role("button", name="Launch backfill").click()
    finished = _wait(
        lambda: [r for r in _backfill_runs(base, before, other_backfill) if r["status"] in ("SUCCESS", "FAILURE")],
        240,
        "the backfill's run",
    )
    (run,) = finished
    assert run["status"] == "SUCCESS"
    assert (run["tags"][RANGE_START_TAG], run["tags"][RANGE_END_TAG]) == (
        str(first),
        str(last),
    )
    assert len(_backfill_runs(base, before, other_backfill)) == 1  # the whole range in a single run

    # The gauges on fleet_snapshot's page at 1440 px: one narrow table per family, the gauge's name first, the value
    # cell on screen (not under the side panel), and no metadata table wider than its cell (nothing cut off).
    page.goto(f"{base}/assets/fleet_snapshot")
    row = page.get_by_role("row", name=re.compile(r"^active \S+ runs$"))
    row.wait_for(timeout=60_000)
    value_cell = row.locator("td").last
    shown = value_cell.inner_text().strip()
    deadline = time.monotonic() + 15
    while True:  # the page lays its tables out again while they load: judge the settled layout, not a frame of it
        value_cell.scroll_into_view_if_needed()
        box = value_cell.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, box
        on_top = page.evaluate(
            "([x, y]) => document.elementFromPoint(x, y)?.closest('td')?.innerText",
            [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
        )
        if (on_top is not None and on_top.strip() == shown) or time.monotonic() > deadline:
            break
        page.wait_for_timeout(500)
    assert on_top is not None and on_top.strip() == shown
    assert _tables_fit(page) == ["gauge"] * 5 + ["project", "project"]
    snapshot_row = page.locator("tr").filter(has=page.get_by_text("snapshot_at_utc", exact=True)).first
    snapshot_at = snapshot_row.locator("td").last.inner_text().strip()
    page.screenshot(path=str(ARTIFACTS / "3-fleet-snapshot-1440.png"))
    # The per-project breakdown of the same snapshot: the demo's three projects in two entities.
    for project in ("demo-team/fleet-demo", "demo-team/vision", "research-lab/llm-pretrain"):
        page.get_by_role("cell", name=project, exact=True).first.wait_for(timeout=30_000)

    def stored_value():  # a tick's snapshot file is published just after its fleet_snapshot shows in the UI
        con = open_snapshot(home / "demo.duckdb")
        try:
            return con.execute(
                "SELECT value FROM fleet_metrics WHERE metric = 'wandb.runs.active' AND snapshot_at = $t::TIMESTAMP",
                {"t": snapshot_at},
            ).fetchone()
        finally:
            con.close()

    (stored,) = _wait(stored_value, 120, f"the analysts' snapshot holding the gauges of {snapshot_at}")
    assert shown == f"{int(stored)} runs"

    # Cost by team and project in gpu_usage's metadata, with the share of GPU-hours priced; nothing cut off.
    page.goto(f"{base}/assets/gpu_usage")
    total = page.get_by_role("row", name=re.compile(r"^total \$[0-9,.]+ [0-9]+%$")).first
    total.wait_for(timeout=60_000)
    assert _tables_fit(page) == ["team", "project", "gpu_model"]
    page.get_by_text("have no price and are not in the dollars", exact=False).first.wait_for(timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "3-gpu-usage-costs-1440.png"))

    # The open alerts in fleet_alerts' metadata: each whole message readable without a click.
    page.goto(f"{base}/assets/fleet_alerts")
    stalled = page.get_by_role("cell", name=re.compile(r"^\[warning\] stalled_run, since .* looks stalled"))
    stalled.wait_for(timeout=60_000)
    stalled.scroll_into_view_if_needed()
    assert stalled.is_visible() and page.get_by_text("Show Markdown").count() == 0
    assert _tables_fit(page) == ["idle episode", "open alert"]  # the idle ladder's open episodes beside the alerts
    page.screenshot(path=str(ARTIFACTS / "3-fleet-alerts-1440.png"))

    # A warning-level check that found something: Dagster labels it "Failed" (its yellow warning tag; the label is
    # Dagster's own for any failed check), and our words say it is a warning, not a failure of the pipeline.
    # The page shows the latest evaluation, and another run may be evaluating it again (the other backfill's fleet
    # run, or a tick of the demo's 15-minute schedule): under load the page then shows "Running" (seen in CI). So
    # wait for the other backfill and for no run in flight, then read the page; a tick starting meanwhile means
    # one more try.
    _wait(lambda: _backfill_finished(base, other_backfill, 2), 300, "the fleet group backfill's two runs")
    warning = page.get_by_text("Warning (the alert is open; nothing failed to run)", exact=False).first
    for attempt in range(3):
        _wait(lambda: all(r["status"] in ENDED for r in _runs(base)), 300, "no run in flight")
        page.goto(f"{base}/assets/fleet_snapshot?view=checks")
        page.get_by_text("sps_regression_check", exact=True).first.click()
        try:
            warning.wait_for(timeout=60_000)
            break
        except PlaywrightTimeoutError:
            page.screenshot(path=str(ARTIFACTS / f"3-warning-check-try-{attempt}.png"))
            if attempt == 2:
                raise
    page.screenshot(path=str(ARTIFACTS / "3-warning-check-1440.png"))

    # An alert's run link opens the run's page on the demo's W&B server (up as long as the UI).
    con = open_snapshot(home / "demo.duckdb")
    try:
        (url,) = con.execute("SELECT url FROM runs WHERE run_id = 'stalled0001'").fetchone()
        (message,) = con.execute(
            "SELECT message FROM alerts WHERE alert_key = 'stalled_run:demo-team/fleet-demo:stalled0001'"
        ).fetchone()
    finally:
        con.close()
    assert f"({url})" in message
    page.goto(url)
    assert page.title() == "demo-team/fleet-demo/stalled0001"
    assert page.get_by_role("cell", name="train-llama-stuck", exact=True).is_visible()
    page.screenshot(path=str(ARTIFACTS / "4-alert-run-link.png"))

    # Nothing failed: not the demo's runs, not the sensor's feed, not the backfill.
    failed = [(r["jobName"], r["runId"]) for r in _runs(base) if r["status"] == "FAILURE"]
    assert failed == []


def test_a_ui_backfill_of_runs_with_the_fleet_group_is_two_runs_in_order(demo_ui, fleet_group_backfill):
    """What the README promises for "select `runs` and the `fleet` group, Materialize, a range": the request the
    UI's launch dialog sends. Dagster's asset backfill never puts daily-partitioned and unpartitioned assets in one
    run, so it is one run for `staged_runs` + `runs` over the whole range, then one for the four fleet assets."""
    base, _home = demo_ui
    days, fleet, backfill = _last_three_days(), FLEET, fleet_group_backfill

    done = _wait(lambda: _backfill_finished(base, backfill, 2), 300, "the backfill's two runs")
    query = "query($id: ID!) { runOrError(runId: $id) { ... on Run { assetSelection { path } startTime } } }"
    shapes = []
    for run in done:
        data = _gql(base, query, {"id": run["runId"]})["runOrError"]
        keys = sorted(a["path"][0] for a in data["assetSelection"])
        tags = run["tags"]
        shapes.append((data["startTime"], keys, run["status"], tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)))
    shapes.sort()
    assert [s[1:] for s in shapes] == [
        (["runs", "staged_runs"], "SUCCESS", days[0], days[-1]),
        (fleet, "SUCCESS", None, None),
    ]


def test_the_demo_terminal_shows_only_our_lines_and_real_warnings(demo_ui, sensor_feed_finished):
    """After the demo, a sensor-launched feed run and two UI backfills: the terminal has none of Dagster's step
    events (DEBUG), no daemon chatter (a "sensor skipped" line every 30 s), no beta/supersession notices."""
    _base, home = demo_ui
    text = (home / "demo.log").read_text()
    noises = ("DEBUG", "SensorDaemon", "skipped", "BetaWarning", "SupersessionWarning", "nanobind", "Traceback")
    for noise in (*noises, "will not be used"):  # dagster dev's warning about a dagster.yaml where the user stands
        assert noise not in text, noise
    assert "Fleet snapshot at" in text and "Dagster UI: http://127.0.0.1:" in text
