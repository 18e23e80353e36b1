"""Datadog (metrics and events, through the official datadog-api-client), the alert channels, and Slack's Web API
(the idle ladder's messages, through the official slack_sdk)."""

from dagster import ConfigurableResource, ResourceDependency

from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.lib.acting.channels import AuthRefused, Outage, datadog_escape, post_webhook, slack_error
from wandb_assets.lib.datadog_feed import SendResult, feed_tags
from wandb_assets.settings import ConfigError, load_settings, pipeline_settings

SLACK_TOKEN_SETTING = "WANDB_ASSETS_SLACK_BOT_TOKEN"


def slack_call(call, absent: str | None = None):
    """``call()`` of a ``slack_sdk`` client, its errors in the notifier's classes (``acting.channels.slack_error``:
    ``Outage`` for a 429 with its ``Retry-After``, a 5xx or a time-out; ``AuthRefused`` for the token;
    ``Undeliverable`` for a target Slack will never take); None when Slack answers the error ``absent`` (what it says
    of a lookup that found nobody)."""
    from slack_sdk.errors import SlackApiError

    try:
        return call()
    except SlackApiError as exc:
        response = exc.response
        error = response.get("error") if response is not None else None
        if absent is not None and error == absent:
            return None
        status = getattr(response, "status_code", None)
        headers = getattr(response, "headers", None) or {}
        retry = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        try:
            retry_after = float(retry[0] if isinstance(retry, list) else retry) if retry is not None else None
        except ValueError:
            retry_after = None
        raise slack_error(error, status, retry_after, SLACK_TOKEN_SETTING) from None
    except Exception as exc:  # noqa: BLE001 - connection trouble of any kind: the row waits
        raise Outage(f"Slack unreachable ({type(exc).__name__})") from None


class DatadogResource(ConfigurableResource):
    """Submits metric payloads and events to Datadog.

    Dry run is a configuration decision: with no ``DD_API_KEY`` in the environment and none in the W&B
    secret (when that secret is in use) the feed runs dry. A key that is configured but cannot be read
    (Secrets Manager throttled, expired credentials) raises, so the step fails loudly and the snapshots
    stay pending. The secret is read once per run (``WandbResource`` caches it). Settings are
    read from the environment (``DD_SITE``, ``DD_ENV``, ``WANDB_ASSETS_DATADOG_URL``), never stored as
    resource config, so nothing secret shows in the UI.
    """

    wandb: ResourceDependency[WandbResource]
    timeout_s: float = 10.0

    @property
    def site(self) -> str:
        return load_settings().DD_SITE

    @property
    def url(self) -> str:
        return load_settings().WANDB_ASSETS_DATADOG_URL or ""

    @property
    def env(self) -> str | None:
        return load_settings().DD_ENV

    def api_key(self) -> str | None:
        """``DD_API_KEY`` from the environment, else from the W&B secret when that secret is in use; None
        when no key is configured anywhere (dry run). Raises ``ConfigError`` when the secret cannot be read."""
        key = load_settings().DD_API_KEY
        if key is not None:
            return key.get_secret_value()
        if not self.wandb.secret_in_use():
            return None  # credentials come from the environment, not the secret: no key means dry run
        secret = self.wandb.load_secret(self.wandb.resolved_secret_name(), "DD_API_KEY")
        return (secret.get("DD_API_KEY") or "").strip() or None

    def tags(self) -> list[str]:
        """The tags of every point and event: the W&B entity and project, ``DD_ENV``. With ``WANDB_ENTITY`` and
        ``WANDB_PROJECT`` both set no W&B request is made (an air-gapped cluster cannot make one); else the key's
        default entity is looked up (which checks the key)."""
        settings = load_settings()
        if settings.WANDB_ASSETS_PROJECTS is not None:  # several projects: the fleet-wide series
            return feed_tags(None, None, self.env)
        if settings.WANDB_ENTITY and settings.WANDB_PROJECT:
            return feed_tags(settings.WANDB_ENTITY, settings.WANDB_PROJECT, self.env)
        entity, project, _ = self.wandb.project_path(pipeline_settings())
        return feed_tags(entity, project, self.env)

    def project_series(self) -> int:
        """How many projects get their own series: ``WANDB_ASSETS_DATADOG_PROJECT_SERIES`` with several projects
        mirrored, else none (one project's series are the fleet's)."""
        settings = load_settings()
        return settings.WANDB_ASSETS_DATADOG_PROJECT_SERIES if settings.WANDB_ASSETS_PROJECTS is not None else 0

    def _configuration(self, key: str, app_key: str | None = None):
        from datadog_api_client import Configuration

        keys = {"apiKeyAuth": key, **({"appKeyAuth": app_key} if app_key else {})}
        configuration = Configuration(
            host=self.url or None, api_key=keys, request_timeout=self.timeout_s, enable_retry=False
        )
        if not self.url:
            configuration.server_variables["site"] = self.site
        return configuration

    def _call(self, key: str, call) -> SendResult:
        from datadog_api_client import ApiClient
        from datadog_api_client.exceptions import ApiException

        try:
            with ApiClient(self._configuration(key)) as client:
                call(client)
            return SendResult(202)
        except ApiException as exc:
            return SendResult(exc.status, str(exc.reason or "")[:200])
        except Exception as exc:  # noqa: BLE001 - timeouts and connection errors from urllib3
            text = str(exc).replace(key, "***")
            kind = "timed out" if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower() else "failed"
            return SendResult(None, f"request {kind} ({type(exc).__name__})")

    def submit_series(self, key: str, payload: dict) -> SendResult:
        """One v2 ``submit_metrics`` call with the series of one snapshot."""
        from datadog_api_client.v2.api.metrics_api import MetricsApi
        from datadog_api_client.v2.model.metric_intake_type import MetricIntakeType
        from datadog_api_client.v2.model.metric_payload import MetricPayload
        from datadog_api_client.v2.model.metric_point import MetricPoint
        from datadog_api_client.v2.model.metric_series import MetricSeries

        body = MetricPayload(
            series=[
                MetricSeries(
                    metric=s["metric"],
                    type=MetricIntakeType(s["type"]),
                    tags=s["tags"],
                    points=[MetricPoint(timestamp=p["timestamp"], value=p["value"]) for p in s["points"]],
                )
                for s in payload["series"]
            ]
        )
        return self._call(key, lambda client: MetricsApi(client).submit_metrics(body=body))

    def send_event(self, key: str, title: str, text: str, resolved: bool, tags: list[str]) -> SendResult:
        from datadog_api_client.v1.api.events_api import EventsApi
        from datadog_api_client.v1.model.event_alert_type import EventAlertType
        from datadog_api_client.v1.model.event_create_request import EventCreateRequest

        body = EventCreateRequest(  # run names in the text: no @mention of theirs may notify anyone
            title=datadog_escape(title)[:100],
            text=datadog_escape(text)[:4000],
            tags=tags,
            alert_type=EventAlertType.SUCCESS if resolved else EventAlertType.WARNING,
        )
        return self._call(key, lambda client: EventsApi(client).create_event(body=body))


