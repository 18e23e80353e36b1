"""The analytics folder's definitions as one file: Dagster's keyword file (``definitions.py``), so loading the
definitions imports this folder's modules (and dbt with them) only when its definitions are built, and a command
running the other jobs builds the other folders alone (``wandb_assets.defs.build_definitions``)."""

import dagster as dg

from wandb_assets.defs.analytics import assets, jobs
from wandb_assets.defs.analytics.project import analytics_cli


@dg.definitions
def analytics() -> dg.Definitions:
    """The dbt models, seed and tests (``assets``), the analytics job and its sensor (``jobs``), and the dbt CLI they
    run (resource ``dbt``: the analytics' own, not among the shared resources)."""
    return dg.Definitions.merge(
        dg.load_definitions_from_modules([assets, jobs]), dg.Definitions(resources={"dbt": analytics_cli()})
    )
