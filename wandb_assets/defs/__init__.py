"""Dagster definitions, one folder per domain, loaded into one `Definitions` by `wandb_assets.definitions`."""
