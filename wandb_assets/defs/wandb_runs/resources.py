"""The W&B resource: settings from the environment or AWS Secrets Manager, and paged run fetching."""

import os
from collections.abc import Iterator
from datetime import datetime

from dagster import ConfigurableResource, ResourceDependency
from dagster_aws.secretsmanager import SecretsManagerResource

from wandb_assets.lib.fetch import default_entity, fetch_run_pages, get_api
from wandb_assets.settings import (
    DEFAULT_SECRET_NAME,
    ConfigError,
    PipelineSettings,
    WandbSettings,
    parse_secret_string,
    resolve_wandb_settings,
)


class WandbResource(ConfigurableResource):
    """Reads a W&B project through the public API (one ``wandb.Api`` per process)."""

    secrets: ResourceDependency[SecretsManagerResource]
    secret_name: str = DEFAULT_SECRET_NAME

    def load_secret(self, name: str, wanted: str = "WANDB_API_KEY") -> dict[str, str]:
        """The secret's JSON object; a one-sentence ``ConfigError`` naming ``wanted`` when it cannot be read."""
        try:
            response = self.secrets.get_client().get_secret_value(SecretId=name)
        except Exception as exc:  # noqa: BLE001 - botocore raises many types; the message names the setting
            reason = type(exc).__name__
            code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
            raise ConfigError(
                f"{wanted} is not set and the secret {name!r} could not be read from AWS Secrets Manager "
                f"({code or reason}): export {wanted} or fix WANDB_ASSETS_SECRET_NAME / AWS credentials."
            ) from None
        return parse_secret_string(name, response.get("SecretString"))

    def wandb_settings(self) -> WandbSettings:
        return resolve_wandb_settings(os.environ, self.load_secret, self.secret_name)

    def fetch_run_pages(self, start: datetime, end: datetime, pipeline: PipelineSettings) -> Iterator[list[dict]]:
        """Raw run nodes created in ``[start, end)``, a page at a time."""
        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        entity = settings.entity or default_entity(api)
        yield from fetch_run_pages(api, entity, settings.project, start, end, pipeline.page_size, settings.api_key)

    def project_path(self, pipeline: PipelineSettings) -> tuple[str, str, str]:
        """``(entity, project, app_url)`` for building run URLs."""
        from wandb.util import app_url

        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        entity = settings.entity or default_entity(api)
        return entity, settings.project, app_url(api.settings["base_url"])


def wandb_resource() -> WandbResource:
    return WandbResource(
        secrets=SecretsManagerResource(region_name=os.environ.get("AWS_REGION") or "us-east-1"),
        secret_name=os.environ.get("WANDB_ASSETS_SECRET_NAME") or DEFAULT_SECRET_NAME,
    )
