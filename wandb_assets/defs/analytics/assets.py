"""The analysts' dbt models, seed and tests as Dagster assets and asset checks: one ``dbt build`` in the
``warehouse`` pool (dbt writes the warehouse like our assets do: one writer at a time), in a run of its own after
the feed or a backfill, so a tick never waits for it."""

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, AssetKey, Config
from dagster_dbt import DagsterDbtTranslator, DagsterDbtTranslatorSettings, DbtCliResource, dbt_assets

from wandb_assets.defs.analytics.project import DOCS_SITE, analytics_project, ensure_manifest, open_dbt_console_log
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL
from wandb_assets.lib.lake import Lake
from wandb_assets.settings import warehouse_location

ANALYTICS_GROUP = "analytics"


class AnalyticsTranslator(DagsterDbtTranslator):
    """Sources are our assets (``meta.dagster.asset_key``; several tables of one asset share its key); models and
    the seed are assets named as in dbt, in group ``analytics``; tests on models are their asset checks."""

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return None if dbt_resource_props["resource_type"] == "source" else ANALYTICS_GROUP

    def get_asset_key(self, dbt_resource_props: Mapping[str, Any]) -> AssetKey:
        if dbt_resource_props["resource_type"] == "source":
            return super().get_asset_key(dbt_resource_props)
        return AssetKey(dbt_resource_props["name"])


TRANSLATOR = AnalyticsTranslator(
    settings=DagsterDbtTranslatorSettings(
        enable_duplicate_source_asset_keys=True,
        # The tests on our tables run in every dbt build (a failure fails the analytics run and pages, and dbt skips
        # the models downstream) and are recorded on our assets as observations, not checks: a check on `runs`
        # would make Dagster run dbt whenever `runs` is materialized from the UI (seen: a UI backfill of `runs` ran
        # the dbt op). stg_runs' own uniqueness test is the asset check a duplicate run fails.
        enable_source_tests_as_checks=False,
        enable_source_metadata=False,  # several tables per asset (run_curves, fleet_snapshot): no conflicting deps
    )
)


class _SourceTestNotes(logging.Filter):
    """Drops dagster-dbt's warning, logged for every test on a source at every build, that it records an observation
    rather than an asset check: that is this project's choice (``TRANSLATOR``: the sources' tests are observations,
    so a UI backfill of ``runs`` never runs dbt), and it said nothing new 24 times in 16 minutes of the UI's terminal
    (issue 53). A failing test still fails the build, and its run pages."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Logging an `AssetObservation` instead of an `AssetCheckResult`")


logging.getLogger("dagster.builtin").addFilter(_SourceTestNotes())


def dbt_environment(location: Any = None) -> dict[str, str]:
    """What ``analytics/profiles.yml`` reads: the target and where the warehouse is, from the pipeline's settings
    (a file's absolute path; a lake's catalog without its password, which dbt inherits as ``PGPASSWORD``)."""
    location = warehouse_location() if location is None else location
    if isinstance(location, Lake):
        return {"WANDB_ANALYTICS_TARGET": "lake", "WANDB_ANALYTICS_CATALOG": location.catalog}
    return {"WANDB_ANALYTICS_TARGET": "file", "WANDB_ANALYTICS_PATH": str(location.resolve())}


class AnalyticsConfig(Config):
    #: Generate the browsable docs after the build when due (``docs_due``; ~4 s: dbt reads the warehouse's catalog).
    docs: bool = True


#: The docs page is made again at most this often (the columns and types it shows change only with an upgrade),
#: or at once when the dbt project changed.
DOCS_MAX_AGE_S = 3600


def docs_due(site: Path, manifest: Path, now: float | None = None) -> bool:
    """Whether the docs page is missing, older than the project's manifest, or older than ``DOCS_MAX_AGE_S``."""
    if not site.exists():
        return True
    made = site.stat().st_mtime
    return made < manifest.stat().st_mtime or (now or time.time()) - made > DOCS_MAX_AGE_S


def publish_docs(page: Path, site: Path = DOCS_SITE) -> Path:
    """Swap ``page`` in as ``site`` atomically (a reader never sees half a page)."""
    site.parent.mkdir(parents=True, exist_ok=True)
    partial = site.with_name(f".{site.name}.{os.getpid()}.partial")
    shutil.copyfile(page, partial)
    os.replace(partial, site)
    return site


@dbt_assets(
    manifest=ensure_manifest(),
    project=analytics_project,
    dagster_dbt_translator=TRANSLATOR,
    pool=WAREHOUSE_POOL,
    name="analytics_models",
    op_tags={"dagster/max_runtime": "900"},
)
@names_the_warehouse
def analytics_models(context: AssetExecutionContext, dbt: DbtCliResource, config: AnalyticsConfig) -> Iterator:
    os.environ.update(dbt_environment())  # this run's process: the dbt subprocess inherits it
    # dagster-dbt writes each of dbt's lines to stdout (a line per model and test: 540 in 16 minutes of the UI's
    # terminal, issue 53); they go to DBT_CONSOLE_LOG instead, and each model and test is an event of the run anyway
    with open_dbt_console_log() as dbt_lines, contextlib.redirect_stdout(dbt_lines):
        build = dbt.cli(["build"], context=context)
        yield from build.stream()
        if not config.docs or not docs_due(DOCS_SITE, analytics_project.manifest_path):
            return
        # the analysts' browsable docs (every table and model, columns, lineage) as one static page: dbt reads the
        # catalog now, while the run holds the warehouse slot (the models are compiled by the build already:
        # --no-compile); `wandb-assets docs` serves the page
        generated = dbt.cli(
            ["docs", "generate", "--static", "--no-compile"], target_path=build.target_path, raise_on_error=True
        ).wait()
    site = publish_docs(Path(generated.target_path) / "static_index.html")
    context.log.info(f"dbt docs: {site}")
