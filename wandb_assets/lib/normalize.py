"""Turn a raw W&B run node (as the GraphQL ``Runs`` query returns it) into one warehouse row.

Everything the client may hand us in odd shapes is normalised here: multiply JSON-encoded summaries,
``{"value": ..., "desc": ...}`` config wrapping, ISO-8601 timestamps with or without a zone, and
non-finite or non-numeric throughput values. Problems never raise: the bad field becomes null/``{}``
and its name is recorded in ``anomalies`` so the asset can count it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from wandb_assets.lib.accounting import gpus
from wandb_assets.lib.naming import categorize, parse_ci_name

#: The state sets every rule uses (gauges, derived tables, views, alerts): one definition each.
ENDED_STATES = ("finished", "failed", "crashed", "killed", "preempted")
#: Alive: W&B still expects the run to log (the ``alive_runs`` view, the tick's unfinished-run window).
ALIVE_STATES = ("running", "pending", "preempting")
#: Occupying GPUs now: alive and not waiting to be scheduled.
BUSY_STATES = ("running", "preempting")
#: Failed: the run itself went wrong (killed and preempted runs are someone's decision, not a failure).
FAILED_STATES = ("failed", "crashed")
#: What a success rate rates: finished / (finished + failed + crashed).
RATED_STATES = ("finished", *FAILED_STATES)
#: A run W&B stopped returning while the warehouse held it alive (deleted, or moved to another project: asked for by
#: id, it was not in the answer), or whose project left the mirror set (anomaly ``unmirrored``). Neither alive nor
#: ended: it is last seen at ``heartbeat_at`` and occupies its GPUs up to then, never after (its past stays).
VANISHED = "vanished"
#: A copy of a run W&B now returns from another project of its entity (the UI's "Move runs"): the same run id and
#: creation time, vanished here and present there. It occupies nothing here (its GPU-hours and dollars count once, in
#: the project that holds it now); W&B returning it here again restores it.
MOVED = "moved"
#: Ended runs whose throughput counts (a crashed CI run may still have logged its SPS).
SPS_STATES = ("finished", "crashed")

#: The five throughput keys logged by CI benchmark runs, and the warehouse column for each.
SPS_KEYS: dict[str, str] = {
    "overview/steps_per_second": "sps_overview_steps_per_second",
    "overview/epoch_steps_per_second": "sps_overview_epoch_steps_per_second",
    "overview/sps": "sps_overview_sps",
    "timing_cumulative/sps": "sps_timing_cumulative_sps",
    "timing_per_epoch/sps": "sps_timing_per_epoch_sps",
}

_MAX_JSON_LAYERS = 8
_DECODER = json.JSONDecoder(strict=False)  # one decoder: json.loads(strict=False) builds one per call

#: Where a run's GPU count is looked for in its config, first match wins (``WANDB_ASSETS_GPU_COUNT_KEYS``).
DEFAULT_GPU_COUNT_KEYS: tuple[str, ...] = ("compute.gpu_count",)


def decode_json_object(raw: Any) -> dict | None:
    """Peel any number of JSON-string layers; return the object, or None if it is not one."""
    for _ in range(_MAX_JSON_LAYERS):
        if isinstance(raw, (bytes, bytearray)):
            raw = raw.decode("utf-8", "replace")
        if not isinstance(raw, str):
            break
        try:
            raw = _DECODER.decode(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None


def normalize_summary(raw: Any) -> tuple[dict, bool]:
    """Return ``(summary, ok)``. Null/empty-object summaries are fine; anything else non-object is not."""
    if raw is None:
        return {}, True
    decoded = decode_json_object(raw)
    if decoded is None:
        return {}, raw in ("null", b"null")
    return decoded, True


#: Keys the wandb client adds to every config (its own bookkeeping, not the user's): dropped from ``config``;
#: the client version inside ``_wandb`` is kept in the ``cli_version`` column.
CLIENT_CONFIG_KEYS = ("_wandb", "wandb_version")


def _unwrap(value: Any) -> Any:
    """``v`` of ``{"value": v}`` or ``{"value": v, "desc": d}`` (W&B's config wrapping); anything else as it is."""
    if isinstance(value, dict) and "value" in value and (len(value) == 1 or (len(value) == 2 and "desc" in value)):
        return value["value"]
    return value


def unwrap_config(raw: Any) -> tuple[dict, bool]:
    """Decode a run config and remove W&B's ``{"value": v, "desc": d}`` wrapping from each key."""
    decoded, ok = normalize_summary(raw)  # the same JSON-object decoding as summaries
    return strip_client_keys(decoded), ok


def strip_client_keys(decoded: dict) -> dict:
    """A decoded config without the client's bookkeeping keys, each value unwrapped."""
    return {key: _unwrap(value) for key, value in decoded.items() if key not in CLIENT_CONFIG_KEYS}


def client_version(decoded: dict) -> str | None:
    """The wandb client version that wrote the run (``_wandb.cli_version``, else ``wandb_version``)."""
    bookkeeping = _unwrap(decoded.get("_wandb"))
    version = bookkeeping.get("cli_version") if isinstance(bookkeeping, dict) else None
    return _text(version or _unwrap(decoded.get("wandb_version")))


def lookup_dotted(mapping: dict, dotted_key: str) -> Any:
    """Find ``a.b`` stored either as the flat key ``"a.b"`` or nested ``{"a": {"b": ...}}``."""
    if dotted_key in mapping:
        return mapping[dotted_key]
    current: Any = mapping
    for part in dotted_key.split("."):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return current


def finite_float(value: Any) -> float | None:
    """A finite float, or None for NaN, +-Infinity, strings, booleans, containers and null."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def non_negative_int(value: Any, maximum: int = gpus.MAX_CPUS) -> int | None:
    """A whole count, 0 to ``maximum``, from an int, a whole float or a string of ASCII digits; else None."""
    return gpus.whole_count(value, 0, maximum)


def parse_timestamp(raw: Any) -> datetime | None:
    """Parse an ISO-8601 string (``Z``, an offset, or no zone = UTC) to a naive UTC datetime."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    text = raw.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return to_naive_utc(parsed)


def to_naive_utc(moment: datetime) -> datetime:
    """Drop the zone of an aware datetime after converting it to UTC; naive values are taken as UTC."""
    return moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)


