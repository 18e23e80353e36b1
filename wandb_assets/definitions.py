"""The code location: everything under ``wandb_assets/defs/`` is loaded from the folders; nothing else. Each
asset's definition names the warehouse this process writes (as each of its materializations does), so the UI's
asset pages say which warehouse they show."""

import warnings

import dagster as dg

import wandb_assets.defs
from wandb_assets.defs.warehouse.named import WAREHOUSE_METADATA
from wandb_assets.settings import ConfigError, warehouse_label


def _named_warehouse() -> dict[str, str]:
    try:
        return {WAREHOUSE_METADATA: warehouse_label()}
    except ConfigError:  # said by the command's preflight, or by the run that opens it: not the code location's load
        return {}


def build_definitions() -> dg.Definitions:
    """The code location, its asset definitions naming this process's warehouse (read now)."""
    with warnings.catch_warnings():  # "in preview": pinned Dagster (1.13.27); tests cover what it does here
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.components.load_defs(wandb_assets.defs).map_resolved_asset_specs(
            func=lambda spec: spec.merge_attributes(metadata=_named_warehouse())
        )


defs = build_definitions()
