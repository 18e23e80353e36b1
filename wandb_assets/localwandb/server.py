"""A W&B-compatible GraphQL server on loopback, serving a dataset of runs to the real wandb client.

It answers what ``wandb.Api().runs(...)`` sends through ``wandb-core``: ``Viewer``, ``GetDefaultEntity``,
``Runs`` (Mongo-style filters, order, cursor pagination, filtered ``runCount``) and ``Run``, plus the few
side queries the client makes. ``Faults`` injects latency, 429s (with ``Retry-After``), 5xx and
malformed summaries. Responses are written in one ``write()`` with ``TCP_NODELAY`` so that the Go
client is not stalled by Nagle + delayed ACK.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from wandb_assets.lib.curves import MAX_SAMPLES as MAX_CURVE_SAMPLES
from wandb_assets.lib.downsample import downsample
from wandb_assets.lib.fetch import METADATA_FILE
from wandb_assets.lib.normalize import decode_json_object, parse_timestamp, to_naive_utc
from wandb_assets.localwandb.filters import matches, sort_runs
from wandb_assets.localwandb.loopback import LoopbackServer, QuietHandler

_OPERATION_RE = re.compile(r"\b(?:query|mutation)\s+(\w+)")
_RUN_FIELDS = (
    "id",
    "tags",
    "name",
    "displayName",
    "sweepName",
    "state",
    "config",
    "group",
    "jobType",
    "commit",
    "readOnly",
    "createdAt",
    "heartbeatAt",
    "description",
    "notes",
    "systemMetrics",
    "summaryMetrics",
    "historyLineCount",
    "user",
    "historyKeys",
    "projectId",
)
#: What ``LightweightRunFragment`` (``lazy=True``) asks for: no config, summary, system metrics or history keys.
_LIGHT_FIELDS = tuple(f for f in _RUN_FIELDS if f not in ("config", "systemMetrics", "summaryMetrics", "historyKeys"))


def iso_z(moment: datetime | None) -> str | None:
    """Format a naive-UTC or aware datetime the way the W&B API does: ``YYYY-MM-DDTHH:MM:SSZ``."""
    if moment is None:
        return None
    return to_naive_utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_run_node(
    run_id: str,
    *,
    display_name: str | None,
    state: str,
    created_at: datetime,
    heartbeat_at: datetime | None = None,
    config: dict | None = None,
    summary: dict | str | None = None,
    summary_encoding: str = "json",
    sweep: str | None = None,
    tags: list[str] | None = None,
    username: str = "ci-bot",
    email: str | None = None,
    group: str | None = None,
    job_type: str | None = "train",
    system_metrics: dict | None = None,
    metadata: dict | str | None = None,
    history: list[dict] | None = None,
    events: list[dict] | None = None,
) -> dict[str, Any]:
    """Build a ``Runs`` node exactly as the W&B API serves it.

    ``config`` is wrapped as ``{"key": {"value": v, "desc": null}}``. ``summary_encoding`` is ``json``
    (a JSON string, as W&B sends), ``double``/``triple`` (JSON-encoded that many times, the known quirk),
    ``object`` (a real JSON object) or ``raw`` (``summary`` is sent verbatim as the string given).
    """
    summary = {} if summary is None else summary
    if summary_encoding == "raw":
        summary_value: Any = summary
    elif summary_encoding == "object":
        summary_value = summary
    else:
        layers = {"json": 1, "double": 2, "triple": 3}[summary_encoding]
        summary_value = summary
        for _ in range(layers):
            summary_value = json.dumps(summary_value)
    wrapped = {k: {"value": v, "desc": None} for k, v in (config or {}).items()}
    wrapped["_wandb"] = {"value": {"cli_version": "0.31.0"}, "desc": None}
    return {
        "id": base64.b64encode(f"Run:v1:{run_id}".encode()).decode(),
        "tags": tags or [],
        "name": run_id,
        "displayName": display_name,
        "sweepName": sweep,
        "state": state,
        "config": json.dumps(wrapped),
        "group": group,
        "jobType": job_type,
        "commit": None,
        "readOnly": False,
        "createdAt": iso_z(created_at),
        "heartbeatAt": iso_z(heartbeat_at or created_at),
        "description": None,
        "notes": None,
        "systemMetrics": json.dumps(system_metrics or {}),
        "summaryMetrics": summary_value,
        "historyLineCount": 0,
        "user": {"name": username, "username": username, "email": email},
        "historyKeys": {"keys": {}, "lastStep": 0},
        "projectId": "1",
        # The run file wandb-metadata.json (a dict, or raw text such as a malformed file); never in a Runs answer.
        "_metadata": metadata,
        # Its full history (rows with ``_step``, ``_timestamp`` and metrics) and system stream (rows with
        # ``_timestamp`` and ``system.*``), answered sampled by ``RunCurves``; never in a Runs answer.
        "_history": history or [],
        "_events": events or [],
    }


@dataclass
class Faults:
    """Switches for fault injection. Mutate them on a running server; every request reads them."""

    latency_s: float = 0.0
    #: Slow-server mode for benchmarks: what a real server charges for a ``Runs`` page (a fixed cost per
    #: request plus a cost per run returned), slept before answering.
    cost_per_request_s: float = 0.0
    cost_per_run_s: float = 0.0
    #: ... for each run whose ``files`` a ``Runs`` page also asks (a lookup and a signed URL per run: half a run's
    #: cost in the benchmarks) ...
    cost_per_run_files_s: float = 0.0
    #: ... and for one run file download (``wandb-metadata.json``), slept before serving it.
    cost_per_file_s: float = 0.0
    #: ... and for each run's curves a ``RunCurves`` request returns (sampled history and system stream).
    cost_per_run_curves_s: float = 0.0
    #: HTTP status every run file download answers (404: storage lost the files the pages list); None serves them.
    file_status: int | None = None
    #: HTTP status for injected failures (429, 500, 503...); None disables failures.
    fail_status: int | None = None
    #: How many more matching requests fail; a negative number means every one.
    fail_count: int = 0
    #: Matching requests answered normally before failures start (e.g. let a configuration check through).
    fail_after: int = 0
    #: Seconds sent in ``Retry-After`` with injected failures, when set.
    retry_after: float | None = None
    #: Operations the failures apply to.
    fail_operations: frozenset[str] = frozenset({"Runs"})
    #: Projects (``entity/project``) the failures apply to; None: every project.
    fail_projects: frozenset[str] | None = None
    #: A ``Runs`` answer longer than this many bytes fails with 500 instead, as a gateway gives up on a page
    #: too big to serve (summaries with histograms); None serves any size.
    max_page_bytes: int | None = None
    #: Runs (ids) whose curves the server cannot serve: a ``RunCurves`` answer that would hold one fails with 500.
    poison_curves: frozenset[str] = frozenset()
    #: Runs (ids) whose ``StopRun`` W&B refuses (a GraphQL error: "permission denied"), as for a run of someone else.
    refuse_stop: frozenset[str] = frozenset()
    #: Fraction of runs whose summary is served as a non-object (``"[1, 2]"``), chosen by run id.
    malformed_summary_fraction: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take_failure(self, operation: str, project: str | None = None) -> int | None:
        with self.lock:
            if self.fail_status is None or operation not in self.fail_operations or self.fail_count == 0:
                return None
            if self.fail_projects is not None and project not in self.fail_projects:
                return None
            if self.fail_after > 0:
                self.fail_after -= 1
                return None
            if self.fail_count > 0:
                self.fail_count -= 1
            return self.fail_status


class _ProjectRuns:
    """One project's runs, with the narrowing a real server's indexes give a sliced request."""

    def __init__(self, faults: Faults, created_at: str) -> None:
        self.faults = faults
        self.created_at = created_at
        self.lock = threading.Lock()
        self.records: dict[str, dict[str, Any]] = {}
        self.ordered_cache: dict[tuple[str, str], list[dict]] = {}
        #: createdAt -> records, sorted (built on first use, dropped when runs change)
        self.created_index: tuple[list, list[dict]] | None = None

    def add(self, node: dict[str, Any]) -> None:
        record = {
            "node": node,
            "_config": {
                k: (v.get("value") if isinstance(v, dict) and "value" in v else v)
                for k, v in (decode_json_object(node.get("config")) or {}).items()
            },
            "_summary": decode_json_object(node.get("summaryMetrics")) or {},
            "_times": {k: parse_timestamp(node.get(k)) for k in ("createdAt", "heartbeatAt")},
        }
        record["_json"] = self.node_json(node)
        record["_light_json"] = json.dumps({k: node.get(k) for k in _LIGHT_FIELDS})
        self.records[node["name"]] = record

    def node_json(self, node: dict) -> str:
        served = dict(node)
        fraction = self.faults.malformed_summary_fraction
        if fraction and int(hashlib.md5(node["name"].encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction:
            served["summaryMetrics"] = "[1, 2]"
        return json.dumps({k: served.get(k) for k in _RUN_FIELDS})

    def upsert(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            for node in nodes:
                self.add(node)
            self.ordered_cache.clear()
            self.created_index = None

    def reserve(self) -> None:
        """Serve every summary again under the current fault settings."""
        with self.lock:
            for record in self.records.values():
                record["_json"] = self.node_json(record["node"])

    def select(self, filters_json: str, order: str) -> list[dict]:
        key = (filters_json, order)
        with self.lock:
            cached = self.ordered_cache.get(key)
            if cached is None:
                filters = json.loads(filters_json or "{}") or {}
                selected = [r for r in self._candidates(filters) if matches(r, filters)]
                cached = sort_runs(selected, order)
                self.ordered_cache[key] = cached
            return cached

    def _candidates(self, filters: dict) -> list[dict]:
        """The records a filter can match, narrowed as a real server's indexes would (a ``createdAt`` range,
        a list of run ids); ``matches`` still decides. Without this, every sliced request would cost the
        local server a scan of the whole project, which a real server does not pay."""
        name = filters.get("name")
        names = name.get("$in") if isinstance(name, dict) else None
        if names is not None:
            return [self.records[n] for n in dict.fromkeys(names) if n in self.records]
        created = filters.get("createdAt")
        bounds = {op: parse_timestamp(v) for op, v in created.items()} if isinstance(created, dict) else {}
        if not bounds or set(bounds) - {"$gte", "$gt", "$lt", "$lte"} or None in bounds.values():
            return list(self.records.values())
        if self.created_index is None:
            dated = [r for r in self.records.values() if r["_times"]["createdAt"] is not None]
            dated.sort(key=lambda r: r["_times"]["createdAt"])
            self.created_index = ([r["_times"]["createdAt"] for r in dated], dated)
        times, dated = self.created_index
        low = min((v for op, v in bounds.items() if op in ("$gte", "$gt")), default=None)
        high = max((v for op, v in bounds.items() if op in ("$lt", "$lte")), default=None)
        start = bisect.bisect_left(times, low) if low is not None else 0
        end = bisect.bisect_right(times, high) if high is not None else len(times)
        return dated[start:end]


class LocalWandbServer:
    """Serve the runs of ``entity/project`` (and of any project added with ``add_project``) on
    ``http://127.0.0.1:<port>``; a context manager."""

    def __init__(
        self,
        runs: list[dict[str, Any]] | None = None,
        *,
        entity: str = "demo-team",
        project: str = "demo-project",
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.entity = entity
        self.project = project
        self.api_key = api_key
        self.faults = Faults()
        self.requests: list[tuple[str, dict]] = []
        #: Requests being answered right now, and the most there ever were at once (any operation).
        self.in_flight = 0
        self.max_in_flight = 0
        #: Runs pages refused for exceeding ``faults.max_page_bytes``.
        self.oversized_pages = 0
        #: ``Runs`` pages answered with each run's ``files`` (the query asked where the metadata files are).
        self.pages_with_files = 0
        self._flight_lock = threading.Lock()
        self._lock = threading.Lock()  # the artifacts
        #: (entity, project) -> its runs; the first is the one given here (the artifacts live there too).
        self._projects: dict[tuple[str, str], _ProjectRuns] = {}
        #: ``_sampled_curves``: (history, events, answer) per (their ids, specs, samples).
        self._curves_cache: dict[tuple, tuple] = {}
        self.add_project(entity, project)
        #: artifact collection -> versions (oldest first); each a dict with id, type, files, metadata, aliases
        self.artifacts: dict[str, list[dict[str, Any]]] = {}
        self.downloads: list[str] = []
        #: ``entity/project/run`` of every wandb-metadata.json served (one download per run).
        self.file_downloads: list[str] = []
        #: ``entity/project/run`` of every run a ``StopRun`` mutation stopped, in order (who stopped what).
        self.stops: list[str] = []
        self.upsert_runs(runs or [])
        self._loopback = LoopbackServer(_handler_for(self), host, port, name="local-wandb", start=False)

    # -- dataset -------------------------------------------------------------------------------
    def add_project(self, entity: str, project: str, runs: list[dict[str, Any]] | None = None) -> None:
        """Create ``entity/project`` (listed from now on) with these runs; an existing one gains them."""
        key = (entity, project)
        if key not in self._projects:
            created = iso_z(to_naive_utc(datetime.now().astimezone())) or ""
            self._projects = {**self._projects, key: _ProjectRuns(self.faults, created)}
        self._projects[key].upsert(runs or [])

    def remove_project(self, entity: str, project: str) -> None:
        """Delete ``entity/project``: no longer listed, its runs answered as a missing project's."""
        self._projects = {k: v for k, v in self._projects.items() if k != (entity, project)}

    def projects(self) -> list[tuple[str, str]]:
        return list(self._projects)

    @property
    def _records(self) -> dict[str, dict[str, Any]]:
        return self._projects[(self.entity, self.project)].records

    def upsert_runs(self, nodes: list[dict[str, Any]], entity: str | None = None, project: str | None = None) -> None:
        """Add or replace runs (by run id), e.g. to move a run from running to finished; in ``entity/project``
        (created if new) when given, else in the server's own project."""
        self.add_project(entity or self.entity, project or self.project, nodes)

    def remove_runs(self, run_ids: list[str], entity: str | None = None, project: str | None = None) -> None:
        """Delete runs (by run id) from ``entity/project`` (else the server's own project), as W&B's UI does."""
        runs = self._projects[(entity or self.entity, project or self.project)]
        with runs.lock:
            for run_id in run_ids:
                runs.records.pop(run_id, None)
            runs.ordered_cache.clear()
            runs.created_index = None

    def set_malformed_summary_fraction(self, fraction: float) -> None:
        self.faults.malformed_summary_fraction = fraction
        for runs in self._projects.values():
            runs.reserve()

    def add_artifact(
        self,
        collection: str,
        artifact_type: str,
        files: dict[str, bytes],
        metadata: dict | None = None,
        aliases: list[str] | None = None,
    ) -> str:
        """Store an artifact version (``latest`` moves to it); returns its ``vN`` name."""
        with self._lock:
            versions = self.artifacts.setdefault(collection, [])
            index = len(versions)
            artifact_id = base64.b64encode(f"Artifact:{collection}:{index}".encode()).decode().rstrip("=")
            for older in versions:
                older["aliases"] = [a for a in older["aliases"] if a != "latest"]
            manifest = {
                "version": 1,
                "storagePolicy": "wandb-storage-policy-v1",
                "storagePolicyConfig": {"storageLayout": "V2"},
                "contents": {
                    name: {"digest": base64.b64encode(hashlib.md5(data).digest()).decode(), "size": len(data)}
                    for name, data in files.items()
                },
            }
            versions.append(
                {
                    "id": artifact_id,
                    "index": index,
                    "type": artifact_type,
                    "files": dict(files),
                    "metadata": metadata or {},
                    "aliases": ["latest", *(aliases or [])],
                    "manifest": json.dumps(manifest).encode(),
                }
            )
            return f"v{index}"

    def _find_artifact(self, name: str) -> dict[str, Any] | None:
        collection, _, alias = name.partition(":")
        for version in reversed(self.artifacts.get(collection, [])):
            if alias in version["aliases"] or alias == f"v{version['index']}":
                return {"collection": collection, **version}
        return None

    def _artifact_by_id(self, artifact_id: str) -> dict[str, Any] | None:
        for collection, versions in self.artifacts.items():
            for version in versions:
                if version["id"] == artifact_id:
                    return {"collection": collection, **version}
        return None

    def _artifact_node(self, art: dict[str, Any]) -> dict[str, Any]:
        project = {"id": "UHJvamVjdDox", "internalId": "1", "name": self.project, "entity": {"name": self.entity}}
        collection = {"__typename": "ArtifactSequence", "name": art["collection"], "project": project}
        size = sum(len(d) for d in art["files"].values())
        aliases = [{"__typename": "ArtifactAlias", "id": f"{art['id']}-{a}", "alias": a} for a in art["aliases"]]
        artifact = {
            "__typename": "Artifact",
            "id": art["id"],
            "artifactSequence": collection,
            "versionIndex": art["index"],
            "artifactType": {"name": art["type"]},
            "description": None,
            "metadata": json.dumps(art["metadata"]),
            "ttlDurationSeconds": -1,
            "ttlIsInherited": True,
            "tags": [],
            "historyStep": None,
            "state": "COMMITTED",
            "size": size,
            "digest": hashlib.md5(art["manifest"]).hexdigest(),
            "digestAlgorithm": "MANIFEST_MD5",
            "commitHash": "0" * 12,
            "fileCount": len(art["files"]),
            "createdAt": "2026-01-01T00:00:00Z",
            "updatedAt": None,
            "aliases": [{**a, "artifactCollection": {**collection, "__typename": "ArtifactSequence"}} for a in aliases],
        }
        return {
            "__typename": "ArtifactCollectionMembership",
            "id": f"{art['id']}-m",
            "versionIndex": art["index"],
            "createdAt": "2026-01-01T00:00:00Z",
            "aliases": aliases,
            "artifactCollection": {**collection},
            "artifact": artifact,
        }

    def _artifact_answer(self, operation: str, variables: dict) -> str | None:
        if operation == "ArtifactMembershipByName":
            art = self._find_artifact(variables.get("name", ""))
            membership = self._artifact_node(art) if art else None
            return json.dumps({"data": {"project": {"artifactCollectionMembership": membership}}})
        if operation == "FetchArtifactManifest":
            art = self._artifact_by_id(variables.get("id", ""))
            manifest = {"file": {"directUrl": f"{self.url}/artifact-files/{art['id']}/__manifest__"}} if art else None
            return json.dumps({"data": {"artifact": {"currentManifest": manifest} if art else None}})
        if operation == "GetArtifactMembershipFileUrls":
            art = self._find_artifact(f"{variables.get('collection')}:{variables.get('alias')}")
            edges = (
                [
                    {
                        "node": {
                            "__typename": "File",
                            "name": n,
                            "directUrl": f"{self.url}/artifact-files/{art['id']}/{n}",
                        }
                    }
                    for n in art["files"]
                ]
                if art
                else []
            )
            return json.dumps(
                {
                    "data": {
                        "project": {
                            "artifactCollection": {
                                "__typename": "ArtifactSequence",
                                "artifactMembership": {
                                    "files": {
                                        "pageInfo": {"__typename": "PageInfo", "endCursor": None, "hasNextPage": False},
                                        "edges": edges,
                                    }
                                },
                            }
                        }
                    }
                }
            )
        return None

    def run_page(self, path: str) -> bytes | None:
        """A plain HTML page for ``/<entity>/<project>/runs/<id>``: the run URLs the warehouse stores (and the
        alerts link to) open while the server runs. Name, state, times, tags, config and summary."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
        runs = self._projects.get((parts[0], parts[1])) if len(parts) == 4 and parts[2] == "runs" else None
        record = runs.records.get(parts[3]) if runs else None
        if record is None:
            return None
        node = record["node"]
        rows = "".join(
            f"<tr><th>{escape(label)}</th><td>{escape(str(node.get(key) or ''))}</td></tr>"
            for label, key in (
                ("display name", "displayName"),
                ("state", "state"),
                ("created", "createdAt"),
                ("heartbeat", "heartbeatAt"),
                ("sweep", "sweepName"),
                ("tags", "tags"),
            )
        )
        blocks = "".join(
            f"<h2>{title}</h2><pre>{escape(json.dumps(values, indent=2, sort_keys=True, default=str))}</pre>"
            for title, values in (("config", record["_config"]), ("summary", record["_summary"]))
        )
        title = escape("/".join(parts[:2] + parts[3:]))
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
            f"<h1>{title}</h1><p>Served by the wandb-assets demo's local W&amp;B server.</p>"
            f"<table>{rows}</table>{blocks}</body></html>"
        ).encode()

    def artifact_file(self, path: str) -> bytes | None:
        """The bytes behind ``/artifact-files/<id>/<name>`` (or the manifest)."""
        _, _, rest = path.partition("/artifact-files/")
        artifact_id, _, name = rest.partition("/")
        art = self._artifact_by_id(artifact_id)
        if art is None:
            return None
        self.downloads.append(name)
        return art["manifest"] if name == "__manifest__" else art["files"].get(name)

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._loopback.base

    def start(self) -> LocalWandbServer:
        self._loopback.start()
        return self

    def stop(self) -> None:
        self._loopback.stop()

    def __enter__(self) -> LocalWandbServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def count(self, operation: str) -> int:
        return sum(1 for op, _ in self.requests if op == operation)

    # -- GraphQL -------------------------------------------------------------------------------
    def _viewer(self) -> dict:
        return {
            "id": "VXNlcjox",
            "entity": self.entity,
            "username": "local-user",
            "email": "local@example.invalid",
            "flags": "{}",
            "admin": False,
            "name": "Local User",
            "deletedAt": None,
            "apiKeys": {"edges": []},
            "teams": {"edges": [{"node": {"name": e}} for e in dict.fromkeys(e for e, _ in self._projects)]},
        }

    def answer(self, operation: str, variables: dict, query: str = "") -> str:
        """The JSON text of the response to one GraphQL operation."""
        if operation in ("Viewer", "GetDefaultEntity", "GetViewer"):
            return json.dumps({"data": {"viewer": self._viewer()}})
        if operation == "ServerFeaturesQuery":
            return json.dumps({"data": {"serverInfo": {"features": []}}})
        if operation == "GetProjects":
            return self._projects_page(variables)
        if operation == "ProjectsActivity":
            return self._projects_activity(variables)
        runs = self._projects.get((variables.get("entity"), variables.get("project")))
        if operation == "Runs":
            if runs is None:
                return json.dumps({"data": {"project": None}})
            return self._runs_page(
                runs, variables, lightweight="...LightweightRunFragment" in query, with_files=_asks_files(query)
            )
        if operation == "RunFiles":
            return self._run_files(runs, variables)
        if operation == "RunCurves":
            return self._run_curves(runs, variables, with_user="user {" in query, with_files=_asks_files(query))
        if operation == "StopRun":
            return self._stop_run(variables)
        if operation == "Run":
            record = runs.records.get(variables.get("name", "")) if runs else None
            run = record["_json"] if record else "null"
            return '{"data":{"project":{"run":' + run + "}}}" if runs else '{"data":{"project":null}}'
        if (artifact_answer := self._artifact_answer(operation, variables)) is not None:
            return artifact_answer
        if operation in ("GetSweep", "GetSweepLegacy"):
            return json.dumps({"data": {"project": {"sweep": None}}})
        return json.dumps({"errors": [{"message": f"operation {operation} is not supported"}], "data": None})

    def _stop_run(self, variables: dict) -> str:
        """``stopRun(input: {id})``, as wandb-core sends it for ``Run.stop()``: the run whose storage id it is stops.
        Its state becomes ``killed`` (as W&B records a run stopped from its UI, once its process sees the stop at its
        next status poll and exits) and the stop is recorded in ``stops``; a run of ``faults.refuse_stop`` is refused
        with W&B's permission error; a run that is not running is left as it is (W&B: "no effect")."""
        storage_id = variables.get("id")
        for (entity, project), runs in list(self._projects.items()):
            for record in list(runs.records.values()):
                node = record["node"]
                if node.get("id") != storage_id:
                    continue
                if node["name"] in self.faults.refuse_stop:
                    message = "permission denied: you may not stop runs of this project"
                    return json.dumps({"errors": [{"message": message, "path": ["stopRun"]}], "data": None})
                if node.get("state") == "running":
                    self.stops.append(f"{entity}/{project}/{node['name']}")
                    runs.upsert([{**node, "state": "killed"}])
                return json.dumps({"data": {"stopRun": {"success": True}}})
        return json.dumps({"errors": [{"message": "run not found", "path": ["stopRun"]}], "data": None})

    def _run_curves(
        self, runs: _ProjectRuns | None, variables: dict, with_user: bool = False, with_files: bool = False
    ) -> str:
        """``lib.curves.CURVES_QUERY``: the runs its filters name, each with ``sampledHistory`` (per spec, the rows
        holding every key of the spec, at most ``samples`` of them, the first and last always among them) and
        ``events`` (the system stream sampled the same way, as JSON strings). What is assumed of W&B: the rows are
        spread evenly over the run (its own sampling picks buckets by step); a spec's keys must all be present."""
        if runs is None:
            return json.dumps({"data": {"project": None}})
        selected = runs.select(variables.get("filters") or "{}", variables.get("order") or "+created_at")
        cursor = variables.get("cursor")  # as W&B pages: after the run the cursor names
        start = int(base64.b64decode(cursor).decode().removeprefix("cursor:")) + 1 if cursor else 0
        listed = len(selected)
        selected = selected[start : start + int(variables.get("perPage") or 50)]
        samples = max(1, min(int(variables.get("samples") or 500), MAX_CURVE_SAMPLES))
        specs = [json.loads(spec) for spec in variables.get("specs") or []]
        edges = []
        for i, record in enumerate(selected):
            node = record["node"]
            sampled, events = self._sampled_curves(node["_history"], node["_events"], specs, samples)
            answer = {"name": node["name"], "sampledHistory": sampled, "events": events}
            if with_user:
                answer["user"] = {"username": node["user"]["username"], "email": node["user"].get("email")}
            if with_files:
                answer["files"] = self._files(record, variables, [METADATA_FILE])
            edges.append({"node": answer, "cursor": base64.b64encode(f"cursor:{start + i}".encode()).decode()})
        info = {"endCursor": edges[-1]["cursor"] if edges else None, "hasNextPage": start + len(edges) < listed}
        data = {"runCount": listed, "runs": {"edges": edges, "pageInfo": info}}
        return json.dumps({"data": {"project": data}}, separators=(",", ":"))

    def _sampled_curves(self, history: list, events: list, specs: list[dict], samples: int) -> tuple[list, list]:
        """A run's sampled history (per spec) and system stream, remembered per (history, events, specs, samples): a
        benchmark's runs share one history, and W&B's own sampling costs its database, not our process (the
        configurable ``cost_per_run_curves_s`` stands for it). The lists are kept with the answer, so their ids stay
        theirs."""
        key = (id(history), id(events), json.dumps(specs, sort_keys=True), samples)
        cached = self._curves_cache.get(key)
        if cached is None:
            sampled = []
            for spec in specs:
                keys = list(dict.fromkeys(spec.get("keys") or []))
                rows = [row for row in history if all(k in row for k in keys)]
                limit = max(1, min(int(spec.get("samples") or samples), MAX_CURVE_SAMPLES))
                sampled.append([{k: row[k] for k in keys} for row in downsample(rows, limit, keep={0})])
            answer = (sampled, [json.dumps(e) for e in downsample(events, samples, keep={0})])
            cached = self._curves_cache[key] = (history, events, answer)
        return cached[2]

    def _run_files(self, runs: _ProjectRuns | None, variables: dict) -> str:
        """``run.files(names=[...])``: the run's files among ``fileNames`` (only ``wandb-metadata.json`` exists
        here, when the run has it), each with the URL this server serves it at."""
        if runs is None:
            return json.dumps({"data": {"project": None}})
        record = runs.records.get(variables.get("name", ""))
        if record is None:
            return json.dumps({"data": {"project": {"internalId": "UHJvamVjdDox", "run": None}}})
        files = self._files(record, variables, variables.get("fileNames") or [METADATA_FILE])
        run = {"fileCount": len(files["edges"]), "files": files}
        return json.dumps({"data": {"project": {"internalId": "UHJvamVjdDox", "run": run}}})

    def _files(self, record: dict, variables: dict, wanted: list[str]) -> dict:
        """A run's ``files`` connection among ``wanted``: its ``wandb-metadata.json`` when it has one, with the URL
        this server serves it at (``variables``: the request's entity and project)."""
        edges = []
        if record["node"].get("_metadata") is not None and METADATA_FILE in wanted:
            path = f"/files/{variables['entity']}/{variables['project']}/{record['node']['name']}/{METADATA_FILE}"
            body = self._metadata_bytes(record["node"])
            node = {
                "id": "file-1",
                "name": METADATA_FILE,
                "url": self.url + path,
                "directUrl": self.url + path,
                "sizeBytes": len(body),
                "mimetype": "application/json",
                "updatedAt": None,
                "md5": None,
            }
            edges.append({"node": node, "cursor": "file-0"})
        return {"edges": edges, "pageInfo": {"endCursor": None, "hasNextPage": False}}

    @staticmethod
    def _metadata_bytes(node: dict) -> bytes:
        metadata = node.get("_metadata")
        return (metadata if isinstance(metadata, str) else json.dumps(metadata)).encode()

    def run_file(self, path: str) -> bytes | None:
        """The bytes of ``/files/<entity>/<project>/<run>/wandb-metadata.json``, or None."""
        parts = path.strip("/").split("/")
        if len(parts) != 5 or parts[0] != "files" or parts[4] != METADATA_FILE:
            return None
        runs = self._projects.get((parts[1], parts[2]))
        record = runs.records.get(parts[3]) if runs else None
        if record is None or record["node"].get("_metadata") is None:
            return None
        self.file_downloads.append("/".join(parts[1:4]))
        return self._metadata_bytes(record["node"])

    def _projects_activity(self, variables: dict) -> str:
        """``p<i>: project(name: $p<i>, entityName: $e<i>) { byHeartbeat: runs(first: 1, order: "-heartbeat_at")
        ... byCreation: runs(first: 1, order: "-created_at") ... }`` for every ``i`` in the variables: each project's
        run with the newest heartbeat and its newest run (null: no such project)."""
        data = {}
        for i in range(len(variables) // 2):
            runs = self._projects.get((variables.get(f"e{i}"), variables.get(f"p{i}")))
            if runs is None:
                data[f"p{i}"] = None
                continue
            answer = {}
            for alias, order in (("byHeartbeat", "-heartbeat_at"), ("byCreation", "-created_at")):
                newest = runs.select("{}", order)[:1]  # as W&B (MySQL) orders: a missing value sorts last
                nodes = [{k: r["node"].get(k) for k in ("name", "createdAt", "heartbeatAt")} for r in newest]
                answer[alias] = {"edges": [{"node": node} for node in nodes]}
            data[f"p{i}"] = answer
        return json.dumps({"data": data})

    def _projects_page(self, variables: dict) -> str:
        """``api.projects(entity)``: the entity's projects, oldest first, paged by cursor."""
        entity = variables.get("entity")
        listed = [(key, runs) for key, runs in self._projects.items() if key[0] == entity]
        per_page = int(variables.get("perPage") or 50)
        cursor = variables.get("cursor")
        start = int(base64.b64decode(cursor).decode().split(":")[1]) + 1 if cursor else 0
        page = listed[start : start + per_page]
        nodes = [
            {
                "node": {
                    "__typename": "Project",
                    "id": base64.b64encode(f"Project:{e}/{p}".encode()).decode(),
                    "name": p,
                    "entityName": e,
                    "createdAt": runs.created_at,
                    "isBenchmark": False,
                    "user": None,
                }
            }
            for (e, p), runs in page
        ]
        end_cursor = base64.b64encode(f"cursor:{start + len(page) - 1}".encode()).decode() if page else None
        info = {"__typename": "PageInfo", "endCursor": end_cursor, "hasNextPage": start + len(page) < len(listed)}
        return json.dumps({"data": {"models": {"pageInfo": info, "edges": nodes}}})

    def _runs_page(
        self, runs: _ProjectRuns, variables: dict, lightweight: bool = False, with_files: bool = False
    ) -> str:
        """One page of ``Runs``; ``with_files``: each node also carries its ``files`` connection (the query asked
        ``files(names: [...])`` of every run)."""
        selected = runs.select(variables.get("filters") or "{}", variables.get("order") or "+created_at")
        per_page = int(variables.get("perPage") or 50)
        cursor = variables.get("cursor")
        start = int(base64.b64decode(cursor).decode().split(":")[1]) + 1 if cursor else 0
        page = selected[start : start + per_page]
        field = "_light_json" if lightweight else "_json"
        self.pages_with_files += with_files

        def node(record: dict) -> str:
            if not with_files:
                return record[field]
            files = json.dumps(self._files(record, variables, [METADATA_FILE]))
            return record[field][:-1] + ',"files":' + files + "}"

        edges = ",".join(
            '{"node":' + node(r) + ',"cursor":"' + base64.b64encode(f"cursor:{start + i}".encode()).decode() + '"}'
            for i, r in enumerate(page)
        )
        end_cursor = base64.b64encode(f"cursor:{start + len(page) - 1}".encode()).decode() if page else None
        has_next = start + len(page) < len(selected)
        return (
            '{"data":{"project":{"internalId":"UHJvamVjdDox","runCount":'
            + str(len(selected))
            + ',"readOnly":false,"runs":{"edges":['
            + edges
            + '],"pageInfo":{"endCursor":'
            + json.dumps(end_cursor)
            + ',"hasNextPage":'
            + ("true" if has_next else "false")
            + "}}}}}"
        )


def _asks_files(query: str) -> bool:
    """A ``Runs`` query that asks each run's ``files`` too (``lib.fetch.RUN_METADATA_FILE_FIELD``)."""
    return "files(names:" in query


def _handler_for(server: LocalWandbServer) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        disable_nagle_algorithm = True

        def _send(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
            extra = extra or {}
            head = [
                f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}",
                f"Content-Type: {extra.pop('Content-Type', 'application/json')}",
                f"Content-Length: {len(body)}",
            ]
            head += [f"{k}: {v}" for k, v in extra.items()]
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?")[0]
            page = server.run_page(path)
            if page is not None:
                self._send(200, page, {"Content-Type": "text/html; charset=utf-8"})
                return
            if server.faults.cost_per_file_s and path.startswith("/files/"):
                time.sleep(server.faults.cost_per_file_s)
            if server.faults.file_status is not None and path.startswith("/files/"):
                self._send(server.faults.file_status, b'{"error": "injected"}')
                return
            data = server.artifact_file(path) if path.startswith("/artifact-files/") else server.run_file(path)
            if data is None:
                self._send(404, b'{"error": "not found"}')
            else:
                self._send(200, data, {"Content-Type": "application/octet-stream"})

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/graphql":
                self._send(200, b"")
                return
            if server.api_key is not None:
                expected = "Basic " + base64.b64encode(f"api:{server.api_key}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self._send(401, b'{"errors":[{"message":"user is not logged in"}],"data":null}')
                    return
            payload = json.loads(raw or b"{}")
            match = _OPERATION_RE.search(payload.get("query") or "")
            operation = match.group(1) if match else (payload.get("operationName") or "")
            variables = payload.get("variables") or {}
            server.requests.append((operation, variables))
            with server._flight_lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._answer(operation, variables, payload)
            finally:
                with server._flight_lock:
                    server.in_flight -= 1

        def _answer(self, operation: str, variables: dict, payload: dict) -> None:
            faults = server.faults
            if faults.latency_s:
                time.sleep(faults.latency_s)
            status = faults.take_failure(operation, f"{variables.get('entity')}/{variables.get('project')}")
            if status is not None:
                extra = {"Retry-After": f"{faults.retry_after:g}"} if faults.retry_after is not None else {}
                self._send(status, json.dumps({"errors": [{"message": f"injected {status}"}]}).encode(), extra)
                return
            body = server.answer(operation, variables, payload.get("query") or "")
            charged = ("Runs", "ProjectsActivity")
            if operation in charged and (faults.cost_per_request_s or faults.cost_per_run_s):
                # Runs returned: a run edge ends with its cursor (the files inside a node have none).
                returned = body.count(',"cursor":"') if operation == "Runs" else body.count('{"node":')
                files = returned if operation == "Runs" and _asks_files(payload.get("query") or "") else 0
                time.sleep(
                    faults.cost_per_request_s + faults.cost_per_run_s * returned + faults.cost_per_run_files_s * files
                )
            if operation == "RunCurves" and faults.poison_curves:
                edges = ((json.loads(body).get("data") or {}).get("project") or {}).get("runs", {}).get("edges", [])
                if any(edge["node"].get("name") in faults.poison_curves for edge in edges):
                    self._send(500, json.dumps({"errors": [{"message": "injected 500: poison run"}]}).encode())
                    return
            if operation == "RunCurves" and (faults.cost_per_request_s or faults.cost_per_run_curves_s):
                time.sleep(faults.cost_per_request_s + faults.cost_per_run_curves_s * body.count(',"cursor":"'))
            if operation == "Runs" and faults.max_page_bytes is not None and len(body) > faults.max_page_bytes:
                server.oversized_pages += 1
                self._send(500, json.dumps({"errors": [{"message": "response too large"}]}).encode())
                return
            self._send(200, body.encode())

    return Handler
