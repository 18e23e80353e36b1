"""The DuckDB warehouse resource (pool `warehouse`) and the analysts' `warehouse_snapshot` asset."""
