"""The README (the front door) and the reference in docs/ stay true to the code: the configuration table, the gauge
table, the quickstart, and every link."""

import re
from pathlib import Path

from wandb_assets.lib.accounting.prices import prices_today
from wandb_assets.lib.gauges import GAUGE_NAMES
from wandb_assets.settings import ENV_VARS, readme_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
PIPELINE = (ROOT / "docs" / "pipeline.md").read_text()


def test_configuration_table_is_the_one_generated_from_the_settings():
    assert readme_table() in CONFIGURATION, "regenerate docs/configuration.md's table: settings.readme_table()"
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| ([^|]+) \| ([^|]+) \|$", CONFIGURATION, flags=re.M)
    assert [(name, default.strip()) for name, default, _ in rows] == [(k, v[0]) for k, v in ENV_VARS.items()]
    assert ("WANDB_ASSETS_ALERT_STALL_HEARTBEAT_MINUTES", "30.0") in [(n, d.strip()) for n, d, _ in rows]


def test_gauge_table_names_every_gauge():
    documented = re.findall(r"^\| `(wandb\.[a-z0-9_.]+)` \|", PIPELINE, flags=re.M)
    assert documented == list(GAUGE_NAMES)


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", README, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["uv run wandb-assets demo", "uv run pytest"]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert '\n  uv run pytest "$@"\n' in ci and "\nrun_tier\nrun_tier -m slow\n" in ci  # both tiers
    assert "uv run pytest -m slow" in README


def test_every_alert_threshold_is_a_documented_variable():
    documented = {k: v[0] for k, v in ENV_VARS.items() if k.startswith("WANDB_ASSETS_ALERT_")}
    assert documented == {
        "WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_PCT": "80.0",
        "WANDB_ASSETS_ALERT_SUCCESS_RATE_MIN_RUNS": "5",
        "WANDB_ASSETS_ALERT_FAILURE_SPIKE_PCT": "50.0",
        "WANDB_ASSETS_ALERT_FAILURE_SPIKE_MIN_ENDED": "10",
        "WANDB_ASSETS_ALERT_STALL_HEARTBEAT_MINUTES": "30.0",
        "WANDB_ASSETS_ALERT_STALL_STEP_MINUTES": "60.0",
        "WANDB_ASSETS_ALERT_IDLE_GPU_MINUTES": "30.0",
        "WANDB_ASSETS_ALERT_CI_SILENT_HOURS": "12.0",
        "WANDB_ASSETS_ALERT_LONG_RUNNING_HOURS": "168.0",
    }


def test_the_notebooks_readme_opens_the_warehouse_the_demo_writes():
    """Issue 33: notebooks/README.md pointed at data/demo.duckdb; the demo writes data/demo/demo.duckdb."""
    from wandb_assets.commands.demo import DEMO_DIR

    text = (Path(__file__).resolve().parent.parent / "notebooks" / "README.md").read_text()
    assert f"WANDB_ASSETS_DUCKDB={DEMO_DIR}/demo.duckdb uv run jupyter lab notebooks/" in text


def test_the_readme_is_a_front_door_and_every_link_of_it_and_of_docs_resolves():
    """Issue 33: the README was 905 lines; reference material lives in docs/, one page a subject."""
    assert len(README.splitlines()) <= 250
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://|mailto:", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)\)", README))
    assert linked == {p.name for p in (ROOT / "docs").glob("*.md")}  # every docs page is reachable from the front door


def test_the_readmes_setup_for_an_organisation_is_valid_as_written(tmp_path):
    """Issue 33: the README's one place for projects, teams and prices: every variable it exports is a setting,
    and its teams and prices files, written as shown, parse (the L40S key by W&B's own name)."""
    from wandb_assets.settings import Settings, pipeline_settings

    section = README.split("## Pointing it at your W&B organisation", 1)[1].split("\n## ", 1)[0]
    exported = dict(re.findall(r"^export (\w+)=(\S+)", section, flags=re.M))
    assert set(exported) <= set(Settings.model_fields)
    teams, prices = re.findall(r"```yaml\n# \S+\n(.*?)```", section, flags=re.S)
    (tmp_path / "teams.yaml").write_text(teams)
    (tmp_path / "prices.yaml").write_text(prices)
    environ = {
        **{name: value.strip('"') for name, value in exported.items()},
        "WANDB_ASSETS_TEAMS": str(tmp_path / "teams.yaml"),
        "WANDB_ASSETS_GPU_PRICES": str(tmp_path / "prices.yaml"),
    }
    settings = pipeline_settings(environ)
    assert settings.teams == {"alice": "vision", "bob": "vision", "carol": "llm", "dan": "llm", "ci-bot": "ci"}
    assert prices_today(settings.gpu_prices) == {"H100-80GB": 2.49, "A100-80GB": 1.40, "L40S": 0.95, "": 2.0}
    assert settings.unknown_price_keys == ()
    assert settings.projects.whole_entities == ("ml-research",)
    assert settings.projects.includes("ml-platform", "ci-benchmarks") and settings.projects.includes("ml-research", "x")


def test_the_numbers_the_docs_state_about_the_code_are_the_codes():
    """Docs drift (issue 43): each count the docs state of the code is checked here: the gauges (README, pipeline,
    projects, gpu-accounting, layout, configuration), the rows a snapshot appends, the notebooks the notebooks'
    README names, the invariants where a doc counts them."""
    from wandb_assets.lib.checks import INVARIANTS

    root = Path(__file__).resolve().parent.parent
    texts = {path: path.read_text() for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]}
    gauges = len(GAUGE_NAMES)
    stated = {
        (path.name, int(n)) for path, text in texts.items() for n in re.findall(r"\b(\d+) (?:fleet )?gauges\b", text)
    }
    assert stated and {n for _, n in stated} == {gauges}, stated
    rows = re.findall(r"appends (\d+) rows to fleet_metrics, (\d+) per project", PIPELINE)
    assert rows == [(str(gauges), str(gauges))]
    listed = re.findall(r"`([a-z_]+)`", (root / "notebooks" / "README.md").read_text().split("read the")[0])
    assert sorted(listed) == sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
    counted = {int(n) for text in texts.values() for n in re.findall(r"\b(\d+) invariants\b", text)}
    assert counted <= {len(INVARIANTS)}, counted  # where a doc counts them, the count is the code's
