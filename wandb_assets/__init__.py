"""wandb-assets: a Dagster code location that mirrors W&B runs into DuckDB."""
