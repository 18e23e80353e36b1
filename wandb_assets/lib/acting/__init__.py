"""What the product does to the world, and how it stays safe to leave switched on: the notifier (``channels``: one
classification of Slack, GitHub and Datadog errors, escaping by default), the idle ladder (policy, episodes, the
ledger, its delivery, its digest and read-out) and the PR checks (judging and their outbox). Each action is decided,
recorded in an outbox, then re-validated at the moment it is sent. No Dagster, no environment."""