@functools.lru_cache(maxsize=64)
def _project_url(app_url: str, entity: str, project: str) -> str:
    return app_url.rstrip("/") + "/" + "/".join(quote(str(p), safe="") for p in (entity, project, "runs")) + "/"


def run_url(app_url: str, entity: str, project: str, run_id: str) -> str:
    """The run's page, built the way the wandb client builds ``Run.url``."""
    return _project_url(app_url, entity, project) + quote(str(run_id), safe="")


def run_row(
    node: dict,
    *,
    entity: str,
    project: str,
    app_url: str,
    default_gpus: int,
    gpu_count_keys: tuple[str, ...] = DEFAULT_GPU_COUNT_KEYS,
    metadata: dict | None = None,
) -> dict[str, Any]:
    """Build one ``runs`` row from a GraphQL run node and what was read of its ``wandb-metadata.json`` (``{"status":
    "read"|"missing"|"malformed", "gpu_count", "gpu"}`` from ``fetch.read_metadata_file``; None: not read). Never
    raises: a bad field is NULL and named in ``anomalies``; a node that cannot be read at all (not even an object)
    is kept as its id alone, with the anomaly ``unreadable``. ``run_id`` is None only for a node with no usable id
    (``name``): such a row cannot be stored, and ``stage_page`` counts it instead. The GPU count follows
    ``lib.gpus.gpu_count``'s precedence over ``gpu_count_keys``, the metadata, the node's ``systemMetrics`` and
    ``default_gpus``."""
    try:
        return _run_row(
            node if isinstance(node, dict) else {},
            entity=entity,
            project=project,
            app_url=app_url,
            default_gpus=default_gpus,
            gpu_count_keys=gpu_count_keys,
            metadata=metadata if isinstance(metadata, dict) else None,
        ) | ({} if isinstance(node, dict) else {"anomalies": ["unreadable"]})
    except Exception:  # noqa: BLE001 - the last line of defence: one run never stops the others
        run_id = mend_text(_text(node.get("name")) if isinstance(node, dict) else None)[0]
        return {
            "entity": entity,
            "project": project,
            "run_id": run_id,
            "state": "unknown",
            "category": "regular",
            "gpu_count": None,
            "url": run_url(app_url, entity, project, run_id) if run_id else None,
            "anomalies": ["unreadable"],
            "source": "wandb",
        }


