"""Pure logic shared by the Dagster definitions, the CLI and the tests. Nothing here imports Dagster."""
