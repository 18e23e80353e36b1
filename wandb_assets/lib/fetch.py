"""Fetch run nodes from W&B through the public API: slices of a window fetched concurrently, politely.

One ``wandb.Api`` per process and settings, shared by the worker threads (wandb-core serves concurrent
requests). Pages are our own ``Runs`` query (``runs_query``) sent through the client's GraphQL transport, one
page at a time, read as raw nodes: the client's paginator (``for run in api.runs(..., lazy=False)``) would raise
on a single malformed summary and lose the whole page, build a ``Run`` object (and an empty directory) per run
that we do not need, and ask fields nothing here reads (``historyKeys`` can outweigh the rest of a run).

wandb-core retries a failed request once (honouring ``Retry-After``) and then reports the HTTP status;
everything else happens here, where the whole fetch can react: a ``Throttle`` (AIMD on requests in flight)
and a ``PageSize`` (halved when a page cannot be served) shared by every worker. wandb-core does not pass
response headers up to Python, so ``RateLimit-Remaining`` cannot be seen; the 429 that follows it can.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from wandb_assets.lib.errors import ConfigError, FetchWideError
from wandb_assets.lib.progress import FetchProgress
from wandb_assets.lib.throttle import PageSize, Throttle

#: Page sizes are halved down to this many runs.
MIN_PAGE_SIZE = 25
#: Config + summary text per page above which later pages are requested smaller (memory per page in flight).
PAGE_BYTES_MAX = 64 * 1024 * 1024
#: How long one page may keep being refused with 429 before the fetch gives up.
THROTTLE_PATIENCE_S = 600.0


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
            # One quick retry inside wandb-core (0 would mean its default of many); the rest is ours.
            x_graphql_retry_max=1,
            # wandb-core ignores waits under a second; Retry-After wins up to the maximum.
            x_graphql_retry_wait_min_seconds=1.0,
            x_graphql_retry_wait_max_seconds=max(1.0, pipeline.retry_wait_max_s),
            x_graphql_timeout_seconds=pipeline.http_timeout_s,
            silent=True,
        )
    )
    overrides = {"base_url": wandb_settings.base_url} if wandb_settings.base_url else {}
    if wandb_settings.entity:
        overrides["entity"] = wandb_settings.entity
    # Python waits for wandb-core, which retries underneath: allow for every attempt and its back-off.
    patience = int(2 * pipeline.http_timeout_s + max(1.0, pipeline.retry_wait_max_s)) + 5
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
        length = re.search(r"API key must have (\d+)\+ characters, has (\d+)", detail)
        if length:  # the client refuses it itself: no server was asked (issue 53: it read "rejected by the server")
            raise ConfigError(
                f"WANDB_API_KEY is {length[2]} characters long after its prefix, and a W&B API key has {length[1]} or "
                "more: the wandb client refuses it before asking any server; check that it was copied whole."
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


@dataclass(frozen=True)
class FetchPolicy:
    """How one fetch treats the server: requests in flight, page sizes, retries."""

    #: Most requests in flight at once (the AIMD limit starts here and never exceeds it).
    concurrency: int = 4
    #: Runs per page to start with; halved (down to ``min_page_size``) when a page cannot be served.
    page_size: int = 1000
    min_page_size: int = MIN_PAGE_SIZE
    #: Retries of a page at the smallest size after a 5xx, a timeout or a connection error.
    retries: int = 4
    retry_wait_max_s: float = 30.0
    #: A page whose config and summary text exceed this is "too big": later pages are requested smaller.
    page_bytes_max: int = PAGE_BYTES_MAX
    #: How long one page may keep being refused with 429 before the fetch gives up.
    throttle_patience_s: float = THROTTLE_PATIENCE_S


@dataclass(frozen=True)
class Slice:
    """One piece of a fetch: a created-at window (part of one UTC ``day``) or a chunk of run ids (no day), of
    ``project`` (``entity/project``; None: the fetch's own project)."""

    index: int
    filters: dict
    day: str | None
    project: str | None = None
    #: The last UTC day of a slice of whole days (``day`` is its first); None: one day, or part of one.
    last_day: str | None = None

    @property
    def days(self) -> tuple[str, ...]:
        """Every UTC day the slice's runs were created on (none for a slice of run ids)."""
        if self.day is None:
            return ()
        if self.last_day is None:
            return (self.day,)
        first, last = datetime.fromisoformat(self.day), datetime.fromisoformat(self.last_day)
        return tuple((first + timedelta(days=n)).date().isoformat() for n in range((last - first).days + 1))


#: Several projects in one fetch: about this many slices per worker in all (each slice costs a request, a
#: small project's day one request for a few runs; fewer slices than this would leave workers idle at the tail).
SLICES_PER_WORKER = 4


def plan_slices(start: datetime, end: datetime, concurrency: int, projects: int = 1) -> list[Slice]:
    """Split ``[start, end)`` (whole UTC days) into day slices, or into hour-aligned parts of days when there
    are too few days (times the ``projects`` fetched alongside, each sliced alike) to keep ``concurrency``
    requests busy (at least two slices per worker). With several projects and more project-days than
    ``SLICES_PER_WORKER`` per worker, runs of whole days instead: every slice is a request, and a request
    costs a server the same whether it returns five runs or five hundred."""
    days = max(1, round((end - start) / timedelta(days=1))) * max(1, projects)
    if projects > 1 and days >= SLICES_PER_WORKER * concurrency:
        return _spans(start, end, max(1, days // (SLICES_PER_WORKER * concurrency)))
    wanted_parts = 1 if concurrency <= 1 else -(-2 * concurrency // days)
    parts = next(p for p in (1, 2, 3, 4, 6, 8, 12, 24) if p >= min(wanted_parts, 24))
    step = timedelta(hours=24 // parts)
    slices: list[Slice] = []
    moment = start
    while moment < end:
        upper = min(moment + step, end)
        slices.append(Slice(len(slices), created_between(moment, upper), moment.date().isoformat()))
        moment = upper
    return slices


def _spans(start: datetime, end: datetime, span_days: int) -> list[Slice]:
    """``[start, end)`` in slices of ``span_days`` whole UTC days (the last one shorter)."""
    slices: list[Slice] = []
    moment = start
    while moment < end:
        upper = min(moment + timedelta(days=span_days), end)
        last = (upper - timedelta(days=1)).date().isoformat()
        first = moment.date().isoformat()
        slices.append(
            Slice(len(slices), created_between(moment, upper), first, last_day=last if last != first else None)
        )
        moment = upper
    return slices


def id_slices(run_ids: list[str], per_request: int, first_index: int) -> list[Slice]:
    """Chunks of run ids, ``per_request`` per request (a filter stays a reasonable size)."""
    chunks = range(0, len(run_ids), per_request)
    return [Slice(first_index + n, with_ids(run_ids[i : i + per_request]), None) for n, i in enumerate(chunks)]


def classify(error: BaseException) -> str:
    """What a failed request means: ``throttled`` (429), ``too_big`` (5xx or timeout: try a smaller page),
    ``transient`` (connection trouble: retry) or ``fatal`` (a GraphQL error or 4xx: retrying cannot help).

    wandb-core reports the last HTTP status in the message ("... while retrying: HTTP 429: ...").
    """
    text = str(error)
    if "HTTP 429" in text:
        return "throttled"
    if re.search(r"HTTP 5\d\d", text) or any(
        marker in text.lower() for marker in ("deadline exceeded", "timeout", "did not respond in time")
    ):
        return "too_big"
    if any(marker in text.lower() for marker in ("connection refused", "connection reset", "eof", "no such host")):
        return "transient"
    return "fatal"


@dataclass(frozen=True)
class NotStopped:
    """Why a stop was not made: ``refused`` (W&B refused it: permission, no such run) or not (the send-time check
    found a reason: the run ended, is another run, is exempt now)."""

    reason: str
    refused: bool = False


def stop_run(api, path: str, check, secret: str = "", act: bool = True) -> tuple[bool, NotStopped | None]:
    """Read the run ``entity/project/run_id`` from W&B now and, unless ``check(state, created_at, tags, config)`` of it
    gives a reason (``lib.acting.idle_delivery.SendTimeCheck``), ask W&B to stop it through the official client
    (``Run.stop()``: wandb-core sends the ``StopRun`` mutation; the run's process sees it at its next status poll).
    Returns ``(True, None)`` when asked (``act`` False: when it would be, nothing asked: the preview),
    ``(False, NotStopped)`` otherwise; raises ``WandbFetchError`` when W&B could not be reached or answered 429/5xx."""
    from wandb.apis.public.runs import RunNotFoundError

    from wandb_assets.lib.normalize import parse_timestamp

    try:
        try:
            run = api.run(path)
        except RunNotFoundError:  # deleted, or moved to another project: not this stop's to chase
            return False, NotStopped("W&B holds no run at that path now (deleted, or moved to another project)")
        created = parse_timestamp(getattr(run, "created_at", None))
        tags, config = tuple(getattr(run, "tags", None) or ()), dict(getattr(run, "config", None) or {})
        reason = check(run.state, created, tags, config)
        if reason is not None:
            return False, NotStopped(reason)
        if act:
            run.stop()
        return True, None
    except Exception as exc:  # noqa: BLE001 - the client raises many types; told apart by what they say
        text = _scrub(str(exc), secret).strip()
        if classify(exc) != "fatal":
            raise WandbFetchError(text.splitlines()[0][:300] if text else type(exc).__name__) from None
        return False, NotStopped(text.splitlines()[-1][:300] if text else type(exc).__name__, refused=True)


def _page_bytes(nodes: list[dict]) -> int:
    """The size of what makes a page big: the JSON text of configs and summaries."""
    return sum(
        len(value)
        for node in nodes
        for value in (node.get("config"), node.get("summaryMetrics"), node.get("systemMetrics"))
        if isinstance(value, str)
    )


#: The run file where W&B's client records the machine: ``gpu_count``, ``gpu`` (the model), and more.
METADATA_FILE = "wandb-metadata.json"

#: The fields of a run that ``normalize.run_row`` reads: the client's ``RunFragment`` (``lazy=False``) less what
#: nothing here uses (``historyKeys`` alone can be larger than the rest of a run; ``id``, ``commit``, ``notes``...).
RUN_FIELDS = (
    "name displayName sweepName state config group jobType createdAt heartbeatAt "
    "systemMetrics summaryMetrics tags user { name username }"
)
#: Asked per run when metadata is read: where its ``wandb-metadata.json`` is (no run has more than one).
RUN_METADATA_FILE_FIELD = f'files(names: ["{METADATA_FILE}"], first: 1) {{ edges {{ node {{ name url directUrl }} }} }}'


def runs_query(with_metadata_file: bool = False) -> str:
    """``Runs``: one page of a project's runs matching ``$filters``, as the client's own query pages them (cursor,
    ``runCount``), asking only ``RUN_FIELDS``; ``with_metadata_file``: also each run's ``RUN_METADATA_FILE_FIELD``,
    so where the files are costs no request of its own."""
    fields = RUN_FIELDS + (" " + RUN_METADATA_FILE_FIELD if with_metadata_file else "")
    return (
        "query Runs($project: String!, $entity: String!, $cursor: String, $perPage: Int = 50, $order: String, "
        "$filters: JSONString) { project(name: $project, entityName: $entity) { runCount(filters: $filters) "
        "runs(filters: $filters, after: $cursor, first: $perPage, order: $order) { edges { node { "
        + fields
        + " } cursor } pageInfo { endCursor hasNextPage } } } }"
    )


def metadata_file_url(node: dict) -> str | None:
    """Where a run node's ``wandb-metadata.json`` is (asked with ``RUN_METADATA_FILE_FIELD``), or None: it has none."""
    files = ((node.get("files") or {}).get("edges")) or []
    file = files[0].get("node") if files else None
    return (file.get("directUrl") or file.get("url")) if file else None


def iter_run_pages(
    api,
    entity: str,
    project: str,
    filters: dict,
    policy: FetchPolicy,
    *,
    throttle: Throttle | None = None,
    page_size: PageSize | None = None,
    secret: str = "",
    cancelled: threading.Event | None = None,
    with_metadata_file: bool = False,
    configured_by: str = "WANDB_ENTITY and WANDB_PROJECT",
    query: str | None = None,
    extra: dict | None = None,
    parse: Callable[[str], Any] = json.loads,
) -> Iterator[tuple[list[dict], int]]:
    """Yield ``(nodes, runs matching filters)`` for each page, oldest first.

    Sends our own ``Runs`` query (``runs_query``) page by page through the client's GraphQL transport
    (wandb-core) and reads the raw nodes (see the module docstring); ``with_metadata_file``: each node also
    says where its ``wandb-metadata.json`` is (``metadata_file_url``); ``parse`` reads an answer's text (the client's
    ``json.loads`` by default). ``throttle`` and ``page_size`` are shared
    by every slice of one fetch. wandb-core retries a failed request once (honouring ``Retry-After``); what it
    then reports is handled here: 429 pauses every worker for about as long as the server asked and halves
    concurrency; a 5xx or a timeout retries the same cursor with half the page size; at the smallest size, up
    to ``policy.retries`` retries with back-off.
    """
    throttle = throttle or Throttle(1)
    page_size = page_size or PageSize(policy.page_size, policy.min_page_size)
    path = f"{entity}/{project}"
    query = query or runs_query(with_metadata_file)
    variables = {"project": project, "entity": entity, "order": "+created_at", "filters": json.dumps(filters)}
    variables.update(extra or {})
    cursor: str | None = None
    page_number, failures, throttled_since = 0, 0, None
    while True:
        if cancelled is not None and cancelled.is_set():
            return
        size = page_size.size
        error: BaseException | None = None
        with throttle.slot():
            started = time.monotonic()
            try:
                response = api._service_api.execute_graphql(
                    query, {**variables, "perPage": size, "cursor": cursor}, parse=parse
                )
            except Exception as exc:  # noqa: BLE001 - classified below
                error = exc
            elapsed = time.monotonic() - started
        if error is None:
            throttle.succeeded()
            failures, throttled_since = 0, None
            page_number += 1
            project_data = (response or {}).get("project")
            if project_data is None:
                raise ConfigError(f"W&B project {path} was not found: check {configured_by}.")
            runs = project_data.get("runs") or {}
            edges = (runs.get("edges") if isinstance(runs, dict) else None) or []
            nodes = (
                [edge.get("node") if isinstance(edge, dict) else None for edge in edges]
                if isinstance(edges, list)
                else [None]
            )
            if not all(isinstance(node, dict) for node in nodes):
                raise WandbFetchError(
                    f"W&B sent a malformed page of {path} {_describe(filters)} (page {page_number}): an edge without "
                    "a run node"
                )
            more = bool((runs.get("pageInfo") or {}).get("hasNextPage")) and bool(edges)
            cursor = edges[-1].get("cursor") if edges else cursor
            if _page_bytes(nodes) > policy.page_bytes_max:
                page_size.shrink(size)
            if nodes or page_number == 1:
                yield nodes, int(project_data.get("runCount") or 0)
            if not more:
                return
            continue
        kind = classify(error)
        if kind == "throttled":
            throttled_since = throttled_since or started
            if time.monotonic() - throttled_since <= policy.throttle_patience_s:
                # wandb-core already waited once between its two attempts (Retry-After, or its back-off):
                # that wait is the best estimate of what the server asked for, now for every worker.
                throttle.throttled(min(max(elapsed, 0.5), policy.retry_wait_max_s))
                continue
        elif kind == "too_big" and page_size.shrink(size):
            continue
        elif kind != "fatal" and failures < policy.retries:
            failures += 1
            time.sleep(min(policy.retry_wait_max_s, 0.25 * 2**failures))
            continue
        detail = _scrub(str(error), secret).replace("\n", " ")
        raise WandbFetchError(
            f"Fetching W&B runs of {path} {_describe(filters)} failed on page {page_number + 1} "
            f"(page size {size}) after retries: {detail[:300]}"
        ) from None


def fetch_curves(
    api,
    path: str,
    names: list[str],
    keys: list[str],
    samples: int,
    policy: FetchPolicy,
    throttle: Throttle,
    secret: str = "",
    with_user: bool = False,
) -> dict[str, dict]:
    """``{run_id: curves}`` of the runs ``names`` of ``path`` (``entity/project``): ``curves.CURVES_RUNS_PER_REQUEST``
    runs a request, in ``throttle`` (the fetch's budget, its 429 back-off and retries). A request that fails after
    its retries leaves its runs ``failed`` (read again by a later fetch): it never fails the fetch."""
    from wandb_assets.lib.curves import (
        CURVES_QUERY,
        CURVES_RUNS_PER_REQUEST,
        CURVES_WITH_USER_QUERY,
        failed_curves,
        history_specs,
        parse_answer,
        read_curves,
    )

    entity, _, project = path.partition("/")
    extra = {"specs": history_specs(keys, samples), "samples": samples}
    found: dict[str, dict] = {}

    def read_one(node: dict, read_at: datetime) -> dict:
        try:
            return read_curves(node, keys, read_at)
        except Exception as exc:  # noqa: BLE001 - a run whose curves cannot be read is that run's failure alone
            return failed_curves(read_at, f"unreadable curves: {type(exc).__name__}")

    def request(chunk: list[str]) -> Exception | None:
        """Read ``chunk`` in one request; the error that stopped it, or None."""
        read_at = datetime.now(UTC).replace(tzinfo=None)
        pages = iter_run_pages(
            api,
            entity,
            project,
            {"name": {"$in": chunk}},
            policy,
            throttle=throttle,
            page_size=PageSize(len(chunk), 1),
            secret=secret,
            query=CURVES_WITH_USER_QUERY if with_user else CURVES_QUERY,
            extra=extra,
            parse=parse_answer,
        )
        try:
            for nodes, _ in pages:
                found.update({node["name"]: read_one(node, read_at) for node in nodes if node.get("name")})
        except (WandbFetchError, ConfigError) as exc:
            return exc
        return None

    for first in range(0, len(names), CURVES_RUNS_PER_REQUEST):
        chunk = names[first : first + CURVES_RUNS_PER_REQUEST]
        error = request(chunk)
        unread = [name for name in chunk if name not in found]
        if error is not None and len(chunk) > 1:
            # One run W&B cannot serve stops its request where it stands: the runs not read yet are asked alone,
            # so only that run fails (two failing alone in a row is an outage: the rest wait for a later fetch).
            failed_alone = 0
            for name in unread:
                if failed_alone >= 2:
                    break
                alone = request([name])
                failed_alone = failed_alone + 1 if alone is not None else 0
                if alone is not None:
                    found[name] = failed_curves(datetime.now(UTC).replace(tzinfo=None), str(alone))
            else:
                error = None  # each run was asked alone: what it answered stands
        read_at = datetime.now(UTC).replace(tzinfo=None)
        if error is not None:
            found.update({name: failed_curves(read_at, str(error)) for name in chunk if name not in found})
        found.update({name: read_curves({}, keys, read_at) for name in chunk if name not in found})  # not returned
    return found


def fetch_due_curves(
    api,
    due: list[tuple[str, str, str, bool]],
    keys: list[str],
    samples: int,
    policy: FetchPolicy,
    on_read: Callable[[str, dict[str, bool], dict[str, dict]], None],
    secret: str = "",
    with_user: bool = False,
) -> Throttle:
    """The curves of the runs ``due`` (``[(entity, project, run_id, final)]``): one request per
    ``curves.CURVES_RUNS_PER_REQUEST`` runs of one project, ``policy.concurrency`` in flight at most (fewer after a
    429). ``on_read(path, final, read)`` gets each request's runs as it answers (``fetch_curves``; a request that
    failed leaves its runs ``failed``), on the request's thread. Returns the throttle (its request counts)."""
    from wandb_assets.lib.curves import CURVES_RUNS_PER_REQUEST

    by_project: dict[str, dict[str, bool]] = {}
    for entity, project, run_id, final in due:
        by_project.setdefault(f"{entity}/{project}", {})[run_id] = final
    chunks = [
        (path, dict(list(runs.items())[first : first + CURVES_RUNS_PER_REQUEST]))
        for path, runs in by_project.items()
        for first in range(0, len(runs), CURVES_RUNS_PER_REQUEST)
    ]
    throttle = Throttle(policy.concurrency)

    def read(path: str, final: dict[str, bool]) -> None:
        on_read(path, final, fetch_curves(api, path, list(final), keys, samples, policy, throttle, secret, with_user))

    with ThreadPoolExecutor(
        max_workers=max(1, min(policy.concurrency, len(chunks))), thread_name_prefix="curves"
    ) as pool:
        for future in [pool.submit(read, path, final) for path, final in chunks]:
            future.result()
    return throttle


def fetch_run_pages(api, entity: str, project: str, filters: dict, policy: FetchPolicy, secret: str = ""):
    """The nodes matching ``filters``, one list per page (one query, sequential; see ``fetch_slices``)."""
    for nodes, _ in iter_run_pages(api, entity, project, filters, policy, secret=secret):
        yield nodes


@dataclass
class FetchStats:
    """What one fetch did, for logs and metadata. ``failed_projects``: ``entity/project`` -> why, for a fetch
    that isolates projects (each failed project's slices were abandoned; every other project was fetched whole)."""

    slices: int
    requests: int
    max_in_flight: int
    throttled_responses: int
    concurrency_decreases: int
    lowest_concurrency: int
    page_size_initial: int
    page_size_final: int
    seconds: float
    failed_projects: dict[str, str] = field(default_factory=dict)


#: Pages fetched but not yet handled, per request in flight (what a fetch holds in memory beyond its requests).
PAGES_WAITING_PER_WORKER = 2


class _PageFinisher:
    """Pages handed over by the fetching workers, enriched (their runs' metadata files downloaded) and handled on
    threads of their own, so that one page's downloads overlap the next pages' requests instead of holding one
    of the fetch's request slots. At most ``PAGES_WAITING_PER_WORKER`` pages per worker wait (memory); a slice is
    done when its last page is handled. The first failure cancels the fetch and is raised by ``finish``."""

    def __init__(self, workers: int, enrich, handle_page, slice_done, cancelled: threading.Event, isolate=None) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="wandb-page")
        self.room = threading.Semaphore(PAGES_WAITING_PER_WORKER * max(1, workers))
        self.enrich, self.handle_page, self.slice_done, self.cancelled = enrich, handle_page, slice_done, cancelled
        self.isolate = isolate  # (slice, error) -> True when the failure is its project's alone (abandoned)
        self.lock = threading.Lock()
        self.unhandled: dict[int, int] = {}  # slice index -> its pages handed over and not yet handled
        self.fetched: set[int] = set()  # slices whose every page was handed over
        self.futures: list = []
        self.error: BaseException | None = None

    def submit(self, piece: Slice, nodes: list[dict]) -> bool:
        """Hand a page over (waiting while the backlog is full); False: the fetch was cancelled meanwhile."""
        while not self.room.acquire(timeout=0.2):
            if self.cancelled.is_set():
                return False
        with self.lock:
            self.unhandled[piece.index] = self.unhandled.get(piece.index, 0) + 1
            self.futures.append(self.pool.submit(self._handle, piece, nodes))
        return True

    def _handle(self, piece: Slice, nodes: list[dict]) -> None:
        try:
            if self.cancelled.is_set():
                return
            self.enrich(piece, nodes)
            self.handle_page(piece, nodes)
        except BaseException as exc:
            if self.isolate is None or not self.isolate(piece, exc):
                with self.lock:
                    self.error = self.error or exc
                self.cancelled.set()
            return
        finally:
            self.room.release()
        with self.lock:
            self.unhandled[piece.index] -= 1
            done = piece.index in self.fetched and not self.unhandled[piece.index]
        if done:
            self.slice_done(piece)

    def slice_fetched(self, piece: Slice) -> None:
        """Every page of ``piece`` was handed over: it is done now if they are all handled."""
        with self.lock:
            self.fetched.add(piece.index)
            done = not self.unhandled.get(piece.index)
        if done:
            self.slice_done(piece)

    def finish(self, report) -> None:
        """Wait for every page handed over (``report()`` now and then); raise the first failure."""
        while True:
            with self.lock:
                waiting = [future for future in self.futures if not future.done()]
            if not waiting:
                break
            wait(waiting, timeout=0.5)
            report()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop: pages not yet started are dropped (the fetch failed or finished), running ones end first."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def fetch_slices(
    api,
    entity: str,
    project: str,
    slices: list[Slice],
    policy: FetchPolicy,
    handle_page: Callable[[Slice, list[dict]], None],
    *,
    progress: FetchProgress | None = None,
    report: Callable[[FetchProgress], None] | None = None,
    report_every_s: float = 0.5,
    secret: str = "",
    isolate_projects: bool = False,
    others_read: bool = False,
    enrich: Callable[[Slice, list[dict]], None] | None = None,
    with_metadata_file: bool = False,
) -> FetchStats:
    """Fetch every slice, ``policy.concurrency`` requests in flight at most, calling ``handle_page(slice,
    nodes)`` from the worker threads (each slice's pages in order). ``report(progress)`` runs on this thread
    every ``report_every_s`` seconds. The first failure cancels the other slices and is raised.

    ``isolate_projects``: the slices of several projects share the one request budget (in-flight limit and 429
    back-off); a failure abandons only its own project's slices, and is raised only when every project failed
    and ``others_read`` does not say that other projects were found current without a fetch (else it is in
    ``failed_projects``). ``enrich(slice, nodes)`` runs before ``handle_page`` (reading the runs' metadata
    files: ``with_metadata_file`` asks where they are with each page); with it, pages are handled on threads of
    their own (``_PageFinisher``), so the workers go on fetching while a page's files download. Each project has its own
    page size: one that cannot serve pages does not shrink the others'."""
    started = time.monotonic()
    throttle = Throttle(policy.concurrency)
    page_sizes: dict[str, PageSize] = {}
    cancelled = threading.Event()
    failed: dict[str, str] = {}
    abandoned: dict[str, threading.Event] = {}
    own = f"{entity}/{project}"
    lock = threading.Lock()

    def page_size_of(path: str) -> PageSize:
        key = path if isolate_projects else own
        with lock:
            return page_sizes.setdefault(key, PageSize(policy.page_size, policy.min_page_size))

    def stop_of(piece: Slice) -> threading.Event:
        """Set when ``piece`` is to be dropped: its project was abandoned (``isolate_projects``), or the fetch."""
        return abandoned.setdefault(piece.project or own, threading.Event()) if isolate_projects else cancelled

    def work(piece: Slice) -> None:
        path = piece.project or own
        stop = stop_of(piece)
        if stop.is_set():
            return
        slice_entity, _, slice_project = path.partition("/")
        try:
            for n, (nodes, total) in enumerate(
                iter_run_pages(
                    api,
                    slice_entity,
                    slice_project,
                    piece.filters,
                    policy,
                    throttle=throttle,
                    page_size=page_size_of(path),
                    secret=secret,
                    cancelled=stop,
                    with_metadata_file=with_metadata_file,
                    # several projects: they are named in WANDB_ASSETS_PROJECTS, not by the single-project variables
                    configured_by="its name in WANDB_ASSETS_PROJECTS"
                    if isolate_projects
                    else "WANDB_ENTITY and WANDB_PROJECT",
                )
            ):
                if cancelled.is_set():
                    return
                if progress is not None:
                    if n == 0:
                        progress.expect(piece.index, total)
                    progress.add(piece.day if len(piece.days) == 1 else None, len(nodes))
                if finisher is None:
                    handle_page(piece, nodes)
                elif not finisher.submit(piece, nodes):
                    return
        except Exception as exc:  # noqa: BLE001 - isolated per project unless fetch-wide (below)
            if not fail_project(piece, exc):
                raise
            return
        if stop.is_set():
            return
        if finisher is not None:
            finisher.slice_fetched(piece)
        else:
            slice_done(piece)

    def fail_project(piece: Slice, exc: BaseException) -> bool:
        """Abandon ``piece``'s project for ``exc`` (True), when projects are isolated and ``exc`` is that project's
        alone: anything raised while its pages are fetched, normalised or staged, but a ``FetchWideError`` or an
        interruption (False: the fetch fails)."""
        if not isolate_projects or isinstance(exc, FetchWideError) or not isinstance(exc, Exception):
            return False
        why = str(exc) if isinstance(exc, (WandbFetchError, ConfigError)) else f"{type(exc).__name__}: {exc}"
        with lock:
            failed.setdefault(piece.project or own, _scrub(why, secret).replace("\n", " ")[:500])
        stop_of(piece).set()
        return True

    def slice_done(piece: Slice) -> None:
        if progress is not None and not stop_of(piece).is_set():
            progress.slice_done(*(piece.days or (None,)))

    finisher = (
        _PageFinisher(
            policy.concurrency,
            enrich,
            handle_page,
            slice_done,
            cancelled,
            fail_project,
        )
        if enrich is not None
        else None
    )
    workers = max(1, min(policy.concurrency, len(slices)))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wandb-fetch") as pool:
            pending = {pool.submit(work, piece) for piece in slices}
            try:
                while pending:
                    done, pending = wait(pending, timeout=report_every_s, return_when=FIRST_EXCEPTION)
                    for future in done:
                        future.result()  # raises the first failure
                    if report is not None and progress is not None:
                        report(progress)
            except BaseException:
                cancelled.set()
                for future in pending:
                    future.cancel()
                raise
        if finisher is not None:
            finisher.finish(lambda: report(progress) if report is not None and progress is not None else None)
    finally:
        if finisher is not None:
            finisher.close()
    projects = {piece.project or own for piece in slices}
    if isolate_projects and failed and set(failed) >= projects and not others_read:
        raise WandbFetchError("Every project failed: " + "; ".join(failed[p] for p in sorted(failed)))
    sizes = list(page_sizes.values()) or [PageSize(policy.page_size, policy.min_page_size)]
    return FetchStats(
        slices=len(slices),
        requests=throttle.requests,
        max_in_flight=throttle.max_in_flight,
        throttled_responses=throttle.throttled_responses,
        concurrency_decreases=throttle.decreases,
        lowest_concurrency=throttle.lowest_limit,
        page_size_initial=policy.page_size,
        page_size_final=min(size.size for size in sizes),
        seconds=time.monotonic() - started,
        failed_projects=dict(sorted(failed.items())),
    )


def default_entity(api) -> str:
    """The entity of the API key's user, used when ``WANDB_ENTITY`` is not set."""
    entity = api.default_entity
    if not entity:
        raise ConfigError("WANDB_ENTITY is not set and the API key has no default entity: export WANDB_ENTITY.")
    return entity


def list_projects(api, entity: str, secret: str = "") -> list[str]:
    """The names of every project of ``entity`` as W&B lists them now, in the order listed.

    wandb 0.31 keeps ``api.projects(entity)`` for the life of the ``Api`` (``api.flush()`` does not clear it), so
    a project created since would never be seen by a long-lived process: the cached listing is dropped first.
    A failed listing raises ``WandbFetchError`` naming the entity (never the key)."""
    cached = getattr(api, "_projects", None)
    if isinstance(cached, dict):
        cached.pop(entity, None)
    try:
        return [project.name for project in api.projects(entity)]
    except Exception as exc:  # wandb-core reports HTTP errors as several exception types
        raise WandbFetchError(f"Listing the projects of {entity!r} failed: {_scrub(str(exc), secret)[:300]}") from None


#: Projects asked about in one ``latest_activity`` request (GraphQL aliases: one request for many projects).
PROJECTS_PER_PROBE = 25


def _activity_query(count: int) -> str:
    """``ProjectsActivity``: for each of ``count`` projects (``$e<i>``/``$p<i>``), its run with the newest heartbeat
    (``order: "-heartbeat_at"``) and its newest run (``"-created_at"``), ``first: 1`` each, as the ``Runs`` query
    orders runs: a run so new that it has no heartbeat yet sorts last by heartbeat (NULLs last, descending), so the
    newest creation is asked for too, in the same request."""
    variables = ", ".join(f"$e{i}: String!, $p{i}: String!" for i in range(count))
    node = "{ edges { node { name createdAt heartbeatAt } } }"
    fields = " ".join(
        f"p{i}: project(name: $p{i}, entityName: $e{i}) "
        f'{{ byHeartbeat: runs(first: 1, order: "-heartbeat_at") {node} '
        f'byCreation: runs(first: 1, order: "-created_at") {node} }}'
        for i in range(count)
    )
    return f"query ProjectsActivity({variables}) {{ {fields} }}"


def latest_activity(api, projects: list[str], secret: str = "") -> dict[str, datetime | None]:
    """The newest moment anything happened in each project (``entity/project``): its newest run heartbeat (a
    run's heartbeat is at least its creation time, moves while it is alive and stops when it ends) or run
    creation (a new run without a heartbeat yet), or None for a project without runs. ``PROJECTS_PER_PROBE``
    projects per request. A project W&B does not return (not found, no access) is left out: the fetch proper will
    say why. Raises ``WandbFetchError`` on a failed request."""
    from wandb_assets.lib.normalize import parse_timestamp

    found: dict[str, datetime | None] = {}
    for first in range(0, len(projects), PROJECTS_PER_PROBE):
        batch = projects[first : first + PROJECTS_PER_PROBE]
        variables = {}
        for i, path in enumerate(batch):
            variables[f"e{i}"], _, variables[f"p{i}"] = path.partition("/")
        try:
            data = api._service_api.execute_graphql(_activity_query(len(batch)), variables)
        except Exception as exc:  # noqa: BLE001 - wandb-core reports HTTP and GraphQL errors as several types
            raise WandbFetchError(
                f"Asking W&B which of {len(projects)} projects changed failed: {_scrub(str(exc), secret)[:300]}"
            ) from None
        for i, path in enumerate(batch):
            project = (data or {}).get(f"p{i}")
            if project is None:
                continue
            nodes = [
                edge.get("node") or {}
                for alias in ("byHeartbeat", "byCreation")
                for edge in ((project.get(alias) or {}).get("edges") or [])[:1]
            ]
            moments = [parse_timestamp(node.get(k)) for node in nodes for k in ("heartbeatAt", "createdAt")]
            found[path] = max((m for m in moments if m is not None), default=None)
    return found


#: Attempts at one metadata file download (a 429 pauses every download first).
METADATA_ATTEMPTS = 2


def failure_cause(text: str) -> str:
    """A failed read's cause, short enough to count failures by (``HTTP 404``, ``the download took longer than
    10 s``, ``timed out``): the HTTP status it names, else what follows "failed: "."""
    status = re.search(r"HTTP \d{3}", text)
    if status:
        return status.group(0)
    return text.rpartition("failed: ")[2].strip()[:80] or "unknown"


def _in_budget(throttle: Throttle, call, what: str, secret: str):
    """One request in a budget: a slot of ``throttle``, a 429 pausing every request of it; retried once."""
    for n in range(METADATA_ATTEMPTS):
        started = time.monotonic()
        with throttle.slot():
            try:
                result = call()
            except Exception as exc:  # noqa: BLE001 - urllib3 and our own status check raise several types
                error = exc
            else:
                throttle.succeeded()
                return result
        kind = classify(error)
        if kind == "throttled":
            throttle.throttled(min(max(time.monotonic() - started, 0.5), 30.0))
        elif kind == "fatal" or n + 1 == METADATA_ATTEMPTS:
            break
    raise WandbFetchError(f"{what} failed: {_scrub(str(error), secret).replace(chr(10), ' ')[:300]}")


def _origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``url``, the default port filled in (``https://h`` is ``https://h:443``)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme, 0)


def metadata_headers(url: str, base_url: str, api_key: str) -> dict[str, str]:
    """The W&B key goes only to the W&B base URL's own origin (scheme, host and port: never over plain HTTP to an
    HTTPS server's host, never to another port); a signed storage URL (``directUrl``) carries its own authorisation
    and is sent nothing."""
    import base64

    try:
        if _origin(url) != _origin(base_url):
            return {}
    except ValueError:  # a port that is not a number: not W&B's origin
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode()}


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` names: itself when an IP literal, else what it resolves to (none when it does not)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in socket.getaddrinfo(host, None)]
    except (OSError, UnicodeError, ValueError):
        return []  # not resolvable: the download fails on its own


def metadata_url_refused(url: str, base_url: str, allowed_hosts: tuple[str, ...] = ()) -> str | None:
    """Why a file URL the server named is not fetched (None: it is): only the W&B base URL's own origin, or another
    host over HTTPS (what signed storage URLs are); never another scheme (``file:``) or plain HTTP elsewhere, never an
    IP literal, and never a name that resolves to a loopback, link-local, private or reserved address (the cluster's
    own services, the cloud's metadata endpoint) unless ``allowed_hosts`` names it (a self-hosted W&B whose file
    storage is on a private network: WANDB_ASSETS_FILE_HOSTS)."""
    try:
        origin = _origin(url)
        same = origin == _origin(base_url)
    except ValueError:
        return "its port is not a number"
    if same:
        return None
    scheme, host, _ = origin
    if scheme != "https" or not host:
        return "another host than W&B's, not over https"
    if host.lower() in {allowed.lower() for allowed in allowed_hosts}:
        return None
    try:
        ipaddress.ip_address(host.strip("[]"))
        return "another host than W&B's named by its IP address"
    except ValueError:
        pass
    inside = [a for a in _addresses(host) if a.is_loopback or a.is_link_local or a.is_private or a.is_reserved]
    if inside:
        return f"another host than W&B's on a local or private network ({inside[0]}): WANDB_ASSETS_FILE_HOSTS allows it"
    return None


class DownloadPool:
    """Kept-alive ``urllib3`` connections for the metadata downloads, through the proxy ``HTTPS_PROXY`` /
    ``HTTP_PROXY`` name for the URL's scheme unless ``NO_PROXY`` exempts its host (read from the environment as
    the wandb client and ``urllib`` read them), else direct."""

    def __init__(self, size: int) -> None:
        import urllib3

        self.size = size
        self.direct = urllib3.PoolManager(num_pools=8, maxsize=size, block=False)
        self.proxied: dict[str, object] = {}
        self.lock = threading.Lock()

    def manager(self, url: str):
        import urllib.request
        from urllib.parse import urlsplit

        import urllib3

        parts = urlsplit(url)
        proxies = urllib.request.getproxies_environment()
        proxy = proxies.get(parts.scheme.lower())
        if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
            return self.direct
        with self.lock:
            if proxy not in self.proxied:
                self.proxied[proxy] = urllib3.ProxyManager(proxy, num_pools=8, maxsize=self.size, block=False)
            return self.proxied[proxy]

    def request(self, method: str, url: str, **options):
        return self.manager(url).request(method, url, **options)


def read_metadata_file(
    http, url: str, headers: dict, throttle: Throttle, what: str, timeout_s: float, secret: str = ""
) -> dict:
    """One ``wandb-metadata.json`` as ``{"status": "read", "gpu_count", "gpu"}``, or ``{"status": "malformed"}`` when
    it is not a JSON object. ``http``: a ``DownloadPool`` (or any ``urllib3`` pool) shared by the fetch (kept-alive
    connections: a download costs a fraction of a millisecond of CPU, where a round trip through wandb-core and a
    temporary file cost several). Redirects are not followed. ``timeout_s`` bounds each socket operation and the
    whole download: a server that drips its bytes is cut off at the deadline. Raises ``WandbFetchError`` when the
    download keeps failing (a later fetch asks again)."""
    from wandb_assets.lib.accounting.gpus import METADATA_MAX_BYTES, machine_metadata

    def get() -> bytes:
        deadline = time.monotonic() + timeout_s
        response = http.request("GET", url, headers=headers, timeout=timeout_s, retries=False, preload_content=False)
        try:
            if response.status != 200:
                response.drain_conn()  # its body read and dropped: a kept-alive connection is reused clean
                raise WandbFetchError(f"HTTP {response.status}")
            body = bytearray()
            while len(body) < METADATA_MAX_BYTES:
                chunk = response.read1(min(65536, METADATA_MAX_BYTES - len(body)))
                if not chunk:
                    break
                body += chunk
                if time.monotonic() > deadline:
                    raise WandbFetchError(f"the download took longer than {timeout_s:g} s")
            return bytes(body)
        finally:
            response.release_conn()

    return machine_metadata(_in_budget(throttle, get, f"Reading {what}", secret))