class DatadogAssets:
    """The dashboard and monitors of ``lib.datadog_assets`` applied through Datadog's API (``DashboardsApi``,
    ``MonitorsApi``) with an API and an application key; a refused or failed call raises ``DatadogApiError``: one
    sentence with its status, never a key."""

    def __init__(self, feed: DatadogResource, key: str, app_key: str) -> None:
        self.feed, self.key, self.app_key = feed, key, app_key

    def _client(self):
        from datadog_api_client import ApiClient

        return ApiClient(self.feed._configuration(self.key, self.app_key))

    def _calling(self, what: str, call):
        from datadog_api_client.exceptions import ApiException

        try:
            with self._client() as client:
                return call(client)
        except ApiException as exc:
            raise DatadogApiError(f"{what}: Datadog answered {exc.status} {str(exc.reason or '')[:100]}") from None
        except Exception as exc:  # noqa: BLE001 - timeouts and connection errors from urllib3
            text = str(exc).replace(self.key, "***").replace(self.app_key, "***")
            raise DatadogApiError(f"{what} failed ({type(exc).__name__}: {text[:150]})") from None

    @staticmethod
    def _model(body: dict, model):
        from datadog_api_client import Configuration
        from datadog_api_client.model_utils import validate_and_convert_types

        return validate_and_convert_types(body, (model,), ["body"], True, True, Configuration())

    def managed_monitors(self, tag: str) -> list[dict]:
        from datadog_api_client.v1.api.monitors_api import MonitorsApi

        found = self._calling("listing the monitors", lambda c: MonitorsApi(c).list_monitors(monitor_tags=tag))
        return [m.to_dict() for m in found]

    def create_monitor(self, body: dict) -> int:
        from datadog_api_client.v1.api.monitors_api import MonitorsApi
        from datadog_api_client.v1.model.monitor import Monitor

        made = self._calling(
            f"creating the monitor {body['name']!r}",
            lambda c: MonitorsApi(c).create_monitor(body=self._model(body, Monitor)),
        )
        return int(made.id)

    def update_monitor(self, monitor_id: int, body: dict) -> None:
        from datadog_api_client.v1.api.monitors_api import MonitorsApi
        from datadog_api_client.v1.model.monitor_update_request import MonitorUpdateRequest

        self._calling(
            f"updating the monitor {body['name']!r}",
            lambda c: MonitorsApi(c).update_monitor(monitor_id, body=self._model(body, MonitorUpdateRequest)),
        )

    def dashboard_summaries(self) -> list[dict]:
        from datadog_api_client.v1.api.dashboards_api import DashboardsApi

        listing = self._calling("listing the dashboards", lambda c: DashboardsApi(c).list_dashboards())
        return [d.to_dict() for d in (listing.get("dashboards") or [])]

    def dashboard(self, dashboard_id: str) -> dict:
        from datadog_api_client.v1.api.dashboards_api import DashboardsApi

        return self._calling("reading the dashboard", lambda c: DashboardsApi(c).get_dashboard(dashboard_id)).to_dict()

    def create_dashboard(self, body: dict) -> str:
        from datadog_api_client.v1.api.dashboards_api import DashboardsApi
        from datadog_api_client.v1.model.dashboard import Dashboard

        made = self._calling(
            "creating the dashboard", lambda c: DashboardsApi(c).create_dashboard(body=self._model(body, Dashboard))
        )
        return str(made.id)

    def update_dashboard(self, dashboard_id: str, body: dict) -> None:
        from datadog_api_client.v1.api.dashboards_api import DashboardsApi
        from datadog_api_client.v1.model.dashboard import Dashboard

        self._calling(
            "updating the dashboard",
            lambda c: DashboardsApi(c).update_dashboard(dashboard_id, body=self._model(body, Dashboard)),
        )


