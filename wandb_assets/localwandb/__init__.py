"""A W&B-compatible GraphQL server for loopback use: the demo and the tests point the real client at it."""

from wandb_assets.localwandb.server import Faults, LocalWandbServer, make_run_node

__all__ = ["Faults", "LocalWandbServer", "make_run_node"]
