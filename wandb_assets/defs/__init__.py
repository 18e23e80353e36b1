"""Dagster definitions, one folder per domain (and ``resources.py``, the resources they share), loaded into one
``Definitions`` by ``build_definitions``: the code location (``wandb_assets.definitions``) loads every folder; a
command running jobs other than the analysts' loads all but ``analytics/`` (its dbt import is 1-2 s of the start)."""

import pkgutil
import sys
import warnings

import dagster as dg
from dagster.components.core.component_tree import LegacyAutoloadingComponentTree
from dagster.components.core.load_defs import get_project_root

from wandb_assets.defs.warehouse.named import WAREHOUSE_METADATA
from wandb_assets.settings import ConfigError, warehouse_label

#: The folder whose definitions import dbt: loaded only where the analytics job may run.
ANALYTICS_FOLDER = "analytics"


def _named_warehouse() -> dict[str, str]:
    try:
        return {WAREHOUSE_METADATA: warehouse_label()}
    except ConfigError:  # said by the command's preflight, or by the run that opens it: not the code location's load
        return {}


def build_definitions(analytics: bool = True) -> dg.Definitions:
    """The definitions of every folder here (without ``analytics/`` when not ``analytics``: no job of it, nor its
    assets, sensor or dbt resource), each asset's definition naming this process's warehouse (read now)."""
    package = sys.modules[__name__]
    with warnings.catch_warnings():  # "in preview", "in beta": pinned Dagster (1.13.27); tests cover what it does here
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        # as dg.components.load_defs makes it: a folder holding a definitions.py is that file alone (analytics/), so
        # building the others imports nothing of it
        tree = LegacyAutoloadingComponentTree.from_module(defs_module=package, project_root=get_project_root(package))
        if analytics:  # the whole tree, as dg.components.load_defs builds it
            loaded = tree.build_defs()
        else:  # each other folder (and resources.py) as the whole tree builds it, merged
            loaded = dg.Definitions.merge(
                *(
                    tree.build_defs(module.name if module.ispkg else f"{module.name}.py")
                    for module in pkgutil.iter_modules(package.__path__)
                    if module.name != ANALYTICS_FOLDER
                )
            )
        return loaded.map_resolved_asset_specs(func=lambda spec: spec.merge_attributes(metadata=_named_warehouse()))
