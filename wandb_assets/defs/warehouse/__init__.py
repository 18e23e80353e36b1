"""The DuckDB warehouse resource."""
