"""The dbt-duckdb plugin of the analysts' dbt project (``analytics/profiles.yml``): each dbt connection gets the
pipeline's clock (UTC) and, on a DuckLake, the lake's extensions from the pinned wheels and its S3 secret, before
dbt-duckdb attaches the lake. The same code as the pipeline's own lake connections (``lib/lake.py``): never an
INSTALL, so dbt needs no network. The S3 options come from the same settings as the pipeline's (inherited
environment); nothing here imports Dagster.
"""

from __future__ import annotations

from typing import Any

from dbt.adapters.duckdb.plugins import BasePlugin

from wandb_assets.lib import lake
from wandb_assets.lib.lake import Lake
from wandb_assets.settings import warehouse_location


def _lake() -> Lake | None:
    location = warehouse_location()
    return location if isinstance(location, Lake) else None


class Plugin(BasePlugin):
    def update_connection_config(self, creds: Any, config: dict[str, Any]) -> None:
        self._lake = _lake() if creds.attach else None
        if self._lake is not None:
            config.update(lake.connection_config(self._lake.s3))

    def configure_connection(self, conn: Any) -> None:
        conn.execute("SET TimeZone = 'UTC'")
        if getattr(self, "_lake", None) is not None:
            lake.load_extensions(conn, self._lake.s3)
