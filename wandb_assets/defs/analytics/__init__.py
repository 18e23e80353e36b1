"""The analysts' dbt project (``analytics/``) as Dagster assets in the same graph as ours: its sources are our
assets, its models and seed are assets of group ``analytics``, its tests are asset checks."""
