"""Every materialization names the warehouse it wrote (issue 53: CLI runs of several warehouses recorded in one
instance showed a scratch warehouse's dollars on the real one's asset page, and nothing said which was which).

``@names_the_warehouse`` under an asset's decorator adds ``warehouse`` (the file's absolute path, or the lake's
catalog without its password) to each materialization the asset reports, whatever else it reports; the asset
definitions carry the same name (``definitions``), so an asset page says it before the first materialization."""

import functools
import inspect
from collections.abc import Callable

from dagster import AssetMaterialization, MaterializeResult, MetadataValue, Output

from wandb_assets.settings import warehouse_label

#: The metadata key naming the warehouse, on every materialization and every asset definition.
WAREHOUSE_METADATA = "warehouse"


def names_the_warehouse(compute: Callable) -> Callable:
    """``compute`` (an asset's body, a function or a generator) with ``warehouse`` in each materialization's
    metadata; its signature unchanged (Dagster reads the resources and config it asks for from it)."""
    if inspect.isgeneratorfunction(compute):

        @functools.wraps(compute)
        def each_named(*args, **kwargs):
            label = warehouse_label()
            for event in compute(*args, **kwargs):
                yield _named(event, label)

        each_named.names_the_warehouse = True
        return each_named

    @functools.wraps(compute)
    def named(*args, **kwargs):
        return _named(compute(*args, **kwargs), warehouse_label())

    named.names_the_warehouse = True  # what the code location's test looks for on every asset
    return named


def _named(event, label: str):
    name = {WAREHOUSE_METADATA: MetadataValue.text(label)}
    if isinstance(event, MaterializeResult):
        return MaterializeResult(
            asset_key=event.asset_key,
            metadata={**(event.metadata or {}), **name},
            check_results=event.check_results,
            data_version=event.data_version,
            tags=event.tags,
            value=event.value,
        )
    if isinstance(event, Output | AssetMaterialization):
        return event.with_metadata({**(event.metadata or {}), **name})
    return event
