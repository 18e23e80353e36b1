"""Every table, view and column carries a COMMENT, and docs/warehouse.md says the same."""

from pathlib import Path

from wandb_assets.lib.schema_docs import SCHEMA_DOCS, render_dbt_macros, render_dbt_sources, render_markdown
from wandb_assets.lib.warehouse import ensure_schema

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "warehouse.md"


def test_docs_file_is_current():
    assert DOCS.read_text() == render_markdown(), (
        "run: uv run python -m wandb_assets.lib.schema_docs > docs/warehouse.md"
    )


def test_the_dbt_projects_sources_and_rules_are_generated_from_the_same_definitions():
    """One definition: the analysts' dbt sources carry these descriptions, and their macros the pipeline's rules."""
    assert (REPO / "analytics" / "models" / "sources.yml").read_text() == render_dbt_sources(), (
        "run: uv run python -m wandb_assets.lib.schema_docs --dbt-sources > analytics/models/sources.yml"
    )
    assert (REPO / "analytics" / "macros" / "warehouse_rules.sql").read_text() == render_dbt_macros(), (
        "run: uv run python -m wandb_assets.lib.schema_docs --dbt-macros > analytics/macros/warehouse_rules.sql"
    )


def test_every_column_of_the_warehouse_is_documented_in_duckdb(memory_con):
    ensure_schema(memory_con)
    columns = memory_con.execute(
        "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal ORDER BY table_name"
    ).fetchall()
    actual = {(t, c): comment for t, c, comment in columns}
    expected = {(t, c): text for t, (_, _, cols) in SCHEMA_DOCS.items() for c, text in cols.items()}
    assert actual == expected
    tables = dict(memory_con.execute("SELECT table_name, comment FROM duckdb_tables() WHERE NOT internal").fetchall())
    views = dict(memory_con.execute("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall())
    assert {**tables, **views} == {name: description for name, (_, description, _) in SCHEMA_DOCS.items()}


def test_schema_setup_is_idempotent_and_cheap_when_current(memory_con):
    ensure_schema(memory_con)
    memory_con.execute("COMMENT ON TABLE runs IS 'changed by hand'")
    ensure_schema(memory_con)  # same version: nothing is re-applied
    assert memory_con.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'runs'").fetchone()[0] == (
        "changed by hand"
    )
