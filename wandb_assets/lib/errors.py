"""Errors shared by every layer. No Dagster here."""


class ConfigError(RuntimeError):
    """A setting is missing or wrong. The message is one sentence naming the setting and the fix."""
