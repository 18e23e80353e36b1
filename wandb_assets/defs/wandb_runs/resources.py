"""The W&B resource: settings from the environment or AWS Secrets Manager, and paged run fetching."""

import functools
from collections.abc import Callable, Iterable, Iterator

from dagster import ConfigurableResource, InitResourceContext, ResourceDependency
from pydantic import PrivateAttr

from wandb_assets.lib.curves import parse_reads
from wandb_assets.lib.fetch import (
    DownloadPool,
    FetchPolicy,
    FetchStats,
    Slice,
    WandbFetchError,
    default_entity,
    failure_cause,
    fetch_due_curves,
    fetch_run_pages,
    fetch_slices,
    get_api,
    latest_activity,
    list_projects,
    metadata_headers,
    metadata_url_refused,
    read_metadata_file,
    stop_run,
)
from wandb_assets.lib.progress import FetchProgress
from wandb_assets.lib.projects import NO_PROJECT_LISTED
from wandb_assets.settings import (
    ConfigError,
    PipelineSettings,
    WandbSettings,
    load_settings,
    parse_secret_string,
    resolve_wandb_settings,
)


@functools.cache
def _download_pool(size: int) -> DownloadPool:
    """One ``DownloadPool`` per process and download limit: kept-alive connections to W&B's file storage."""
    return DownloadPool(size)


class SecretsManagerResource(ConfigurableResource):
    """An AWS Secrets Manager client, made on first use: boto3 is imported only when a secret is read (most runs
    have their keys in the environment). dagster-aws's resource of the same name costs every process that loads
    the definitions 3.7 s of imports here (its components package); this one costs nothing until used. The
    endpoint comes from boto3's own ``AWS_ENDPOINT_URL``, credentials from its usual chain."""

    region_name: str

    def get_client(self):
        import boto3

        return boto3.session.Session().client("secretsmanager", region_name=self.region_name)