def _run_row(node: dict, *, entity, project, app_url, default_gpus, gpu_count_keys, metadata) -> dict[str, Any]:
    """``run_row`` without its last line of defence (the same arguments)."""
    anomalies: list[str] = []
    summary, summary_ok = normalize_summary(node.get("summaryMetrics"))
    if not summary_ok:
        anomalies.append("summary")
    raw_config, config_ok = normalize_summary(node.get("config"))
    config = strip_client_keys(raw_config)
    if not config_ok:
        anomalies.append("config")

    created_at = parse_timestamp(node.get("createdAt"))
    if created_at is None:
        anomalies.append("created_at")
    heartbeat_at = parse_timestamp(node.get("heartbeatAt"))
    state = mend_text(_text(node.get("state")))[0] or "unknown"
    ended_at = heartbeat_at if state in ENDED_STATES else None
    duration_hours = None
    if ended_at is not None and created_at is not None:
        duration_hours = max((ended_at - created_at).total_seconds(), 0.0) / 3600.0

    system, system_ok = normalize_summary(node.get("systemMetrics"))
    if not system_ok:
        anomalies.append("system_metrics")
    machine = metadata if metadata and metadata.get("status") == "read" else None
    found = gpus.system_gpus(system)  # once: count, utilisation and sample all read it
    gpu_count, gpu_count_source, gpu_count_bad = gpus.gpu_count(
        config, machine, system, gpu_count_keys, default_gpus, found
    )
    if gpu_count_bad:
        anomalies.append("gpu_count")
    gpu_model, _ = gpus.canonical_gpu_model(lookup_dotted(config, "compute.gpu_type"))
    if gpu_model is None:
        gpu_model, _ = gpus.canonical_gpu_model((machine or {}).get("gpu"))

    raw_cpus = lookup_dotted(config, "compute.cpu_count")
    cpu_count = non_negative_int(raw_cpus)
    if raw_cpus is not None and cpu_count is None:
        anomalies.append("cpu_count")
    if (
        machine is not None
        and machine.get("gpu_count") is not None
        and gpus.valid_gpu_count(machine["gpu_count"]) is None
    ):
        anomalies.append("metadata_gpu_count")
    metadata_json, metadata_mended = mend_json_text(to_json(metadata)) if metadata else (None, False)
    config_json, config_mended = mend_json_text(to_json(config))
    summary_json, summary_mended = mend_json_text(to_json(summary))
    compute = {
        "gpu_type": _text(lookup_dotted(config, "compute.gpu_type")),
        "cpu_count": cpu_count,
        "memory_gb": finite_float(lookup_dotted(config, "compute.memory_gb")),
        "slurm_job_id": _text(lookup_dotted(config, "slurm.job_id")),
        "hostname": _text(lookup_dotted(config, "system.hostname")),
    }
    texts = {  # the text fields W&B users set freely: each mended of lone surrogates
        key: mend_text(_text(node.get(key))) for key in ("name", "displayName", "sweepName", "group", "jobType")
    }
    user = node.get("user") if isinstance(node.get("user"), dict) else {}
    username, user_mended = mend_text(_text(user.get("username") or user.get("name")))
    raw_tags = node.get("tags") if isinstance(node.get("tags"), list) else []
    tags = [mend_text(tag) for tag in map(_text, raw_tags) if tag is not None]
    run_id, display_name = texts["name"][0], texts["displayName"][0]
    sweep_id = texts["sweepName"][0] or None
    ci = parse_ci_name(display_name)
    row: dict[str, Any] = {
        "entity": entity,
        "project": project,
        "run_id": run_id,
        "name": display_name,
        "state": state,
        "category": categorize(display_name, sweep_id),
        "created_at": created_at,
        "heartbeat_at": heartbeat_at,
        "ended_at": ended_at,
        "duration_hours": duration_hours,
        "gpu_count": gpu_count,
        "gpu_count_source": gpu_count_source,
        "gpu_model": gpu_model,
        "gpu_util_pct": gpus.mean_utilisation(system, found),
        "latest_gpu_sample": gpus.gpu_sample(system, found),
        "wandb_metadata": metadata_json,
        **compute,
        "sweep_id": sweep_id,
        "tags": [tag for tag, _ in tags],
        "user": username,
        "group_name": texts["group"][0],
        "job_type": texts["jobType"][0],
        "url": run_url(app_url, entity, project, run_id),
        "ci_branch": ci.branch if ci else None,
        "ci_commit": ci.commit if ci else None,
        "ci_config": ci.config if ci else None,
        "ci_timestamp": ci.timestamp.replace(tzinfo=None) if ci and ci.timestamp else None,
        "summary_step": finite_float(summary.get("_step")),
        "cli_version": client_version(raw_config),
        "config": config_json,
        "summary": summary_json,
        "anomalies": anomalies,
        "source": "wandb",
        "log_path": None,
    }
    for column in ("gpu_type", "gpu_model", "slurm_job_id", "hostname"):
        row[column], mended = mend_text(row[column])
        user_mended |= mended
    if user_mended or config_mended or summary_mended or metadata_mended or any(m for _, m in (*texts.values(), *tags)):
        anomalies.append("text_encoding")
    for key, column in SPS_KEYS.items():
        value = summary.get(key)
        row[column] = finite_float(value)
        if isinstance(value, float) and not math.isfinite(value):
            anomalies.append(column)  # NaN or +-Infinity throughput: NULL in its column, counted here
    return row


