"""Fetch run nodes from W&B through the public API, page by page, with bounded retries.

One ``wandb.Api`` per process and settings; ``api.flush()`` before each fetch so a poll never reuses the
client's cached ``Runs`` object. Paging drives the public ``Runs`` paginator ourselves, one GraphQL page
at a time, and reads the raw nodes: iterating ``for run in runs`` with ``lazy=False`` would raise on a
single malformed summary and lose the whole page, and it would also build a ``Run`` object (and an
empty directory) per run that we do not need. Retries of 429/5xx/connection errors happen inside
``wandb-core`` (exponential back-off, honouring ``Retry-After``), bounded by the settings passed here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Protocol

from wandb_assets.lib.errors import ConfigError


class WandbSettings(Protocol):
    """Where to read from (``settings.WandbSettings`` is one); passed in, never read from the environment."""

    api_key: str
    entity: str | None
    base_url: str | None


class PipelineSettings(Protocol):
    """The request limits (``settings.PipelineSettings`` is one)."""

    http_timeout_s: float
    http_retries: int
    retry_wait_max_s: float


_API_CACHE: dict[tuple, object] = {}
_API_LOCK = threading.Lock()


class WandbFetchError(RuntimeError):
    """Fetching from W&B failed after the retries; nothing was written."""


def _scrub(text: str, secret: str) -> str:
    text = text.replace(secret, "***") if secret else text
    return re.sub(r"Basic [A-Za-z0-9+/=]{20,}", "Basic ***", text)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def get_api(wandb_settings: WandbSettings, pipeline: PipelineSettings):
    """Return this process's ``wandb.Api`` for these settings, creating (and authenticating) it once."""
    key = (
        wandb_settings.base_url,
        wandb_settings.api_key,
        wandb_settings.entity,
        pipeline.http_timeout_s,
        pipeline.http_retries,
        pipeline.retry_wait_max_s,
    )
    with _API_LOCK:
        api = _API_CACHE.get(key)
        if api is None:
            api = _open_api(wandb_settings, pipeline)
            _API_CACHE[key] = api
        return api


def _open_api(wandb_settings: WandbSettings, pipeline: PipelineSettings):
    import wandb

    wandb.setup(
        wandb.Settings(
            x_graphql_retry_max=pipeline.http_retries,
            x_graphql_retry_wait_min_seconds=min(1.0, pipeline.retry_wait_max_s),
            x_graphql_retry_wait_max_seconds=pipeline.retry_wait_max_s,
            x_graphql_timeout_seconds=pipeline.http_timeout_s,
            silent=True,
        )
    )
    overrides = {"base_url": wandb_settings.base_url} if wandb_settings.base_url else {}
    if wandb_settings.entity:
        overrides["entity"] = wandb_settings.entity
    # Python waits for wandb-core, which retries underneath: allow for every attempt and its back-off.
    patience = int((pipeline.http_retries + 1) * (pipeline.http_timeout_s + pipeline.retry_wait_max_s)) + 5
    where = wandb_settings.base_url or "the default W&B server"
    try:
        return wandb.Api(overrides=overrides, timeout=patience, api_key=wandb_settings.api_key)
    except Exception as exc:  # noqa: BLE001 - the client raises many types; all mean the same to a user
        detail = _scrub(str(exc), wandb_settings.api_key)
        unreachable = any(m in detail.lower() for m in ("did not respond", "connection refused", "no such host"))
        if unreachable:
            raise ConfigError(
                f"Could not reach W&B at {where} to check WANDB_API_KEY: check WANDB_BASE_URL and the network."
            ) from None
        if type(exc).__name__ == "AuthenticationError" or "not logged in" in detail or "401" in detail:
            raise ConfigError(f"WANDB_API_KEY was rejected by {where}: set a valid W&B API key.") from None
        raise ConfigError(f"Could not connect to W&B at {where} ({detail.splitlines()[0][:200]}).") from None


def created_between(start: datetime, end: datetime) -> dict:
    """The server-side filter for runs created in ``[start, end)`` (naive UTC)."""
    return {"createdAt": {"$gte": _iso(start), "$lt": _iso(end)}}


def with_ids(run_ids: list[str]) -> dict:
    """The server-side filter for the runs with these ids, in one request (``name`` is the run id)."""
    return {"name": {"$in": list(run_ids)}}


def _describe(filters: dict) -> str:
    """``created A..B`` or ``by id (N runs)``: what a fetch asked for, for error messages."""
    created = filters.get("createdAt") or {}
    if created:
        return f"created {created.get('$gte')}..{created.get('$lt')}"
    ids = (filters.get("name") or {}).get("$in")
    return f"by id ({len(ids)} runs)" if ids is not None else str(filters)[:200]


def fetch_run_pages(
    api, entity: str, project: str, filters: dict, per_page: int, secret: str = ""
) -> Iterator[list[dict]]:
    """Yield raw run nodes matching ``filters``, oldest first, one list per page."""
    api.flush()
    runs = api.runs(f"{entity}/{project}", filters=filters, order="+created_at", per_page=per_page, lazy=False)
    what = _describe(filters)

    def next_page(page_number: int) -> list[dict] | None:
        if not runs.more:
            return None
        runs.update_variables()
        try:
            runs._update_response()  # one GraphQL page; the public iterator has no per-page hook
        except Exception as exc:  # noqa: BLE001
            detail = _scrub(str(exc), secret).replace("\n", " ")
            raise WandbFetchError(
                f"Fetching W&B runs of {entity}/{project} {what} failed on page {page_number} after retries: "
                f"{detail[:300]}"
            ) from None
        project_data = (runs.last_response or {}).get("project")
        if project_data is None:
            raise ConfigError(f"W&B project {entity}/{project} was not found: check WANDB_ENTITY and WANDB_PROJECT.")
        edges = (project_data.get("runs") or {}).get("edges") or []
        return [edge["node"] for edge in edges] or None

    # Fetch page N+1 in the background while the caller normalises and writes page N.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wandb-page") as pool:
        pending = pool.submit(next_page, 1)
        page_number = 1
        while (page := pending.result()) is not None:
            page_number += 1
            pending = pool.submit(next_page, page_number)
            yield page


def default_entity(api) -> str:
    """The entity of the API key's user, used when ``WANDB_ENTITY`` is not set."""
    entity = api.default_entity
    if not entity:
        raise ConfigError("WANDB_ENTITY is not set and the API key has no default entity: export WANDB_ENTITY.")
    return entity
