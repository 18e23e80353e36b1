"""Ingestion of W&B runs: the W&B resource and the daily-partitioned `runs` asset."""
