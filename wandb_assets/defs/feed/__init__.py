"""The operations feed: Datadog delivery, alert evaluation and notifications after each fleet snapshot."""
