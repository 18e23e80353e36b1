"""The code location: everything under ``wandb_assets/defs/`` is loaded from the folders; nothing else."""

import dagster as dg

import wandb_assets.defs

defs = dg.components.load_defs(wandb_assets.defs)
