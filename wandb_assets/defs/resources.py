"""The resources every domain shares, built once from the settings (see ``wandb_assets.settings``)."""

import dagster as dg

from wandb_assets.defs.feed.github import GitHubResource
from wandb_assets.defs.feed.resources import AlertChannelsResource, DatadogResource, SlackResource
from wandb_assets.defs.wandb_runs.resources import wandb_resource
from wandb_assets.defs.warehouse.resources import warehouse_resource


@dg.definitions
def resources() -> dg.Definitions:
    wandb = wandb_resource()
    return dg.Definitions(
        resources={
            "wandb": wandb,
            "warehouse": warehouse_resource(),
            "datadog": DatadogResource(wandb=wandb),
            "channels": AlertChannelsResource(),
            "slack": SlackResource(wandb=wandb),
            "github": GitHubResource(wandb=wandb),
        }
    )
