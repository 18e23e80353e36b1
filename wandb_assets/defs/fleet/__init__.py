"""Fleet tables, the fleet snapshot, the refresh/backfill jobs and the 15-minute schedule."""
