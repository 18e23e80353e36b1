"""Logic shared by the Dagster definitions, the CLI and the tests: no Dagster, no environment (settings are
passed in). Most of it is pure; `fetch.py` and `channels.py` do the network I/O they are given."""
