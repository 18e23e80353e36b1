"""The README's configuration table and quickstart stay true to the code."""

import re
from pathlib import Path

from wandb_assets.lib.gauges import GAUGE_NAMES
from wandb_assets.settings import ENV_VARS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_configuration_table_lists_every_variable_with_its_default():
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \| ([^|]+) \|$", README, flags=re.M)
    assert [(name, default.strip()) for name, default, _ in rows] == [(k, v[0]) for k, v in ENV_VARS.items()]


def test_gauge_table_names_every_gauge():
    documented = re.findall(r"^\| `(wandb\.[a-z0-9_.]+)` \|", README, flags=re.M)
    assert documented == list(GAUGE_NAMES)


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", README, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["uv run wandb-assets demo", "uv run pytest"]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "\nuv run pytest\n" in ci


def test_every_alert_threshold_is_a_documented_variable():
    from wandb_assets.lib.alerts import AlertThresholds

    documented = {k: v[0] for k, v in ENV_VARS.items() if k.startswith("WANDB_ASSETS_ALERT_")}
    assert documented == {f"WANDB_ASSETS_ALERT_{k.upper()}": str(v) for k, v in AlertThresholds().__dict__.items()}