class DatadogApiError(Exception):
    """Datadog refused or did not answer a dashboard or monitor call: one sentence, never a key."""


class AlertChannelsResource(ConfigurableResource):
    """Where alert notifications go besides the ``alerts`` table and the Dagster log.

    ``WANDB_ASSETS_SLACK_WEBHOOK_URL`` is read at each call: a webhook URL is a secret.
    """

    timeout_s: float = 10.0

    @property
    def slack_enabled(self) -> bool:
        return load_settings().WANDB_ASSETS_SLACK_WEBHOOK_URL is not None

    def post_slack(self, text: str, markup: bool = False) -> str | None:
        """``markup``: ``text`` is Slack markup already (escaped, with ``<url|label>`` links)."""
        url = load_settings().WANDB_ASSETS_SLACK_WEBHOOK_URL.get_secret_value()
        return post_webhook(url, text, self.timeout_s, markup)


class SlackResource(ConfigurableResource):
    """Slack's Web API through ``slack_sdk`` (``chat.postMessage``, ``users.lookupByEmail``), for the idle ladder.

    The bot token is ``WANDB_ASSETS_SLACK_BOT_TOKEN``, else the secret's key of that name when the W&B secret is in use;
    it is read at each run and kept in memory only (never resource config, never in a message or a log).
    ``WANDB_ASSETS_SLACK_API_URL`` points it elsewhere (a proxy, a loopback Slack in the tests).
    """

    wandb: ResourceDependency[WandbResource]
    timeout_s: float = 10.0

    def token(self) -> str | None:
        """The bot token; None when none is configured anywhere. ``ConfigError`` when the secret cannot be read."""
        token = load_settings().WANDB_ASSETS_SLACK_BOT_TOKEN
        if token is not None:
            return token.get_secret_value().strip() or None
        if not self.wandb.secret_in_use():
            return None
        secret = self.wandb.load_secret(self.wandb.resolved_secret_name(), SLACK_TOKEN_SETTING)
        return (secret.get(SLACK_TOKEN_SETTING) or "").strip() or None

    def verify(self, why: str) -> None:
        """``ConfigError`` of one sentence when no bot token is configured, or Slack refuses it (``auth.test``);
        ``why``: what needs it. Slack unreachable now is no setting's mistake: the messages wait, as at any outage."""
        token = self.token()
        if token is None:
            raise ConfigError(
                f"{why}, but no Slack bot token is configured: set {SLACK_TOKEN_SETTING} (a bot token with chat:write "
                "and users:read.email), or take the telling steps out of the policy."
            )
        client = self.client(token)
        try:
            slack_call(client.auth_test)
        except AuthRefused as exc:
            raise ConfigError(f"{why}, but {exc}") from None
        except Outage:
            return

    def client(self, token: str):
        from slack_sdk import WebClient

        base_url = load_settings().WANDB_ASSETS_SLACK_API_URL
        return WebClient(
            token=token, base_url=base_url if base_url.endswith("/") else base_url + "/", timeout=int(self.timeout_s)
        )