def _text(value: Any) -> str | None:
    """A scalar config value as text (ids may be logged as numbers); None for missing or containers."""
    if value is None or isinstance(value, (dict, list, bool)):
        return None
    return str(value)


#: A lone UTF-16 surrogate in a Python string (what ``json.loads`` makes of an unpaired ``\\udXXX`` escape, and
#: what surrogateescape makes of a non-UTF-8 byte in a path). DuckDB refuses such text, so one of them would fail
#: the load of every run beside it: each becomes U+FFFD and the run's ``anomalies`` gets ``text_encoding``.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: In JSON text written with ``ensure_ascii``: an escaped backslash, a valid surrogate pair, or a lone one.
_JSON_SURROGATE = re.compile(r"(\\\\)|(\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2})|\\ud[89a-f][0-9a-f]{2}")


def mend_text(value: Any) -> tuple[Any, bool]:
    """``(value, mended)``: a string with every lone surrogate replaced by U+FFFD; anything else as it is."""
    if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):  # ASCII holds no surrogate
        return _SURROGATE.sub("\ufffd", value), True
    return value, False


def mend_json_text(text: str) -> tuple[str, bool]:
    """``(text, mended)``: JSON text (``ensure_ascii``) with every escaped lone surrogate made ``\\ufffd``; escaped
    backslashes and valid pairs (characters beyond the BMP) are kept. Only text holding ``\\ud`` is scanned."""
    if "\\ud" not in text:
        return text, False
    mended = []

    def replace(match: re.Match) -> str:
        if match.group(1) or match.group(2):
            return match.group(0)
        mended.append(True)
        return "\\ufffd"

    text = _JSON_SURROGATE.sub(replace, text)
    return text, bool(mended)


def to_json(value: dict) -> str:
    """JSON text that keeps NaN, Infinity and -Infinity as those tokens (as wandb-core writes them).

    DuckDB's JSON type accepts the tokens and ``->>``/``::DOUBLE`` and Python's ``json.loads`` read them
    back as the numbers, so a non-finite summary value never turns into the string "nan".
    """
    return _ENCODER.encode(value)


#: One encoder for every ``to_json``: ``json.dumps`` with ``default`` builds one per call; decoded JSON has no cycles.
_ENCODER = json.JSONEncoder(default=str, check_circular=False)
