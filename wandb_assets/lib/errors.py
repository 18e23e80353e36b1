"""Errors shared by every layer. No Dagster here."""


class ConfigError(RuntimeError):
    """A setting is missing or wrong. The message is one sentence naming the setting and the fix."""


class FetchWideError(RuntimeError):
    """A failure of the fetch itself, not of one project's data (a worker process died): it stops every project.
    Anything else that goes wrong while a project's pages are fetched, normalised or staged is that project's."""