class WandbResource(ConfigurableResource):
    """Reads a W&B project through the public API (one ``wandb.Api`` per process and settings).

    The Secrets Manager secret is read at most once per run (per resource instance outside Dagster) and
    kept only in memory; it is never resource config, so nothing secret shows in the UI.
    """

    secrets: ResourceDependency[SecretsManagerResource]
    #: The secret's name; empty: ``WANDB_ASSETS_SECRET_NAME`` (default ``dev/datadog/collectors/wandb``) at run time.
    secret_name: str = ""
    _secret_cache: dict = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._secret_cache = {}  # a fresh cache for every run

    def load_secret(self, name: str, wanted: str = "WANDB_API_KEY") -> dict[str, str]:
        """The secret's JSON object; a one-sentence ``ConfigError`` naming ``wanted`` when it cannot be read."""
        if name in self._secret_cache:
            return self._secret_cache[name]
        try:
            response = self.secrets.get_client().get_secret_value(SecretId=name)
        except Exception as exc:  # noqa: BLE001 - botocore raises many types; the message names the setting
            reason = type(exc).__name__
            code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
            raise ConfigError(
                f"{wanted} is not set and the secret {name!r} could not be read from AWS Secrets Manager "
                f"({code or reason}): export {wanted} or fix WANDB_ASSETS_SECRET_NAME / AWS credentials."
            ) from None
        self._secret_cache[name] = parse_secret_string(name, response.get("SecretString"))
        return self._secret_cache[name]

    def resolved_secret_name(self) -> str:
        return self.secret_name or load_settings().WANDB_ASSETS_SECRET_NAME

    def secret_in_use(self) -> bool:
        """Whether credentials come from the secret (``WANDB_API_KEY`` is not in the environment)."""
        return load_settings().WANDB_API_KEY is None

    def wandb_settings(self) -> WandbSettings:
        return resolve_wandb_settings(None, self.load_secret, self.resolved_secret_name())

    def _client(self, pipeline: PipelineSettings) -> tuple[WandbSettings, object, str]:
        """``(settings, this process's wandb.Api, entity)``: the key and entity resolved once per call."""
        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        return settings, api, settings.entity or default_entity(api)

    def fetch_run_pages(self, filters: dict, pipeline: PipelineSettings) -> Iterator[list[dict]]:
        """Raw run nodes matching ``filters`` (see ``lib.fetch.created_between`` / ``with_ids``), a page at a time."""
        settings, api, entity = self._client(pipeline)
        yield from fetch_run_pages(api, entity, settings.project, filters, fetch_policy(pipeline), settings.api_key)

    def fetch_slices(
        self,
        slices: list[Slice],
        pipeline: PipelineSettings,
        handle_page: Callable[[Slice, list[dict]], None],
        progress: FetchProgress,
        report: Callable[[FetchProgress], None],
        others_read: bool = False,
        enrich: Callable | None = None,
    ) -> FetchStats:
        """Fetch the slices concurrently (``lib.fetch.fetch_slices``), ``WANDB_ASSETS_FETCH_CONCURRENCY`` at most;
        with ``WANDB_ASSETS_PROJECTS``, a failing project is skipped (``FetchStats.failed_projects``), and the
        fetch fails when every project failed, unless ``others_read`` (a tick found the others unchanged)."""
        settings, api, entity = self._client(pipeline)
        return fetch_slices(
            api,
            entity,
            settings.project or "",
            slices,
            fetch_policy(pipeline),
            handle_page,
            progress=progress,
            report=report,
            secret=settings.api_key,
            isolate_projects=pipeline.projects is not None,
            others_read=others_read,
            enrich=enrich,
            with_metadata_file=enrich is not None and pipeline.fetch_metadata,
        )

    def due_curves(self, due: list[tuple[str, str, str, bool]], on_read, pipeline: PipelineSettings):
        """The curves of the runs ``due`` (``lib.fetch.fetch_due_curves``: one request per 20 runs, at most
        WANDB_ASSETS_FETCH_CONCURRENCY in flight), each request's handed to ``on_read``; returns the throttle."""
        settings, api, _ = self._client(pipeline)
        return fetch_due_curves(
            api,
            due,
            list(pipeline.history_keys),
            pipeline.history_samples,
            fetch_policy(pipeline),
            on_read,
            settings.api_key,
        )

    def idle_streams(self, runs: list[tuple[str, str, str]], pipeline: PipelineSettings) -> dict[tuple, dict]:
        """``{(entity, project, run_id): read}`` of ``runs``' sampled GPU streams and W&B users' e-mails (the idle
        ladder; ``lib.fetch.fetch_due_curves`` without history keys: 20 runs a request, batched as the curves job)."""
        settings, api, _ = self._client(pipeline)
        found: dict[tuple, dict] = {}

        def on_read(path: str, final: dict[str, bool], read: dict[str, dict]) -> None:
            entity, _, project = path.partition("/")
            found.update({(entity, project, run_id): curves for run_id, curves in read.items()})

        due = [(*run, False) for run in runs]
        fetch_due_curves(
            api, due, [], pipeline.history_samples, fetch_policy(pipeline), on_read, settings.api_key, with_user=True
        )
        return parse_reads(found)

    def stop_run(self, path: str, pipeline: PipelineSettings, check, act: bool = True):
        """``lib.fetch.stop_run`` through this process's client (``check``: what must hold of the run now; ``act``
        False: only read and checked, the preview)."""
        settings, api, _ = self._client(pipeline)
        return stop_run(api, path, check, settings.api_key, act)

    def runs_metadata(
        self, path: str, urls: dict[str, str | None], downloads, pipeline: PipelineSettings
    ) -> dict[str, dict]:
        """``{run_id: what was read of its wandb-metadata.json}`` (``{"status": "error", "error", "cause"}`` for a
        read that failed) for ``urls`` (``{run_id: where its file is, None: it has none}``, as the runs page said):
        the files concurrently from W&B's storage, ``downloads`` (a ``Throttle`` shared by the fetch) at most."""
        settings = self.wandb_settings()
        run_ids = list(urls)

        def one(run_id: str) -> dict:
            url = urls[run_id]
            if url is None:
                return {"status": "missing"}
            what = f"wandb-metadata.json of {path}/{run_id}"
            base_url = settings.base_url or "https://api.wandb.ai"
            refused = metadata_url_refused(url, base_url, pipeline.file_hosts)
            if refused:  # kept as read: asking again would be refused again
                return {"status": "refused", "error": f"{what} not read: {refused}"}
            headers = metadata_headers(url, base_url, settings.api_key)
            try:
                return read_metadata_file(
                    http, url, headers, downloads, what, pipeline.http_timeout_s, settings.api_key
                )
            except WandbFetchError as exc:  # stored with its cause alone (never a URL): asked again next fetch
                return {"status": "error", "error": str(exc), "cause": failure_cause(str(exc))}

        from concurrent.futures import ThreadPoolExecutor

        http = _download_pool(pipeline.metadata_downloads)

        with ThreadPoolExecutor(max_workers=max(1, min(pipeline.metadata_downloads, len(run_ids)))) as pool:
            return dict(zip(run_ids, pool.map(one, run_ids), strict=True))

    def latest_activity(self, projects: list[str], pipeline: PipelineSettings) -> dict:
        """Each project's newest run heartbeat (``lib.fetch.latest_activity``): one request per 25 projects."""
        settings = self.wandb_settings()
        return latest_activity(get_api(settings, pipeline), projects, settings.api_key)

    def project_path(self, pipeline: PipelineSettings) -> tuple[str, str, str]:
        """``(entity, project, app_url)`` for building run URLs; checks the key (and the server) on the way."""
        from wandb.util import app_url

        settings, api, entity = self._client(pipeline)
        return entity, settings.project or "", app_url(api.settings["base_url"])

    def mirrored_projects(self, pipeline: PipelineSettings) -> tuple[list[str], dict[str, str], str]:
        """``(["entity/project", ...], {"entity/*": why its listing failed}, app_url)``: the projects to mirror
        now. Without ``WANDB_ASSETS_PROJECTS``, the one of WANDB_ENTITY/WANDB_PROJECT; ``entity/*`` is listed
        again on every call (a project created since is mirrored from this tick)."""
        from wandb.util import app_url

        if pipeline.projects is None:
            settings, api, entity = self._client(pipeline)
            return [f"{entity}/{settings.project}"], {}, app_url(api.settings["base_url"])
        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        url = app_url(api.settings["base_url"])
        listed, failures = {}, {}
        for whole in pipeline.projects.whole_entities:
            try:
                listed[whole] = list_projects(api, whole, settings.api_key)
            except WandbFetchError as exc:
                failures[f"{whole}/*"] = str(exc)
                continue
            if not listed[whole]:  # a mistyped entity lists nothing: said, alerted, never silent
                failures[f"{whole}/*"] = (
                    f"{NO_PROJECT_LISTED} {whole!r} for this key: check the entity's name in WANDB_ASSETS_PROJECTS"
                )
        return [str(ref) for ref in pipeline.projects.resolve(listed)], failures, url

    def readable_entities(self, pipeline: PipelineSettings) -> tuple[list[str], str]:
        """``([entity, ...], app_url)``: the key's own entity and its teams', as W&B's viewer says."""
        from wandb.util import app_url

        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        viewer = api.viewer
        entities = [viewer._attrs.get("entity"), *(viewer.teams or [])]
        return [e for e in dict.fromkeys(entities) if e], app_url(api.settings["base_url"])

    def project_listings(self, pipeline: PipelineSettings, entities: Iterable[str]) -> dict[str, list[str]]:
        """``{entity: [project, ...]}`` as W&B lists them for the key now; an entity whose listing failed (W&B down,
        a refused key) is left out: what a listing could not say, it does not decide."""
        settings = self.wandb_settings()
        api = get_api(settings, pipeline)
        listed = {}
        for entity in dict.fromkeys(entities):
            try:
                listed[entity] = list_projects(api, entity, settings.api_key)
            except WandbFetchError:
                continue
        return listed


def fetch_policy(pipeline: PipelineSettings) -> FetchPolicy:
    return FetchPolicy(
        concurrency=pipeline.fetch_concurrency,
        page_size=pipeline.page_size,
        retries=pipeline.http_retries,
        retry_wait_max_s=pipeline.retry_wait_max_s,
    )


def wandb_resource() -> WandbResource:
    settings = load_settings()
    return WandbResource(secrets=SecretsManagerResource(region_name=settings.AWS_REGION))
