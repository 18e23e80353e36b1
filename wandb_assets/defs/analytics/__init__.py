"""The analysts' dbt project (``analytics/``) as Dagster assets in the same graph as ours: its sources are our
assets, its models and seed are assets of group ``analytics``, its tests are asset checks.

Only this folder imports ``dagster_dbt`` (1-2 s of a process's start): a command running the other jobs loads the
definitions without it (``wandb_assets.defs.build_definitions``), so nothing outside imports its modules at load."""

#: The analytics job's name, for what refers to it without loading dbt (the pipeline_failure sensors, the CLI).
ANALYTICS_JOB = "analytics"
