"""The code location: everything under ``wandb_assets/defs/`` is loaded from the folders; nothing else. Each
asset's definition names the warehouse this process writes (as each of its materializations does), so the UI's
asset pages say which warehouse they show."""

from wandb_assets.defs import build_definitions

defs = build_definitions()
